"""Fault injection: slow ranks, slow links, jitter, crashes and hangs, parsed from one-line specs.

  slow-rank:RANK:FACTOR    that rank's block compute takes FACTOR times as long
  slow-host:HOST:FACTOR    every rank on that host (hosts in order of first appearance) computes FACTOR times as long
  slow-link:SRC:DST:MS     each transfer from SRC to DST arrives MS milliseconds later
  jitter:MS                each transfer arrives up to MS milliseconds later (uniform, seeded per rank)
  crash:RANK:STEP          that rank's process dies at that forward ring step of the first timed iteration
  hang:RANK:STEP           that rank stops responding there (its neighbours time out)

Faults are recorded in the metadata and the case rows, and labelled in every output.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field

from ringbench.errors import UsageError
from ringbench.kernels.base import BlockKernel

FAULT_HELP = (
    "slow-rank:RANK:FACTOR, slow-host:HOST:FACTOR, slow-link:SRC:DST:MS, jitter:MS, crash:RANK:STEP or hang:RANK:STEP"
)
_ARITY = {"slow-rank": 2, "slow-host": 2, "slow-link": 3, "jitter": 1, "crash": 2, "hang": 2}


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    kind: str
    rank: int = -1  # slow-rank, crash, hang
    src: int = -1  # slow-link
    dst: int = -1
    factor: float = 1.0  # slow-rank, slow-host
    host: int = -1  # slow-host
    ms: float = 0.0  # slow-link, jitter
    step: int = -1  # crash, hang

    @property
    def spec(self) -> str:
        if self.kind == "slow-rank":
            return f"slow-rank:{self.rank}:{self.factor:g}"
        if self.kind == "slow-host":
            return f"slow-host:{self.host}:{self.factor:g}"
        if self.kind == "slow-link":
            return f"slow-link:{self.src}:{self.dst}:{self.ms:g}"
        if self.kind == "jitter":
            return f"jitter:{self.ms:g}"
        return f"{self.kind}:{self.rank}:{self.step}"


def parse_fault(spec: str, field: str = "fault") -> Fault:
    """One spec -> Fault; a malformed one raises UsageError naming the field, the value and the forms allowed."""
    parts = str(spec).strip().split(":")
    kind = parts[0]
    if kind not in _ARITY or len(parts) != _ARITY[kind] + 1:
        raise UsageError(f"{field}={spec!r} is not allowed; expected {FAULT_HELP}")
    try:
        if kind == "slow-rank":
            fault = Fault(kind=kind, rank=int(parts[1]), factor=float(parts[2]))
            ok = fault.factor >= 1.0
        elif kind == "slow-host":
            fault = Fault(kind=kind, host=int(parts[1]), factor=float(parts[2]))
            ok = fault.factor >= 1.0 and fault.host >= 0
        elif kind == "slow-link":
            fault = Fault(kind=kind, src=int(parts[1]), dst=int(parts[2]), ms=float(parts[3]))
            ok = fault.ms >= 0
        elif kind == "jitter":
            fault = Fault(kind=kind, ms=float(parts[1]))
            ok = fault.ms >= 0
        else:
            fault = Fault(kind=kind, rank=int(parts[1]), step=int(parts[2]))
            ok = fault.step >= 0
    except ValueError:
        raise UsageError(f"{field}={spec!r} is not allowed; expected {FAULT_HELP} with numbers") from None
    numbers_ok = math.isfinite(fault.factor) and math.isfinite(fault.ms)
    ranks = (
        (fault.src, fault.dst) if kind == "slow-link" else (fault.rank,) if kind not in ("jitter", "slow-host") else ()
    )
    if not ok or not numbers_ok or any(rank < 0 for rank in ranks):
        raise UsageError(
            f"{field}={spec!r} is not allowed; factors are finite and >= 1, delays finite and >= 0, steps, ranks "
            "and hosts >= 0"
        )
    if kind == "slow-link" and fault.src == fault.dst:
        raise UsageError(f"{field}={spec!r} is not allowed; a link joins two different ranks (SRC != DST)")
    return fault


def check_faults(faults: list[Fault], world: int, field: str = "fault") -> None:
    """Ranks named by a fault must exist in a world of ``world`` ranks, and no two faults may act on one thing."""
    for fault in faults:
        for rank in (fault.rank, fault.src, fault.dst):
            if rank >= world:
                raise UsageError(f"{field}={fault.spec!r} is not allowed on {world} ranks; ranks are 0..{world - 1}")
        if fault.kind in ("crash", "hang") and fault.step >= world:
            raise UsageError(f"{field}={fault.spec!r} is not allowed on {world} ranks; ring steps are 0..{world - 1}")
    check_fault_overlap(faults, field)


def check_fault_overlap(faults: list[Fault], field: str = "fault") -> None:
    """Two faults on one rank, host or hop are refused: how they combine (a product of factors, a sum of delays, a
    crash or a hang) is the user's to state as one fault."""
    seen: dict[tuple, Fault] = {}
    for fault in faults:
        if fault.kind in ("slow-rank", "crash", "hang"):
            key, what = ("rank", fault.rank), f"rank {fault.rank}"
        elif fault.kind == "slow-host":
            key, what = ("host", fault.host), f"host {fault.host}"
        elif fault.kind == "slow-link":
            key, what = ("link", fault.src, fault.dst), f"the hop {fault.src} -> {fault.dst}"
        else:
            key, what = ("jitter",), "every transfer"
        first = seen.get(key)
        if first is None:
            seen[key] = fault
            continue
        if fault.kind == first.kind == "slow-rank":
            combined = f"slow-rank:{fault.rank}:{first.factor * fault.factor:g} for both factors"
        elif fault.kind == first.kind == "slow-host":
            combined = f"slow-host:{fault.host}:{first.factor * fault.factor:g} for both factors"
        elif fault.kind == first.kind == "slow-link":
            combined = f"slow-link:{fault.src}:{fault.dst}:{first.ms + fault.ms:g} for both delays"
        elif fault.kind == first.kind == "jitter":
            combined = f"jitter:{max(first.ms, fault.ms):g}"
        else:
            combined = "the one you mean"
        raise UsageError(
            f"{field}={fault.spec!r} is not allowed together with {first.spec!r}: both act on {what}; give one fault "
            f"({combined})"
        )


