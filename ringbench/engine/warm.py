"""Compile a JIT kernel's block variants before the ranks start timing together.

A Triton kernel compiles each new variant (mask mode, dtype, the divisibility of its lengths) on its first call, on
the host, for seconds. Inside the first iteration that is a rank posting late: its peers' transfers wait, and past
the ring's bound (``timeout``, 60 s) they are flagged as a stall, or NCCL's watchdog ends the job. Plans differ by
rank (document and window masks above all), so ranks compile different variants for different times. ``warm``
runs every distinct block of this rank's plans once, forward and backward, on zeros, with no exchange and no
record; the runner then meets the other ranks over a patient group (ringbench/rank/collectives.py) before any
timed work. Kernels without ``compiles`` (torch's, the emulated ones) skip it.
"""

from __future__ import annotations

import torch

from ringbench.engine.ring import RingContext

MOST = 128  # distinct blocks warmed per context: a document pack's many partial blocks share few variants


def compiles(kernel) -> bool:
    """Whether ``kernel`` (or a kernel it wraps: faults, emulation) compiles its variants on first use."""
    while kernel is not None:
        if getattr(kernel, "compiles", False):
            return True
        kernel = getattr(kernel, "_inner", None) or getattr(kernel, "inner", None)
    return False


def _rings(ctx, q: torch.Tensor, k: torch.Tensor) -> list[tuple[RingContext, torch.Tensor, torch.Tensor]]:
    """Each ring loop the context runs, with query and key tensors of the shapes its blocks see (the K/V heads
    pick a JIT kernel's variant too: grouped-query attention)."""
    if isinstance(ctx, RingContext):
        return [(ctx, q, k)]
    kind = ctx.strategy.kind
    if kind == "double-ring":
        return [(ctx.inner_context(o), q, k) for o in range(ctx.outer_world)]
    batch, heads, local, head_dim = q.shape
    size = ctx.groups.size  # after the all-to-all: H/U heads (and their KV heads) of U members' rows
    lo, hi = ctx.kv_span(ctx.groups.slot(ctx.rank)[1])
    return [(ctx.ring_context(), q.new_zeros(batch, heads // size, size * local, head_dim),
             q.new_zeros(batch, hi - lo, size * local, head_dim))]  # fmt: skip


def _rule_mode(rule) -> tuple:
    """What of a positional rule picks a kernel variant: causal or not, a window, documents."""
    if rule is None:
        return ()
    return (rule.causal, rule.window > 0, rule.q_doc is not None)


def warm(ctx, q: torch.Tensor, k: torch.Tensor | None = None) -> int:
    """Run every distinct block of the context's plans once (module docstring); returns how many ran. ``k``: this
    rank's K shard (its KV heads; default: as many heads as q)."""
    if not compiles(ctx.kernel):
        return 0
    ran = 0
    for ring_ctx, shape, key_shape in _rings(ctx, q, q if k is None else k):
        zeros, key_zeros = torch.zeros_like(shape), torch.zeros_like(key_shape)
        seen = set()
        for owner in ring_ctx.ring:
            for block in ring_ctx.plan(owner).blocks:
                mask = block.mask
                key = (mask.kind, _rule_mode(mask.rule), block.q_hi - block.q_lo, block.k_hi - block.k_lo)
                if key in seen or len(seen) >= MOST:
                    continue
                seen.add(key)
                rows, cols = zeros[:, :, block.q_lo : block.q_hi], key_zeros[:, :, block.k_lo : block.k_hi]
                out, lse = ring_ctx.kernel.forward(rows, cols, cols, mask, ring_ctx.scale)
                ring_ctx.kernel.backward(rows, rows, cols, cols, out, lse, mask, ring_ctx.scale)
                ran += 1
    return ran


__all__ = ["compiles", "warm"]
