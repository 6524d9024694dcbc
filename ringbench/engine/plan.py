"""The mask plan: for every (query rank, key rank) pair, which sub-blocks to compute and with which mask.

One rule for all layouts. A query segment with positions a + i*t (i < Lq) and a key segment with positions
b + j*t (j < Lk) share the stride t; under causal masking query i sees key j iff b + j*t <= a + i*t, i.e.
j <= i + d with d = floor((a - b) / t). From d alone:
  * every key visible  (b + (Lk-1)t <= a)                     -> FULL
  * no key visible     (b > a + (Lq-1)t)                      -> SKIP: no arithmetic, the block is only forwarded
  * square, d <= 0     (rows i >= -d see keys j <= i + d)     -> CAUSAL on q rows [-d, L) x k rows [0, L+d)
  * anything else                                             -> PARTIAL with an explicit positional mask
Striped blocks are the d = -1 case (strictly lower triangle); zigzag and contiguous give FULL, SKIP and d = 0.
Adjacent FULL sub-blocks are coalesced so zigzag's half-blocks run as one kernel call.
``causal-naive`` computes every rank pair in one call with its positional mask, skipping nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from ringbench.engine.layout import Segment, segments
from ringbench.kernels.base import BlockMask, MaskKind
from ringbench.vocab import Layout, Mask


@dataclass(frozen=True, slots=True)
class SubBlock:
    """Compute q rows [q_lo, q_hi) against k rows [k_lo, k_hi) (local rows) with ``mask``."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    mask: BlockMask

    @property
    def pair_kind(self) -> str:
        return self.mask.kind.value

    def work_pairs(self) -> float:
        """Score-matrix entries the kernel computes (masked entries of a PARTIAL block included)."""
        return (self.q_hi - self.q_lo) * (self.k_hi - self.k_lo) * self.mask.work_fraction

    def visible_pairs(self) -> float:
        return (self.q_hi - self.q_lo) * (self.k_hi - self.k_lo) * self.mask.visible_fraction


@dataclass(frozen=True, slots=True)
class PairPlan:
    """Everything a rank does with one KV block: the sub-blocks, or none (skip)."""

    q_rank: int
    k_rank: int
    blocks: tuple[SubBlock, ...]

    @property
    def skip(self) -> bool:
        return not self.blocks

    @property
    def kind(self) -> str:
        """full | causal | partial | skip: the most general mask among the sub-blocks."""
        if not self.blocks:
            return "skip"
        kinds = {b.mask.kind for b in self.blocks}
        for kind in (MaskKind.PARTIAL, MaskKind.CAUSAL):
            if kind in kinds:
                return kind.value
        return MaskKind.FULL.value


def _positional_mask(q_seg: Segment, k_seg: Segment) -> BlockMask:
    return BlockMask.partial(k_seg.positions()[None, :] <= q_seg.positions()[:, None])  # (Lq, Lk)


def _segment_blocks(q_seg: Segment, k_seg: Segment) -> list[SubBlock]:
    q0, k0 = q_seg.local_start, k_seg.local_start
    if k_seg.last <= q_seg.first:
        return [SubBlock(q0, q0 + q_seg.length, k0, k0 + k_seg.length, BlockMask(MaskKind.FULL))]
    if k_seg.first > q_seg.last:
        return []
    offset = (q_seg.start - k_seg.start) // q_seg.stride  # d in the module docstring
    if q_seg.stride == k_seg.stride and q_seg.length == k_seg.length and offset <= 0:
        length = q_seg.length + offset
        return [SubBlock(q0 - offset, q0 + q_seg.length, k0, k0 + length, BlockMask(MaskKind.CAUSAL))]
    block = SubBlock(q0, q0 + q_seg.length, k0, k0 + k_seg.length, _positional_mask(q_seg, k_seg))
    return [block]


def _coalesce(blocks: list[SubBlock]) -> list[SubBlock]:
    """Merge FULL sub-blocks that share a row range and abut in the other (repeat until nothing changes)."""
    blocks = list(blocks)
    merged = True
    while merged:
        merged = False
        for i, a in enumerate(blocks):
            for j, b in enumerate(blocks):
                if i == j or a.mask.kind is not MaskKind.FULL or b.mask.kind is not MaskKind.FULL:
                    continue
                if (a.k_lo, a.k_hi) == (b.k_lo, b.k_hi) and a.q_hi == b.q_lo:
                    joined = SubBlock(a.q_lo, b.q_hi, a.k_lo, a.k_hi, a.mask)
                elif (a.q_lo, a.q_hi) == (b.q_lo, b.q_hi) and a.k_hi == b.k_lo:
                    joined = SubBlock(a.q_lo, a.q_hi, a.k_lo, b.k_hi, a.mask)
                else:
                    continue
                blocks = [x for n, x in enumerate(blocks) if n not in (i, j)] + [joined]
                merged = True
                break
            if merged:
                break
    return sorted(blocks, key=lambda b: (b.k_lo, b.q_lo))


@cache
def pair_plan(mask: Mask, layout: Layout, seq: int, world: int, q_rank: int, k_rank: int) -> PairPlan:
    """The plan for rank ``q_rank``'s queries against rank ``k_rank``'s keys (cached: built once per layout)."""
    q_segs = segments(layout, seq, world, q_rank)
    k_segs = segments(layout, seq, world, k_rank)
    q_len = sum(s.length for s in q_segs)
    k_len = sum(s.length for s in k_segs)
    if mask is Mask.NONE:
        return PairPlan(q_rank, k_rank, (SubBlock(0, q_len, 0, k_len, BlockMask(MaskKind.FULL)),))
    if mask is Mask.CAUSAL_NAIVE:
        q_pos = torch.cat([s.positions() for s in q_segs])
        k_pos = torch.cat([s.positions() for s in k_segs])
        allowed = k_pos[None, :] <= q_pos[:, None]
        if bool(allowed.all()):
            block_mask = BlockMask(MaskKind.FULL)
        else:
            block_mask = BlockMask.partial(allowed)
        return PairPlan(q_rank, k_rank, (SubBlock(0, q_len, 0, k_len, block_mask),))
    blocks = [block for q_seg in q_segs for k_seg in k_segs for block in _segment_blocks(q_seg, k_seg)]
    return PairPlan(q_rank, k_rank, tuple(_coalesce(blocks)))


def plan_table(mask: Mask | str, layout: Layout | str, seq: int, world: int) -> list[list[PairPlan]]:
    """plans[q_rank][k_rank] for the whole ring."""
    mask, layout = Mask.parse(mask, "mask"), Layout.parse(layout, "layout")
    return [[pair_plan(mask, layout, seq, world, q, k) for k in range(world)] for q in range(world)]
