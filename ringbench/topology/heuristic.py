"""Ring orders for large worlds: hierarchical construction, then lexicographic local search.

1. Within each host, the best Hamiltonian *path* (the ring enters a host once and leaves it once). Up to the exact
   limit this is exact: add a dummy device joined to every device at zero cost; a ring through the dummy is a path with
   free ends, and zero-cost hops change neither its worst hop nor its total. Hosts with identical link matrices share
   one solve (a 128-host cluster of one board type is solved once).
2. Hosts in a ring: the cost from host g to host h is the hop from g's path end to h's path start; exact for up to the
   exact limit of hosts, nearest neighbour plus local search beyond it.
3. The whole ring is improved by 2-opt (symmetric costs only: it reverses a segment) and or-opt (move a run of 1 to 3
   devices elsewhere, direction kept, so it is valid for asymmetric costs), until no move helps or time runs out.

Lexicographic local search: with B the current worst hop, hops above B are forbidden and hops equal to B carry a
penalty larger than any total of cheaper hops, so minimising the penalised total first removes worst hops (and lowers
B when the last one goes), then lowers the total. No guarantee of optimality: the result is a good ring, not the best.
"""

from __future__ import annotations

import time

import numpy as np

from ringbench.topology.exact import solve_exact


def _relative_tolerance(cost: np.ndarray) -> float:
    return 1e-9 * max(float(np.abs(cost).max()), 1e-12)


def _penalised(cost: np.ndarray, bottleneck: float, tolerance: float) -> np.ndarray:
    world = cost.shape[0]
    penalty = world * bottleneck + 1.0  # more than the total of any `world` hops cheaper than the bottleneck
    weights = np.where(cost < bottleneck - tolerance, cost, cost + penalty)
    weights[cost > bottleneck + tolerance] = np.inf
    np.fill_diagonal(weights, np.inf)
    return weights


def _best_two_opt(weights: np.ndarray, order: np.ndarray, valid: np.ndarray) -> tuple[float, int, int]:
    """Best segment reversal: replace hops (a_i, a_i+1), (a_j, a_j+1) by (a_i, a_j), (a_i+1, a_j+1)."""
    here, after = order, np.roll(order, -1)
    current = weights[here, after]
    delta = weights[np.ix_(here, here)] + weights[np.ix_(after, after)] - current[:, None] - current[None, :]
    delta = np.where(valid, delta, np.inf)
    flat = int(np.argmin(delta))
    i, j = divmod(flat, len(order))
    return float(delta[i, j]), i, j


def _best_or_opt(weights: np.ndarray, order: np.ndarray, run: int) -> tuple[float, int, int]:
    """Best move of the run order[i .. i+run-1] to between order[k] and order[k+1], keeping its direction."""
    world = len(order)
    positions = np.arange(world)
    first = order
    last = order[(positions + run - 1) % world]
    before = order[(positions - 1) % world]
    beyond = order[(positions + run) % world]
    gain = weights[before, first] + weights[last, beyond] - weights[before, beyond]  # (world,) saved by removing run i
    nxt = np.roll(order, -1)
    insert = (
        weights[order[None, :], first[:, None]] + weights[last[:, None], nxt[None, :]] - weights[order, nxt][None, :]
    )
    offset = (positions[None, :] - positions[:, None]) % world  # hop k relative to run start i
    valid = (offset >= run) & (offset != world - 1)
    delta = np.where(valid, insert - gain[:, None], np.inf)
    flat = int(np.argmin(delta))
    i, k = divmod(flat, world)
    return float(delta[i, k]), i, k


def _apply_or_opt(order: np.ndarray, i: int, k: int, run: int) -> np.ndarray:
    world = len(order)
    moved = [int(order[(i + step) % world]) for step in range(run)]
    anchor = int(order[k])
    rest = [int(order[(i + run + step) % world]) for step in range(world - run)]
    at = rest.index(anchor) + 1
    return np.array(rest[:at] + moved + rest[at:], dtype=np.int64)


