"""From a simulated timeline to the record's events table (ringbench/record/schema.py), full or bounded.

Full: every span of every rank, as a run records it. Bounded (large rings; docs/simulate.md): the ``iteration``
rows of every rank (so step times are exact), every span of the kept positions (faulty ranks and links with their
ring neighbours, the rank that finished last, an even sample) on the kept steps, and the spans of each
iteration's critical path (with both ends of every transfer on it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.record.schema import EVENT_COLUMNS
from ringbench.simulate.case import class_flops
from ringbench.simulate.phase_ring import StepCells
from ringbench.simulate.ring_timeline import Timeline
from ringbench.simulate.walk import class_index

_INT32 = ("repeat", "iteration", "rank", "ring_position", "step", "src", "dst", "block")
_INT64 = ("start_ns", "end_ns", "bytes")


PHASE_NAMES = np.array(["fwd", "bwd"], dtype=object)
KIND_NAMES = np.array(["iteration", "compute", "send", "recv", "wait", "collective"], dtype=object)
PAIR_NAMES = np.array(["", "full", "causal", "partial", "skip"], dtype=object)


class RowSink:
    """Accumulates event columns as arrays (strings as small codes) and builds one DataFrame at the end."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.parts: list[dict[str, np.ndarray]] = []
        case = timeline.case
        self.ring = np.asarray(case.ring)
        self.kinds = np.array([list(PAIR_NAMES).index(c.kind) for c in case.classes().classes])  # pair codes
        self.flops = {phase: class_flops(case, phase) for phase in case.phases}

    def add(self, *, iters, phase, step, kind, start, end, positions, src, dst, nbytes=0, block=-1, pair=0,
            flops=0.0) -> None:  # fmt: skip
        """Rows for ``positions`` (flattened with ``iters``); times in ms on each iteration's own clock."""
        iters = np.asarray(iters)
        offset = self.timeline.offsets[iters]
        n = len(iters)

        def col(value, dtype=None):
            value = np.asarray(value, dtype=dtype)
            return value if value.shape == (n,) else np.full(n, value, dtype=value.dtype)

        self.parts.append({
            "iteration": iters, "phase": col(list(PHASE_NAMES).index(phase), np.int8), "rank": self.ring[positions],
            "ring_position": np.asarray(positions), "step": col(step),
            "kind": col(list(KIND_NAMES).index(kind), np.int8),
            "start_ns": np.rint((np.asarray(start) + offset) * 1e6).astype(np.int64),
            "end_ns": np.rint((np.asarray(end) + offset) * 1e6).astype(np.int64),
            "src": col(src), "dst": col(dst), "bytes": col(nbytes), "block": col(block), "pair": col(pair, np.int8),
            "flops": col(flops, float),
        })  # fmt: skip

    def frame(self, case_id: str, repeat: int, dedupe: bool = False) -> pd.DataFrame:
        """The events, sorted by (iteration, start, rank); ``dedupe`` drops rows repeated by several sources."""
        if not self.parts:
            return pd.DataFrame(columns=list(EVENT_COLUMNS))
        cols = {key: np.concatenate([p[key] for p in self.parts]) for key in self.parts[0]}
        if dedupe:
            keys = np.stack([cols[k].astype(np.int64) for k in ("iteration", "phase", "step", "kind", "rank",
                                                                 "start_ns", "end_ns")], axis=1)  # fmt: skip
            order = np.lexsort(keys.T[::-1])
            ordered = keys[order]
            first = order[np.r_[True, (ordered[1:] != ordered[:-1]).any(axis=1)]]
            cols = {key: value[np.sort(first)] for key, value in cols.items()}
        order = np.lexsort((cols["rank"], cols["start_ns"], cols["iteration"]))
        cols = {key: value[order] for key, value in cols.items()}
        for key, names in (("phase", PHASE_NAMES), ("kind", KIND_NAMES), ("pair", PAIR_NAMES)):
            cols[key] = names[cols[key]]
        events = pd.DataFrame(cols)
        events.insert(0, "case_id", case_id)
        events.insert(1, "repeat", repeat)
        events["nccl_ms"] = np.nan
        events["layer"] = 0
        events = events.astype({**dict.fromkeys(_INT32, "int32"), **dict.fromkeys(_INT64, "int64")})
        return events.reindex(columns=list(EVENT_COLUMNS))


