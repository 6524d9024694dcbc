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


def _worst(current: float, value: float) -> float:
    """max() that lets NaN win: a NaN error must fail the check, not vanish (max(0.0, nan) is 0.0)."""
    return math.nan if math.isnan(current) or math.isnan(value) else max(current, value)


def reference_rows(q, k, v, dout, q_index, k_index, causal: bool, rows_per_chunk: int = 512, tick=None):
    """Float64 attention outputs and gradients restricted to this rank's tokens, in bounded memory.

    q, k, v, dout: (B, H, S, D) full sequence. Returns out and dq for the query rows ``q_index`` and dk, dv for
    the key rows ``k_index``, all (B, H, len, D). Queries are processed in chunks of ``rows_per_chunk`` so at
    most (chunk x S) scores exist at once; the backward uses dS = P * (dP - rowsum(dO * O)) on each chunk.
    """
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    seq, scale = q.shape[-2], q.shape[-1] ** -0.5
    positions = torch.arange(seq)
    out_rows = torch.empty(*q.shape[:2], len(q_index), q.shape[-1], dtype=torch.float64)
    dq_rows = torch.empty_like(out_rows)
    dk = torch.zeros(*k.shape[:2], len(k_index), k.shape[-1], dtype=torch.float64)
    dv = torch.zeros_like(dk)
    wanted = torch.full((seq,), -1, dtype=torch.long)
    wanted[q_index] = torch.arange(len(q_index))
    for chunk, lo in enumerate(range(0, seq, rows_per_chunk)):
        if tick is not None:
            tick(chunk)  # progress for the parent's watchdog: a long check is not a hang
        rows = slice(lo, min(lo + rows_per_chunk, seq))
        scores = torch.matmul(q[:, :, rows], k.transpose(-1, -2)) * scale  # (B, H, R, S)
        if causal:
            scores = scores.masked_fill(positions[None, :] > positions[rows, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v)  # (B, H, R, D)
        dprobs = torch.matmul(dout[:, :, rows], v.transpose(-1, -2))
        delta = (dout[:, :, rows] * out).sum(-1, keepdim=True)
        dscores = probs * (dprobs - delta) * scale  # (B, H, R, S)
        local_rows = wanted[rows]
        keep = local_rows >= 0
        if bool(keep.any()):
            out_rows[:, :, local_rows[keep]] = out[:, :, keep]
            dq_rows[:, :, local_rows[keep]] = torch.matmul(dscores[:, :, keep], k)
        dk += torch.matmul(dscores[..., k_index].transpose(-1, -2), q[:, :, rows])
        dv += torch.matmul(probs[..., k_index].transpose(-1, -2), dout[:, :, rows])
    return out_rows, dq_rows, dk, dv


def _reference_errors(case: Case, tensors, out, grads, rank: int, tick=None) -> tuple[float, float]:
    """Max abs errors of this rank's output and gradients against float64 attention over the whole sequence."""
    from ringbench.layout import token_positions

    q, k, v, dout = tensors  # full sequence, (B, H, S, D), values exactly representable in the case dtype
    index = token_positions(case.layout, case.seq, case.world, rank)
    ref_out, ref_dq, ref_dk, ref_dv = reference_rows(q, k, v, dout, index, index, case.mask != "none", tick=tick)
    fwd_err = (out.double() - ref_out).abs().max().item()
    if grads is None:
        return _worst(0.0, fwd_err), math.nan
    bwd_err = 0.0
    for got, want in zip(grads, (ref_dq, ref_dk, ref_dv), strict=True):
        bwd_err = _worst(bwd_err, (got.double() - want).abs().max().item())
    return _worst(0.0, fwd_err), bwd_err


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
        tick = (lambda chunk: progress.set_step("check", chunk)) if progress is not None else None
        cpu_grads = [g.cpu() for g in grads] if grads else None
        errors = _reference_errors(case, full, out.detach().cpu(), cpu_grads, rank, tick=tick)
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
