"""Recorders: the ring loops call one at every step boundary; the default records nothing.

The engine never stores timings itself. It calls ``recorder.on_step(phase, step)`` when a ring step begins and
``recorder.span(...)`` for each finished span (compute, send, recv, wait, collective); the run layer passes a
``ListRecorder`` and turns its rows into the events table (ringbench/schema.py).
"""

from __future__ import annotations

import time


class NullRecorder:
    """Records nothing (the default): ring_attention inside a training program pays for no bookkeeping."""

    enabled = False

    def now(self) -> int:
        return 0

    def on_step(self, phase: str, step: int) -> None:
        pass

    def span(self, **fields) -> None:
        pass


class ListRecorder(NullRecorder):
    """Keeps spans as dicts in memory; ``iteration`` and ``repeat`` are set by the runner between iterations."""

    enabled = True

    def __init__(self, rank: int, ring_position: int, sync=None) -> None:
        self.rank = rank
        self.ring_position = ring_position
        self.iteration = -1  # negative: warm-up, not kept
        self.rows: list[dict] = []
        self._sync = sync  # e.g. torch.cuda.synchronize, so that GPU spans end when the work ends

    def now(self) -> int:
        if self._sync is not None:
            self._sync()
        return time.perf_counter_ns()

    def span(self, *, phase, step, kind, start, end, src=-1, dst=-1, nbytes=0, block=-1, pair="", flops=0.0):
        if self.iteration < 0:
            return
        self.rows.append(
            {
                "iteration": self.iteration,
                "phase": phase,
                "rank": self.rank,
                "ring_position": self.ring_position,
                "step": step,
                "kind": kind,
                "start_ns": start,
                "end_ns": end,
                "src": src,
                "dst": dst,
                "bytes": nbytes,
                "block": block,
                "pair": pair,
                "flops": flops,
            }
        )