def _cell_rows(sink: RowSink, phase: str, steps: list[StepCells], cols: np.ndarray, succ: np.ndarray,
               positions: np.ndarray) -> None:  # fmt: skip
    """Every span of positions ``positions`` (columns ``cols`` of each step's cells, the positions their sends go
    to at ``succ``) in every iteration, for a list of steps at once. One-way exchanges (the short ring) leave out
    the direction that did not happen: a send where nothing landed, a receive and its wait where nothing came."""
    world = len(sink.ring)
    ring = sink.ring
    model = sink.timeline.models[phase]
    direction = model.direction
    iterations = steps[0].end.shape[0] if steps else 0
    it = np.repeat(np.arange(iterations), len(cols))  # (G * K,) rows of one step, iteration-major
    pos = np.tile(positions, iterations)
    rank, pred, nxt = ring[pos], ring[(pos - direction) % world], ring[(pos + direction) % world]
    comp: dict[str, list] = {"step": [], "start": [], "ms": [], "cls": [], "it": [], "pos": []}
    lanes: dict[str, dict[str, list]] = {}
    for cells in steps:
        if cells.step < model.n_steps:
            comp["step"].append(np.full(len(it), cells.step))
            comp["start"].append(np.asarray(cells.compute_start)[:, cols].ravel())
            comp["ms"].append(np.asarray(cells.compute_ms)[:, cols].ravel())
            comp["cls"].append(np.tile(class_index(cells, cols), iterations))
        for ex in cells.exchanges:
            out = lanes.setdefault(ex.lane, {k: [] for k in ("step", "post", "sent", "recv", "ws", "we", "got")})
            out["step"].append(np.full(len(it), ex.step))
            out["post"].append(ex.post[:, cols].ravel())
            out["sent"].append(ex.landed[:, succ].ravel())
            out["recv"].append(ex.recv[:, cols].ravel())
            out["got"].append(np.isfinite(ex.landed[:, cols]).ravel())
            out["ws"].append(ex.wait_start[:, cols].ravel())
            out["we"].append(ex.wait_end[:, cols].ravel())
    if comp["step"]:
        n = len(comp["step"])
        step = np.concatenate(comp["step"])
        start, ms, cls = (np.concatenate(comp[k]) for k in ("start", "ms", "cls"))
        its, poss = np.tile(it, n), np.tile(pos, n)
        distance = model.n_steps - 1 - step if model.reverse_blocks else step
        owner = ring[(poss - distance) % world]
        on = ms > 0
        sink.add(iters=its[on], phase=phase, step=step[on], kind="compute", start=start[on], end=(start + ms)[on],
                 positions=poss[on], src=owner[on], dst=ring[poss[on]], block=owner[on], pair=sink.kinds[cls[on]],
                 flops=sink.flops[phase][cls[on]])  # fmt: skip
    for lane, out in lanes.items():
        n = len(out["step"])
        step = np.concatenate(out["step"])
        its, poss = np.tile(it, n), np.tile(pos, n)
        r, pr, nx = np.tile(rank, n), np.tile(pred, n), np.tile(nxt, n)
        nbytes = model.lanes[lane].nbytes
        post, sent, got = np.concatenate(out["post"]), np.concatenate(out["sent"]), np.concatenate(out["got"])
        sends = np.isfinite(sent)
        ws, we, recv = (np.concatenate(out[k]) for k in ("ws", "we", "recv"))

        for kind, keep, start, end, src, dst, size in (("send", sends, post, sent, r, nx, nbytes),
                                                        ("recv", got, post, recv, pr, r, nbytes),
                                                        ("wait", got, ws, we, pr, r, 0)):  # fmt: skip
            sink.add(iters=its[keep], phase=phase, step=step[keep], positions=poss[keep], kind=kind,
                     start=start[keep], end=end[keep], src=src[keep], dst=dst[keep], nbytes=size)  # fmt: skip


