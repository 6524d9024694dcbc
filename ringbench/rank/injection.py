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

        def delay(src: int, dst: int, nbytes: int, flows=None) -> float:
            extra = 0.0
            if model is not None:  # the topology's cost of the hop, NIC sharing included (topology/linkmodel.py)
                share = shares.get((src, dst), 1.0) if flows is None else self._flow_sharing(src, dst, flows)
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

    def _net_shares(self) -> dict[tuple[int, int], float]:
        """(src, dst) -> ring hops that cross from src's host to dst's host at once (they share that link)."""
        from ringbench.topology.linkmodel import net_shares

        model, ring = self.link_model, self.ring
        if len(ring) < 2:
            return {}
        hops = list(zip(ring, ring[1:] + ring[:1], strict=True))
        shares = net_shares(model["hosts"], [bool(model["net"][a][b]) for a, b in hops], ring)
        return {hop: float(share) for hop, share in zip(hops, shares, strict=True)}

    def _flow_sharing(self, src: int, dst: int, flows) -> int:
        """Transfers of one exchange (``flows``: its (src, dst) pairs on every rank) that share this one's link:
        across hosts, every transfer of the exchange between the same two hosts (they share that host pair's
        network link, as the ring's hops do); inside a host, the rank's other transfers of the exchange (they
        share its port: an all-to-all of U ranks sends U - 1 chunks at once). A ring's exchange gives 1 inside a
        host, and the hops between the same two hosts across them, as ``_net_shares``."""
        model = self.link_model
        hosts, net = model["hosts"], model["net"]
        if net[src][dst]:
            pair = (hosts[src], hosts[dst])
            return max(1, sum(1 for a, b in flows if net[a][b] and (hosts[a], hosts[b]) == pair))
        out = sum(1 for a, b in flows if a == src and not net[a][b])
        into = sum(1 for a, b in flows if b == dst and not net[a][b])
        return max(1, out, into)

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
