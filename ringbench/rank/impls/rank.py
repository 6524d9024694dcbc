"""The per-rank call the runner makes instead of ``ring_attention`` when a case names another implementation.

Inside each rank (after the process group is up)::

    from ringbench.rank.impls.rank import run_impl_case
    result = run_impl_case("torch-ring:alltoall", case, rank=r, world=n, device=device, group=None,
                           iters=10, warmup=2, seed=0, check=True, profile_path=path_or_None)

It builds this rank's shards in the layout the adapter expects (ringbench.engine.inputs.rank_shards), runs the warm-up
and timed iterations (forward, and backward through autograd with the same ``dout`` as ringbench's engine),
times every whole iteration on the host clock (``perf_counter_ns``, after a barrier; on CUDA the device is
synchronised at the iteration's end, since an outside library's streams are not ringbench's to instrument),
checks the output and gradients against float64 (ringbench.engine.reference.check_errors) and returns a dict shaped
like the runner's per-rank result: ``rows`` (``iteration`` rows, fwd and bwd, host ns), ``fwd_err``, ``bwd_err``,
``check_note``, ``peak_mem_mb``, ``memory_method``, ``impl``, ``profile``.

With ``profile_path`` every timed iteration runs under the PyTorch profiler inside a ``ringbench:iteration K``
range and the trace is written there; once every rank's trace is written, the parent turns them into the case's
events rows (ringbench.traces.captures, through the importer), iteration rows included.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch

from ringbench.rank.impls import get_adapter


def _barrier(group) -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier(group=group)


def _sync(device) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def _row(iteration: int, phase: str, rank: int, position: int, start: int, end: int) -> dict:
    return {"iteration": iteration, "phase": phase, "rank": rank, "ring_position": position, "step": -1,
            "kind": "iteration", "start_ns": start, "end_ns": end, "src": rank, "dst": rank, "bytes": 0,
            "block": -1, "pair": "", "flops": 0.0, "nccl_ms": None}  # fmt: skip


def run_impl_case(
    impl: str, case, *, rank: int, world: int, device=None, group=None, iters: int = 10, warmup: int = 2,
    seed: int = 0, check: bool = True, check_budget_s: float | None = 60.0, profile_path: Path | None = None,
    recorder=None, before_iteration=None,
) -> dict:  # fmt: skip
    """Run one case of adapter ``impl`` on this rank (see the module doc); ``before_iteration(i)``: a hook
    called before each iteration (warm-up ones negative), e.g. for progress reports."""
    from ringbench.engine.inputs import ShardSpec, rank_shards
    from ringbench.engine.masks import mask_rule
    from ringbench.engine.reference import check_errors
    from ringbench.rank.memory import peak_mb, reset_peak
    from ringbench.rank.profiling import ProfileCapture

    device = torch.device(device) if device is not None else torch.device("cpu")
    adapter = get_adapter(impl)
    fn = adapter.prepare(case, group=group, device=device, recorder=recorder)
    layout = adapter.layout(case)
    memory_method = reset_peak(device)
    shard = ShardSpec.of(case, seed=seed, rank=rank, layout=layout)
    q, k, v, dout = rank_shards(shard, device=device)  # (B, H, S/N, D); k, v: (B, KV, S/N, D)
    backward = bool(case.backward)
    q, k, v = (t.requires_grad_(backward) for t in (q, k, v))
    rows, out, lse, grads = [], None, None, None
    capture = ProfileCapture(profile_path, device) if profile_path is not None else contextlib.nullcontext()
    try:
        for iteration in range(-warmup, iters):
            if before_iteration is not None:
                before_iteration(iteration)
            if iteration == 0:
                capture.__enter__()  # the profiler covers the timed iterations only
            _barrier(group)
            marker = capture.iteration(iteration) if iteration >= 0 and profile_path else contextlib.nullcontext()
            with marker:
                start = time.perf_counter_ns()
                out = fn(q, k, v)
                if isinstance(out, (tuple, list)):  # (out, lse) where the implementation exposes it: both checked
                    out, lse = out[0], (out[1] if len(out) > 1 else None)
                _sync(device)
                middle = time.perf_counter_ns()
                if backward:
                    grads = torch.autograd.grad(out, (q, k, v), dout)
                    _sync(device)
                end = time.perf_counter_ns()
            if iteration >= 0:
                rows.append(_row(iteration, "fwd", rank, rank, start, middle))
                if backward:
                    rows.append(_row(iteration, "bwd", rank, rank, middle, end))
        if profile_path is not None:
            capture.__exit__(None, None, None)
    except BaseException:
        if profile_path is not None and iters > 0:
            capture.__exit__(*__import__("sys").exc_info())
        raise
    finally:
        fn.close()
    from ringbench.rank.layer_checks import nonfinite_tensors

    result = {"impl": adapter.name, "rank": rank, "rows": rows, "fwd_err": math.nan, "bwd_err": math.nan,
              "check_note": "", "nonfinite": nonfinite_tensors(out, grads) if out is not None else "",
              "peak_mem_mb": peak_mb(device), "memory_method": memory_method,
              "profile": str(profile_path) if profile_path is not None else None, "layout": layout}  # fmt: skip
    if check and out is not None:
        lse = lse if isinstance(lse, torch.Tensor) and tuple(lse.shape) == tuple(q.shape[:-1]) else None
        rule = mask_rule(case.mask, case.docs, case.seq)  # a document mask's documents travel in the rule
        checked = check_errors(out.detach(), grads, shard, rule, device=device, budget_s=check_budget_s, lse=lse)
        result.update(fwd_err=checked.fwd_err, bwd_err=checked.bwd_err, check_note=checked.note,
                      errors=checked.errors())  # fmt: skip
    return result


__all__ = ["run_impl_case"]
