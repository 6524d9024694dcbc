"""The short ring (``sync-short`` / ``double-short``; the window-aware ring): a block travels only as far as some
rank's queries can see it, and the ring stops after the last step any rank needs.

Route. For the block owned by ring position b, its travel t_b is the largest ring distance d (0 <= d < N) such that
the rank at position b + d sees some key of it (ringbench.engine.plan.pair_visibility). The forward runs steps
0..D with D = max_b t_b; the exchange that brings step s's block moves block b from b + s - 1 to b + s only when
t_b >= s, so at step s position p receives iff t_{p-s} >= s and sends iff t_{p-s+1} >= s (one-way exchanges where
only one holds). With a causal window of W tokens on a contiguous layout every rank needs the ceil((W - 1) / (S/N))
blocks before its own, so D = ceil((W - 1) / (S/N)), not N - 1, and no block crosses the ring's wrap (position N-1
to 0) needlessly. A rank keeps the blocks its queries saw (at most D; O(W) memory for a window) for the backward.

Backward: the dK/dV accumulators go home along the same short path, in lock step. At step s (0..D) position p
handles the block at distance d = D - s behind it, b = p - d: it computes its contribution from the kept K/V,
adds the accumulator its successor sent (the contributions of positions b + d + 1 .. b + t_b) and sends the sum
to its predecessor, which handles b at step s + 1. The farthest position starts an accumulator, relays pass it on,
and at step D each rank adds its own block's contribution: fully summed, home. The backward moves no K/V at all
(the kept blocks are used) and only the dK/dV bytes the forward's K/V bytes travelled; the exchange goes to the
predecessor (a RingComm on the reversed ring). Recorded like the full ring (spans per step; the backward's
exchanges are dK/dV only, sent to the predecessor).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ringbench.engine.plan import pair_visibility
from ringbench.engine.ring import RingContext, _compute_backward, _compute_forward, _wait
from ringbench.kernels.base import stats_dtype


@dataclass(frozen=True, slots=True)
class ShortRoute:
    """How far each block travels on one ring (indexed by the ring position of its owner)."""

    travel: tuple[int, ...]

    @property
    def world(self) -> int:
        return len(self.travel)

    @property
    def depth(self) -> int:
        """D: the last ring step any rank needs (the forward runs D + 1 steps)."""
        return max(self.travel) if self.travel else 0

    def _t(self, position: int) -> int:
        return self.travel[position % self.world]

    def receives(self, position: int, step: int) -> bool:
        """Forward: the exchange of step ``step`` brings position ``position`` a block."""
        return step >= 1 and self._t(position - step) >= step

    def sends(self, position: int, step: int) -> bool:
        """Forward: position ``position`` passes its block of step ``step - 1`` on in the exchange of ``step``."""
        return step >= 1 and self._t(position - step + 1) >= step

    def handles(self, position: int, step: int) -> bool:
        """Backward step ``step``: the block at distance D - step is on this position's path."""
        distance = self.depth - step
        return distance == 0 or self._t(position - distance) >= distance

    def back_sends(self, position: int, step: int) -> bool:
        """Backward: after step ``step`` the accumulator goes to the predecessor (it is not home yet)."""
        distance = self.depth - step
        return distance >= 1 and self._t(position - distance) >= distance

    def back_receives(self, position: int, step: int) -> bool:
        """Backward: after step ``step`` the successor sends the accumulator of this position's next block."""
        distance = self.depth - step
        return distance >= 1 and self._t(position - distance + 1) >= distance

    def blocks_moved(self) -> int:
        """Block hops of one forward (and of one backward's accumulators): sum of the travels."""
        return int(sum(self.travel))


