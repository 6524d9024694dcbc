"""The mask plan of every (query rank, key rank) pair at any N, for the masks whose plan depends on more than the
sign of k - q: documents and windows (the three original masks keep plans.py's three classes).

A ``PairTable`` maps every pair to a class of identical plans (``matrix[q_rank, k_rank]``, class 0 = skip), and
each class to its PairClass (its blocks' kinds, computed and visible entries: what the simulator prices). Building
it never plans every pair: per query rank, each (query segment, key segment) pair over all key ranks at once is

  nothing     no key of it is visible (causal order, the window's reach, no shared document)
  simple      both segments lie in one and the same document (or there are none) and the window does not cut
              them: FULL, or the causal diagonal (the seed's rule), in closed form
  complex     a document boundary or the window's edge runs through it

and a pair is simple when all of its segment pairs are. Simple pairs with the same blocks share a class, planned
once (ringbench.engine.plan.plan_pair on one of them: coalescing included); each complex pair is planned exactly.
On a contiguous layout the complex pairs are those at a document boundary or the window's edge (about
2 x documents x ranks per document, plus 2N), so a document mask at 4,096 ranks plans a few thousand pairs.
tests/test_simulate_plans.py checks the table against pair_plan for every pair at small N.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ringbench.engine.layout import resolve_layout, segments
from ringbench.engine.masks import MaskRule, mask_rule
from ringbench.engine.plan import plan_pair
from ringbench.simulate.pair_classes import PairClass, block_of

SKIP = PairClass(kind="skip", blocks=())
_NONE, _FULL, _CAUSAL = 0, 1, 2


@dataclass(frozen=True, kw_only=True, slots=True)
class PairTable:
    """Every pair's plan class: ``matrix`` (N, N) int32 [q_rank, k_rank] into ``classes`` (0 = skip)."""

    classes: tuple[PairClass, ...]
    matrix: np.ndarray

    def classify(self, q_ranks, k_ranks) -> np.ndarray:
        """Class index of each (q, k) pair (broadcast shape)."""
        return self.matrix[np.asarray(q_ranks), np.asarray(k_ranks)]

    def kinds(self) -> tuple[str, ...]:
        return tuple(c.kind for c in self.classes)

    def visible(self) -> np.ndarray:
        """(N, N) visible score entries of every pair."""
        entries = np.array([sum(b.visible_pairs for b in c.blocks) for c in self.classes])
        return entries[self.matrix]


def _class_of(blocks) -> PairClass:
    from ringbench.engine.plan import PairPlan

    plan = PairPlan(0, 0, tuple(blocks))
    return PairClass(kind=plan.kind, blocks=tuple(block_of(b) for b in plan.blocks))


class _Segments:
    """Every rank's segments as arrays (index = rank * m + i; empty slots have length 0)."""

    def __init__(self, layout, seq: int, world: int, rule: MaskRule) -> None:
        per_rank = [segments(layout, seq, world, r, rule=rule) for r in range(world)]
        m = max(len(s) for s in per_rank)
        shape = (world, m)
        self.m = m
        self.segs = per_rank
        self.start = np.zeros(shape, np.int64)
        self.length = np.zeros(shape, np.int64)
        self.stride = np.ones(shape, np.int64)
        self.local = np.zeros(shape, np.int64)
        for r, segs in enumerate(per_rank):
            for i, s in enumerate(segs):
                self.start[r, i], self.length[r, i], self.stride[r, i], self.local[r, i] = (
                    s.start,
                    s.length,
                    s.stride,
                    s.local_start,
                )
        self.last = self.start + (self.length - 1) * self.stride
        self.doc_first = rule.doc_ids(self.start)
        self.doc_last = rule.doc_ids(self.last)