def _iteration_rows(sink: RowSink, timeline: Timeline) -> None:
    case = timeline.case
    iters = np.repeat(np.arange(case.iterations), case.world)
    positions = np.tile(np.arange(case.world), case.iterations)
    ranks = sink.ring[positions]
    for phase in case.phases:
        sink.add(iters=iters, phase=phase, step=-1, kind="iteration", start=timeline.phase_start[phase].ravel(),
                 end=timeline.phase_end[phase].ravel(), positions=positions, src=ranks, dst=ranks)  # fmt: skip
    for coll in timeline.collectives:
        end = np.broadcast_to(coll.end, coll.post.shape)
        sink.add(iters=iters, phase=coll.phase, step=coll.step, kind="collective", start=coll.post.ravel(),
                 end=end.ravel(), positions=positions, src=-1, dst=ranks, nbytes=coll.nbytes)  # fmt: skip


def full_events(timeline: Timeline, case_id: str, repeat: int = 0) -> pd.DataFrame:
    """Every span of every rank."""
    sink = RowSink(timeline)
    _iteration_rows(sink, timeline)
    world = timeline.case.world
    cols = np.arange(world)
    for phase, steps in (timeline.full or {}).items():
        _cell_rows(sink, phase, steps, cols, (cols + timeline.models[phase].direction) % world, cols)
    return sink.frame(case_id, repeat)


def bounded_events(timeline: Timeline, path_rows: list[list[tuple]], case_id: str, repeat: int = 0) -> pd.DataFrame:
    """Iteration rows of every rank, all spans of the kept positions on the kept steps, the critical paths'
    (``path_rows[g]``: walk.walk's rows of iteration g)."""
    sink = RowSink(timeline)
    _iteration_rows(sink, timeline)
    world = timeline.case.world
    for phase, kept in timeline.kept.items():
        if kept:
            take = kept[0][0]
            cols = np.searchsorted(take, timeline.keep)
            succ = np.searchsorted(take, (timeline.keep + timeline.models[phase].direction) % world)
            _cell_rows(sink, phase, [cells for _, cells in kept], cols, succ, timeline.keep)
    for g, rows in enumerate(path_rows):
        _path_rows(sink, timeline, g, rows)
    return sink.frame(case_id, repeat, dedupe=True)


def _path_rows(sink: RowSink, timeline: Timeline, g: int, rows: list[tuple]) -> None:
    """The critical path's spans (walk rows: kind, phase, step, position, start, end, lane or class)."""
    if not rows:
        return
    world = timeline.case.world
    ring = sink.ring
    table = pd.DataFrame(rows, columns=["kind", "phase", "step", "position", "start", "end", "extra"])
    for (kind, phase), part in table.groupby(["kind", "phase"], sort=False):
        model = timeline.models[phase]
        direction = model.direction
        pos = part["position"].to_numpy(np.int64)
        step = part["step"].to_numpy(np.int64)
        iters = np.full(len(part), g)
        rank, pred, nxt = ring[pos], ring[(pos - direction) % world], ring[(pos + direction) % world]
        start, end = part["start"].to_numpy(float), part["end"].to_numpy(float)
        if kind == "compute":
            cls = part["extra"].to_numpy(np.int64)
            distance = model.n_steps - 1 - step if model.reverse_blocks else step
            owner = ring[(pos - distance) % world]
            sink.add(iters=iters, phase=phase, step=step, kind=kind, start=start, end=end, positions=pos, src=owner,
                     dst=rank, block=owner, pair=sink.kinds[cls], flops=sink.flops[phase][cls])  # fmt: skip
            continue
        lanes = timeline.models[phase].lanes
        nbytes = np.array([lanes[name].nbytes for name in part["extra"]]) if kind != "wait" else 0
        src, dst = (rank, nxt) if kind == "send" else (pred, rank)
        sink.add(iters=iters, phase=phase, step=step, kind=kind, start=start, end=end, positions=pos, src=src,
                 dst=dst, nbytes=nbytes)  # fmt: skip
