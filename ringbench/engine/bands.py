"""One band of diagonals, lo <= i - j <= hi on an (Lq x Lk) block, as a handful of FULL / CAUSAL / PARTIAL pieces.

Within one document a query segment and a key segment of the same stride see each other along a band (the mask
plan, ringbench/engine/plan.py, derives lo from causality and hi from the window). ``band_items`` cuts it:

  * rows only the causal edge cuts      -> a FULL part left of the diagonal and one CAUSAL square on it (and
                                           the FULL rows below the square when the key block ends first)
  * rows the window edge cuts as well   -> strips of T rows (T <= hi - lo + 1), each a PARTIAL triangle along
                                           the window edge, a FULL middle and a CAUSAL square along the causal
                                           edge (a middle smaller than one call joins the triangle); or, for bands
                                           thinner than a strip, one PARTIAL block per strip

T is the candidate (the band's width, a half or a quarter of it; or 1, 2 or 4 thin strips) of least cost, the cost
being the score entries computed (CAUSAL at half) plus CALL_ENTRIES per kernel call.
"""

from __future__ import annotations

CALL_ENTRIES = 1 << 14  # what one kernel call costs, in score entries (a 128 x 128 tile): launch and merge overhead


def _ceil_div(a: int, b: int) -> int:
    return -((-a) // b)


def _lower(r0: int, r1: int, lk: int, lo: int) -> list[tuple]:
    """Rows [r0, r1) that only the causal edge (j <= i - lo) cuts: a FULL part and a CAUSAL square (and the FULL
    rows below the square when the key piece ends first). Items: (kind, i0, i1, j0, j1)."""
    out = []
    full_hi = min(lk, r0 - lo)
    if full_hi > 0:
        out.append(("full", r0, r1, 0, full_hi))
    return out + _causal_edge(r0, r1, lk, lo)


def _strips(r0: int, r1: int, lk: int, lo: int, hi: int, height: int, call_entries: int) -> list[tuple]:
    """Rows [r0, r1) (all cut by the window edge j >= i - hi) in strips of ``height`` <= hi - lo + 1 rows: each a
    PARTIAL triangle along the window edge, a FULL middle and a CAUSAL square along the causal edge.

    A FULL middle smaller than one call (``call_entries``) joins the triangle beside it: its entries are computed
    either way, so the join saves a call and wastes nothing. (Left alone, a window's last strip ends in a FULL
    sliver one key wide -- 255 x 1 entries for W = S/N = 512 -- a call that costs the kernel's whole overhead.)"""
    out = []
    for r in range(r0, r1, height):
        end = min(r + height, r1)
        left_hi = min(lk, end - 1 - hi)
        full_lo, full_hi = max(0, end - 1 - hi), min(lk, r - lo)
        triangle = left_hi > r - hi
        middle = full_hi > full_lo
        if triangle and middle and (end - r) * (full_hi - full_lo) < call_entries and full_lo == left_hi:
            out.append(("partial", r, end, r - hi, full_hi))
        else:
            if triangle:
                out.append(("partial", r, end, r - hi, left_hi))
            if middle:
                out.append(("full", r, end, full_lo, full_hi))
        out += _causal_edge(r, end, lk, lo)
    return out


def _causal_edge(r0: int, r1: int, lk: int, lo: int) -> list[tuple]:
    """Along the causal edge j <= i - lo of rows [r0, r1): a CAUSAL square, and the FULL rows below it."""
    j0 = r0 - lo
    n = min(lk, r1 - lo) - j0
    if n <= 0:
        return []
    return [("causal", r0, r0 + n, j0, j0 + n)] + ([("full", r0 + n, r1, j0, j0 + n)] if r0 + n < r1 else [])


def _thin(r0: int, r1: int, lk: int, lo: int, hi: int, height: int) -> list[tuple]:
    """Rows [r0, r1) in strips of ``height`` rows, each one PARTIAL block over the band's columns in it."""
    return [("partial", r, min(r + height, r1), max(0, r - hi), min(lk, min(r + height, r1) - lo))
            for r in range(r0, r1, height)]  # fmt: skip


def _cost(items: list[tuple], call_entries: int) -> float:
    work = sum((i1 - i0) * (j1 - j0) * (0.5 if kind == "causal" else 1.0) for kind, i0, i1, j0, j1 in items)
    return work + call_entries * len(items)


def band_items(lq: int, lk: int, lo: int | None, hi: int | None, call_entries: int = CALL_ENTRIES) -> list[tuple]:
    """The sub-blocks of the band lo <= i - j <= hi (None: unbounded) on rows [0, lq) x cols [0, lk), as
    (kind, i0, i1, j0, j1) with kind full | causal | partial; [] when nothing is visible."""
    if lo is None and hi is None:
        return [("full", 0, lq, 0, lk)]
    if lo is None:  # a window without causality is not a mode; keep the function total
        lo = -(lk + lq)
    r0 = max(0, lo)
    r1 = lq if hi is None else min(lq, lk + hi)
    if r0 >= r1 or lo > lq - 1:
        return []
    if hi is None or r1 - 1 <= hi:  # no row is cut by the window edge
        return _lower(r0, r1, lk, lo)
    head_end = max(r0, min(r1, hi + 1))  # rows whose window reaches back past key 0
    head = _lower(r0, head_end, lk, lo) if head_end > r0 else []
    rows = r1 - head_end
    width = hi - lo + 1
    candidates = []
    for height in {width, _ceil_div(width, 2), _ceil_div(width, 4)}:
        if 1 <= height <= width:
            candidates.append(_strips(head_end, r1, lk, lo, hi, height, call_entries))
    for parts in (1, 2, 4):
        height = _ceil_div(rows, parts)
        if height > width:
            candidates.append(_thin(head_end, r1, lk, lo, hi, height))
    best = min(candidates, key=lambda items: (_cost(items, call_entries), len(items)))
    return head + best


__all__ = ["CALL_ENTRIES", "band_items"]
