"""The interval arithmetic under an import's evidence (ringbench/traces/evidence.py), against the walks that define
it: ``subtract`` (an interval minus the cuts, piece by piece) and ``classify_gaps`` (a gap walked forward through
the completions observed in it). The module's functions are vectorised; these walks are the specification, on
random interval sets with touching, nested and zero-length pieces."""

from __future__ import annotations

import numpy as np
import pytest

from ringbench.traces.evidence import WAIT_TOL_NS, classify_gaps, subtract, union


def walk_subtract(base: np.ndarray, cut: np.ndarray) -> np.ndarray:
    out = []
    for start, end in base:
        cursor = start
        for cut_start, cut_end in cut:
            if cut_start >= end:
                break
            if cut_start > cursor:
                out.append((cursor, cut_start))
            cursor = max(cursor, cut_end)
        if cursor < end:
            out.append((cursor, end))
    return np.array(out, np.int64).reshape(-1, 2)


def walk_gaps(gaps, times, done, ids, late):
    waits, own = [], []
    observed = sorted(range(len(times)), key=lambda i: times[i])  # stable: ties keep their order
    for g0, g1 in gaps:
        cursor = g0
        later = [g[0] for g in gaps if g[0] > g0]
        for i in observed:
            # an observation belongs to the last gap starting at or before it, if it ends within WAIT_TOL_NS
            if times[i] < g0 or (later and times[i] >= min(later)) or times[i] > g1 + WAIT_TOL_NS:
                continue
            seen = min(times[i], g1)
            if seen > cursor:
                if times[i] - done[i] <= late[i]:  # observed about when it completed: the rank was waiting
                    waits.append((cursor, seen, ids[i]))
                else:  # observed well after it completed: the rank was busy with its own work
                    own.append((cursor, seen))
                cursor = seen
        if g1 > cursor:
            own.append((cursor, g1))
    return np.array(waits, np.int64).reshape(-1, 3), np.array(own, np.int64).reshape(-1, 2)


def _intervals(rng, n: int, disjoint: bool) -> np.ndarray:
    starts = np.sort(rng.integers(0, 60, n))
    pieces = np.c_[starts, starts + rng.integers(0, 10, n)].astype(np.int64)
    return union(pieces[:, 0], pieces[:, 1]) if disjoint else pieces


@pytest.mark.parametrize("seed", range(4))
def test_subtract_is_the_walk_of_each_interval_through_the_cuts(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        base = _intervals(rng, int(rng.integers(0, 7)), disjoint=bool(rng.integers(2)))
        cut = _intervals(rng, int(rng.integers(0, 7)), disjoint=True)
        if len(cut) and rng.random() < 0.3:  # a zero-length cut splits what it lies inside
            at = int(rng.integers(len(cut)))
            cut[at, 1] = cut[at, 0]
        np.testing.assert_array_equal(subtract(base, cut), walk_subtract(base, cut), err_msg=f"{base} - {cut}")


def test_a_zero_length_cut_splits_an_interval():
    np.testing.assert_array_equal(subtract(np.array([[0, 10]]), np.array([[4, 4]])), [[0, 4], [4, 10]])


@pytest.mark.parametrize("seed", range(4))
def test_classify_gaps_is_the_walk_through_each_gap(seed):
    rng = np.random.default_rng(100 + seed)
    for _ in range(300):
        starts = np.sort(rng.integers(0, 100_000, int(rng.integers(0, 6))))
        gaps = union(starts, starts + rng.integers(0, 30_000, len(starts)))
        count = int(rng.integers(0, 10))
        times = rng.integers(-1_000, 140_000, count).astype(np.int64)
        if count and rng.random() < 0.3:
            times[:] = times[0]  # observations at one moment keep their order
        done = times - rng.integers(-5_000, 40_000, count)
        ids, late = rng.integers(0, 50, count), rng.uniform(0, 20_000, count)
        expected = walk_gaps(gaps.tolist(), times.tolist(), done.tolist(), ids.tolist(), late.tolist())
        found = classify_gaps(gaps, times, done, ids, late)
        np.testing.assert_array_equal(found[0], expected[0], err_msg=f"waits: {gaps} {times}")
        np.testing.assert_array_equal(found[1], expected[1], err_msg=f"own: {gaps} {times}")
