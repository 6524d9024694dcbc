"""The mask plan: for every (query rank, key rank) pair, which sub-blocks to compute and with which mask.

Public interface (pure functions of token positions and document ids; any strategy may call them):

    plan_pair(q_segments, k_segments, rule) -> tuple[SubBlock, ...]   # one query set against one key set
    pair_plan(mask, layout, seq, world, q_rank, k_rank, docs="none") -> PairPlan   # a ring's pair (cached)
    plan_table(mask, layout, seq, world, docs="none") -> plans[q_rank][k_rank]
    pair_visibility(mask, layout, seq, world, docs="none") -> (N, N) visible entries per pair (no plan built)

Segments (ringbench.engine.layout.Segment) are arithmetic progressions of positions held in consecutive local rows;
the rule (ringbench.engine.masks.MaskRule) says which keys a query sees. A query segment a + i*t (i < Lq) and a key
segment b + j*t (j < Lk) with the same stride t are first cut at document boundaries into pieces that lie in one
document each; pieces of different documents never meet. Within a pair of pieces of one document, query i sees key
j iff lo <= i - j <= hi, with
    lo = ceil((b - a) / t)                    (causal: key at or before the query; -inf without causality)
    hi = floor((W - 1 - (a - b)) / t)         (window W; +inf without a window)
a band of diagonals. From it:
  * every key visible                         -> FULL
  * no key visible                            -> SKIP (no arithmetic: the block is only forwarded)
  * only the causal edge cuts (no window)     -> a FULL part and one CAUSAL square on q rows [r, r+n) x k rows
                                                 [r - lo, r - lo + n): 1 or 2 kernel calls (the seed's rule: the
                                                 striped blocks are d = -1, zigzag and contiguous FULL / SKIP / d = 0)
  * the window edge cuts as well              -> strips of T rows, each a PARTIAL triangle along the window edge, a
                                                 FULL middle and a CAUSAL square along the causal edge; or, for bands
                                                 thinner than a strip, one PARTIAL block per strip. T is chosen by a
                                                 cost model: computed score entries + CALL_ENTRIES per kernel call
                                                 (ringbench/engine/bands.py).
PARTIAL blocks carry their positional rule (ringbench.kernels.base.PositionMask): kernels evaluate it on their tiles
or build the mask on their device; the plan holds no (Lq, Lk) tensor. Adjacent FULL sub-blocks are coalesced, so
zigzag's half-blocks run as one kernel call; a pair that would still need more than MAX_CALLS calls (many short
documents) is cut into at most MAX_CALLS row groups, each one PARTIAL block over its part of the band.

``causal-naive`` computes every rank pair in one call with its positional mask, skipping nothing. Plans of the three
original masks (none, causal, causal-naive) are unchanged (tests/test_mask_plans.py holds them to stored digests);
their sub-blocks report the kernels' visible share (CAUSAL = 1/2); the other masks count visible entries exactly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ringbench.engine.bands import CALL_ENTRIES, band_items
from ringbench.engine.layout import Segment, as_layout, segments
from ringbench.engine.masks import MaskRule, mask_rule
from ringbench.kernels.base import BlockMask, MaskKind

MAX_CALLS = 16  # kernel calls per (query rank, key rank) pair at most; beyond it rows are grouped into PARTIAL blocks


@dataclass(frozen=True, slots=True)
class SubBlock:
    """Compute q rows [q_lo, q_hi) against k rows [k_lo, k_hi) (local rows) with ``mask``."""

    q_lo: int
    q_hi: int
    k_lo: int
    k_hi: int
    mask: BlockMask
    visible: float | None = None
    """Exact visible score entries (masks with documents or windows); None: the kernel's share (legacy masks)."""

    @property
    def pair_kind(self) -> str:
        return self.mask.kind.value

    @property
    def area(self) -> int:
        return (self.q_hi - self.q_lo) * (self.k_hi - self.k_lo)

    def work_pairs(self) -> float:
        """Score-matrix entries the kernel computes (masked entries of a PARTIAL block included)."""
        return self.area * self.mask.work_fraction

    def visible_pairs(self) -> float:
        """Score entries not masked out: exact for the document and window masks, the kernels' share otherwise."""
        if self.visible is not None:
            return self.visible
        return self.area * self.mask.visible_fraction


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
    def calls(self) -> int:
        """Kernel calls this pair costs (one per sub-block)."""
        return len(self.blocks)

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

    def visible_pairs(self) -> float:
        return float(sum(b.visible_pairs() for b in self.blocks))

    def work_pairs(self) -> float:
        return float(sum(b.work_pairs() for b in self.blocks))


