"""Public API: ``attention`` for every strategy and its ring alias ``ring_attention`` (both autograd-capable),
usable inside any torch.distributed program; ``build_context``, the one builder of a rank's context.

    from ringbench import AttentionSpec, Runtime, attention, ring_attention, shard, unshard
    q_l = shard(q, layout="zigzag", world=N, rank=r)                 # (B, H, S, D) -> (B, H, S/N, D)
    out_l = attention(q_l, k_l, v_l, spec=AttentionSpec(mask="causal", layout="zigzag", strategy="hybrid:2"),
                      runtime=Runtime(group=None))
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

from ringbench.engine import reference
from ringbench.engine.comm import RingComm
from ringbench.engine.layout import as_layout, check_divisible, resolve_layout
from ringbench.engine.masks import mask_rule
from ringbench.engine.pgroups import channel, resolve_policy, ring_partition
from ringbench.engine.recorder import NullRecorder
from ringbench.engine.ring import RingContext, ring_backward, ring_forward
from ringbench.engine.spec import AttentionSpec, Runtime, check_tensors, group_world_rank, split_options
from ringbench.engine.strategy import delay_collectives, grouped_attention, grouped_context
from ringbench.engine.timeline import timeline_for
from ringbench.kernels import get_kernel
from ringbench.orders import parse_order, validate_ring
from ringbench.vocab import Buffer

RING_KEYWORDS = ("mask", "layout", "buffer", "order", "group", "kernel", "scale", "timeout_s", "recorder", "docs")


def build_context(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec | None = None,
                  runtime: Runtime | None = None):  # fmt: skip
    """Validate everything once and build this rank's context for ``spec`` (ringbench/engine/spec.py) on
    ``runtime``: a RingContext (and its communicators) for ``ring`` and ``allgather``, a StrategyContext for the
    grouped strategies (ringbench/engine/strategy.py). Emulated links carry the all-gather baseline's collectives
    too."""
    spec = spec if spec is not None else AttentionSpec()
    runtime = runtime if runtime is not None else Runtime()
    check_tensors(q, k, v)
    if spec.grouped:
        return grouped_context(q, k, v, spec, runtime)
    ctx = _ring_context(q, spec, runtime)
    if ctx.buffer is Buffer.ALLGATHER and ctx.comm is not None and runtime.link_delay is not None:
        delay_collectives(ctx, runtime.link_delay, k)
    return ctx


def _ring_context(q: torch.Tensor, spec: AttentionSpec, runtime: Runtime) -> RingContext:
    """The ring's context (``ring``, ``allgather``): its plan, kernel and communicators -- the K/V rotation and the
    backward's dK/dV, each on a process group of its own unless ``spec.groups`` says shared
    (ringbench/engine/pgroups.py)."""
    layout, buffer = as_layout(spec.layout), Buffer.parse(spec.buffer, "buffer")
    group = runtime.group
    world, rank = group_world_rank(group)
    order = spec.order
    ring = parse_order(order, world) if isinstance(order, str) else validate_ring(list(order), world)
    seq = q.shape[-2] * world
    check_divisible(layout, seq, world)
    rule = mask_rule(spec.mask, spec.docs, seq)
    layout = resolve_layout(layout, seq, world, rule)  # doc-balanced: refuses a mask without documents
    block_kernel = get_kernel(spec.kernel)
    block_kernel.check(q.shape[-1], q.dtype, q.device)
    scale = 1.0 / math.sqrt(q.shape[-1]) if spec.scale is None else spec.scale
    recorder = runtime.recorder if runtime.recorder is not None else NullRecorder()
    timeline = runtime.timeline if runtime.timeline is not None else timeline_for(q.device)
    loopback = bool(runtime.loopback) and world == 1
    comm = back_comm = dkv_comm = None
    if world > 1 or loopback:
        policy = resolve_policy(spec.groups, group, world)
        options = dict(timeout_s=runtime.timeout_s, watch=recorder.enabled, link_delay=runtime.link_delay,
                       timeline=timeline, on_stall=runtime.on_stall)  # fmt: skip

        def on(role: str):
            return channel(group, role, ring_partition(world), rank, timeout_s=runtime.timeout_s, policy=policy)

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
        timeout_s=runtime.timeout_s,
        recorder=recorder,
        timeline=timeline,
        comm=comm,
        loopback=loopback,
        layer=int(spec.layer),
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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec | None = None,
              runtime: Runtime | None = None, *, context=None):  # fmt: skip
    """Exact attention of this rank's queries against the whole sequence, by any strategy: ring, allgather,
    ulysses, hybrid:U or double-ring:W (``spec``; ringbench/engine/spec.py), over ``runtime``'s process group.

    q, k, v: (B, H, S/N, D), this rank's tokens under ``spec.layout`` (see ringbench.shard); the output rows of
    those tokens, (B, H, S/N, D) in q's dtype, autograd-capable. A strategy changes who computes what and which
    links carry it, never the result. ``context`` reuses one built by ``build_context`` (benchmarks do this so that
    validation and planning stay out of the timed loop); without it the call builds one and closes it when done.
    """
    owned = context is None
    if owned:
        context = build_context(q, k, v, spec, runtime)
    if isinstance(context, RingContext):
        return _ring_call(q, k, v, context, owned=owned, return_lse=False)
    return grouped_attention(q, k, v, context, owned=owned)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: bool = False,
                   context: RingContext | None = None, **options):  # fmt: skip
    """The ring (or the all-gather baseline): ``attention`` with the keywords of ringbench's first API -- mask,
    layout, buffer, order, group, kernel, scale, timeout_s, recorder, docs.

    Returns the output rows (B, H, S/N, D) in q's dtype; with ``return_lse`` also the log-sum-exp (B, H, S/N) in
    fp32 (fp64 for fp64 inputs). ``context`` reuses a ring context built by ``build_context``.
    """
    unknown = sorted(set(options) - set(RING_KEYWORDS))
    if unknown:
        raise TypeError(f"ring_attention() got an unexpected keyword argument {unknown[0]!r}")
    owned = context is None
    if owned:
        context = build_context(q, k, v, *split_options("ring_attention", options))
    return _ring_call(q, k, v, context, owned=owned, return_lse=return_lse)


def _ring_call(q, k, v, ctx: RingContext, *, owned: bool, return_lse: bool):
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
    return reference.attention(q, k, v, rule=rule, scale=scale)