def _candidates(s: _Segments, rule: MaskRule) -> tuple[np.ndarray, np.ndarray]:
    """(query segment, key segment) flat indices of every segment pair whose key range may meet: for each query
    segment, the key positions its queries may see (MaskRule.key_range), against the key segments there (a range
    query when segments are disjoint intervals; every key segment otherwise, e.g. striped)."""
    flat = np.flatnonzero(s.length.ravel() > 0)
    first, last = s.start.ravel()[flat], s.last.ravel()[flat]
    lo, _ = rule.key_bounds(first)
    _, hi = rule.key_bounds(last)
    order = np.argsort(first, kind="stable")
    f_sorted, l_sorted = first[order], last[order]
    disjoint = bool((s.stride.ravel()[flat] == 1).all()) and bool((f_sorted[1:] > l_sorted[:-1]).all())
    if disjoint:
        i0 = np.searchsorted(l_sorted, lo, side="left")
        i1 = np.searchsorted(f_sorted, hi, side="right")
    else:
        i0, i1 = np.zeros(len(flat), np.int64), np.full(len(flat), len(flat))
    counts = np.maximum(i1 - i0, 0)
    q_seg = np.repeat(flat, counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    k_seg = flat[order[np.repeat(i0, counts) + offsets]]
    return q_seg, k_seg


def _closed_forms(s: _Segments, rule: MaskRule, qf: np.ndarray, kf: np.ndarray):
    """Per segment pair (flat indices): (may, complex, kind, q_lo, q_hi, k_lo, k_hi); kind 0 none, 1 FULL,
    2 CAUSAL (the closed forms of the module docstring)."""
    flat = lambda x: x.ravel()  # noqa: E731
    a, lq, t, q0 = (flat(x)[qf] for x in (s.start, s.length, s.stride, s.local))
    b, lk, tk, k0 = (flat(x)[kf] for x in (s.start, s.length, s.stride, s.local))
    q_last, k_last = flat(s.last)[qf], flat(s.last)[kf]
    may = (lk > 0) & (lq > 0)
    if rule.causal:
        may &= b <= q_last
    if rule.window is not None:
        may &= a - k_last < rule.window
    simple = may & (tk == t)
    if rule.documents:
        qd0, qd1 = flat(s.doc_first)[qf], flat(s.doc_last)[qf]
        kd0, kd1 = flat(s.doc_first)[kf], flat(s.doc_last)[kf]
        may &= (kd1 >= qd0) & (kd0 <= qd1)
        simple &= may & (qd0 == qd1) & (kd0 == kd1) & (kd0 == qd0)
    unwindowed = np.ones_like(may) if rule.window is None else (q_last - b < rule.window)
    simple &= unwindowed
    d = np.floor_divide(a - b, t)  # causal: key j visible to query i iff j <= i + d
    if rule.causal:
        full = simple & (k_last <= a)
        causal = simple & ~full & (lk == lq) & (d <= 0)
    else:
        full, causal = simple, np.zeros_like(simple)
    q_lo = np.where(full, q0, np.where(causal, q0 - d, 0))
    q_hi = np.where(full | causal, q0 + lq, 0)
    k_lo = np.where(full | causal, k0, 0)
    k_hi = np.where(full, k0 + lk, np.where(causal, k0 + lk + d, 0))
    if rule.documents:
        # Keys all before the queries (or no causality) and no window cut: what one side's single document meets
        # of the other side is one run of rows (documents are intervals), so the block is FULL in closed form.
        before = may & ~(full | causal) & (tk == t) & unwindowed & ((k_last <= a) if rule.causal else True)
        starts = np.concatenate([[0], np.asarray(rule.doc_ends[:-1], np.int64)])
        ends = np.asarray(rule.doc_ends, np.int64)
        rows_of = (kd0 == kd1) & before  # the key segment lies in one document: the query rows in it
        r_lo = np.clip(-((a - starts[kd0]) // t), 0, lq)
        r_hi = np.clip(-((a - ends[kd0]) // t), 0, lq)
        cols_of = (qd0 == qd1) & before & ~rows_of  # the query segment lies in one: the key rows in it
        c_lo = np.clip(-((b - starts[qd0]) // t), 0, lk)
        c_hi = np.clip(-((b - ends[qd0]) // t), 0, lk)
        rows_of &= r_hi > r_lo
        cols_of &= c_hi > c_lo
        empty = before & (kd0 == kd1) & ~rows_of | before & ~(kd0 == kd1) & (qd0 == qd1) & ~cols_of
        q_lo = np.where(rows_of, q0 + r_lo, np.where(cols_of, q0, q_lo))
        q_hi = np.where(rows_of, q0 + r_hi, np.where(cols_of, q0 + lq, q_hi))
        k_lo = np.where(rows_of, k0, np.where(cols_of, k0 + c_lo, k_lo))
        k_hi = np.where(rows_of, k0 + lk, np.where(cols_of, k0 + c_hi, k_hi))
        full = full | rows_of | cols_of
        may = may & ~empty
    kind = np.where(full, _FULL, np.where(causal, _CAUSAL, _NONE))
    return may, may & ~(full | causal), (kind, q_lo, q_hi, k_lo, k_hi)


@lru_cache(maxsize=16)
def pair_table(mask, layout, seq: int, world: int, docs: str = "none") -> PairTable:
    """The pair classes of a ring under a document or window mask (cached)."""
    rule = mask_rule(mask, docs, seq)
    layout = resolve_layout(layout, seq, world, rule)
    s = _Segments(layout, seq, world, rule)
    matrix = np.zeros((world, world), np.int32)
    classes: list[PairClass] = [SKIP]
    by_cost: dict[tuple, int] = {}

    def add(cls: PairClass) -> int:
        key = (cls.kind, tuple((b.kind, b.work_pairs, b.visible_pairs, b.q_len, b.k_len) for b in cls.blocks))
        index = by_cost.get(key)
        if index is None:
            index = by_cost[key] = len(classes)
            classes.append(cls)
        return index

    def plan_class(q: int, k: int) -> int:
        return add(_class_of(plan_pair(s.segs[q], s.segs[k], rule)))

    qf, kf = _candidates(s, rule)
    may, complex_, fields = _closed_forms(s, rule, qf, kf)
    q_rank, k_rank = qf // s.m, kf // s.m
    slot = (qf % s.m) * s.m + kf % s.m  # which (query segment, key segment) of the pair
    pair = q_rank * world + k_rank
    # Two 64-bit hashes of each rank pair's block set (wrapping sums; equal sets, equal hashes).
    weights = np.random.default_rng(0).integers(1, 1 << 62, size=(2, s.m * s.m, 5), dtype=np.int64)
    with np.errstate(over="ignore"):
        terms = [sum(f * weights[h, slot, i] for i, f in enumerate(fields)) for h in range(2)]
    order = np.argsort(pair, kind="stable")
    pair_sorted = pair[order]
    starts = np.flatnonzero(np.r_[True, pair_sorted[1:] != pair_sorted[:-1]]) if len(pair) else np.zeros(0, int)
    pairs = pair_sorted[starts]
    any_may = np.maximum.reduceat(may[order].astype(np.int8), starts) > 0 if len(pair) else np.zeros(0, bool)
    any_complex = np.maximum.reduceat(complex_[order].astype(np.int8), starts) > 0 if len(pair) else any_may
    with np.errstate(over="ignore"):
        keys = np.stack([np.add.reduceat(t[order], starts) for t in terms], axis=1) if len(pair) else None
    simple = any_may & ~any_complex
    if simple.any():
        _, first, inverse = np.unique(keys[simple], axis=0, return_index=True, return_inverse=True)
        chosen = pairs[simple]
        ids = np.array([plan_class(int(chosen[i] // world), int(chosen[i] % world)) for i in first], np.int32)
        matrix.ravel()[chosen] = ids[inverse.ravel()]
    for p in pairs[any_complex]:
        matrix.ravel()[p] = plan_class(int(p // world), int(p % world))
    matrix.setflags(write=False)
    return PairTable(classes=tuple(classes), matrix=matrix)


__all__ = ["SKIP", "PairTable", "pair_table"]
