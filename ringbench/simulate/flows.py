"""The transfers of one exchange, priced flow by flow as vectors: what a strategy's all-to-alls and rings cost.

An exchange is a set of ``flows`` (src, dst) moving on every rank at once. A flow's transfer is

    latency + bytes x share / bandwidth            (real links)
    local transport, then latency + bytes / (bandwidth / share) as an injected delay   (emulated links)

with ``share`` the number of the exchange's flows that divide its limit, by the one link model's rule
(ringbench.topology.linkmodel.exchange_shares, which emulated links apply too): across hosts, the flows through the
same source NIC or the same destination NIC (the topology says which GPUs share a NIC; the NET class's bandwidth is
one NIC's); inside a host, the rank's other flows (its port). An all-to-all on a topology priced for a GPU
(simulate/priors.py: classes with an all-to-all bandwidth) shares the links inside a host per class instead: a
rank's flows over one class share that class's all-to-all bandwidth, and the flows through several PCIe bridges
(PXB) of one switch tree share the tree's upstream link.

Every array here is indexed by flow; a topology's links are turned into integer codes once (``LinkArrays``), so a
1,024-rank all-to-all (a million flows) is a few vector operations, not a million Python calls.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from ringbench.simulate.costs import Costs
from ringbench.topology.linkmodel import exchange_shares

_ARRAYS: dict[int, tuple] = {}


class LinkArrays:
    """One topology's links as arrays: a code per (src, dst) into per-link-object kind, latency, bandwidths, label;
    each device's host and PCIe switch tree."""

    def __init__(self, topology) -> None:
        from ringbench.topology import LinkKind

        world = topology.world
        links, codes = topology.link_codes()  # each distinct Link object once (the diagonal: None)
        links = list(links)
        if any(link is None for link in links):  # the diagonal: a code of its own, never priced
            none = next(i for i, link in enumerate(links) if link is None)
            links[none] = next(link for link in links if link is not None)
        kinds = list(LinkKind)
        model = topology.cost_model
        self.codes = codes
        self.kind = np.array([kinds.index(link.kind) if link.kind is not None else -1 for link in links], np.int64)
        priced = [model.latency_bandwidth(link) for link in links]
        self.latency_us = np.array([p[0] for p in priced], float)
        self.bandwidth = np.array([p[1] for p in priced], float)
        a2a = [model.alltoall_bandwidth(link) for link in links]
        self.alltoall = np.array([np.nan if value is None else value for value in a2a], float)
        self.labels = [link.label for link in links]
        self.net_code = kinds.index(LinkKind.NET)
        self.pxb_code = kinds.index(LinkKind.PXB)
        self.host = topology.host_ids()
        self.nic = topology.nic_ids()
        pcie = np.isin(self.kind, [kinds.index(LinkKind.PIX), kinds.index(LinkKind.PXB)])
        self.tree = _components(pcie[codes] & ~np.eye(world, dtype=bool))
        self.world = world

    @classmethod
    def of(cls, topology) -> LinkArrays:
        found = _ARRAYS.get(id(topology))
        if found is not None and found[0] is topology:
            return found[1]
        arrays = cls(topology)
        _ARRAYS.clear()
        _ARRAYS[id(topology)] = (topology, arrays)
        return arrays


