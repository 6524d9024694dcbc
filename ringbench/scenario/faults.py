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
from dataclasses import dataclass

from ringbench.errors import UsageError

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


__all__ = ["FAULT_HELP", "Fault", "check_fault_hops", "check_fault_overlap", "check_faults", "hops_text", "parse_fault"]
