"""The one link model: what the transfers of one exchange cost on a topology, NIC sharing included.

Every transfer of every strategy -- a ring's hops, an all-to-all's chunks, the double ring's outer ring, the
all-gather's ring steps -- is one *flow* (src, dst) of an *exchange*: the flows that move at once. A flow moving
``nbytes`` takes

    transfer_us = latency_us + nbytes * share / (bandwidth_gbps * 1e3)        (bytes / (GB/s * 1e3) = us)

with the link's (or its class's) latency and bandwidth, and ``share`` the number of the exchange's flows that
divide the resource the flow is limited by:

  across hosts (NET)  the NICs: a flow leaves through its source GPU's NIC and enters through its destination
                      GPU's NIC (``Topology.nic_ids``: which GPUs share a NIC; default one per host); ``share`` is
                      the larger of the NET flows leaving that source NIC and those entering that destination NIC.
                      The NET class's bandwidth is one NIC's. An all-to-all across hosts thus shares the host's
                      NICs; a ring between two hosts with one NIC each puts all its crossing hops on it.
  inside a host       the rank's port: the larger of the exchange's flows out of its source and into its
                      destination (a ring: 1; an all-to-all of U: U - 1). ``ports`` may name other owners (an
                      all-to-all priced per class shares per class, a PCIe switch tree's uplink).

NCCL's ring collectives (the all-gather baseline's gather, its backward's all-reduce) are the exception: they
run several channels, each crossing between hosts through another NIC, so a collective's crossing hop draws on every
NIC of its hosts (``collective=True``: the host's NICs together, shared by the collective's crossing hops); its
point-to-point sends and all-to-alls leave through the GPU's own NIC (NCCL's all-to-all cannot aggregate NICs).

A ring step's communication is its slowest hop (the next step needs every block in hand).

One definition, used by every place that prices a link: the emulated links of a run (`RankFaults.link_delay`), the
simulator (`simulate/case.py` rings, `simulate/flows.py` every strategy's exchanges) and its calibration (the
delay a run injected), the report's placement section, and `recommend`'s predicted speedup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def transfer_us(latency_us, bandwidth_gbps, nbytes, share=1):
    """Microseconds to move ``nbytes`` over a link shared by ``share`` transfers (scalars or numpy arrays)."""
    return latency_us + nbytes * share / (bandwidth_gbps * 1e3)


def exchange_shares(src, dst, net, nic, flows=None, flow_net=None, ports=None, flow_ports=None,
                    capacity=None) -> np.ndarray:  # fmt: skip
    """(P,) how many flows of one exchange divide each pair's limiting resource (the module docstring's rule).

    ``src``, ``dst``: (P,) the pairs priced; ``net``: (P,) bool, the pair crosses hosts; ``nic``: (N,) the NIC
    number of every rank (``Topology.nic_ids``). ``flows``: (src, dst) arrays of every flow of the exchange (None:
    the pairs themselves), ``flow_net`` their NET flags. ``ports``/``flow_ports``: ((P,), (P,)) and ((F,), (F,))
    integer owners of the out and in ports of the non-NET pairs and flows (None: the source and destination rank).
    ``capacity``: (max nic + 1,) NICs' worth of bandwidth behind each ``nic`` number (a collective: the host's NIC
    count, with ``nic`` the host), which divides its flows' share (a share below 1: faster than one NIC).
    """
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    net = np.asarray(net, bool)
    if flows is None:
        flows, flow_net, flow_ports = (src, dst), net, ports
    fsrc, fdst = np.asarray(flows[0], np.int64), np.asarray(flows[1], np.int64)
    fnet = np.asarray(flow_net, bool)
    nic = np.asarray(nic, np.int64)
    top = int(max(nic.max(initial=0), src.max(initial=0), dst.max(initial=0), fsrc.max(initial=0),
                  fdst.max(initial=0))) + 1  # fmt: skip
    out_owner, in_owner = (src, dst) if ports is None else ports
    fout_owner, fin_owner = (fsrc, fdst) if flow_ports is None else flow_ports
    span = int(max(top, np.max(out_owner, initial=0) + 1, np.max(in_owner, initial=0) + 1,
                   np.max(fout_owner, initial=0) + 1, np.max(fin_owner, initial=0) + 1))  # fmt: skip

    # keys: a port's owner (non-NET) or a NIC (NET, offset past every owner), egress and ingress apart
    def keys(a, b, owner_out, owner_in, crosses):
        out_key = np.where(crosses, span + nic[a], owner_out)
        in_key = np.where(crosses, span + nic[b], owner_in) + 2 * span
        return out_key, in_key

    f_out, f_in = keys(fsrc, fdst, np.asarray(fout_owner), np.asarray(fin_owner), fnet)
    p_out, p_in = keys(src, dst, np.asarray(out_owner), np.asarray(in_owner), net)
    count_out = np.maximum(_count(f_out, p_out), 1).astype(float)
    count_in = np.maximum(_count(f_in, p_in), 1).astype(float)
    if capacity is not None:
        capacity = np.asarray(capacity, float)
        count_out = np.where(net, count_out / capacity[nic[src]], count_out)
        count_in = np.where(net, count_in / capacity[nic[dst]], count_in)
    return np.maximum(count_out, count_in)


def _count(population: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """How often each of ``keys`` occurs in ``population`` (0 where it does not)."""
    if not len(population):
        return np.zeros(len(keys), np.int64)
    values, counts = np.unique(population, return_counts=True)
    index = np.clip(np.searchsorted(values, keys), 0, len(values) - 1)
    return np.where(values[index] == keys, counts[index], 0)


def net_shares(nic: Sequence[int], net: Sequence[bool], ring: Sequence[int], capacity=None) -> np.ndarray:
    """(N,) per sending position p: how many of the ring's flows share hop p's limit (NET hops: their NICs'
    egress and ingress; hops inside a host: 1).

    ``nic[rank]``: the NIC number of each rank (``Topology.nic_ids``); ``net[p]``: hop p (ring[p] -> ring[p+1])
    crosses hosts; ``capacity``: see ``exchange_shares`` (a collective's hosts' NICs together).
    """
    world = len(ring)
    if world < 2:
        return np.ones(world)
    src = np.asarray(ring, np.int64)
    return exchange_shares(src, np.roll(src, -1), np.asarray(net, bool), np.asarray(nic, np.int64),
                           capacity=capacity)  # fmt: skip


def collective_nics(topology) -> tuple[np.ndarray, np.ndarray]:
    """(nic, capacity) for an NCCL ring collective: every rank's host as its 'NIC', and each host's NIC count."""
    host, nics = topology.host_ids(), topology.nic_ids()
    capacity = np.zeros(int(host.max()) + 1)
    for h in range(len(capacity)):
        capacity[h] = len(np.unique(nics[host == h]))
    return host, capacity


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
    """(N,) transfers sharing the hop's link in one ring step (1 unless a NET hop shares a NIC)."""

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
    topology,
    ring: Sequence[int],
    class_costs: Mapping[str, tuple[float, float]] | None = None,
    collective: bool = False,
) -> RingLinks:
    """The hops of ``ring`` on ``topology`` (a ringbench.topology.Topology with one device per rank).

    ``class_costs``: (latency_us, bandwidth_gbps) per class label that replace the topology's for that class (a
    calibration that measured it); other links keep the topology's cost model (measured costs where given).
    ``collective``: the ring of an NCCL collective, whose crossing hops draw on all their hosts' NICs.
    """
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
    host = topology.host_ids()
    net = host[src] != host[dst]
    nic, capacity = collective_nics(topology) if collective else (topology.nic_ids(), None)
    return RingLinks(ring=ring, src=src, dst=dst, labels=labels, latency_us=latency, bandwidth_gbps=bandwidth,
                     net=net, shares=net_shares(nic, net, ring, capacity))  # fmt: skip


__all__ = ["RingLinks", "collective_nics", "exchange_shares", "net_shares", "ring_links", "transfer_us"]