# -- building blocks --------------------------------------------------------------------------------------------
class _Rows:
    """Global positions of a rank's local rows, for the PARTIAL blocks' rules (built when first needed)."""

    def __init__(self, segs: tuple[Segment, ...]) -> None:
        self.segs = segs
        self.positions: np.ndarray | None = None

    def __getitem__(self, rows: slice) -> np.ndarray:
        if self.positions is None:
            parts = [np.arange(s.length, dtype=np.int64) * s.stride + s.start for s in self.segs]
            self.positions = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self.positions[rows]


def _full(q_lo, q_hi, k_lo, k_hi, exact: bool) -> SubBlock:
    area = (q_hi - q_lo) * (k_hi - k_lo)
    return SubBlock(q_lo, q_hi, k_lo, k_hi, BlockMask(MaskKind.FULL), float(area) if exact else None)


def _causal(q_lo, k_lo, n, exact: bool) -> SubBlock:
    return SubBlock(q_lo, q_lo + n, k_lo, k_lo + n, BlockMask(MaskKind.CAUSAL), n * (n + 1) / 2 if exact else None)


def _partial(q_lo, q_hi, k_lo, k_hi, rule: MaskRule, q_rows: _Rows, k_rows: _Rows) -> SubBlock | None:
    """A PARTIAL block with its positional rule (None when nothing in it is visible)."""
    import torch  # on first use (module docstring of ringbench.kernels.base)

    q_pos, k_pos = q_rows[slice(q_lo, q_hi)], k_rows[slice(k_lo, k_hi)]
    counts = rule.row_counts(q_pos, k_pos)
    visible = int(counts.sum())
    if visible == 0:
        return None
    if visible == len(q_pos) * len(k_pos):
        return _full(q_lo, q_hi, k_lo, k_hi, True)
    mask = BlockMask.from_rule(rule.position_mask(q_pos, k_pos), torch.as_tensor(counts))
    return SubBlock(q_lo, q_hi, k_lo, k_hi, mask, float(visible))


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


# -- pieces of one document --------------------------------------------------------------------------------------
def _pieces(seg: Segment, rule: MaskRule) -> list[tuple[int, int, int, int]]:
    """(document, local_start, length, start position) runs of ``seg`` that lie in one document each."""
    if not rule.documents or seg.length == 0:
        return [(0, seg.local_start, seg.length, seg.start)]
    ends = np.asarray(rule.doc_ends, dtype=np.int64)
    lo, hi = np.searchsorted(ends, [seg.first, seg.last], side="right")
    cuts = [0]
    for end in ends[lo:hi]:  # document ends inside the segment: the first row at or past each
        cuts.append(_ceil_div(int(end) - seg.start, seg.stride))
    cuts.append(seg.length)
    out = []
    doc = int(lo)
    for a, b in itertools.pairwise(cuts):
        if b > a:
            out.append((doc, seg.local_start + a, b - a, seg.start + a * seg.stride))
        doc += 1
    return out


def _segment_pair(q_seg: Segment, k_seg: Segment, rule: MaskRule, q_rows, k_rows, call_entries) -> list[SubBlock]:
    if q_seg.length == 0 or k_seg.length == 0 or not rule.may_see(q_seg.first, q_seg.last, k_seg.first, k_seg.last):
        return []
    exact = not rule.legacy
    if q_seg.stride != k_seg.stride:  # no layout does this; stay exact with one PARTIAL block
        block = _partial(q_seg.local_start, q_seg.local_start + q_seg.length, k_seg.local_start,
                         k_seg.local_start + k_seg.length, rule, q_rows, k_rows)  # fmt: skip
        return [block] if block is not None else []
    t = q_seg.stride
    k_pieces = _pieces(k_seg, rule)
    by_doc: dict[int, list] = {}
    for piece in k_pieces:
        by_doc.setdefault(piece[0], []).append(piece)
    out: list[SubBlock] = []
    for doc, q0, lq, a in _pieces(q_seg, rule):
        for _, k0, lk, b in by_doc.get(doc, ()):
            lo = _ceil_div(b - a, t) if rule.causal else None
            hi = (rule.window - 1 - (a - b)) // t if rule.window is not None else None
            for kind, i0, i1, j0, j1 in band_items(lq, lk, lo, hi, call_entries):
                if kind == "full":
                    out.append(_full(q0 + i0, q0 + i1, k0 + j0, k0 + j1, exact))
                elif kind == "causal":
                    out.append(_causal(q0 + i0, k0 + j0, i1 - i0, exact))
                else:
                    block = _partial(q0 + i0, q0 + i1, k0 + j0, k0 + j1, rule, q_rows, k_rows)
                    if block is not None:
                        out.append(block)
    return out


