"""A ring inside a strategy: today's ring loops (ringbench/engine/ring.py) over a sub-ring of blocks of several ranks.

The hybrid's ring across Ulysses groups and the double ring's inner rotations are rings whose block in hand is not
one rank's shard but a group's (after the all-to-all) or an outer block passed on from another group. The loops of
ring.py run them unchanged: ``GroupRingContext`` is a RingContext whose ``plan(owner)`` is the plan of the block
the ring rank ``owner`` held at the loop's start (``members_of[owner]``: the ranks whose shards it is made of)
against this rank's query rows (``q_members``), from ringbench.engine.groups.block_plan; ``world_all`` is the N the
pair plans are cut for.

``StepRecorder`` shows the loops a recorder whose steps start at ``offset`` (the double ring's rotation o covers
steps o*W .. o*W + W - 1 of the phase) and keeps the phase's end for the strategy, which still has exchanges to do
after the loop. ``post`` / ``wait`` are the strategy's own exchanges on a ring (the double ring's outer ring),
recorded like the ring's with what they moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ringbench.engine.comm import RingComm, Transfer
from ringbench.engine.groups import block_plan
from ringbench.engine.plan import PairPlan
from ringbench.engine.ring import RingContext


@dataclass(kw_only=True, slots=True)
class GroupRingContext(RingContext):
    """A RingContext over a sub-ring whose blocks are made of several ranks' shards."""

    world_all: int = 1
    """N, the world the pair plans are cut for (``world`` is the sub-ring's length)."""
    q_members: tuple[int, ...] = ()
    """The ranks whose rows this rank's queries are, in local-row order."""
    members_of: dict = field(default_factory=dict)
    """Ring rank -> the ranks whose shards make the block it holds at the loop's start."""

    def plan(self, owner: int) -> PairPlan:
        return block_plan(self.mask, self.layout, self.seq, self.world_all, self.q_members, self.members_of[owner])


class StepRecorder:
    """The recorder as a strategy's inner loop sees it: steps shifted by ``offset``; the phase end is the
    strategy's (it has exchanges left after the loop)."""

    def __init__(self, inner, offset: int = 0) -> None:
        self.inner = inner
        self.offset = offset

    @property
    def enabled(self) -> bool:
        return self.inner.enabled

    def on_step(self, phase: str, step: int) -> None:
        self.inner.on_step(phase, step + self.offset)

    def end_phase(self, phase: str) -> None:
        pass

    def span(self, **fields) -> None:
        fields["step"] = fields["step"] + self.offset
        self.inner.span(**fields)


@dataclass(slots=True)
class Posted:
    """A strategy's exchange in flight on one ring, with what it moved."""

    transfer: Transfer
    comm: RingComm
    exchange: str
    blocking: bool


def post(comm: RingComm, tensor: torch.Tensor, *, into: torch.Tensor, phase: str, step: int, exchange: str,
         blocking: bool = False) -> Posted:  # fmt: skip
    return Posted(comm.post(tensor, into=into, phase=phase, step=step), comm, exchange, blocking)


def wait(posted: Posted, recorder, timeline) -> torch.Tensor:
    """Wait for an exchange (bounded, RingStall on failure) and record it as the ring records its own: a send to the
    successor, a recv from the predecessor, and the time this rank sat blocked (from the post when ``blocking``)."""
    transfer, comm = posted.transfer, posted.comm
    start = transfer.start if posted.blocking else (timeline.mark() if recorder.enabled else None)
    received = comm.wait(transfer)
    if recorder.enabled:
        end = timeline.mark()
        common = dict(phase=transfer.phase, step=transfer.step, start=transfer.start, nbytes=transfer.nbytes,
                      nccl=transfer.nccl_ms, exchange=posted.exchange, group=comm.label)  # fmt: skip
        recorder.span(kind="send", end=transfer.send_done, src=comm.rank, dst=comm.next, **common)
        recorder.span(kind="recv", end=transfer.recv_done, src=comm.prev, dst=comm.rank, **common)
        recorder.span(phase=transfer.phase, step=transfer.step, kind="wait", start=start, end=end, src=comm.prev,
                      dst=comm.rank, exchange=posted.exchange, group=comm.label)  # fmt: skip
    return received


__all__ = ["GroupRingContext", "Posted", "StepRecorder", "post", "wait"]