def hops_text(ring: list[int] | tuple[int, ...], limit: int = 8) -> str:
    """The hops a ring uses, ``0->1, 1->2, ..., 7->0`` (the first and last ``limit // 2`` beyond ``limit``)."""
    world = len(ring)
    hops = [f"{ring[p]}->{ring[(p + 1) % world]}" for p in range(world)] if world > 1 else []
    if len(hops) > limit:
        hops = [*hops[: limit // 2], "...", *hops[-(limit // 2) :]]
    return ", ".join(hops) or "none (one rank)"


def check_fault_hops(faults: list[Fault], ring, order: str | None = None, *, buffer: str = "double",
                     field: str = "fault") -> None:  # fmt: skip
    """Link faults must be able to act: a slow-link names a hop the ring uses (SRC sends to DST), and the
    all-gather baseline, which moves blocks by collectives, takes no slow-link or jitter at all."""
    ring = [int(rank) for rank in ring]
    world = len(ring)
    successor = {ring[p]: ring[(p + 1) % world] for p in range(world)} if world > 1 else {}
    where = f"with order {order} " if order is not None else ""
    for fault in faults:
        if fault.kind in ("slow-link", "jitter") and buffer == "allgather":
            raise UsageError(
                f"{field}={fault.spec!r} is not allowed with buffer allgather: its blocks move by collectives, "
                "which no link fault delays (use buffer double or sync)"
            )
        if fault.kind != "slow-link" or successor.get(fault.src) == fault.dst:
            continue
        sends = f"rank {fault.src} sends to {successor[fault.src]}" if fault.src in successor else "no hops"
        raise UsageError(
            f"{field}={fault.spec!r} is not allowed {where}on {world} ranks: the ring never sends {fault.src} -> "
            f"{fault.dst} ({sends}); its hops are {hops_text(ring)}"
        )


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
