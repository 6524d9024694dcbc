"""The mask plan at any scale: O(1) pair classes per (mask, layout), each backed by ringbench.engine.plan.pair_plan.

The plan of a (query rank q, key rank k) pair depends only on the sign of k - q, whatever the layout:

  contiguous  k < q every key visible; k = q the causal diagonal; k > q nothing visible
  zigzag      rank r owns chunks r and 2N-1-r: k < q both query chunks see k's first chunk; k > q q's second
              chunk sees both of k's; k = q two causal chunks and one full one
  striped     positions r + iN: k <= q query i sees keys j <= i; k > q keys j <= i - 1

(causal-naive: one call per pair whose mask has the same shape within each class; mask none: every pair full.)
So a ring of 65,536 ranks needs three plans, not 65,536^2: ``PairClasses`` calls ``pair_plan`` for the
representative pairs (1, 0), (0, 0) and (0, 1) and ``classify`` maps any (q, k) arrays to a class.
tests/test_simulate_plans.py checks against ``pair_plan`` for every pair at small N, every mask and layout.

A causal-naive block is one (L, L) positional mask; above NAIVE_MASK_LIMIT entries its visible share is counted
from the token positions (sorted search) instead of building the (L, L) mask pair_plan would hold in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from ringbench.engine.layout import check_divisible, token_positions
from ringbench.engine.plan import pair_plan
from ringbench.kernels.base import MaskKind, block_flops
from ringbench.vocab import Layout, Mask

LESS, EQUAL, GREATER = 0, 1, 2  # class of a pair: k < q, k == q, k > q
CLASS_NAMES = ("k<q", "k=q", "k>q")
PAIR_KINDS = ("full", "causal", "partial")
NAIVE_MASK_LIMIT = 1 << 24  # entries of one causal-naive (L, L) mask built through pair_plan; larger: counted


@dataclass(frozen=True, kw_only=True, slots=True)
class Block:
    """One kernel call of a pair's plan: its mask kind, computed entries and visible (useful) entries."""

    kind: str
    """full | causal | partial."""
    work_pairs: float
    """Score-matrix entries the kernel computes (what the time depends on)."""
    visible_pairs: float
    """Entries not masked out (what the recorded FLOPs count)."""
    q_len: int = 0
    """Query rows of the call (0: unknown; a GPU kernel's rate depends on the block's shape)."""
    k_len: int = 0
    """Key columns of the call."""


def block_of(sub) -> Block:
    """The simulator's Block of one sub-block of the engine's plan (ringbench.engine.plan.SubBlock)."""
    return Block(kind=sub.mask.kind.value, work_pairs=float(sub.work_pairs()), visible_pairs=float(sub.visible_pairs()),
                 q_len=sub.q_hi - sub.q_lo, k_len=sub.k_hi - sub.k_lo)  # fmt: skip


@dataclass(frozen=True, kw_only=True, slots=True)
class PairClass:
    """The plan of every pair of one class."""

    kind: str
    """full | causal | partial | skip: the most general mask among the blocks (PairPlan.kind)."""
    blocks: tuple[Block, ...]

    def flops(self, batch: int, heads: int, head_dim: int, backward: bool, *, visible: bool) -> float:
        """Useful (``visible``) or computed FLOPs of the pair, the kernels' block_flops formula."""
        entries = sum(b.visible_pairs if visible else b.work_pairs for b in self.blocks)
        return block_flops(batch, heads, 1, 1, head_dim, 1.0, backward) * entries

    def work_by_kind(self) -> dict[str, float]:
        """Computed entries per mask kind (the compute model prices each kind at its own rate)."""
        out = dict.fromkeys(PAIR_KINDS, 0.0)
        for block in self.blocks:
            out[block.kind] += block.work_pairs
        return out


def _naive_block(layout: Layout, seq: int, world: int, q_rank: int, k_rank: int) -> Block:
    """A causal-naive pair's one block without its (L, L) mask: entries with key position <= query position."""
    q_pos = np.sort(token_positions(layout, seq, world, q_rank).numpy())  # (L,)
    k_pos = np.sort(token_positions(layout, seq, world, k_rank).numpy())  # (L,)
    visible = float(np.searchsorted(k_pos, q_pos, side="right").sum())
    entries = float(len(q_pos) * len(k_pos))
    return Block(
        kind="full" if visible == entries else "partial",
        work_pairs=entries,
        visible_pairs=visible,
        q_len=len(q_pos),
        k_len=len(k_pos),
    )


def _plan_class(mask: Mask, layout: Layout, seq: int, world: int, q_rank: int, k_rank: int) -> PairClass:
    local = seq // world
    if mask is Mask.CAUSAL_NAIVE and local * local > NAIVE_MASK_LIMIT:
        block = _naive_block(layout, seq, world, q_rank, k_rank)
        return PairClass(kind=block.kind, blocks=(block,))
    plan = pair_plan(mask, layout, seq, world, q_rank, k_rank)
    blocks = tuple(block_of(b) for b in plan.blocks)
    return PairClass(kind=plan.kind, blocks=blocks)


@dataclass(frozen=True, kw_only=True, slots=True)
class PairClasses:
    """The three pair classes of one (mask, layout, seq, world)."""

    mask: str
    layout: str
    seq: int
    world: int
    classes: tuple[PairClass, PairClass, PairClass]
    """Indexed by LESS, EQUAL, GREATER (a 1-rank ring has only EQUAL; the others repeat it)."""

    def classify(self, q_ranks: np.ndarray, k_ranks: np.ndarray) -> np.ndarray:
        """Class index of each (q, k) pair: 0 (k < q), 1 (k == q), 2 (k > q); int8, broadcast shape."""
        return (np.sign(np.asarray(k_ranks) - np.asarray(q_ranks)) + 1).astype(np.int8)

    def kinds(self) -> tuple[str, str, str]:
        return tuple(c.kind for c in self.classes)  # type: ignore[return-value]


@cache
def pair_classes(mask: str, layout: str, seq: int, world: int) -> PairClasses:
    """The pair classes of a ring (cached): three calls of pair_plan whatever the world size."""
    mask_v, layout_v = Mask.parse(mask, "mask"), Layout.parse(layout, "layout")
    check_divisible(layout_v, seq, world)
    equal = _plan_class(mask_v, layout_v, seq, world, 0, 0)
    if world == 1:
        classes = (equal, equal, equal)
    else:
        less = _plan_class(mask_v, layout_v, seq, world, 1, 0)
        greater = _plan_class(mask_v, layout_v, seq, world, 0, 1)
        classes = (less, equal, greater)
    return PairClasses(mask=mask_v.value, layout=layout_v.value, seq=seq, world=world, classes=classes)


__all__ = ["CLASS_NAMES", "EQUAL", "GREATER", "LESS", "PAIR_KINDS", "Block", "MaskKind", "PairClass",
           "PairClasses", "block_of", "pair_classes"]  # fmt: skip
