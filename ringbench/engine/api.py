"""Public API: ``ring_attention`` (autograd-capable), usable inside any torch.distributed program.

    from ringbench import ring_attention, shard, unshard
    q_l = shard(q, layout="zigzag", world=N, rank=r)                 # (B, H, S, D) -> (B, H, S/N, D)
    out_l = ring_attention(q_l, k_l, v_l, mask="causal", layout="zigzag",
                           buffer="double", order="identity", group=None)
    out = unshard([out_0, ..., out_N_minus_1], layout="zigzag")      # list in rank order -> (B, H, S, D)

Packed documents and windows: ``mask="causal-document", docs="lengths:3000,1096"`` (or a MaskRule from
ringbench.engine.masks.mask_rule, which carries its documents); ``mask="window:512", buffer="double-short"`` runs
the short ring, which stops when the window is covered. ``layout="doc-balanced"`` needs the same rule to shard
(``shard(x, "doc-balanced", N, r, rule=mask_rule(mask, docs, S))``).

Unsupported input raises ValueError (ringbench.errors.UsageError) naming the argument, the value and what is
allowed.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ringbench.engine.comm import RingComm
from ringbench.engine.layout import as_layout, check_divisible, resolve_layout
from ringbench.engine.masks import mask_rule
from ringbench.engine.pgroups import channel, resolve_policy, ring_partition
from ringbench.engine.recorder import NullRecorder
from ringbench.engine.reference import attention
from ringbench.engine.ring import RingContext, ring_backward, ring_forward
from ringbench.engine.timeline import timeline_for
from ringbench.errors import UsageError, bad_value
from ringbench.kernels import get_kernel
from ringbench.orders import parse_order, validate_ring
from ringbench.vocab import Buffer


def _group_world_rank(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise UsageError("group is given but torch.distributed is not initialized; call init_process_group first")
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise bad_value(f"{name}.shape", shape, "a 4-D tensor (batch, heads, local_seq, head_dim)")
        if not t.is_floating_point():
            raise bad_value(f"{name}.dtype", str(t.dtype), "a floating-point dtype")
    if k.shape != v.shape:
        raise bad_value("v.shape", tuple(v.shape), f"the shape of k, {tuple(k.shape)}")
    if q.shape != k.shape:
        raise bad_value("k.shape", tuple(k.shape), f"the shape of q, {tuple(q.shape)} (same heads and local length)")
    if not (q.dtype == k.dtype == v.dtype):
        raise bad_value("k.dtype/v.dtype", f"{k.dtype}/{v.dtype}", f"q's dtype, {q.dtype}")
    if not (q.device == k.device == v.device):
        raise bad_value("k.device/v.device", f"{k.device}/{v.device}", f"q's device, {q.device}")


def build_context(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask="causal",
    layout="contiguous",
    buffer="double",
    order="identity",
    group=None,
    kernel="torch",
    scale: float | None = None,
    timeout_s: float = 60.0,
    recorder=None,
    link_delay=None,
    timeline=None,
    loopback: bool = False,
    on_stall=None,
    docs="none",
    layer: int = 0,
    groups: str = "auto",
) -> RingContext:
    """Validate everything once and build the per-rank ring context (and its communicator).

    ``timeline``: where spans get their times (ringbench.engine.timeline.timeline_for(device) picks it; the host clock
    when None). ``loopback``: a 1-rank ring still exchanges its block with itself (the one-device transfer test).
    ``mask``: a mode name or a MaskRule; ``docs``: the docs spec of a document mask. ``layer``: the attention layer
    the context runs (recorded with its spans). ``groups``: ``auto``, ``own`` or ``shared`` -- whether the K/V
    rotation and the backward's dK/dV each get a process group of their own (ringbench/engine/pgroups.py).
    """
    _check_tensors(q, k, v)
    layout, buffer = as_layout(layout), Buffer.parse(buffer, "buffer")
    world, rank = _group_world_rank(group)
    ring = parse_order(order, world) if isinstance(order, str) else validate_ring(order, world)
    seq = q.shape[-2] * world
    check_divisible(layout, seq, world)
    rule = mask_rule(mask, docs, seq)
    layout = resolve_layout(layout, seq, world, rule)  # doc-balanced: refuses a mask without documents
    block_kernel = get_kernel(kernel)
    block_kernel.check(q.shape[-1], q.dtype, q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    recorder = recorder if recorder is not None else NullRecorder()
    timeline = timeline if timeline is not None else timeline_for(q.device)
    loopback = bool(loopback) and world == 1
    comm = back_comm = dkv_comm = None
    if world > 1 or loopback:
        policy = resolve_policy(groups, group, world)
        options = dict(timeout_s=timeout_s, watch=recorder.enabled, link_delay=link_delay, timeline=timeline,
                       on_stall=on_stall)  # fmt: skip

        def on(role: str):
            return channel(group, role, ring_partition(world), rank, timeout_s=timeout_s, policy=policy)

        comm = RingComm(ring, rank, group, loopback=loopback, channel=on("ring-kv"), **options)
        if buffer.short and world > 1:  # dK/dV go home to the predecessor: the same ring, reversed
            back_comm = RingComm(ring[::-1], rank, group, channel=on("ring-dkv"), **options)
        elif not buffer.short and buffer is not Buffer.ALLGATHER:  # dK/dV travel beside the next K/V
            dkv_comm = RingComm(ring, rank, group, loopback=loopback, channel=on("ring-dkv"), **options)
    return RingContext(
        mask=rule,
        layout=layout,
        buffer=buffer,
        ring=ring,
        rank=rank,
        seq=seq,
        kernel=block_kernel,
        scale=float(scale),
        group=group,
        timeout_s=timeout_s,
        recorder=recorder,
        timeline=timeline,
        comm=comm,
        loopback=loopback,
        layer=int(layer),
        back_comm=back_comm,
        dkv_comm=dkv_comm,
    )


def close_context(ctx) -> None:
    """Close the context's communicators (their watcher threads); a strategy's context closes its set of them."""
    for comm in ctx.comms() if isinstance(ctx, RingContext) else [ctx.comm]:
        comm.close()


def _forward(q, k, v, ring_ctx: RingContext):
    """(out, lse, the blocks the short ring kept for its backward): the full ring, or the short one."""
    if ring_ctx.buffer.short:
        from ringbench.engine.short_ring import short_forward

        return short_forward(q, k, v, ring_ctx)
    out, lse = ring_forward(q, k, v, ring_ctx)
    return out, lse, {}


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(autograd_ctx, q, k, v, ring_ctx: RingContext, return_lse: bool):
        out, lse, held = _forward(q, k, v, ring_ctx)
        kept_steps, kept = list(held), list(held.values())
        autograd_ctx.save_for_backward(q, k, v, out, lse, *kept)
        autograd_ctx.kept_steps = kept_steps
        autograd_ctx.ring_ctx = ring_ctx
        autograd_ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(autograd_ctx, dout, _dlse):
        q, k, v, out, lse, *kept = autograd_ctx.saved_tensors
        ring_ctx = autograd_ctx.ring_ctx
        try:
            dout, out = ring_ctx.kernel.prepare_backward(dout, out)  # once per call: the layout its blocks read
            if ring_ctx.buffer.short:
                from ringbench.engine.short_ring import short_backward

                held = dict(zip(autograd_ctx.kept_steps, kept, strict=True))
                dq, dk, dv = short_backward(dout, q, k, v, out, lse, held, ring_ctx)
            else:
                dq, dk, dv = ring_backward(dout, q, k, v, out, lse, ring_ctx)
        finally:
            if ring_ctx.owns_comm:
                close_context(ring_ctx)
        return dq, dk, dv, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: str = "causal",
    layout: str = "contiguous",
    buffer: str = "double",
    order: str | list[int] = "identity",
    group=None,
    kernel: str = "torch",
    scale: float | None = None,
    timeout_s: float = 60.0,
    recorder=None,
    return_lse: bool = False,
    context: RingContext | None = None,
    docs: str = "none",
):
    """Exact attention of this rank's queries against the whole sequence's keys, by a ring over ``group``.

    q, k, v: (B, H, S/N, D), this rank's tokens under ``layout`` (see ringbench.shard). Returns the output rows
    for those tokens, (B, H, S/N, D) in q's dtype; with ``return_lse`` also the log-sum-exp (B, H, S/N) in fp32
    (fp64 for fp64 inputs). ``context`` reuses a context built by ``build_context`` (benchmarks do this so that
    validation and planning stay out of the timed loop).
    """
    owned = context is None
    ctx = context or build_context(
        q,
        k,
        v,
        mask=mask,
        layout=layout,
        buffer=buffer,
        order=order,
        group=group,
        kernel=kernel,
        scale=scale,
        timeout_s=timeout_s,
        recorder=recorder,
        docs=docs,
    )
    ctx.owns_comm = owned
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _RingAttention.apply(q, k, v, ctx, return_lse)
    else:
        try:
            with torch.no_grad():
                out, lse = _forward(q, k, v, ctx)[:2]
        finally:
            if owned:
                close_context(ctx)
    return (out, lse) if return_lse else out


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask="causal", scale=None,
                        docs: str = "none"):  # fmt: skip
    """Single-device attention over the whole sequence in float64 (the exactness oracle; autograd-capable).

    q, k, v: (B, H, S, D), token i at position i. ``mask``: a mode name (with ``docs`` for document masks) or a
    MaskRule. Delegates to ``ringbench.engine.reference.attention``, the project's one float64 attention
    implementation (the same math the run's streaming check uses).
    """
    rule = mask_rule(mask, docs, q.shape[-2])
    return attention(q, k, v, rule=rule, scale=scale)