def _components(joined: np.ndarray) -> np.ndarray:
    """(N,) a component label per device of the (N, N) boolean adjacency ``joined`` (symmetrised)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    _, labels = connected_components(csr_matrix(joined | joined.T), directed=False)
    return labels.astype(np.int64)


def switch_trees(topology) -> np.ndarray:
    """(N,) the PCIe switch tree of each device: devices joined by PIX or PXB links share one."""
    return LinkArrays.of(topology).tree


class Prices:
    """Prices the flows of a strategy's exchanges on one cluster, and counts the bytes each link class carries
    per iteration (``count``)."""

    def __init__(self, costs: Costs, cluster) -> None:
        self.costs, self.cluster = costs, cluster
        self.local = costs.links["local"]
        self.topology = cluster.topology
        self.emulated = self.topology is not None and cluster.emulate_links
        self.bytes_by_class: dict[str, float] = {}
        self._labels: dict[int, tuple] = {}
        self.arrays = LinkArrays.of(self.topology) if self.topology is not None else None

    @property
    def alltoall_by_class(self) -> bool:
        """The topology prices an all-to-all's flows per class (a GPU of the catalogue), on real links."""
        if self.arrays is None or self.emulated:
            return False
        return bool(np.isfinite(self.arrays.alltoall).any())

    def count(self, pairs, nbytes: float, messages: float = 1.0) -> None:
        """``messages`` messages of ``nbytes`` over each (src, dst) of ``pairs``, per iteration."""
        key = id(pairs)
        labels = self._labels.get(key)
        if labels is None or labels[0] is not pairs:
            src, dst = _columns(pairs)
            if self.arrays is None:
                counted = Counter({"local": int((src != dst).sum())})
            else:
                codes = self.arrays.codes[src, dst][src != dst]
                hops = np.bincount(codes, minlength=len(self.arrays.labels))
                counted = Counter()
                for code in np.flatnonzero(hops):
                    counted[self.arrays.labels[code]] += int(hops[code])
            labels = self._labels[key] = (pairs, counted)
        for label, hops in labels[1].items():
            self.bytes_by_class[label] = self.bytes_by_class.get(label, 0.0) + nbytes * messages * hops

    def price(
        self, pairs, nbytes: float, flows, port: int = 1, alltoall: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(transfer ms, injected delay ms) of each of ``pairs`` in an exchange of ``flows`` (module docstring)."""
        src, dst = _columns(pairs)
        local = self.local.ms(nbytes, share=port)
        if self.arrays is None:
            transfer = np.where(src == dst, 0.0, local)
            return transfer, np.zeros(len(src))
        arrays = self.arrays
        by_class = alltoall and self.alltoall_by_class
        code = arrays.codes[src, dst]
        latency, bandwidth = arrays.latency_us[code].copy(), arrays.bandwidth[code].copy()
        share = self._shares(src, dst, code, _columns(flows), by_class)
        same = src == dst
        if self.emulated:  # the run moves it over the local transport, then holds it for the link's price
            delay = (latency + nbytes / (bandwidth / share * 1e3)) / 1e3
            return np.where(same, 0.0, local), np.where(same, 0.0, delay)
        calibrated = np.zeros(len(src), bool)
        for label, cost in self.costs.links.items():
            if label == "local" or label not in arrays.labels:
                continue
            hit = np.isin(code, [i for i, name in enumerate(arrays.labels) if name == label])
            latency[hit], bandwidth[hit] = cost.latency_us, cost.bandwidth_gbps
            calibrated |= hit
        if by_class:
            a2a = arrays.alltoall[code]
            use = np.isfinite(a2a) & ~calibrated
            bandwidth[use] = a2a[use]
        transfer = (latency + nbytes * share / (bandwidth * 1e3)) / 1e3
        return np.where(same, 0.0, transfer), np.zeros(len(src))

    def shares(self, pairs, flows, alltoall: bool = False) -> np.ndarray:
        """(P,) how many of the exchange's ``flows`` divide each of ``pairs``' links."""
        src, dst = _columns(pairs)
        return self._shares(src, dst, self.arrays.codes[src, dst], _columns(flows),
                            alltoall and self.alltoall_by_class)  # fmt: skip

    def _shares(self, src, dst, code, flows, by_class: bool) -> np.ndarray:
        """(P,) how many of the exchange's flows divide each pair's limit (module docstring)."""
        arrays = self.arrays
        fsrc, fdst = flows
        fcode = arrays.codes[fsrc, fdst]
        return exchange_shares(src, dst, arrays.host[src] != arrays.host[dst], arrays.nic, (fsrc, fdst),
                               arrays.host[fsrc] != arrays.host[fdst], self._ports(src, dst, code, by_class),
                               self._ports(fsrc, fdst, fcode, by_class))  # fmt: skip

    def _ports(self, src, dst, code, by_class: bool):
        """Integer owners of each flow's out and in ports inside a host: its rank (per class in an all-to-all
        priced per class), or its PCIe switch tree's uplink (PXB flows of such an all-to-all)."""
        if not by_class:
            return src, dst
        arrays = self.arrays
        n = arrays.world
        kind = arrays.kind[code]
        tree = kind == arrays.pxb_code
        out_owner = np.where(tree, n + arrays.tree[src], src)
        in_owner = np.where(tree, n + arrays.tree[dst], dst)
        return out_owner * 16 + kind + 1, in_owner * 16 + kind + 1


def _columns(pairs) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(pairs, tuple) and len(pairs) == 2 and isinstance(pairs[0], np.ndarray):
        return pairs
    array = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    return array[:, 0], array[:, 1]


__all__ = ["LinkArrays", "Prices", "switch_trees"]