def _coalesce(blocks: list[SubBlock]) -> list[SubBlock]:
    """Merge FULL sub-blocks that share a row range and abut in the other (repeat until nothing changes)."""
    blocks = list(blocks)
    merged = True
    while merged:
        merged = False
        fulls = [b for b in blocks if b.mask.kind is MaskKind.FULL]
        if len(fulls) < 2:
            break
        by_rows = {(b.q_lo, b.q_hi, b.k_hi): b for b in fulls}
        by_cols = {(b.k_lo, b.k_hi, b.q_hi): b for b in fulls}
        for b in fulls:
            a = by_rows.get((b.q_lo, b.q_hi, b.k_lo))  # same rows, ends where b starts
            if a is not None and a is not b:
                joined = SubBlock(a.q_lo, a.q_hi, a.k_lo, b.k_hi, a.mask, _add(a.visible, b.visible))
            else:
                a = by_cols.get((b.k_lo, b.k_hi, b.q_lo))
                if a is None or a is b:
                    continue
                joined = SubBlock(a.q_lo, b.q_hi, a.k_lo, a.k_hi, a.mask, _add(a.visible, b.visible))
            blocks = [x for x in blocks if x is not a and x is not b] + [joined]
            merged = True
            break
    return sorted(blocks, key=lambda b: (b.k_lo, b.q_lo))


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _grouped(blocks: list[SubBlock], rule: MaskRule, q_rows, k_rows, limit: int) -> list[SubBlock]:
    """At most ``limit`` blocks: rows cut into groups no block straddles, each group one PARTIAL block over the
    columns its blocks cover (a group of one block keeps it). Every visible entry of a row lies in a block of that
    row, so a group's box holds all of its rows' visible entries and the rule masks the rest."""
    atoms: list[list[SubBlock]] = []
    reach = None
    for b in sorted(blocks, key=lambda b: (b.q_lo, b.k_lo)):
        if reach is None or b.q_lo >= reach:  # every earlier block ended above this row: a new atom
            atoms.append([])
            reach = b.q_hi
        atoms[-1].append(b)
        reach = max(reach, b.q_hi)
    rows = sum(max(x.q_hi for x in a) - min(x.q_lo for x in a) for a in atoms)
    target = _ceil_div(rows, limit)
    groups: list[list[SubBlock]] = []
    span = 0
    for atom in atoms:
        height = max(x.q_hi for x in atom) - min(x.q_lo for x in atom)
        if groups and span + height <= target:
            groups[-1].extend(atom)
            span += height
        else:
            groups.append(list(atom))
            span = height
    while len(groups) > limit:  # merge the neighbours with the fewest rows between them
        spans = [max(x.q_hi for x in b) - min(x.q_lo for x in a) for a, b in itertools.pairwise(groups)]
        i = int(np.argmin(spans))
        groups[i : i + 2] = [groups[i] + groups[i + 1]]
    out = []
    for group in groups:
        if len(group) == 1:
            out.append(group[0])
            continue
        q_lo, q_hi = min(b.q_lo for b in group), max(b.q_hi for b in group)
        k_lo, k_hi = min(b.k_lo for b in group), max(b.k_hi for b in group)
        block = _partial(q_lo, q_hi, k_lo, k_hi, rule, q_rows, k_rows)
        if block is not None:
            out.append(block)
    return out