def local_search(cost: np.ndarray, order: list[int], deadline: float) -> list[int]:
    """Improve ``order`` lexicographically (worst hop, then total) until no move helps or ``deadline`` passes."""
    world = len(order)
    order_arr = np.asarray(order, dtype=np.int64)
    if world < 5:
        return list(order)
    tolerance = _relative_tolerance(cost)
    symmetric = bool(np.allclose(cost, cost.T, rtol=1e-12, atol=0))
    valid = np.triu(np.ones((world, world), dtype=bool), k=2)
    valid[0, world - 1] = False  # those two hops share a device: not a reversal
    bottleneck = None
    while time.monotonic() < deadline:
        hops = cost[order_arr, np.roll(order_arr, -1)]
        if bottleneck is None or hops.max() < bottleneck - tolerance:
            bottleneck = float(hops.max())
            weights = _penalised(cost, bottleneck, tolerance)
        moves = []
        if symmetric:
            delta, i, j = _best_two_opt(weights, order_arr, valid)
            moves.append((delta, "2opt", i, j, 0))
        for run in (1, 2, 3):
            if world > run + 2:
                delta, i, k = _best_or_opt(weights, order_arr, run)
                moves.append((delta, "oropt", i, k, run))
        delta, kind, i, j, run = min(moves, key=lambda move: move[0])
        if not delta < -tolerance:
            break
        if kind == "2opt":
            order_arr = order_arr.copy()
            order_arr[i + 1 : j + 1] = order_arr[i + 1 : j + 1][::-1]
        else:
            order_arr = _apply_or_opt(order_arr, i, j, run)
    return [int(device) for device in order_arr]


def nearest_neighbour(cost: np.ndarray, start: int = 0) -> list[int]:
    """Greedy ring: from each device go to the cheapest unvisited one (ties: lowest index)."""
    world = cost.shape[0]
    visited = np.zeros(world, dtype=bool)
    order = [start]
    visited[start] = True
    for _ in range(world - 1):
        row = np.where(visited, np.inf, cost[order[-1]])
        order.append(int(np.argmin(row)))
        visited[order[-1]] = True
    return order


def best_path(cost: np.ndarray, exact_limit: int, deadline: float) -> list[int]:
    """A Hamiltonian path with free ends, lexicographically best (exact up to ``exact_limit`` devices)."""
    world = cost.shape[0]
    if world <= 2:
        return list(range(world))
    if world + 1 <= exact_limit:
        padded = np.zeros((world + 1, world + 1))
        padded[1:, 1:] = cost  # device 0 is the dummy, joined to all at zero cost
        _, _, order = solve_exact(padded)
        return [device - 1 for device in order[1:]]
    ring = local_search(cost, nearest_neighbour(cost), deadline)
    hops = cost[ring, np.roll(ring, -1)]
    cut = int(np.argmax(hops))  # drop the worst hop of the ring: the path starts after it
    return ring[cut + 1 :] + ring[: cut + 1]


def ring_order(cost: np.ndarray, exact_limit: int, deadline: float) -> list[int]:
    """A lexicographically good ring over a flat cost matrix (exact when small enough)."""
    if cost.shape[0] <= exact_limit:
        return solve_exact(cost)[2]
    return local_search(cost, nearest_neighbour(cost), deadline)


def hierarchical(cost: np.ndarray, host_of: list[int], exact_limit: int, time_budget_s: float) -> list[int]:
    """Ring over all devices: best path within each host, hosts ordered, then local search on the whole ring."""
    deadline = time.monotonic() + time_budget_s
    hosts = list(dict.fromkeys(host_of))
    members = {host: [device for device, owner in enumerate(host_of) if owner == host] for host in hosts}
    solved: dict[bytes, list[int]] = {}
    paths = []
    for host in hosts:
        devices = members[host]
        sub = cost[np.ix_(devices, devices)]
        key = sub.tobytes() + bytes(str(sub.shape), "ascii")
        if key not in solved:
            solved[key] = best_path(sub, exact_limit, deadline)
        paths.append([devices[local] for local in solved[key]])
    if len(paths) == 1:
        order = paths[0]
    else:
        ends = np.array([path[-1] for path in paths])
        starts = np.array([path[0] for path in paths])
        between = cost[np.ix_(ends, starts)]  # between[g, h]: leave host g, enter host h
        np.fill_diagonal(between, 0.0)
        host_ring = ring_order(between, exact_limit, deadline)
        order = [device for host in host_ring for device in paths[host]]
    return local_search(cost, order, deadline)
