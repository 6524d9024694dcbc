"""The critical path of a simulated iteration, and the exposed communication on it, at any ring size.

The walk is the one ringbench/figures/critical_path.py runs on a record (metrics.py's definition of exposed communication),
done on the engine's own cells: from the rank that finished last, back in time; on each rank take the latest
blocking span (compute or wait) that ended by the cursor:

  compute             on the path; continue at its start
  wait, bound         the exchange was still in flight when the rank began to wait (in_hand > wait start): its
                      link is on the path (transfer end - transfer start) and the wait while it was in flight is
                      exposed; continue where the transfer began (the later poster: the peer if it posted later)
  wait, not bound     the rank was busy until the wait began: continue at the wait's start

Cells come from a ``CellSource``: every step's arrays kept in memory (small rings), or a ring of 65,536 positions
re-run from checkpoints on a window around the path (the state every ``every`` steps is kept; a window of
2 x radius + 1 positions is exact around its centre for radius / exchanges-per-step steps).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ringbench.simulate.pair_classes import EQUAL, GREATER, LESS
from ringbench.simulate.phase_ring import Exchange, PhaseEngine, State, StepCells, Window

TOL_MS = 0.02  # the analysis's default clock tolerance (20 us): a transfer done that close to the wait binds not


@dataclass(kw_only=True, slots=True)
class PathResult:
    """One iteration's critical path."""

    path_ms: float
    exposed_ms: float
    compute_ms: dict[int, float] = field(default_factory=dict)
    """Position -> compute ms on the path."""
    link_ms: dict[tuple[int, int], float] = field(default_factory=dict)
    """(src position, dst position) -> transfer ms on the path."""
    cells: list[tuple[str, int, int]] = field(default_factory=list)
    """(phase, step, position) of every span the walk went through."""


class FullSource:
    """Every step's cells of the whole ring, kept in memory."""

    def __init__(self, steps: dict[str, list[StepCells]], world: int) -> None:
        self.steps = steps
        self.world = world

    def cells(self, phase: str, step: int, g: int, position: int) -> tuple[StepCells, int, int]:
        return self.steps[phase][step], g, position


class RecomputeSource:
    """Cells re-run on a window around the walk from the nearest checkpoint at or before the step."""

    def __init__(self, engines: dict[str, PhaseEngine], checkpoints: dict[str, dict[int, State]],
                 finals: dict[str, StepCells | None], world: int, every: int) -> None:  # fmt: skip
        self.engines, self.checkpoints, self.finals = engines, checkpoints, finals
        self.world, self.every = world, every
        self._cache: dict[tuple[str, int], tuple[Window, dict[int, StepCells], int]] = {}

    def _reach(self, phase: str) -> int:
        model = self.engines[phase].model
        return 2 if model.two_exchanges else 1  # exchanges per step: how far a step moves information

    def cells(self, phase: str, step: int, g: int, position: int) -> tuple[StepCells, int, int]:
        steps = self.engines[phase].model.n_steps
        if step >= steps:  # the backward's final dK/dV wait (kept for the whole ring)
            return self.finals[phase], g, position
        base = step - step % self.every
        key = (phase, g)
        cached = self._cache.get(key)
        if cached is not None:
            window, cells, first = cached
            if first == base and step in cells:
                index = self._index(window, position)
                reach = self._reach(phase) * (step - base + 1) + 1
                whole = len(window.positions) == self.world
                if index is not None and (whole or reach <= index < len(window.positions) - reach):
                    return cells[step], 0, index
        last = min(base + self.every, steps)
        radius = self._reach(phase) * (last - base) + 2
        window = Window.around(self.world, position, radius, np.array([g]))
        state = self.checkpoints[phase][base].take(window.positions)
        state = State(start=state.start[g : g + 1], last_recv=None if state.last_recv is None else
                      state.last_recv[g : g + 1], pending=_take_iteration(state.pending, g))  # fmt: skip
        engine = self.engines[phase]
        cells = {s: engine.advance(state, s, window) for s in range(base, last)}
        self._cache[key] = (window, cells, base)
        return cells[step], 0, self._index(window, position)

    def _index(self, window: Window, position: int) -> int | None:
        if len(window.positions) == self.world and window.positions[0] == 0:
            return position
        index = (position - int(window.positions[0])) % self.world
        return index if index < len(window.positions) else None


def _take_iteration(pending: Exchange | None, g: int) -> Exchange | None:
    if pending is None:
        return None
    arrays = [getattr(pending, name)[g : g + 1] for name in ("post", "start", "landed", "recv", "in_hand")]
    return Exchange(pending.lane, pending.step, *arrays)


def _blocking(cells: StepCells, g: int, i: int) -> list[tuple[float, float, object]]:
    """(start, end, what) of the compute and waits of one position in one step, sorted by end."""
    spans: list[tuple[float, float, object]] = []
    if cells.compute_ms is not None:
        c = float(cells.compute_ms[g, i])
        if c > 0:
            cs = float(cells.compute_start[g, i])
            spans.append((cs, cs + c, None))
    for ex in cells.exchanges:
        if ex.wait_start is not None:
            spans.append((float(ex.wait_start[g, i]), float(ex.wait_end[g, i]), ex))
    spans.sort(key=lambda span: span[1])
    return spans