def plan_pair(q_segments, k_segments, rule: MaskRule, *, call_entries: int = CALL_ENTRIES,
              max_calls: int = MAX_CALLS) -> tuple[SubBlock, ...]:  # fmt: skip
    """The sub-blocks of one query set against one key set (local rows of each), under ``rule``.

    ``q_segments`` / ``k_segments``: the Segments of the two sets in local-row order. Pure: the result depends on the
    positions and the documents only. ``call_entries`` and ``max_calls`` tune the cost model (module docstring).
    """
    q_segments, k_segments = tuple(q_segments), tuple(k_segments)
    q_len = sum(s.length for s in q_segments)
    k_len = sum(s.length for s in k_segments)
    if rule.everything:
        return (SubBlock(0, q_len, 0, k_len, BlockMask(MaskKind.FULL), None if rule.legacy else float(q_len * k_len)),)
    if rule.naive:
        return (_naive(q_segments, k_segments, q_len, k_len),)
    q_rows, k_rows = _Rows(q_segments), _Rows(k_segments)
    blocks = [b for qs in q_segments for ks in k_segments for b in _segment_pair(qs, ks, rule, q_rows, k_rows,
                                                                                    call_entries)]  # fmt: skip
    blocks = _coalesce(blocks) if len(blocks) <= 4 * max_calls else blocks
    if len(blocks) > max_calls:
        blocks = _coalesce(_grouped(blocks, rule, q_rows, k_rows, max_calls))
    return tuple(sorted(blocks, key=lambda b: (b.k_lo, b.q_lo)))


def _naive(q_segs, k_segs, q_len: int, k_len: int) -> SubBlock:
    import torch  # on first use (module docstring of ringbench.kernels.base)

    q_pos = torch.cat([s.positions() for s in q_segs])
    k_pos = torch.cat([s.positions() for s in k_segs])
    allowed = k_pos[None, :] <= q_pos[:, None]
    block_mask = BlockMask(MaskKind.FULL) if bool(allowed.all()) else BlockMask.partial(allowed)
    return SubBlock(0, q_len, 0, k_len, block_mask)


# -- a ring's pairs ------------------------------------------------------------------------------------------------
def _layout(layout) -> object:
    return as_layout(layout)


@lru_cache(maxsize=1 << 16)
def _pair_plan(rule: MaskRule, layout, seq: int, world: int, q_rank: int, k_rank: int) -> PairPlan:
    q_segs = segments(layout, seq, world, q_rank, rule=rule)
    k_segs = segments(layout, seq, world, k_rank, rule=rule)
    return PairPlan(q_rank, k_rank, plan_pair(q_segs, k_segs, rule))


def pair_plan(mask, layout, seq: int, world: int, q_rank: int, k_rank: int, docs: str = "none") -> PairPlan:
    """The plan for rank ``q_rank``'s queries against rank ``k_rank``'s keys (cached: built once per layout).

    ``mask``: a mode name, a MaskSpec, or a MaskRule (which then carries the documents; ``docs`` is ignored).
    """
    rule = mask_rule(mask, docs, seq)
    return _pair_plan(rule, _layout(layout), seq, world, q_rank, k_rank)


pair_plan.cache_info = _pair_plan.cache_info  # type: ignore[attr-defined]
pair_plan.cache_clear = _pair_plan.cache_clear  # type: ignore[attr-defined]


@lru_cache(maxsize=64)
def _visibility(rule: MaskRule, layout, seq: int, world: int) -> np.ndarray:
    positions = [segments(layout, seq, world, r, rule=rule) for r in range(world)]
    flat = [np.concatenate([s.positions().numpy() for s in segs]) for segs in positions]
    keys = [np.sort(p) for p in flat]
    out = np.zeros((world, world))
    for q in range(world):
        lo, hi = rule.key_bounds(flat[q])
        for k in range(world):
            counts = np.searchsorted(keys[k], hi, side="right") - np.searchsorted(keys[k], lo, side="left")
            out[q, k] = float(np.maximum(counts, 0).sum())
    out.setflags(write=False)
    return out


def pair_visibility(mask, layout, seq: int, world: int, docs: str = "none") -> np.ndarray:
    """(N, N) exact visible score entries of every (query rank, key rank) pair, counted from positions without
    building a plan (the plan covers exactly these entries: tests/test_mask_plans.py). Row sums are each rank's
    predicted work; a zero is a skipped pair."""
    rule = mask_rule(mask, docs, seq)
    return _visibility(rule, _layout(layout), seq, world)


def plan_table(mask, layout, seq: int, world: int, docs: str = "none") -> list[list[PairPlan]]:
    """plans[q_rank][k_rank] for the whole ring."""
    rule = mask_rule(mask, docs, seq)
    layout = _layout(layout)
    return [[_pair_plan(rule, layout, seq, world, q, k) for k in range(world)] for q in range(world)]


__all__ = ["CALL_ENTRIES", "MAX_CALLS", "PairPlan", "SubBlock", "band_items", "pair_plan", "pair_visibility",
           "plan_pair", "plan_table"]  # fmt: skip
