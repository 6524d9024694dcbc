"""Recorders: the ring loops call one at every step boundary; the default records nothing.

The engine never stores timings itself. It calls ``recorder.on_step(phase, step)`` when a ring step begins,
``recorder.end_phase(phase)`` when a phase's ring loop is done, and ``recorder.span(...)`` for each span (compute,
send, recv, wait, collective) with its start and end as *marks* of the ring's timeline (ringbench/engine/timeline.py).
A mark is resolved into nanoseconds only after the iteration (``finish_iteration``): on a GPU the marks are events
that fire when the device reaches them, so resolving inside the loop would drain the streams it measures. The run
layer passes a ``ListRecorder`` and turns its rows into the events table (ringbench/record/schema.py).
"""

from __future__ import annotations

import math

from ringbench.engine.timeline import HostTimeline

# The optional columns of a span and what a span without them records.
SPAN_COLUMNS = {"src": -1, "dst": -1, "nbytes": 0, "block": -1, "pair": "", "flops": 0.0, "nccl": None, "exchange": "",
                "layer": 0, "group": ""}  # fmt: skip


class LayerRecorder:
    """A recorder's view for one attention layer: every span recorded through it carries ``layer`` (a strategy's
    loops record spans without knowing the layer they run; the ring's own loops pass it)."""

    def __init__(self, inner, layer: int) -> None:
        self.inner, self.layer = inner, layer

    def span(self, **fields) -> None:
        self.inner.span(**({"layer": self.layer} | fields))

    def __getattr__(self, name):
        return getattr(self.inner, name)


class NullRecorder:
    """Records nothing (the default): ring_attention inside a training program pays for no bookkeeping."""

    enabled = False

    def on_step(self, phase: str, step: int) -> None:
        pass

    def end_phase(self, phase: str) -> None:
        pass

    def span(self, **fields) -> None:
        pass


class ListRecorder(NullRecorder):
    """Keeps spans as dicts in memory; ``iteration`` and ``repeat`` are set by the runner between iterations.

    Rows hold marks until ``finish_iteration`` resolves them on ``timeline`` (host marks are already integers).
    """

    enabled = True

    def __init__(self, rank: int, ring_position: int, timeline=None) -> None:
        self.rank = rank
        self.ring_position = ring_position
        self.iteration = -1  # negative: warm-up, not kept
        self.rows: list[dict] = []
        self.timeline = timeline if timeline is not None else HostTimeline()
        self._resolved = 0  # rows before this index hold nanoseconds

    def span(self, *, phase, step, kind, start, end, **columns):
        """One span: its phase, ring step, kind and start / end marks, and the optional ``columns`` of
        SPAN_COLUMNS (the peer ranks, bytes, block, pair class, FLOPs, ...). ``nccl``: a callable giving NCCL's own
        duration of the exchange in ms once it completed (or None). ``exchange``: what a send / recv / wait moved
        when the strategy says so (``kv``, ``dkv``, ``qkv``, ...); "" lets the record infer it (the ring's K/V and
        dK/dV). ``layer``: the attention layer of the iteration the span belongs to (0 for a one-layer model).
        ``group``: the channel (process group) an exchange used, as ringbench/engine/pgroups.py labels it ("" for
        spans that are no exchange)."""
        unknown = set(columns) - set(SPAN_COLUMNS)
        if unknown:
            raise TypeError(f"span() got an unexpected keyword argument {sorted(unknown)[0]!r}")
        if self.iteration < 0:
            return
        extra = SPAN_COLUMNS | columns
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
                "src": extra["src"],
                "dst": extra["dst"],
                "bytes": extra["nbytes"],
                "block": extra["block"],
                "pair": extra["pair"],
                "flops": extra["flops"],
                "nccl_ms": extra["nccl"],
                "exchange": extra["exchange"],
                "layer": extra["layer"],
                "comm_group": extra["group"],
            }
        )

    def finish_iteration(self) -> None:
        """Resolve this iteration's marks into nanoseconds (call after the timeline settled)."""
        resolve = self.timeline.resolve
        for row in self.rows[self._resolved :]:
            row["start_ns"] = resolve(row["start_ns"])
            row["end_ns"] = resolve(row["end_ns"])
            nccl = row["nccl_ms"]
            value = nccl() if callable(nccl) else nccl
            row["nccl_ms"] = math.nan if value is None else float(value)
        self._resolved = len(self.rows)
