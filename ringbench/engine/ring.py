"""The ring loops: forward and backward for the ``sync`` and ``double`` strategies, and the all-gather baseline.
(The short ring, ``sync-short`` / ``double-short``, is ringbench/engine/short_ring.py; api.py chooses between them.)

Forward, read as a sentence: post the exchange that brings the next block (double), compute on the block in hand
and merge it into the (out, lse) accumulator, wait for the exchange, swap. ``sync`` instead exchanges first and
then computes. At step s the block in hand belongs to the rank s positions back around the ring.

Backward rotates K, V again together with a dK, dV accumulator that travels with its block. Because gradients
add, each rank computes its contribution into a fresh buffer while the block's accumulator is still in flight,
then adds the two and sends the sum on; after the N-th hop every accumulator is home, fully summed.

Recorded spans (when the recorder is enabled): ``compute`` per step with a KV block, ``send`` / ``recv`` from the
post to the completion of each exchange, ``wait`` for the time the rank sat blocked. The exchange posted in step
s carries the block used at step s+1 (double) or at step s (sync, posted at the start of the step); in the
backward, the dK/dV exchange of step s is posted after step s's compute and waited for in step s+1.

Times are marks of the context's timeline (ringbench/engine/timeline.py): host nanoseconds on CPU, events on the streams
that run the work on a GPU. Nothing here reads a clock or synchronises a device; the recorder resolves the marks
after the iteration. Buffers are allocated once per call and rotated (two K/V buffers; three dK/dV buffers in the
backward: the one being filled by this step's compute and the two that travel), never once per hop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringbench.engine.comm import RingComm, Transfer
from ringbench.engine.masks import MaskRule
from ringbench.engine.merge import merge_into
from ringbench.engine.plan import PairPlan, pair_plan
from ringbench.engine.recorder import NullRecorder
from ringbench.engine.timeline import HostTimeline
from ringbench.kernels.base import BlockKernel, block_flops, stats_dtype
from ringbench.vocab import Buffer, Layout


@dataclass(kw_only=True, slots=True)
class RingContext:
    """What one rank needs to run the ring; built and validated by ringbench.engine.api."""

    mask: MaskRule
    layout: Layout
    buffer: Buffer
    ring: list[int]  # group ranks in ring order
    rank: int  # this process's group rank
    seq: int
    kernel: BlockKernel
    scale: float
    group: object = None
    timeout_s: float = 60.0
    recorder: object = NullRecorder()
    timeline: object = HostTimeline()
    comm: RingComm | None = None
    owns_comm: bool = False  # built for one call: close its watcher threads when the call is done
    loopback: bool = False  # a 1-rank ring still exchanges with itself (the one-device test of the transfer path)
    layer: int = 0  # the attention layer this context runs (recorded with every span)
    back_comm: RingComm | None = None  # the short ring: dK/dV go home to the predecessor (the reversed ring)
    dkv_comm: RingComm | None = None  # the backward's dK/dV, on a group of its own (None: the K/V's)
    plans: dict = None  # owner rank -> PairPlan, filled on first use (the plan is fixed for the whole run)

    @property
    def world(self) -> int:
        return len(self.ring)

    @property
    def position(self) -> int:
        return self.ring.index(self.rank)

    @property
    def hops(self) -> int:
        """Exchanges per rotation: N - 1 (the block in hand at step 0 is the rank's own); 1 for a loopback."""
        return 1 if self.loopback and self.world == 1 else self.world - 1

    def owner_at(self, step: int) -> int:
        """Rank whose KV block this rank holds at ring step ``step``."""
        return self.ring[(self.position - step) % self.world]

    def plan(self, owner: int) -> PairPlan:
        if self.plans is None:
            self.plans = {}
        plan = self.plans.get(owner)
        if plan is None:
            plan = self.plans[owner] = pair_plan(self.mask, self.layout, self.seq, self.world, self.rank, owner)
        return plan

    def prev(self) -> int:
        return self.ring[(self.position - 1) % self.world]

    def comms(self) -> list[RingComm]:
        """Every communicator of the context (settled and closed together)."""
        return [c for c in (self.comm, self.dkv_comm, self.back_comm) if c is not None]

    @property
    def dkv(self) -> RingComm | None:
        """Where the backward's dK/dV travel: a group of their own, beside the K/V rotation in flight."""
        return self.dkv_comm if self.dkv_comm is not None else self.comm

    def next(self) -> int:
        return self.ring[(self.position + 1) % self.world]


class _Rotation:
    """Two buffers for a travelling block: the one in hand and the one the next block is received into.

    A ring without hops (one rank, no loopback: every Ulysses rank) keeps its own (k, v) as they are: no stacked
    copy and no receive buffer, which would cost time in the timed iteration and memory the record would count."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, hops: int) -> None:
        self.in_hand = torch.stack([k, v]) if hops else (k, v)  # (2, B, H, L, D): one message per hop
        self.spare = None

    def post(self, ctx: RingContext, phase: str, step: int) -> Transfer:
        if self.spare is None:
            self.spare = torch.empty_like(self.in_hand)
        return ctx.comm.post(self.in_hand, into=self.spare, phase=phase, step=step)

    def arrived(self, ctx: RingContext, transfer: Transfer, blocking: bool = False) -> torch.Tensor:
        received = _wait(ctx, transfer, blocking)
        self.in_hand, self.spare = received, self.in_hand
        return received


def _plan_flops(plan: PairPlan, q: torch.Tensor, backward: bool) -> float:
    """Useful FLOPs of a pair: its visible score entries (exact for document and window masks) at the kernels'
    block_flops rate."""
    batch, heads, _, head_dim = q.shape
    return block_flops(batch, heads, 1, 1, head_dim, 1.0, backward) * plan.visible_pairs()


def _record_compute(ctx: RingContext, phase: str, step: int, owner: int, plan: PairPlan, q, start) -> None:
    rec = ctx.recorder
    if rec.enabled:
        flops = _plan_flops(plan, q, backward=phase == "bwd")
        rec.span(phase=phase, step=step, kind="compute", start=start, end=ctx.timeline.mark(), src=owner,
                 dst=ctx.rank, block=owner, pair=plan.kind, flops=flops, layer=ctx.layer)  # fmt: skip


def _record_transfer(ctx: RingContext, transfer: Transfer, wait_start, wait_end, comm: RingComm | None = None) -> None:
    """The send / recv rows of an exchange (only the directions it had), and the wait row when it received.
    ``comm``: the communicator that posted it (default: the ring's; the short ring's dK/dV go the other way)."""
    rec = ctx.recorder
    if not rec.enabled:
        return
    comm = comm if comm is not None else ctx.comm
    successor, predecessor = (comm.next, comm.prev) if comm is not None else (ctx.next(), ctx.prev())
    phase, step = transfer.phase, transfer.step
    for kind, end, src, dst in (
        ("send", transfer.send_done, ctx.rank, successor),
        ("recv", transfer.recv_done, predecessor, ctx.rank),
    ):
        if kind in transfer.directions:
            rec.span(phase=phase, step=step, kind=kind, start=transfer.start, end=end, src=src, dst=dst,
                     nbytes=transfer.nbytes, nccl=transfer.nccl_ms, layer=ctx.layer, group=_label(comm))  # fmt: skip
    if "recv" in transfer.directions:
        rec.span(phase=phase, step=step, kind="wait", start=wait_start, end=wait_end, src=predecessor, dst=ctx.rank,
                 layer=ctx.layer, group=_label(comm))  # fmt: skip


def _label(comm: RingComm | None) -> str:
    return comm.label if comm is not None else ""


def _wait(ctx: RingContext, transfer: Transfer, blocking: bool = False, comm: RingComm | None = None) -> torch.Tensor:
    """Wait for an exchange. ``blocking``: posted and waited for at once (sync), so the rank was blocked from
    the post on, including the time spent inside the post itself."""
    comm = comm if comm is not None else ctx.comm
    start = transfer.start if blocking else (ctx.timeline.mark() if ctx.recorder.enabled else None)
    buffer = comm.wait(transfer)
    if ctx.recorder.enabled:
        _record_transfer(ctx, transfer, start, ctx.timeline.mark(), comm)
    return buffer


def _compute_forward(ctx, q, kv, owner, step, acc_out, acc_lse) -> None:
    plan = ctx.plan(owner)
    if plan.skip:
        return
    start = ctx.timeline.mark() if ctx.recorder.enabled else None
    for block in plan.blocks:
        q_rows = q[:, :, block.q_lo : block.q_hi]  # (B, H, Lq', D)
        k_rows = kv[0][:, :, block.k_lo : block.k_hi]  # (B, H, Lk', D)
        v_rows = kv[1][:, :, block.k_lo : block.k_hi]
        out, lse = ctx.kernel.forward(q_rows, k_rows, v_rows, block.mask, ctx.scale)
        merge_into(acc_out[:, :, block.q_lo : block.q_hi], acc_lse[:, :, block.q_lo : block.q_hi], out, lse)
    _record_compute(ctx, "fwd", step, owner, plan, q, start)


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: RingContext, keep_acc: bool = False):
    """(B, H, L, D) local shards -> (out (B, H, L, D) in q's dtype, lse (B, H, L) in the statistics dtype).
    ``keep_acc``: out stays in the statistics dtype (a strategy that merges this ring's result again, as the double
    ring does after each rotation, rounds once at its end, as the ring does)."""
    if ctx.buffer is Buffer.ALLGATHER:
        return allgather_forward(q, k, v, ctx)
    acc = stats_dtype(q.dtype)
    acc_out = torch.zeros(q.shape, dtype=acc, device=q.device)  # the merge's identity: (out=0, lse=-inf)
    acc_lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    world, hops = ctx.world, ctx.hops
    kv = _Rotation(k, v, hops)
    sync = ctx.buffer.sync
    for step in range(world):
        ctx.recorder.on_step("fwd", step)
        pending = None
        if sync and step >= world - hops:  # the exchange that brings this step's block, then compute
            kv.arrived(ctx, kv.post(ctx, "fwd", step), blocking=True)
        if not sync and step < hops:  # double: the next block travels while this one is computed
            pending = kv.post(ctx, "fwd", step)
        _compute_forward(ctx, q, kv.in_hand, ctx.owner_at(step), step, acc_out, acc_lse)
        if pending is not None:
            kv.arrived(ctx, pending)
    ctx.recorder.end_phase("fwd")
    return (acc_out if keep_acc else acc_out.to(q.dtype)), acc_lse


def _compute_backward(ctx, saved, kv, owner, step, dq, dkv) -> None:
    """One step's backward for the block of ``owner``: ``saved`` is (dout, q, out, lse) of this rank's queries, ``kv``
    the block's (K, V); adds into ``dq`` and the travelling ``dkv`` (2, B, KV, L, D)."""
    dout, q, out, lse = saved
    plan = ctx.plan(owner)
    if plan.skip:
        return
    start = ctx.timeline.mark() if ctx.recorder.enabled else None
    for block in plan.blocks:
        rows = slice(block.q_lo, block.q_hi)
        cols = slice(block.k_lo, block.k_hi)
        dq_b, dk_b, dv_b = ctx.kernel.backward(
            dout[:, :, rows],
            q[:, :, rows],
            kv[0][:, :, cols],
            kv[1][:, :, cols],
            out[:, :, rows],
            lse[:, :, rows],
            block.mask,
            ctx.scale,
        )
        dq[:, :, rows] += dq_b
        dkv[0, :, :, cols] += dk_b
        dkv[1, :, :, cols] += dv_b
    _record_compute(ctx, "bwd", step, owner, plan, q, start)


def ring_backward(dout, q, k, v, out, lse, ctx: RingContext, keep_acc: bool = False):
    """Gradients of the local shards: (dq, dk, dv), each (B, H, L, D) in the input dtype (``keep_acc``: in the
    statistics dtype, for a strategy that sums them again)."""
    if ctx.buffer is Buffer.ALLGATHER:
        return allgather_backward(dout, q, k, v, out, lse, ctx)
    acc = stats_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    world, hops = ctx.world, ctx.hops
    kv = _Rotation(k, v, hops)
    sync = ctx.buffer.sync
    # dK/dV buffers, (2, B, H, L, D) each: ``contribution`` takes this step's compute; ``travelling`` holds the
    # accumulator being sent and the one being received. Step 0's contribution is sent as it is (nothing came
    # before it), after which a fresh buffer takes the contributions.
    contribution = torch.zeros((2, *k.shape), dtype=acc, device=q.device)
    travelling = [torch.empty_like(contribution), torch.empty_like(contribution)] if hops else [None]
    incoming = None  # the upstream accumulator of the block in hand (None: nothing yet, i.e. zero)
    dkv_pending: Transfer | None = None
    for step in range(world):
        ctx.recorder.on_step("bwd", step)
        kv_pending = None
        if sync and step >= world - hops:
            kv.arrived(ctx, kv.post(ctx, "bwd", step), blocking=True)
        if not sync and step < hops:
            kv_pending = kv.post(ctx, "bwd", step)
        if step > 0:
            contribution.zero_()
        _compute_backward(ctx, (dout, q, out, lse), kv.in_hand, ctx.owner_at(step), step, dq, contribution)
        if dkv_pending is not None:  # double: the accumulator travelled while we computed
            incoming, dkv_pending = _wait(ctx, dkv_pending, comm=ctx.dkv), None
        if incoming is None:  # step 0: this rank's contribution is the whole accumulator so far
            incoming, contribution = contribution, travelling.pop()
        else:
            incoming.add_(contribution)
        if hops:  # pass the sum on; receive the accumulator of the next block (after the last hop: our own)
            into = travelling[0] if travelling[0] is not incoming else travelling[1]
            dkv_pending = ctx.dkv.post(incoming, into=into, phase="bwd", step=step)
            travelling = [incoming, into]
            incoming = None
            if sync:
                incoming, dkv_pending = _wait(ctx, dkv_pending, blocking=True, comm=ctx.dkv), None
        if kv_pending is not None:
            kv.arrived(ctx, kv_pending)
    if dkv_pending is not None:
        incoming = _wait(ctx, dkv_pending, comm=ctx.dkv)
    ctx.recorder.end_phase("bwd")
    dkv = incoming  # (2, B, H, L, D), fully summed
    if keep_acc:
        return dq, dkv[0], dkv[1]
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


# -- the all-gather baseline: exact, but every rank holds all S keys and values ------------------------------------
def _all_gather(ctx: RingContext, tensor: torch.Tensor, phase: str) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(ctx.world)]
    tensor = tensor.contiguous()
    if ctx.comm is not None:
        start, end = ctx.comm.collective(
            "all_gather", lambda: dist.all_gather(parts, tensor, group=ctx.comm.pg, async_op=True), phase=phase
        )
    else:
        start = ctx.timeline.mark()
        parts[0].copy_(tensor)
        end = ctx.timeline.mark()
    nbytes = tensor.numel() * tensor.element_size() * (ctx.world - 1)
    ctx.recorder.span(phase=phase, step=0, kind="collective", start=start, end=end, dst=ctx.rank, nbytes=nbytes,
                      layer=ctx.layer, group=_label(ctx.comm))  # fmt: skip
    return parts


def allgather_forward(q, k, v, ctx: RingContext):
    acc = stats_dtype(q.dtype)
    acc_out = torch.zeros(q.shape, dtype=acc, device=q.device)
    acc_lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    ctx.recorder.on_step("fwd", 0)
    blocks = _all_gather(ctx, torch.stack([k, v]), "fwd")  # N x (2, B, H, L, D): O(S) memory
    for step in range(ctx.world):
        owner = ctx.owner_at(step)
        _compute_forward(ctx, q, blocks[owner], owner, step, acc_out, acc_lse)
    ctx.recorder.end_phase("fwd")
    return acc_out.to(q.dtype), acc_lse


def allgather_backward(dout, q, k, v, out, lse, ctx: RingContext):
    acc = stats_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    ctx.recorder.on_step("bwd", 0)
    blocks = _all_gather(ctx, torch.stack([k, v]), "bwd")
    dkv_all = torch.zeros((ctx.world, 2, *k.shape), dtype=acc, device=q.device)  # every block's dK, dV
    for step in range(ctx.world):
        owner = ctx.owner_at(step)
        _compute_backward(ctx, (dout, q, out, lse), blocks[owner], owner, step, dq, dkv_all[owner])
    if ctx.comm is not None:
        start, end = ctx.comm.collective(
            "all_reduce", lambda: dist.all_reduce(dkv_all, group=ctx.comm.pg, async_op=True), phase="bwd"
        )
        ctx.recorder.span(phase="bwd", step=ctx.world - 1, kind="collective", start=start, end=end, dst=ctx.rank,
                          nbytes=dkv_all.numel() * dkv_all.element_size(), layer=ctx.layer,
                          group=_label(ctx.comm))  # fmt: skip
    ctx.recorder.end_phase("bwd")
    mine = dkv_all[ctx.rank]
    return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype)
