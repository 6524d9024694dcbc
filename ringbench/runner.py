"""The per-rank runner: for each case, build the shards, warm up, time iterations, record, check, report.

Runs inside every rank (local processes or a torchrun/SLURM job). Each finished case is sent to the parent (or
to rank 0 when launched externally) as a dict: this rank's event rows on the aligned clock plus its errors.
"""

from __future__ import annotations

import math
import socket
import time

import torch
import torch.distributed as dist

from ringbench.api import build_context, ring_attention
from ringbench.faults import RankFaults, parse_fault
from ringbench.kernels import get_kernel
from ringbench.layout import shard
from ringbench.record import ListRecorder, NullRecorder
from ringbench.scenario import Case
from ringbench.selfcheck import DTYPES


class RunRecorder(ListRecorder):
    """Records spans (unless tracing is off), keeps the parent informed of the ring step, and fires faults."""

    def __init__(self, rank, ring_position, progress, faults: RankFaults, trace: bool, sync=None) -> None:
        super().__init__(rank, ring_position, sync=sync)
        self.enabled = trace
        self.progress = progress
        self.faults = faults

    def on_step(self, phase: str, step: int) -> None:
        if self.progress is not None:
            self.progress.set_step(phase, step)
        self.faults.at_step(phase, step, self.iteration)

    def span(self, **fields) -> None:
        if self.enabled:
            super().span(**fields)


