"""Faults injected into a rank's ring (the specs are ringbench/scenario/faults.py): a slower kernel, emulated
link delays priced by the one link model, jitter, a crash or a hang at a ring step."""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

from ringbench.kernels.base import BlockKernel
from ringbench.scenario.faults import Fault


class SlowKernel(BlockKernel):
    """Wraps a kernel so that each block takes FACTOR times as long, on the device that runs it (see Pacer)."""

    def __init__(self, inner: BlockKernel, factor: float) -> None:
        self.inner = inner
        self.factor = factor
        self.name = inner.name
        self.emulated = inner.emulated
        self.max_head_dim = inner.max_head_dim
        self.dtypes = inner.dtypes
        from ringbench.kernels.emulated import Pacer  # torch: only where a kernel is wrapped, in a rank

        self.pacer = Pacer()

    def check(self, head_dim, dtype, device):
        self.inner.check(head_dim, dtype, device)

    def _slowed(self, call, q, key, *args):
        begun = self.pacer.begin(q.device)
        result = call(*args)
        self.pacer.stretch(q.device, key, begun, self.factor)
        return result

    def forward(self, q, k, v, mask, scale):
        key = (tuple(q.shape), k.shape[-2], mask.kind, False)
        return self._slowed(self.inner.forward, q, key, q, k, v, mask, scale)

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        key = (tuple(q.shape), k.shape[-2], mask.kind, True)
        return self._slowed(self.inner.backward, q, key, dout, q, k, v, out, lse, mask, scale)

    def settle(self) -> None:
        self.pacer.settle()
        if hasattr(self.inner, "settle"):
            self.inner.settle()


@dataclass(kw_only=True, slots=True)
class RankFaults:
    """The faults as seen by one rank."""

    rank: int
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    # Emulated links from a topology: latency_us / bandwidth_gbps / net matrices indexed [src][dst] and the host
    # of each rank (see Scenario.link_model), or None.
    link_model: dict | None = None
    ring: tuple[int, ...] = ()
    rng: random.Random = field(init=False, repr=False)
    _shared: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed * 1009 + self.rank)

    @property
    def slowdown(self) -> float:
        factor = 1.0
        for fault in self.faults:
            if fault.kind == "slow-rank" and fault.rank == self.rank:
                factor *= fault.factor
        return factor

    def wrap_kernel(self, kernel: BlockKernel) -> BlockKernel:
        if self.slowdown == 1.0:
            return kernel
        if hasattr(kernel, "slowdown"):  # the emulated kernel models the slowdown in its modelled time
            kernel.slowdown = self.slowdown
            return kernel
        return SlowKernel(kernel, self.slowdown)

    def link_delay(self):
        """(src, dst, nbytes) -> extra seconds for one transfer, or None when no link fault or model applies."""
        from ringbench.engine.comm import LinkClock
        from ringbench.topology.linkmodel import transfer_us

        links = [f for f in self.faults if f.kind in ("slow-link", "jitter")]
        model = self.link_model
        if not links and model is None:
            return None
        shares = self._net_shares() if model is not None else {}

        def delay(src: int, dst: int, nbytes: int, flows=None, collective: bool = False) -> float:
            extra = 0.0
            if model is not None:  # the topology's cost of the hop, NIC sharing included (topology/linkmodel.py)
                share = (shares.get((src, dst), 1.0) if flows is None else
                         self._flow_sharing(src, dst, flows, collective))  # fmt: skip
                extra += transfer_us(model["latency_us"][src][dst], model["bandwidth_gbps"][src][dst], nbytes,
                                     share) / 1e6  # fmt: skip
            for fault in links:
                if fault.kind == "slow-link" and (fault.src, fault.dst) == (src, dst):
                    extra += fault.ms / 1e3
                elif fault.kind == "jitter":
                    extra += self.rng.uniform(0.0, fault.ms) / 1e3
            return extra

        delay.accepts_flows = True  # strategies pass the transfers of the exchange (ringbench/engine/groups.py)
        if model is not None:  # emulated links: blocks over one hop take turns on it (ringbench/engine/comm.py)
            delay.clock = LinkClock()
        return delay

    def _nics(self) -> list[int]:
        """Each rank's NIC number (records written before NICs were modelled: one NIC per host)."""
        model = self.link_model
        if "nics" in model:
            return list(model["nics"])
        names: dict[str, int] = {}
        return [names.setdefault(host, len(names)) for host in model["hosts"]]

    def _net_shares(self) -> dict[tuple[int, int], float]:
        """(src, dst) -> the ring's hops that share this hop's NICs at once (ringbench.topology.linkmodel)."""
        from ringbench.topology.linkmodel import net_shares

        model, ring = self.link_model, self.ring
        if len(ring) < 2:
            return {}
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        shares = net_shares(self._nics(), [bool(model["net"][a][b]) for a, b in hops], ring)
        return {hop: float(share) for hop, share in zip(hops, shares, strict=True)}

    def _flow_sharing(self, src: int, dst: int, flows, collective: bool = False) -> float:
        """Transfers of one exchange (``flows``: its (src, dst) pairs on every rank) that share this one's limit,
        by the one link model's rule (ringbench.topology.linkmodel.exchange_shares): across hosts, the flows
        through the same source NIC or destination NIC; inside a host, the rank's other flows of the exchange
        (its port: an all-to-all of U ranks sends U - 1 chunks at once). ``collective``: an NCCL ring collective,
        whose crossing hops draw on all their hosts' NICs together."""
        from ringbench.topology.linkmodel import exchange_shares

        key = (src, dst, id(flows), collective)
        found = self._shared.get(key)
        if found is not None and found[0] is flows:
            return found[1]
        net = self.link_model["net"]
        pairs = list(flows)
        fsrc = [a for a, _ in pairs]
        fdst = [b for _, b in pairs]
        nics, capacity = self._nics(), None
        if collective:  # the host's NICs together: each rank's 'NIC' is its host, worth that host's NIC count
            names: dict[str, int] = {}
            host = [names.setdefault(h, len(names)) for h in self.link_model["hosts"]]
            capacity = [len({n for n, h in zip(nics, host, strict=True) if h == index}) for index in range(len(names))]
            nics = host
        share = exchange_shares([src], [dst], [bool(net[src][dst])], nics, (fsrc, fdst),
                                [bool(net[a][b]) for a, b in pairs], capacity=capacity)  # fmt: skip
        self._shared[key] = (flows, float(share[0]))
        return float(share[0])

    def at_step(self, phase: str, step: int, iteration: int) -> None:
        """Crash or hang here if a fault says so (first timed iteration, forward)."""
        if iteration != 0 or phase != "fwd":
            return
        for fault in self.faults:
            if fault.rank == self.rank and fault.step == step:
                if fault.kind == "crash":
                    os._exit(17)
                if fault.kind == "hang":
                    while True:
                        time.sleep(3600)
