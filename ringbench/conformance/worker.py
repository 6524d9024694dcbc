"""Inside each rank of a check's pool: take cases from the parent, run the implementation, send its tensors back.

The rank builds its shards of the case's global inputs (ringbench.engine.inputs, the rows of its positions), calls
the adapter's attention function, differentiates it with the case's dO, and sends out (and lse, where the function
returns one), dq, dk and dv as they are (dtype and all) -- the parent compares them with float64. A failure of the
implementation (it raises, returns the wrong shape or dtype, gives no gradient to an input, or refuses the case) is
sent as one line; the rank stays up for the next case. Its stdout goes to stderr: whatever an implementation prints
must not mix with `--json` on the parent's stdout.
"""

from __future__ import annotations

import contextlib
import os
import queue
import time

import torch

from ringbench.errors import UsageError

FAILURE_KINDS = ("error", "refused", "shape", "timeout", "hang", "died")


class Misbehaved(Exception):
    """The implementation returned something that is not what the interface promises (shape, dtype, gradient)."""


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    head = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {head}" if head and not isinstance(exc, (UsageError, Misbehaved)) else (
        head or type(exc).__name__)  # fmt: skip


def _waited(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text or " stalled " in text


def _expect(name: str, tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise Misbehaved(f"{name} is a {type(tensor).__name__}, expected a tensor of shape {shape}")
    if tuple(tensor.shape) != shape:
        raise Misbehaved(f"{name} has shape {tuple(tensor.shape)}, expected {shape}")
    if tensor.dtype != dtype:
        raise Misbehaved(f"{name} has dtype {str(tensor.dtype).removeprefix('torch.')}, expected "
                         f"{str(dtype).removeprefix('torch.')}")  # fmt: skip
    return tensor


def run_case(adapter, case, rank: int, device, group, progress=None) -> dict:
    """This rank's tensors of one case (see the module doc); raises on misbehaviour."""
    from ringbench.engine.inputs import token_rows

    adapter.check(case, device.type)
    positions = case.positions(rank)
    shard = case.shard(rank)
    q, k, v = (token_rows(shard, name, positions).to(device).requires_grad_(case.backward) for name in "qkv")
    dout = token_rows(shard, "dout", positions).to(device)  # (B, H, L, D); k, v: (B, KV, L, D)
    fn = adapter.prepare(case, group=group, device=device)
    try:
        if progress is not None:
            progress.set_step("fwd", 0)
        start = time.perf_counter()
        result = fn(q, k, v)
        lse = None
        if isinstance(result, (tuple, list)):
            if len(result) != 2:
                raise Misbehaved(f"returned {len(result)} values, expected out or (out, lse)")
            result, lse = result
        out = _expect("out", result, tuple(q.shape), q.dtype)
        if lse is not None:
            lse = _expect("lse", lse, tuple(q.shape[:-1]), lse.dtype if isinstance(lse, torch.Tensor) else q.dtype)
        shipped = {"out": out.detach().cpu(), "lse": None if lse is None else lse.detach().float().cpu()}
        if case.backward:
            if progress is not None:
                progress.set_step("bwd", 0)
            if not out.requires_grad:
                raise Misbehaved("out does not require grad: the function is not differentiable (autograd)")
            grads = torch.autograd.grad(out, (q, k, v), dout, allow_unused=True)
            for name, grad, tensor in zip(("dq", "dk", "dv"), grads, (q, k, v), strict=True):
                if grad is None:
                    raise Misbehaved(f"no gradient reaches {name[1]} (autograd)")
                shipped[name] = _expect(name, grad, tuple(tensor.shape), tensor.dtype).detach().cpu()
        shipped["seconds"] = time.perf_counter() - start
    finally:
        fn.close()
    if progress is not None:
        progress.set_step("done", 0)
    return shipped


def serve(ctx, impl: str, inboxes: list) -> str:
    """A pool rank's loop: ("case", index, case) -> ("case", index, rank, tensors | failure); ("ping", index) ->
    ("pong", index, rank) after a barrier; None -> leave."""
    import torch.distributed as dist

    from ringbench.rank.impls import get_adapter

    with contextlib.suppress(OSError):
        os.dup2(2, 1)  # an implementation's prints go to stderr (module doc)
    rank, inbox = ctx.env.rank, inboxes[ctx.env.rank]
    adapter = get_adapter(impl)
    group = dist.group.WORLD
    dist.barrier()  # every pair's connection made before the first case's clock starts
    ctx.send(("ready", -1, rank, None))
    while True:
        try:
            command = inbox.get(timeout=1.0)
        except queue.Empty:
            continue
        if command is None:
            return "done"
        kind, index, payload = command
        if kind == "ping":
            dist.barrier()
            ctx.send(("pong", index, rank, None))
            continue
        ctx.progress.set_case(index)
        try:
            ctx.send(("case", index, rank, run_case(adapter, payload, rank, ctx.env.device, group, ctx.progress)))
        except Exception as exc:  # the implementation's failure is a finding, not the pool's end
            kind = "refused" if isinstance(exc, UsageError) else "shape" if isinstance(exc, Misbehaved) else "error"
            if kind == "error" and _waited(exc):  # a bounded wait on a peer expired: a symptom, the peer is the cause
                kind = "timeout"
            ctx.send(("case", index, rank, {"failure": kind, "line": _line(exc)}))


__all__ = ["FAILURE_KINDS", "Misbehaved", "run_case", "serve"]