def _clock_offset(group=None) -> tuple[int, int, str]:
    """(offset_ns to subtract, residual_ns, method) aligning this rank's perf_counter to rank 0's.

    Ranks on one host share CLOCK_MONOTONIC, so the offset is exactly 0. Across hosts: five barrier rounds;
    each rank stamps on leaving the barrier; the offset is the median difference to rank 0's stamp and the
    residual the spread of that difference over the rounds (barrier exit skew bounds the error).
    """
    world = dist.get_world_size(group)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) == 1:
        return 0, 0, "shared monotonic clock (one host)"
    stamps = []
    for _ in range(5):
        dist.barrier(group=group)
        stamps.append(time.perf_counter_ns())
    mine = torch.tensor(stamps, dtype=torch.int64)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    diffs = (mine - gathered[0]).tolist()
    diffs.sort()
    return diffs[len(diffs) // 2], diffs[-1] - diffs[0], "barrier rounds (multi-host)"


def _reference_errors(case: Case, tensors, out, grads, rank: int, device) -> tuple[float, float]:
    """Max abs errors of this rank's output and gradients against float64 attention over the whole sequence.

    The reference runs one head at a time so its S x S score matrix stays small.
    """
    from ringbench.api import reference_attention

    q, k, v, dout = tensors  # full sequence, (B, H, S, D), values exactly representable in the case dtype
    ref_mask = "none" if case.mask == "none" else "causal"
    fwd_err = bwd_err = 0.0
    for head in range(case.heads):
        sl = slice(head, head + 1)
        q_h, k_h, v_h = (t[:, sl].double().requires_grad_() for t in (q, k, v))
        ref = reference_attention(q_h, k_h, v_h, mask=ref_mask)
        local = lambda t: shard(t, case.layout, case.world, rank)  # noqa: E731
        fwd_err = max(fwd_err, (out[:, sl].double() - local(ref.detach())).abs().max().item())
        if grads is not None:
            ref_grads = torch.autograd.grad(ref, (q_h, k_h, v_h), dout[:, sl].double())
            for g, r in zip(grads, ref_grads, strict=True):
                bwd_err = max(bwd_err, (g[:, sl].double() - local(r)).abs().max().item())
    return fwd_err, (bwd_err if grads is not None else math.nan)


def run_case(case: Case, *, env, progress, settings: dict, case_index: int, repeat: int) -> dict:
    """Run one case on this rank; returns its rows and figures for the parent."""
    group = None
    rank, world = env.rank, env.world
    device = env.device
    dtype = DTYPES[case.dtype]
    faults = RankFaults(
        rank=rank,
        faults=tuple(parse_fault(f) for f in settings["faults"]),
        seed=settings["seed"],
        link_model=settings.get("link_model"),
        ring=tuple(case.ring),
    )
    if progress is not None:
        progress.set_case(case_index)
    generator = torch.Generator().manual_seed(settings["seed"] + 7919 * case_index)
    shape = (case.batch, case.heads, case.seq, case.head_dim)
    full = [torch.randn(shape, generator=generator).to(dtype) for _ in range(4)]  # q, k, v, dout (B, H, S, D)
    q, k, v, dout = (shard(t, case.layout, world, rank).to(device) for t in full)
    q, k, v = (t.requires_grad_(case.backward) for t in (q, k, v))

    ring = case.ring
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    recorder = RunRecorder(rank, ring.index(rank), progress, faults, trace=settings["trace"], sync=sync)
    kernel = faults.wrap_kernel(get_kernel(case.kernel))
    ctx = build_context(
        q, k, v, mask=case.mask, layout=case.layout, buffer=case.buffer, order=ring, group=group, kernel=kernel,
        timeout_s=settings["timeout"], recorder=recorder, link_delay=faults.link_delay(),
    )  # fmt: skip
    offset_ns, residual_ns, clock_method = _clock_offset(group)
    origin = None
    out = grads = None
    try:
        for iteration in range(-settings["warmup"], settings["iters"]):
            recorder.iteration = iteration
            if iteration == 0 and hasattr(kernel, "saturated_blocks"):
                kernel.saturated_blocks = 0  # count only timed iterations (warm-up pays one-off allocations)
            if progress is not None:
                progress.set_iteration(iteration)
            dist.barrier(group=group)  # every iteration starts together (bounded by the group's timeout)
            start = recorder.now() if recorder.enabled else time.perf_counter_ns()
            origin = origin if origin is not None else start
            out = ring_attention(q, k, v, context=ctx)
            fwd_end = time.perf_counter_ns() if sync is None else (sync(), time.perf_counter_ns())[1]
            if case.backward:
                grads = torch.autograd.grad(out, (q, k, v), dout)
            end = time.perf_counter_ns() if sync is None else (sync(), time.perf_counter_ns())[1]
            if iteration >= 0:
                # Iteration rows are kept even with tracing off: they carry the step times.
                recorder.rows.append(_row(iteration, "fwd", rank, ring, start, fwd_end))
                if case.backward:
                    recorder.rows.append(_row(iteration, "bwd", rank, ring, fwd_end, end))
    finally:
        if ctx.comm is not None:
            ctx.comm.close()
    errors = (math.nan, math.nan)
    if settings["check"]:
        errors = _reference_errors(case, full, out.detach().cpu(), [g.cpu() for g in grads] if grads else None,
                                   rank, device)  # fmt: skip
    rows = recorder.rows
    # One origin for all ranks, on rank 0's clock: the earliest first-iteration start of any rank. (Each rank
    # subtracting its own start would misalign the ranks by their barrier-exit skew.)
    common = torch.tensor([origin - offset_ns], dtype=torch.int64)
    dist.all_reduce(common, op=dist.ReduceOp.MIN, group=group)
    shift = int(common.item()) + offset_ns
    for row in rows:
        row["start_ns"] -= shift
        row["end_ns"] -= shift
        row["repeat"] = repeat
        row["case_id"] = case.case_id
    return {
        "case_id": case.case_id,
        "rank": rank,
        "rows": rows,
        "fwd_err": errors[0],
        "bwd_err": errors[1],
        "clock_offset_ns": offset_ns,
        "clock_residual_ns": residual_ns,
        "clock_method": clock_method,
        "saturated_blocks": getattr(kernel, "saturated_blocks", 0),
        "host": socket.gethostname(),
        "device": str(device),
    }


def _row(iteration, phase, rank, ring, start, end) -> dict:
    return {
        "iteration": iteration, "phase": phase, "rank": rank, "ring_position": ring.index(rank), "step": -1,
        "kind": "iteration", "start_ns": start, "end_ns": end, "src": rank, "dst": rank, "bytes": 0,
        "block": -1, "pair": "", "flops": 0.0,
    }  # fmt: skip


def rank_worker(worker_ctx, cases: list[tuple[int, Case]], settings: dict, repeat: int) -> int:
    """Entry point inside each local rank: run the cases, streaming each result to the parent."""
    for done, (index, case) in enumerate(cases):
        worker_ctx.wait_stored(done)  # the parent stores the previous case before we time the next one
        result = run_case(case, env=worker_ctx.env, progress=worker_ctx.progress, settings=settings,
                          case_index=index, repeat=repeat)  # fmt: skip
        worker_ctx.send(result)
    return len(cases)


__all__ = ["NullRecorder", "RunRecorder", "rank_worker", "run_case"]
