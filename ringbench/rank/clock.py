"""Aligning the ranks' clocks: one time base (rank 0's) for the spans of every rank.

Ranks on one host share CLOCK_MONOTONIC (``time.perf_counter_ns``): the offset is exactly 0. Across hosts each
rank measures its offset to rank 0 by ping-pong over the CPU side group (NTP's rule): the rank stamps t0, sends,
rank 0 answers with its own stamp T, the rank stamps t1. If the two one-way delays were equal, rank 0 read T at
the rank's (t0 + t1) / 2, so

    offset = (t0 + t1) / 2 - T        (subtract it from this rank's stamps to get rank 0's clock)
    bound  = (t1 - t0) / 2            (the true offset lies within +- bound whatever the asymmetry)

The round with the smallest round trip gives the tightest bound; its offset and bound are kept. Unlike stamps
taken on leaving a barrier, this bound is a guarantee, not a spread: the analysis attributes nothing smaller.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockAlignment:
    """This rank's clock against rank 0's."""

    offset_ns: int  # subtract from this rank's perf_counter_ns to read rank 0's clock
    bound_ns: int  # the offset is exact to +- bound_ns
    method: str
    hosts: int  # distinct hosts in the group


def align_clocks(ops, rounds: int = 16) -> ClockAlignment:
    """Measure this rank's offset to rank 0 (collective: every rank of ``ops`` calls it)."""
    hosts = ops.all_objects(socket.gethostname())
    distinct = len(set(hosts))
    if distinct == 1:
        return ClockAlignment(offset_ns=0, bound_ns=0, method="shared monotonic clock (one host)", hosts=1)
    side, dist = ops.side(), ops.dist
    rank, world = ops.rank, ops.world
    best = (0, 2**62)  # (offset, bound)
    stamp = torch.zeros(1, dtype=torch.int64)
    for peer in range(1, world):  # one pair at a time, so no ping waits behind another
        ops.dist.barrier(group=side)
        if rank == 0:
            for _ in range(rounds):
                dist.recv(stamp, src=_global(dist, side, peer), group=side)
                stamp[0] = time.perf_counter_ns()
                dist.send(stamp, dst=_global(dist, side, peer), group=side)
        elif rank == peer:
            for _ in range(rounds):
                t0 = time.perf_counter_ns()
                dist.send(stamp, dst=_global(dist, side, 0), group=side)
                dist.recv(stamp, src=_global(dist, side, 0), group=side)
                t1 = time.perf_counter_ns()
                bound = (t1 - t0) // 2
                if bound < best[1]:
                    best = ((t0 + t1) // 2 - int(stamp[0]), bound)
    dist.barrier(group=side)
    offset, bound = best if rank != 0 else (0, 0)
    return ClockAlignment(offset_ns=offset, bound_ns=bound, method="ping-pong with rank 0 (multi-host)", hosts=distinct)


def _global(dist, group, group_rank: int) -> int:
    try:
        return dist.get_global_rank(group, group_rank)
    except Exception:  # the default group: group ranks are global ranks
        return group_rank
