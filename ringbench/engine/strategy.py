"""The grouped strategies (ulysses, hybrid:U, double-ring:W): their context and their autograd call, behind
ringbench.engine.api's one builder and one call for every strategy.

    spec = AttentionSpec(strategy="hybrid:2", placement="heads-first", mask="causal", layout="zigzag")
    ctx = build_context(q_l, k_l, v_l, spec)             # ringbench.engine.api: this module's grouped_context
    out_l = attention(q_l, k_l, v_l, context=ctx)        # autograd-capable; shards in and out as the ring's

Shards are the same for every strategy (``ringbench.shard`` under the layout), and so are the outputs and the
gradients: a strategy changes who computes what and which links carry it, never the result. ``ring`` and
``allgather`` are today's engine (ringbench/engine/api.py, ring.py); the others live in their own modules
(ulysses.py: Ulysses and the hybrid; double_ring.py) and are made of the engine's pieces: the mask plan (through
groups.block_plan), the ring loops over sub-rings (subring.py), the kernels, the merge, the one communication class
(comm.RingComm, and alltoall.PeerComm for the all-to-alls), the timeline and the recorder.

Bad input raises UsageError (one line): degrees that do not divide the world or the heads, a placement that is not
a permutation, an unknown strategy, a buffer the strategy does not take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ringbench.engine.alltoall import PeerComm
from ringbench.engine.comm import RingComm
from ringbench.engine.groups import Groups
from ringbench.engine.layout import as_layout, check_divisible, resolve_layout
from ringbench.engine.masks import MaskRule, mask_rule
from ringbench.engine.pgroups import channel, resolve_policy
from ringbench.engine.recorder import LayerRecorder, NullRecorder
from ringbench.engine.ring import RingContext
from ringbench.engine.spec import AttentionSpec, Runtime, group_world_rank
from ringbench.engine.subring import GroupRingContext, StepRecorder
from ringbench.engine.timeline import timeline_for
from ringbench.errors import UsageError
from ringbench.kernels import get_kernel
from ringbench.orders import parse_placement
from ringbench.vocab import Buffer, Layout, Strategy


def bind_flows(link_delay, flows, collective: bool = False):
    """The link delay of one exchange: NIC sharing priced from the exchange's transfers on every rank
    (``collective``: an NCCL ring collective's, whose crossing hops draw on all their hosts' NICs)."""
    if link_delay is None or not getattr(link_delay, "accepts_flows", False):
        return link_delay

    def delay(src: int, dst: int, nbytes: int) -> float:
        if collective:
            return link_delay(src, dst, nbytes, flows=flows, collective=True)
        return link_delay(src, dst, nbytes, flows=flows)

    delay.clock = getattr(link_delay, "clock", None)  # the rank's hops take turns across exchanges (comm.py)
    return delay


def delay_collectives(ctx: RingContext, link_delay, k: torch.Tensor) -> None:
    """Emulated links carry the all-gather baseline's traffic too: each collective is held, after it completed
    over the local transport, for the time the ring algorithm takes over the emulated links -- an all-gather
    N - 1 rounds of one block over the ring's slowest hop, an all-reduce of N blocks 2 (N - 1) rounds of one
    accumulator (the simulator's all-gather model, ringbench/simulate/ring_timeline.py, prices the same)."""
    from ringbench.kernels.base import stats_dtype

    ring, world = ctx.ring, ctx.world
    flows = tuple((ring[p - 1], ring[p]) for p in range(world))
    delay = bind_flows(link_delay, flows, collective=True)
    block = 2 * k.numel() * k.element_size()  # (2, B, H, L, D): one rank's K and V
    acc = 2 * k.numel() * torch.empty((), dtype=stats_dtype(k.dtype)).element_size()

    def slowest(nbytes: int) -> float:
        return max(float(delay(ring[p - 1], ring[p], nbytes)) for p in range(world))

    held = {"all_gather": (world - 1) * slowest(block), "all_reduce": 2 * (world - 1) * slowest(acc)}
    comm, collective = ctx.comm, ctx.comm.collective

    def delayed(what, launch, *, phase):
        start, end = collective(what, launch, phase=phase)
        if held.get(what, 0.0) > 0:
            timeline = comm.timeline
            with timeline.on_comm(comm.lane):
                timeline.spin(comm.lane, held[what])
                end = timeline.mark(comm.lane)
            timeline.compute_after(end)
        return start, end

    comm.collective = delayed


class CommSet:
    """The communicators of one strategy context, closed and settled together."""

    def __init__(self, comms: list) -> None:
        self.comms = [c for c in comms if c is not None]

    def close(self) -> None:
        for comm in self.comms:
            comm.close()

    def settle(self, timeout_s: float | None = None) -> None:
        for comm in self.comms:
            comm.settle(timeout_s)


@dataclass(kw_only=True, slots=True)
class StrategyContext:
    """What one rank needs to run a grouped strategy (ulysses, hybrid:U, double-ring:W)."""

    strategy: Strategy
    mask: MaskRule
    layout: Layout
    buffer: Buffer
    groups: Groups
    rank: int
    seq: int
    heads: int
    kernel: object
    kv_heads: int = 0
    """K/V heads (grouped-query attention: query head h reads KV head h // (heads / kv_heads)); 0: as many."""
    scale: float
    group: object = None
    timeout_s: float = 60.0
    recorder: object = NullRecorder()
    timeline: object = None
    peer: PeerComm | None = None  # the all-to-alls of the Ulysses group
    cross_comm: RingComm | None = None  # hybrid: the ring across groups; double ring: the outer ring
    inner_comm: RingComm | None = None  # double ring: the inner ring
    cross_dkv_comm: RingComm | None = None  # the backward's dK/dV on those rings, each on a group of its own
    inner_dkv_comm: RingComm | None = None
    owns_comm: bool = False
    _ring: GroupRingContext | None = field(default=None, repr=False)
    _inner: GroupRingContext | None = field(default=None, repr=False)

    @property
    def world(self) -> int:
        return self.groups.world

    @property
    def local(self) -> int:
        return self.seq // self.world

    @property
    def members(self) -> tuple[int, ...]:
        return self.groups.group_of(self.rank)

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.groups.size

    @property
    def kv_repeats(self) -> int:
        """Ranks of a Ulysses group that receive each KV head: 1 when the degree divides the KV heads, else
        degree / kv_heads (every member's query heads then read one KV head, which goes to that many members)."""
        return max(1, self.groups.size // (self.kv_heads or self.heads))

    def kv_span(self, index: int) -> tuple[int, int]:
        """[lo, hi): the KV heads the Ulysses group's member ``index`` reads (its query heads' KV heads)."""
        group = self.heads // (self.kv_heads or self.heads)  # query heads per KV head
        first, last = index * self.heads_per_rank, (index + 1) * self.heads_per_rank - 1
        return first // group, last // group + 1

    @property
    def comm(self) -> CommSet:
        return CommSet([self.peer, self.cross_comm, self.inner_comm, self.cross_dkv_comm, self.inner_dkv_comm])

    # double ring views
    @property
    def outer_world(self) -> int:
        return self.groups.count

    @property
    def inner_world(self) -> int:
        return self.groups.size

    @property
    def outer_comm(self) -> RingComm | None:
        return self.cross_comm

    @property
    def outer_dkv_comm(self) -> RingComm | None:
        return self.cross_dkv_comm

    def exchange(self, parts: dict, *, phase: str, step: int, exchange: str) -> dict:
        """The all-to-all of this rank's Ulysses group (nothing moves in a group of one)."""
        if step == 0:
            self.recorder.on_step(phase, 0)
        if self.peer is None:
            return parts
        return self.peer.all_to_all(parts, phase=phase, step=step, exchange=exchange,
                                    flows=self.groups.alltoall_flows(), recorder=self.recorder)  # fmt: skip

    def _sub_ring(self, ring: list[int], comm, dkv_comm, q_members, members_of) -> GroupRingContext:
        return GroupRingContext(
            mask=self.mask, layout=self.layout, buffer=Buffer.SYNC if self.buffer is Buffer.SYNC else Buffer.DOUBLE,
            ring=ring, rank=self.rank, seq=self.seq, kernel=self.kernel, scale=self.scale, group=self.group,
            timeout_s=self.timeout_s, recorder=StepRecorder(self.recorder), timeline=self.timeline, comm=comm,
            dkv_comm=dkv_comm, world_all=self.world, q_members=q_members, members_of=members_of,
        )  # fmt: skip

    def ring_context(self) -> GroupRingContext:
        """Hybrid: the ring across groups; cross-ring rank of group g holds group g's block."""
        if self._ring is None:
            ring = self.groups.cross_ring(self.rank)
            members_of = {r: self.groups.group_of(r) for r in ring}
            self._ring = self._sub_ring(ring, self.cross_comm, self.cross_dkv_comm, self.members, members_of)
        self._ring.recorder = StepRecorder(self.recorder)
        return self._ring

    def inner_context(self, outer_step: int) -> GroupRingContext:
        """Double ring, rotation o: inner rank (g, j) holds the outer block of (g - o, j)."""
        groups = self.groups
        group, _ = groups.slot(self.rank)
        source = groups.members((group - outer_step) % groups.count)
        ring = groups.inner_ring(self.rank)
        members_of = {r: (source[j],) for j, r in enumerate(ring)}
        if self._inner is None:
            self._inner = self._sub_ring(ring, self.inner_comm, self.inner_dkv_comm, (self.rank,), members_of)
        self._inner.members_of = members_of
        self._inner.recorder = StepRecorder(self.recorder, outer_step * groups.size)
        return self._inner


def grouped_context(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec,
                    runtime: Runtime) -> StrategyContext:  # fmt: skip
    """The context of a grouped strategy (ulysses, hybrid:U, double-ring:W): the grouped branch of
    ringbench.engine.api.build_context, which has checked the tensors. Every mask the plan can express applies to
    every strategy (a Ulysses block is plain attention over the full sequence); every ring and all-to-all group
    exchanges on a process group of its own (``spec.groups``; ringbench/engine/pgroups.py)."""
    strategy = Strategy.parse(spec.strategy, "strategy")
    layout, buffer = as_layout(spec.layout), Buffer.parse(spec.buffer, "buffer")
    if buffer.short:
        raise UsageError(f"buffer={buffer.value!r} is not allowed with strategy={strategy.spec!r}; expected sync or "
                         "double (the short ring is the ring's: it stops where the window is covered)")  # fmt: skip
    if buffer is Buffer.ALLGATHER:
        raise UsageError(f"buffer='allgather' is not allowed with strategy={strategy.spec!r}; expected sync or double "
                         "(allgather is a strategy of its own)")  # fmt: skip
    group = runtime.group
    world, rank = group_world_rank(group)
    strategy.check(world, q.shape[1], kv_heads=k.shape[1])
    size = strategy.group_size(world)
    placement = spec.placement
    ranks = parse_placement(placement, world, size) if isinstance(placement, str) else list(placement)
    from ringbench.orders import validate_ring

    policy = resolve_policy(spec.groups, group, world)
    placed = Groups(tuple(validate_ring(ranks, world, "placement")), size)
    seq = q.shape[-2] * world
    check_divisible(layout, seq, world)
    mask = mask_rule(spec.mask, spec.docs, seq)
    layout = resolve_layout(layout, seq, world, mask)
    block_kernel = get_kernel(spec.kernel)
    block_kernel.check(q.shape[-1], q.dtype, q.device)
    scale = 1.0 / math.sqrt(q.shape[-1]) if spec.scale is None else float(spec.scale)
    recorder = runtime.recorder if runtime.recorder is not None else NullRecorder()
    if spec.layer:
        recorder = LayerRecorder(recorder, spec.layer)
    timeline = runtime.timeline if runtime.timeline is not None else timeline_for(q.device)
    comms = _strategy_comms(strategy, placed, rank, group, policy, runtime, watch=recorder.enabled, timeline=timeline)
    return StrategyContext(strategy=strategy, mask=mask, layout=layout, buffer=buffer, groups=placed, rank=rank,
                           seq=seq, heads=q.shape[1], kv_heads=k.shape[1], kernel=block_kernel, scale=scale, group=group,
                           timeout_s=runtime.timeout_s, recorder=recorder, timeline=timeline, **comms)  # fmt: skip


def _strategy_comms(strategy: Strategy, groups: Groups, rank: int, group, policy: str, runtime: Runtime,
                    **options) -> dict:  # fmt: skip
    """The communicators of a grouped strategy, each on a process group of its own (ringbench/engine/pgroups.py),
    made in the same order on every rank: the all-to-all group, then each ring's K/V and dK/dV."""
    timeout_s, link_delay = runtime.timeout_s, runtime.link_delay
    options["on_stall"] = runtime.on_stall

    def on(role: str, partition):
        return channel(group, role, partition, rank, timeout_s=timeout_s, policy=policy)

    def ring_comm(ring: list[int], role: str, partition, flows) -> RingComm:
        return RingComm(ring, rank, group, link_delay=bind_flows(link_delay, flows), channel=on(role, partition),
                        timeout_s=timeout_s, **options)  # fmt: skip

    comms: dict = {}
    inner = groups.all_groups()
    cross = groups.cross_rings()
    if strategy.kind in ("ulysses", "hybrid") and groups.size > 1:
        comms["peer"] = PeerComm(rank, group, link_delay=link_delay, channel=on("a2a", inner), timeout_s=timeout_s,
                                 **options)  # fmt: skip
    if strategy.kind == "double-ring" and groups.size > 1:
        for key, role in (("inner_comm", "inner-kv"), ("inner_dkv_comm", "inner-dkv")):
            comms[key] = ring_comm(groups.inner_ring(rank), role, inner, groups.inner_flows())
    if groups.count > 1:
        prefix = "outer" if strategy.kind == "double-ring" else "cross"
        for key, role in (("cross_comm", f"{prefix}-kv"), ("cross_dkv_comm", f"{prefix}-dkv")):
            comms[key] = ring_comm(groups.cross_ring(rank), role, cross, groups.cross_flows())
    return comms


class _StrategyAttention(torch.autograd.Function):
    @staticmethod
    def forward(autograd_ctx, q, k, v, sctx: StrategyContext):
        if sctx.strategy.kind == "double-ring":
            from ringbench.engine.double_ring import double_ring_forward

            out, lse = double_ring_forward(q, k, v, sctx)
            autograd_ctx.save_for_backward(q, k, v, out, lse)
        else:
            from ringbench.engine.ulysses import hybrid_forward

            out, saved = hybrid_forward(q, k, v, sctx)
            autograd_ctx.save_for_backward(*saved)
        autograd_ctx.sctx = sctx
        return out

    @staticmethod
    def backward(autograd_ctx, dout):
        sctx = autograd_ctx.sctx
        saved = autograd_ctx.saved_tensors
        try:
            if sctx.strategy.kind == "double-ring":
                from ringbench.engine.double_ring import double_ring_backward

                q, k, v, out, lse = saved
                dq, dk, dv = double_ring_backward(dout.contiguous(), q, k, v, out, lse, sctx)
            else:
                from ringbench.engine.ulysses import hybrid_backward

                dq, dk, dv = hybrid_backward(dout.contiguous(), saved, sctx)
        finally:
            if sctx.owns_comm:
                sctx.comm.close()
        return dq, dk, dv, None


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: StrategyContext, *,
                      owned: bool):  # fmt: skip
    """A grouped strategy's attention of this rank's query shard (ringbench.engine.api.attention calls it);
    ``owned``: the context was built for this call, its communicators close when it is done."""
    context.owns_comm = owned
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _StrategyAttention.apply(q, k, v, context)
    try:
        with torch.no_grad():
            if context.strategy.kind == "double-ring":
                from ringbench.engine.double_ring import double_ring_forward

                return double_ring_forward(q, k, v, context)[0]
            from ringbench.engine.ulysses import hybrid_forward

            return hybrid_forward(q, k, v, context)[0]
    finally:
        if owned:
            context.comm.close()


__all__ = ["CommSet", "StrategyContext", "bind_flows", "delay_collectives", "grouped_attention", "grouped_context"]