def route_of(visibility: np.ndarray, ring: list[int]) -> ShortRoute:
    """The route on ``ring`` (ranks in ring order) from the (N, N) visible entries per (query, key) rank pair:
    each block's travel is the largest ring distance at which a rank still sees some of it."""
    ring = np.asarray(ring, dtype=np.int64)
    world = len(ring)
    seen = np.asarray(visibility)[np.ix_(ring, ring)] > 0  # [query position, key position]
    positions = np.arange(world, dtype=np.int32)
    travel = np.zeros(world, dtype=np.int64)
    step = max(1, (1 << 24) // max(1, world))  # key positions per pass: bounded memory
    for lo in range(0, world, step):
        keys = positions[lo : lo + step]
        distance = (positions[:, None] - keys[None, :]) % world  # (N, K) ring distance from owner to query
        travel[lo : lo + step] = np.where(seen[:, lo : lo + step], distance, 0).max(axis=0)
    return ShortRoute(travel=tuple(int(x) for x in travel))


@lru_cache(maxsize=256)
def short_route(rule, layout, seq: int, world: int, ring: tuple[int, ...]) -> ShortRoute:
    """The route of a ring: ``rule`` a MaskRule, ``ring`` the group ranks in ring order (cached)."""
    return route_of(pair_visibility(rule, layout, seq, world), list(ring))


def _route(ctx: RingContext) -> ShortRoute:
    return short_route(ctx.mask, ctx.layout, ctx.seq, ctx.world, tuple(ctx.ring))


def short_forward(q, k, v, ctx: RingContext):
    """(out, lse, kept): as ring_forward, plus the K/V blocks this rank's queries saw, by step (for the backward)."""
    acc = stats_dtype(q.dtype)
    acc_out = torch.zeros(q.shape, dtype=acc, device=q.device)  # the merge's identity: (out=0, lse=-inf)
    acc_lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    route = _route(ctx)
    position, depth = ctx.position, route.depth
    sync = ctx.buffer.sync
    in_hand = torch.stack([k, v])  # (2, B, H, L, D)
    in_hand_step = 0  # the step whose block is in hand (a step that brought nothing leaves it)
    spare = [torch.empty_like(in_hand)]  # relay buffers (blocks passed on but not kept)
    kept: dict[int, torch.Tensor] = {}

    def post(step: int):
        """The exchange that brings step ``step``'s block (None when this position neither sends nor receives)."""
        sending, receiving = route.sends(position, step), route.receives(position, step)
        if not (sending or receiving):
            return None, None
        needed = receiving and not ctx.plan(ctx.owner_at(step)).skip
        into = torch.empty_like(in_hand) if needed or not spare else spare.pop()
        transfer = ctx.comm.post(in_hand, into=into, phase="fwd", step=step, sending=sending, receiving=receiving)
        return transfer, into

    def arrived(step: int, transfer, into) -> None:
        nonlocal in_hand, in_hand_step
        _wait(ctx, transfer, blocking=sync)
        if route.receives(position, step):
            previous, in_hand = in_hand, into
            if in_hand_step not in kept:
                spare.append(previous)  # a relayed block (or the own one): its buffer takes the next one
            in_hand_step = step
        elif into is not None:
            spare.append(into)

    for step in range(depth + 1):
        ctx.recorder.on_step("fwd", step)
        pending = None
        if sync and step >= 1:
            transfer, into = post(step)
            if transfer is not None:
                arrived(step, transfer, into)
        if not sync and step < depth:
            pending = post(step + 1)
        if step == 0 or route.receives(position, step):
            owner = ctx.owner_at(step)
            _compute_forward(ctx, q, in_hand, owner, step, acc_out, acc_lse)
            if step > 0 and not ctx.plan(owner).skip:
                kept[step] = in_hand
        if pending is not None and pending[0] is not None:
            arrived(step + 1, *pending)
    ctx.recorder.end_phase("fwd")
    return acc_out.to(q.dtype), acc_lse, kept


def short_backward(dout, q, k, v, out, lse, kept: dict[int, torch.Tensor], ctx: RingContext):
    """Gradients of the local shards (dq, dk, dv) by the lock-step short backward (module docstring)."""
    acc = stats_dtype(q.dtype)
    route = _route(ctx)
    position, depth = ctx.position, route.depth
    sync = ctx.buffer.sync
    comm = ctx.back_comm
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    own = torch.stack([k, v])
    pool = [torch.zeros((2, *k.shape), dtype=acc, device=q.device)]

    def take() -> torch.Tensor:
        return pool.pop().zero_() if pool else torch.zeros((2, *k.shape), dtype=acc, device=q.device)

    pending = None  # (transfer, its receive buffer, the buffer it sends)
    incoming = None  # the accumulator of this step's block from the successor
    total = None
    for step in range(depth + 1):
        ctx.recorder.on_step("bwd", step)
        distance = depth - step
        owner = ctx.ring[(position - distance) % ctx.world]
        contribution = None
        if route.handles(position, step) and not ctx.plan(owner).skip:
            contribution = take()
            block = own if distance == 0 else kept[distance]
            _compute_backward(ctx, (dout, q, out, lse), block, owner, step, dq, contribution)
        if pending is not None:  # double: the accumulator travelled while this step computed
            transfer, into, sent = pending
            _wait(ctx, transfer, comm=comm)
            incoming = into if route.back_receives(position, step - 1) else None
            if sent is not None:
                pool.append(sent)
            if incoming is None and into is not None:
                pool.append(into)
            pending = None
        if contribution is not None and incoming is not None:
            incoming.add_(contribution)
            pool.append(contribution)
            summed = incoming
        else:
            summed = contribution if contribution is not None else incoming
        incoming = None
        if distance == 0:
            total = summed
            break
        sending, receiving = route.back_sends(position, step), route.back_receives(position, step)
        if not (sending or receiving):
            continue
        if sending and summed is None:  # a relay that received nothing (cannot happen on a consistent route)
            summed = take()
        into = take() if receiving else None
        send = summed if sending else (into if into is not None else take())
        transfer = comm.post(send, into=into if into is not None else send, phase="bwd", step=step,
                             sending=sending, receiving=receiving)  # fmt: skip
        pending = (transfer, into, summed if sending else None)
        if sync:
            _wait(ctx, transfer, blocking=True, comm=comm)
            incoming = into if receiving else None
            if sending:
                pool.append(summed)
            pending = None
    ctx.recorder.end_phase("bwd")
    if total is None:  # this rank's keys are seen by no query at all (cannot happen: each query sees itself)
        total = torch.zeros((2, *k.shape), dtype=acc, device=q.device)
    return dq.to(q.dtype), total[0].to(k.dtype), total[1].to(v.dtype)


__all__ = ["ShortRoute", "route_of", "short_backward", "short_forward", "short_route"]
