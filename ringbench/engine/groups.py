"""Groups of ranks and the mask plan of a block made of several ranks' shards: what every strategy is built from.

A grouped strategy cuts the N ranks, in *placement* order (ringbench.orders.parse_placement), into G groups of
``size`` consecutive entries. Group g holds ranks placement[g*size .. (g+1)*size); a rank's *index* is its place
in its group. Two kinds of ring follow from that:
  inner ring   the ranks of one group, in placement order (the double ring's inner rotation)
  cross ring   the ranks with the same index in every group, in group order (the hybrid's ring across Ulysses
               groups; the double ring's outer ring)

After a Ulysses all-to-all a rank holds the rows of every member of its group, one shard after another in member
order (member a's L = S/N rows at [a*L, (a+1)*L)), for H/U of the heads. The mask plan of such a block against
another group's block is the union of ringbench.engine.plan.pair_plan over every (query member, key member) pair,
each shifted to its rows and columns (``block_plan``), then coalesced: it is the same per-pair plan the ring uses,
so any mask the plan can express applies to every strategy.

``flows``: the transfers of one exchange on every rank at once, (src, dst) pairs. Emulated links price NIC sharing
from them (ringbench.topology.linkmodel: a cross-host transfer shares its source and destination NICs with the
exchange's other transfers through them; a transfer inside a host shares its rank's port with the rank's other
transfers of the exchange).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ringbench.engine.plan import PairPlan, SubBlock, pair_plan
from ringbench.kernels.base import MaskKind
from ringbench.vocab import Layout


@dataclass(frozen=True, slots=True)
class Groups:
    """N ranks in ``placement`` order, cut into groups of ``size``."""

    placement: tuple[int, ...]
    size: int

    @property
    def world(self) -> int:
        return len(self.placement)

    @property
    def count(self) -> int:
        return self.world // self.size

    def slot(self, rank: int) -> tuple[int, int]:
        """(group, index in the group) of ``rank``."""
        place = self.placement.index(rank)
        return divmod(place, self.size)

    def members(self, group: int) -> tuple[int, ...]:
        return self.placement[group * self.size : (group + 1) * self.size]

    def group_of(self, rank: int) -> tuple[int, ...]:
        return self.members(self.slot(rank)[0])

    def inner_ring(self, rank: int) -> list[int]:
        return list(self.group_of(rank))

    def cross_ring(self, rank: int) -> list[int]:
        index = self.slot(rank)[1]
        return [self.members(g)[index] for g in range(self.count)]

    def all_groups(self) -> list[tuple[int, ...]]:
        return [self.members(g) for g in range(self.count)]

    def cross_rings(self) -> list[list[int]]:
        """Every cross ring (index i of every group, in group order)."""
        return [[self.members(g)[i] for g in range(self.count)] for i in range(self.size)]

    def inner_flows(self) -> tuple[tuple[int, int], ...]:
        """Every inner ring's hops (one exchange of the double ring's inner rotation on every rank)."""
        return _ring_flows([list(m) for m in self.all_groups()])

    def cross_flows(self) -> tuple[tuple[int, int], ...]:
        """Every cross ring's hops (the hybrid's ring step, the double ring's outer exchange, on every rank)."""
        return _ring_flows(self.cross_rings())

    def alltoall_flows(self) -> tuple[tuple[int, int], ...]:
        """Every ordered pair inside every group (one all-to-all of every group at once)."""
        return tuple((a, b) for members in self.all_groups() for a in members for b in members if a != b)


def _ring_flows(rings: list[list[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((ring[p], ring[(p + 1) % len(ring)]) for ring in rings if len(ring) > 1 for p in range(len(ring)))


def _coalesce(blocks: list[SubBlock]) -> list[SubBlock]:
    """Merge FULL blocks that share a row range and abut in columns, then those that share columns and abut in
    rows (a block of several members is many pairs; most of a causal one is FULL)."""
    for rows_first in (True, False):
        key = (lambda b: (b.q_lo, b.q_hi, b.k_lo)) if rows_first else (lambda b: (b.k_lo, b.k_hi, b.q_lo))
        full = sorted((b for b in blocks if b.mask.kind is MaskKind.FULL), key=key)
        rest = [b for b in blocks if b.mask.kind is not MaskKind.FULL]
        merged: list[SubBlock] = []
        for block in full:
            last = merged[-1] if merged else None
            if last is not None and rows_first and (last.q_lo, last.q_hi) == (block.q_lo, block.q_hi) \
                    and last.k_hi == block.k_lo:  # fmt: skip
                merged[-1] = SubBlock(last.q_lo, last.q_hi, last.k_lo, block.k_hi, last.mask)
            elif last is not None and not rows_first and (last.k_lo, last.k_hi) == (block.k_lo, block.k_hi) \
                    and last.q_hi == block.q_lo:  # fmt: skip
                merged[-1] = SubBlock(last.q_lo, block.q_hi, last.k_lo, last.k_hi, last.mask)
            else:
                merged.append(block)
        blocks = merged + rest
    return sorted(blocks, key=lambda b: (b.k_lo, b.q_lo))


@lru_cache(maxsize=4096)
def block_plan(mask, layout: Layout, seq: int, world: int, q_members: tuple[int, ...],
               k_members: tuple[int, ...]) -> PairPlan:  # fmt: skip
    """The plan of a query block of ``q_members``' shards against a key block of ``k_members``' shards.

    Rows and columns are local to the blocks: member a's shard is rows [a*L, (a+1)*L), L = seq / world.
    """
    local = seq // world
    blocks = []
    for a, q_rank in enumerate(q_members):
        for b, k_rank in enumerate(k_members):
            for sub in pair_plan(mask, layout, seq, world, q_rank, k_rank).blocks:
                blocks.append(SubBlock(sub.q_lo + a * local, sub.q_hi + a * local, sub.k_lo + b * local,
                                       sub.k_hi + b * local, sub.mask))  # fmt: skip
    return PairPlan(q_members[0], k_members[0], tuple(_coalesce(blocks)))


__all__ = ["Groups", "block_plan"]