def class_index(cells: StepCells, column):
    """The pair class of the block at ``column`` (an index or an array of them): the pair table's class, or the
    three sign classes (EQUAL at step 0)."""
    greater = cells.greater
    if greater is None:
        return EQUAL if np.isscalar(column) else np.full(len(column), EQUAL)
    value = np.asarray(greater)[column]
    if np.asarray(greater).dtype != bool:
        return value
    return (GREATER if value else LESS) if np.isscalar(column) else np.where(value, GREATER, LESS)


def walk(source, phases: list[str], ends: dict[str, np.ndarray], origin: np.ndarray, g: int, world: int,
         steps_per_phase: dict[str, int], rows: list | None = None,
         directions: dict[str, int] | None = None) -> PathResult:  # fmt: skip
    """The critical path of iteration ``g``: ``ends[phase]`` (G, N) are the phases' ends, ``origin`` (G, N) the
    iteration's starts; ``phases`` in time order; ``steps_per_phase`` counts a final pseudo-step (the backward's
    last dK/dV wait) when there is one. ``rows``: when a list, the path's spans are appended to it as
    (kind, phase, step, position, start, end, lane or pair class), with both ends of every exchange waited on."""
    last_phase = phases[-1]
    p = int(np.argmax(ends[last_phase][g]))
    t = float(ends[last_phase][g, p])
    result = PathResult(path_ms=t - float(origin[g].min()), exposed_ms=0.0)
    compute_ms: dict[int, float] = defaultdict(float)
    link_ms: dict[tuple[int, int], float] = defaultdict(float)
    for phase in reversed(phases):
        direction = (directions or {}).get(phase, 1)
        step = steps_per_phase[phase] - 1
        while step >= 0:
            cells, gi, i = source.cells(phase, step, g, p)
            jump = None
            for span_start, span_end, what in reversed(_blocking(cells, gi, i)):
                if span_end > t + TOL_MS or span_start >= t:
                    continue
                result.cells.append((phase, cells.step, p))
                if what is None:  # compute
                    compute_ms[p] += span_end - span_start
                    t = span_start
                    if rows is not None:
                        rows.append(("compute", phase, cells.step, p, span_start, span_end, int(class_index(cells, i))))
                    continue
                if rows is not None:
                    _exchange_rows(rows, what, phase, gi, i, p, world, span_start, direction)
                jump = _follow(what, gi, i, p, world, span_start, span_end, result, link_ms, direction)
                if jump is None:
                    t = span_start
                    continue
                break
            if jump is None:
                step -= 1
            else:  # continue where the binding transfer began: its poster, in the step it was posted
                p, t, step = jump
    result.compute_ms, result.link_ms = dict(compute_ms), dict(link_ms)
    return result


def _exchange_rows(rows: list, ex: Exchange, phase: str, g: int, i: int, p: int, world: int, ws: float,
                   direction: int = 1) -> None:  # fmt: skip
    """The wait of position p on ``ex`` and, when the exchange bound it, the transfer that did (both ends).
    ``direction``: blocks move from p - direction to p (the short ring's backward: -1)."""
    width = ex.recv.shape[1]
    prv, nxt = (i - direction) % width, (i + direction) % width
    step, lane = ex.step, ex.lane
    rows.append(("wait", phase, step, p, ws, float(ex.wait_end[g, i]), lane))
    recv, sent = float(ex.recv[g, i]), float(ex.landed[g, nxt])
    if max(recv, sent) <= ws + TOL_MS:
        return
    if sent > recv:  # p's own send finished last
        rows.append(("send", phase, step, p, float(ex.post[g, i]), sent, lane))
        rows.append(("recv", phase, step, (p + direction) % world, float(ex.post[g, nxt]), float(ex.recv[g, nxt]),
                     lane))  # fmt: skip
    else:
        rows.append(("recv", phase, step, p, float(ex.post[g, i]), recv, lane))
        rows.append(("send", phase, step, (p - direction) % world, float(ex.post[g, prv]), float(ex.landed[g, i]),
                     lane))  # fmt: skip


def _follow(ex: Exchange, g: int, i: int, p: int, world: int, ws: float, we: float,
            result: PathResult, link_ms, direction: int = 1) -> tuple[int, float, int] | None:  # fmt: skip
    """A wait on ``ex``: None when it did not bind, else (position, time, step) where the walk continues."""
    n_w = ex.recv.shape[1]
    nxt, prv = (i + direction) % n_w, (i - direction) % n_w
    recv, sent = float(ex.recv[g, i]), float(ex.landed[g, nxt])
    link_end = max(recv, sent)
    if link_end <= ws + TOL_MS:
        return None
    by_send = sent > recv
    if by_send:
        moved_from = float(ex.start[g, nxt])
        peer, peer_post, own_post = (p + direction) % world, float(ex.post[g, nxt]), float(ex.post[g, i])
        link_ms[(p, (p + direction) % world)] += max(sent - moved_from, 0.0)
    else:
        moved_from = float(ex.start[g, i])
        peer, peer_post, own_post = (p - direction) % world, float(ex.post[g, prv]), float(ex.post[g, i])
        link_ms[((p - direction) % world, p)] += max(recv - moved_from, 0.0)
    result.exposed_ms += min(max(min(link_end, we) - max(ws, moved_from), 0.0), we - ws)
    if peer_post > own_post:
        return peer, peer_post, ex.step
    return p, own_post, ex.step
