"""The one link model: what the transfers of one ring step cost on a topology, NIC sharing included.

Every rank of a ring sends its block to its successor at the same time, so all of a ring's hops are busy together.
Hop p (ring position p sends to p + 1) moving ``nbytes`` takes

    transfer_us = latency_us + nbytes * share / (bandwidth_gbps * 1e3)        (bytes / (GB/s * 1e3) = us)

where ``share`` is the number of the ring's NET hops that cross from the same source host to the same destination
host: they share that host pair's network link, each at 1/share of its bandwidth. Hops inside a host are priced
alone (several SYS hops on one socket link, or PCIe switches shared by transfers, are not modelled). The ring step's
communication is its slowest hop (the next step needs every block in hand).

One definition, used by every place that prices a link: the emulated links of a run (`RankFaults.link_delay`), the
simulator (`simulate/case.py`) and its calibration (the delay a run injected), the report's placement section, and
`recommend`'s predicted speedup.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def transfer_us(latency_us, bandwidth_gbps, nbytes, share=1):
    """Microseconds to move ``nbytes`` over a link shared by ``share`` transfers (scalars or numpy arrays)."""
    return latency_us + nbytes * share / (bandwidth_gbps * 1e3)


def net_shares(hosts: Sequence[Hashable], net: Sequence[bool], ring: Sequence[int]) -> np.ndarray:
    """(N,) per sending position p: how many of the ring's NET hops go from p's host to p+1's host (1 elsewhere).

    ``hosts[rank]``: the host of each rank; ``net[p]``: hop p (ring[p] -> ring[p+1]) is a NET link.
    """
    world = len(ring)
    if world < 2:
        return np.ones(world)
    names = {name: index for index, name in enumerate(dict.fromkeys(hosts))}
    host = np.array([names[hosts[int(rank)]] for rank in ring])
    pair = host * len(names) + np.roll(host, -1)
    crosses = np.asarray(net, dtype=bool)
    counts = np.bincount(pair[crosses], minlength=len(names) ** 2)
    return np.where(crosses, counts[pair], 1).astype(float)


@dataclass(frozen=True, kw_only=True, slots=True)
class RingLinks:
    """The hops of one ring on one topology, indexed by sending position p (p sends to p + 1)."""

    ring: tuple[int, ...]
    src: np.ndarray
    """(N,) rank sending at position p."""
    dst: np.ndarray
    """(N,) rank receiving from position p."""
    labels: tuple[str, ...]
    """Link class of each hop (``NV4``, ``SYS``, ``NET``, ``measured``)."""
    latency_us: np.ndarray
    bandwidth_gbps: np.ndarray
    """(N,) each hop's own bandwidth, before sharing."""
    net: np.ndarray
    """(N,) bool: the hop crosses between hosts."""
    shares: np.ndarray
    """(N,) transfers sharing the hop's link in one ring step (1 unless a NET hop shares its host pair's link)."""

    def transfer_us(self, nbytes: float) -> np.ndarray:
        """(N,) microseconds each hop takes to move ``nbytes`` while every hop of the step moves its block."""
        return transfer_us(self.latency_us, self.bandwidth_gbps, nbytes, self.shares)

    def alone_us(self, nbytes: float) -> np.ndarray:
        """(N,) the same, each hop priced alone (no sharing)."""
        return transfer_us(self.latency_us, self.bandwidth_gbps, nbytes)

    def step_us(self, nbytes: float) -> float:
        """One ring step's communication: its slowest hop, sharing included (0 for a ring without hops)."""
        return float(self.transfer_us(nbytes).max()) if len(self.src) else 0.0

    def into(self, values: np.ndarray) -> np.ndarray:
        """``values`` per sending position re-indexed by receiving position (the hop into p comes from p - 1)."""
        return np.roll(np.asarray(values), 1)

    def shared_classes(self) -> dict[str, int]:
        """Class label -> the most transfers sharing one link of that class (only classes with sharing)."""
        out: dict[str, int] = {}
        for label, share in zip(self.labels, self.shares, strict=True):
            if share > 1:
                out[label] = max(out.get(label, 1), int(share))
        return out


def ring_links(
    topology, ring: Sequence[int], class_costs: Mapping[str, tuple[float, float]] | None = None
) -> RingLinks:
    """The hops of ``ring`` on ``topology`` (a ringbench.topology.Topology with one device per rank).

    ``class_costs``: (latency_us, bandwidth_gbps) per class label that replace the topology's for that class (a
    calibration that measured it); other links keep the topology's cost model (measured costs where given).
    """
    from ringbench.topology.links import LinkKind

    ring = tuple(int(rank) for rank in ring)
    world = len(ring)
    src = np.asarray(ring, dtype=np.int64)
    dst = np.roll(src, -1)
    if world < 2:
        empty = np.zeros(0)
        return RingLinks(ring=ring, src=src[:0], dst=dst[:0], labels=(), latency_us=empty, bandwidth_gbps=empty,
                         net=np.zeros(0, bool), shares=empty)  # fmt: skip
    links = [topology.link(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
    labels = tuple(link.label for link in links)
    priced: dict[int, tuple[float, float]] = {}  # sources share one Link object among many pairs
    latency, bandwidth = np.empty(world), np.empty(world)
    for p, link in enumerate(links):
        cost = priced.get(id(link))
        if cost is None:
            given = class_costs.get(labels[p]) if class_costs else None
            cost = priced[id(link)] = given if given is not None else topology.cost_model.latency_bandwidth(link)
        latency[p], bandwidth[p] = cost
    net = np.array([link.kind is LinkKind.NET for link in links])
    hosts = [device.host for device in topology.devices]
    return RingLinks(ring=ring, src=src, dst=dst, labels=labels, latency_us=latency, bandwidth_gbps=bandwidth,
                     net=net, shares=net_shares(hosts, net, ring))  # fmt: skip


__all__ = ["RingLinks", "net_shares", "ring_links", "transfer_us"]
