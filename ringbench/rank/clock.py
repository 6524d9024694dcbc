"""Aligning the ranks' clocks: one time base (rank 0's) for the spans of every rank.

Ranks on one host share CLOCK_MONOTONIC (``time.perf_counter_ns``): the offset is exactly 0. Across hosts each
rank measures its offset to rank 0 by ping-pong over the CPU side group (NTP's rule): the rank stamps t0, sends,
rank 0 answers with its own stamp T, the rank stamps t1. If the two one-way delays were equal, rank 0 read T at
the rank's (t0 + t1) / 2, so

    offset = (t0 + t1) / 2 - T        (subtract it from this rank's stamps to get rank 0's clock)
    bound  = (t1 - t0) / 2            (the true offset lies within +- bound whatever the asymmetry)

The round with the smallest round trip gives the tightest bound; its offset and bound are kept. Unlike stamps
taken on leaving a barrier, this bound is a guarantee, not a spread: the analysis attributes nothing smaller.

Clocks drift (tens of ppm between hosts without PTP: 50 ppm is 3 ms an hour, more than an inter-node hop), so one
offset per session would misplace the spans of a long sweep. The runner measures again after each case's timed
loop and fits the offset as a line between the two measurements (``fit_drift``): a stamp t reads
t - (offset_before + drift * (t - at_before)) on rank 0's clock, with drift = d(offset) / d(t).
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockAlignment:
    """This rank's clock against rank 0's: an offset measured at ``at_ns`` (this rank's clock), and its drift."""

    offset_ns: int  # subtract from this rank's perf_counter_ns (at at_ns) to read rank 0's clock
    bound_ns: int  # the offset is exact to +- bound_ns
    method: str
    hosts: int  # distinct hosts in the group
    at_ns: int = 0  # when the offset was measured, on this rank's clock
    drift: float = 0.0  # d(offset)/dt, ns per ns (fitted from two measurements; 0 for one)

    def offset_at(self, t_ns: int) -> int:
        return self.offset_ns + round(self.drift * (t_ns - self.at_ns))

    def to_reference(self, t_ns: int) -> int:
        """A stamp of this rank's clock on rank 0's."""
        return int(t_ns) - self.offset_at(int(t_ns))


def fit_drift(before: ClockAlignment, after: ClockAlignment) -> ClockAlignment:
    """The offset as the line through two measurements (before and after a case): exact at both, interpolated
    in between; its bound is the larger of the two (an interpolation between two bounded points stays within it)."""
    span = after.at_ns - before.at_ns
    if before.hosts == 1 or span <= 0:
        return after
    drift = (after.offset_ns - before.offset_ns) / span
    return ClockAlignment(offset_ns=before.offset_ns, bound_ns=max(before.bound_ns, after.bound_ns),
                          method="ping-pong with rank 0 before and after each case (offset and drift)",
                          hosts=after.hosts, at_ns=before.at_ns, drift=drift)  # fmt: skip


def align_clocks(ops, rounds: int = 16, *, now=time.perf_counter_ns, host: str | None = None) -> ClockAlignment:
    """Measure this rank's offset to rank 0 (collective: every rank of ``ops`` calls it). ``now`` and ``host``:
    this rank's clock and host name (injectable, so that a test can give ranks of one machine skewed clocks)."""
    hosts = ops.all_objects(host if host is not None else socket.gethostname())
    distinct = len(set(hosts))
    if distinct == 1:
        return ClockAlignment(offset_ns=0, bound_ns=0, method="shared monotonic clock (one host)", hosts=1)
    side, dist = ops.side(), ops.dist
    rank, world = ops.rank, ops.world
    best = (0, 2**62, 0)  # (offset, bound, when)
    stamp = torch.zeros(1, dtype=torch.int64)
    for peer in range(1, world):  # one pair at a time, so no ping waits behind another
        ops.dist.barrier(group=side)
        if rank == 0:
            for _ in range(rounds):
                dist.recv(stamp, src=_global(dist, side, peer), group=side)
                stamp[0] = now()
                dist.send(stamp, dst=_global(dist, side, peer), group=side)
        elif rank == peer:
            for _ in range(rounds):
                t0 = now()
                dist.send(stamp, dst=_global(dist, side, 0), group=side)
                dist.recv(stamp, src=_global(dist, side, 0), group=side)
                t1 = now()
                bound = (t1 - t0) // 2
                if bound < best[1]:
                    best = ((t0 + t1) // 2 - int(stamp[0]), bound, (t0 + t1) // 2)
    dist.barrier(group=side)
    offset, bound, when = best if rank != 0 else (0, 0, now())
    return ClockAlignment(offset_ns=offset, bound_ns=bound, method="ping-pong with rank 0 (multi-host)",
                          hosts=distinct, at_ns=when)  # fmt: skip


def _global(dist, group, group_rank: int) -> int:
    try:
        return dist.get_global_rank(group, group_rank)
    except Exception:  # the default group: group ranks are global ranks
        return group_rank
