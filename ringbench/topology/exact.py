"""Exact ring orders for small worlds: minimise the worst hop first, then the total (lexicographic).

Lexicographic (max, sum) has no optimal substructure, so it is solved in two stages:
1. the smallest bottleneck B* is the smallest distinct hop cost t for which a Hamiltonian cycle exists using only hops
   of cost <= t (binary search over the sorted distinct costs, each test one Held-Karp run);
2. among cycles using only hops <= B*, the Held-Karp run at t = B* already returns the one of least total.

Held-Karp fixes device 0 as the start and keeps, for every subset of the other n-1 devices and every last device, the
least total of a path from 0 through exactly that subset: O(2^n n^2) time, vectorised with numpy one subset size at a
time (n = 12: 2048 subsets x 11 ends). Costs may be asymmetric: cost[i, j] is the hop i -> j, the ring's direction.
"""

from __future__ import annotations

import numpy as np

MAX_EXACT = 16  # 2^15 x 15 states; beyond this the DP's memory and time grow past what a CLI call should take


def _popcounts(size: int) -> np.ndarray:
    counts = np.zeros(size, dtype=np.int64)
    for bit in range(max(size - 1, 0).bit_length()):
        counts += (np.arange(size) >> bit) & 1
    return counts


def held_karp(cost: np.ndarray, allowed: np.ndarray | None = None) -> tuple[float, list[int]] | None:
    """The least-total Hamiltonian cycle from device 0 using only ``allowed`` hops, or None if there is none.

    Returns (total, order) with order[0] == 0; the cycle is order[0] -> order[1] -> ... -> order[-1] -> order[0].
    """
    world = cost.shape[0]
    if world > MAX_EXACT:
        raise ValueError(f"held_karp: {world} devices is beyond the exact limit of {MAX_EXACT}")
    weights = np.where(allowed if allowed is not None else True, cost, np.inf).astype(np.float64)
    np.fill_diagonal(weights, np.inf)
    if world == 1:
        return 0.0, [0]
    if world == 2:
        total = weights[0, 1] + weights[1, 0]
        return (float(total), [0, 1]) if np.isfinite(total) else None
    others = world - 1  # devices 1..world-1 are bits 0..others-1
    inner = weights[1:, 1:]  # (others, others): hop between two non-start devices
    subsets = 1 << others
    best = np.full((subsets, others), np.inf)  # best[mask, j]: least total 0 -> .. -> j+1 visiting exactly mask
    parent = np.full((subsets, others), -1, dtype=np.int64)
    for j in range(others):
        best[1 << j, j] = weights[0, j + 1]
    popcount = _popcounts(subsets)
    masks = np.arange(subsets)
    for size in range(2, others + 1):
        layer = masks[popcount == size]
        for j in range(others):
            ending = layer[(layer >> j) & 1 == 1]
            previous = ending ^ (1 << j)
            candidates = best[previous] + inner[:, j]  # (len(ending), others): come to j from each i
            choice = np.argmin(candidates, axis=1)
            best[ending, j] = candidates[np.arange(len(ending)), choice]
            parent[ending, j] = choice
    full = subsets - 1
    closing = best[full] + weights[1:, 0]
    last = int(np.argmin(closing))
    total = float(closing[last])
    if not np.isfinite(total):
        return None
    path = []
    mask = full
    while last >= 0:
        path.append(last + 1)
        previous = int(parent[mask, last])
        mask ^= 1 << last
        last = previous
    return total, [0, *reversed(path)]


def solve_exact(cost: np.ndarray) -> tuple[float, float, list[int]]:
    """(worst hop, total, order) of the lexicographically best ring; order starts at device 0."""
    world = cost.shape[0]
    if world == 1:
        return 0.0, 0.0, [0]
    off_diagonal = ~np.eye(world, dtype=bool)
    # Every device needs one outgoing and one incoming hop, so B* is at least the worst of their cheapest ones.
    masked = np.where(off_diagonal, cost, np.inf)
    lower = max(masked.min(axis=1).max(), masked.min(axis=0).max())
    thresholds = np.unique(cost[off_diagonal])
    thresholds = thresholds[thresholds >= lower]
    low, high = 0, len(thresholds) - 1
    found = held_karp(cost, cost <= thresholds[high])  # every hop allowed: always feasible (complete graph)
    assert found is not None
    while low < high:
        middle = (low + high) // 2
        attempt = held_karp(cost, cost <= thresholds[middle])
        if attempt is None:
            low = middle + 1
        else:
            high, found = middle, attempt
    total, order = found
    hops = cost[order, np.roll(order, -1)]
    return float(hops.max()), float(total), order
