"""Placements from a topology: which ranks form each strategy's groups, and in which order each of its rings runs.

Per-host groups matter more than rank order for these strategies: Ulysses wants its all-to-all inside a host, the
double ring its inner ring inside a host, and the hybrid's ring crosses hosts once per group. From the topology's
hosts (NVML, nvidia-smi or YAML; a launched run's meta.json records the hosts it ran on):

  hosts        ranks host by host, each host's in the order of its best path (recommend's optimizer on the
               host's devices), cut into groups: groups inside a host when they fit (U or W divides the GPUs per
               host), whole hosts otherwise; the groups then ordered by recommend's ring over the groups' first
               ranks (the cross rings follow it)
  interleaved  the same host-major list dealt round-robin: group g takes every G-th rank (its ranks on as many
               hosts as possible; the rings across groups stay inside hosts)

Every ring inside a strategy (the ring itself, each inner ring, each cross ring) is then one sub-topology's ring;
``rings`` lists them with their hops' link classes, for ``ringbench plan`` and the report.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ringbench.fmt import ring_text
from ringbench.topology.model import Device, Topology
from ringbench.topology.optimize import recommend

RECOMMEND_BUDGET_S = 0.5  # per ring inside a strategy (the whole plan must answer in seconds)


def sub_topology(topology: Topology, ranks: list[int]) -> Topology:
    """The devices ``ranks`` (in that order) and the links between them, renumbered 0..len-1."""
    devices = tuple(
        Device(rank=i, host=topology.devices[r].host, local_index=topology.devices[r].local_index,
               numa_node=topology.devices[r].numa_node, name=topology.devices[r].name, nic=topology.devices[r].nic)
        for i, r in enumerate(ranks)
    )  # fmt: skip
    links = tuple(tuple(None if a == b else topology.links[a][b] for b in ranks) for a in ranks)
    return Topology(devices=devices, links=links, cost_model=topology.cost_model, source=topology.source)


def best_ring(topology: Topology, ranks: list[int]) -> list[int]:
    """recommend's ring over ``ranks`` (exact up to 12 devices), as the ranks themselves, from ranks[0]."""
    ranks = list(ranks)
    if len(ranks) <= 2:
        return ranks
    cost = _costs(topology)[np.ix_(ranks, ranks)]
    key = (id(topology), cost.tobytes(), cost.shape)
    local = _RINGS.get(key)
    if local is None:  # equal link costs (every host of one board type) share one solve
        local = list(recommend(sub_topology(topology, ranks), time_budget_s=RECOMMEND_BUDGET_S).order)
        _RINGS[key] = local
    return [ranks[i] for i in local]


_RINGS: dict[tuple, list[int]] = {}
_COSTS: dict[int, tuple[Topology, np.ndarray]] = {}


def _costs(topology: Topology) -> np.ndarray:
    """The topology's cost matrix, computed once per topology object."""
    entry = _COSTS.get(id(topology))
    if entry is None or entry[0] is not topology:
        entry = _COSTS[id(topology)] = (topology, topology.cost_matrix())
    return entry[1]


def host_major(topology: Topology) -> list[int]:
    """Ranks host by host (hosts in first-appearance order), each host's along its best ring."""
    by_host: dict[str, list[int]] = {}
    for device in topology.devices:
        by_host.setdefault(device.host, []).append(device.rank)
    return [rank for ranks in by_host.values() for rank in best_ring(topology, ranks)]


def placements(topology: Topology, size: int) -> dict[str, list[int]]:
    """Named placements for groups of ``size``: ``hosts`` and ``interleaved`` (module docstring)."""
    world = topology.world
    ordered = host_major(topology)
    count = world // size
    groups = [ordered[g * size : (g + 1) * size] for g in range(count)]
    if count > 2:
        leaders = [group[0] for group in groups]
        ring = best_ring(topology, leaders)
        groups = [groups[leaders.index(leader)] for leader in ring]
    out = {"hosts": [rank for group in groups for rank in group]}
    if 1 < size < world:
        dealt = [ordered[g::count] for g in range(count)]
        out["interleaved"] = [rank for group in dealt for rank in group]
    return out


def rings(topology: Topology | None, strategy, placement: list[int] | None, world: int,
          order: list[int] | None = None) -> list[dict]:  # fmt: skip
    """The rings inside a strategy on this placement: name, ranks (one example of each kind), and hop classes."""
    from ringbench.engine.groups import Groups

    def describe(name: str, ring: list[int], copies: int) -> dict:
        classes = Counter()
        if topology is not None and len(ring) > 1:
            for p, rank in enumerate(ring):
                classes[topology.link(rank, ring[(p + 1) % len(ring)]).label] += 1
        return {"ring": name, "ranks": ring_text(ring), "copies": copies, "hops": dict(classes)}

    kind = strategy.kind
    if kind in ("ring", "allgather"):
        return [describe("ring", order or list(range(world)), 1)]
    groups = Groups(tuple(placement), strategy.group_size(world))
    first = groups.placement[0]
    out = []
    if kind in ("ulysses", "hybrid"):
        out.append(describe("all-to-all group", list(groups.group_of(first)), groups.count) | {"hops": _a2a(
            topology, groups.group_of(first))})  # fmt: skip
        if groups.count > 1:
            out.append(describe("ring across groups", groups.cross_ring(first), groups.size))
    else:
        out.append(describe("inner ring", groups.inner_ring(first), groups.count))
        if groups.count > 1:
            out.append(describe("outer ring", groups.cross_ring(first), groups.size))
    return out


def _a2a(topology: Topology | None, members) -> dict:
    if topology is None:
        return {}
    return dict(Counter(topology.link(a, b).label for a in members for b in members if a != b))


__all__ = ["best_ring", "host_major", "placements", "rings", "sub_topology"]
