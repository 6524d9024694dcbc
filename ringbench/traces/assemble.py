"""Every rank's reduced trace put on one clock and one iteration numbering, its messages matched across ranks,
its time in no op classified by evidence (evidence.py), and the events rows written (reconstruct.py's layout).

``assemble(ranks, ring, clock, labels, numbers)`` takes the importer's ``RankImport`` per rank and returns the rows,
the origin of the record's clock and what the notes of the import should say.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ringbench.traces.evidence import (
    LATE_NS,
    WAIT_TOL_NS,
    classify_gaps,
    late_tolerance,
    match_messages,
    measured,
    subtract,
    union,
)
from ringbench.traces.reconstruct import _row, compute_rows, iteration_rows, number_steps, step_of

_SEEN_FROM_PEER = "seen from its peer only"
MERGE_NS = 200_000  # waits of one exchange this close together are one wait (the wake-ups between them)


@dataclass(kw_only=True, slots=True)
class Assembled:
    rows: list[dict]
    origin_ns: int
    transfers: int = 0  # messages matched on both sides, in the kept iterations
    censored: int = 0
    own_ms: dict[int, float] = field(default_factory=dict)  # rank -> unprofiled own time per iteration (median)
    busy_share: dict[int, float] = field(default_factory=dict)  # rank -> share of its iterations in CPU ops
    synthesized: int = 0  # sends or receives seen only from their peer's side


def _shift(frame: pd.DataFrame, shift: int, remap: dict[int, int], columns) -> pd.DataFrame:
    frame = frame.copy()
    for column in columns:
        if column in frame:
            frame[column] = frame[column] + shift
    if "iteration" in frame:
        frame["iteration"] = frame["iteration"].map(remap).fillna(-1).astype("int64")
    return frame


@dataclass(kw_only=True, slots=True)
class _Rank:
    """One rank on the shared clock and iteration numbering."""

    rank: int
    gpu: bool
    ring_tid: int
    windows: dict  # iteration -> (start, backward start or None, end)
    messages: pd.DataFrame
    exchanges: pd.DataFrame
    compute: pd.DataFrame
    syncs: pd.DataFrame
    busy: np.ndarray
    cpu_busy: np.ndarray


def _on_clock(rank, shift: int, remap: dict[int, int], labels, numbers) -> _Rank:
    index = {label: i for i, label in enumerate(rank.iterations.labels)}
    windows = {}
    for label, number in zip(labels, numbers, strict=True):
        i = index[label]
        backward = rank.backward_starts.get(i)
        windows[number] = [int(rank.iterations.starts[i]) + shift, None if backward is None else backward + shift,
                           int(rank.iterations.ends[i]) + shift]  # fmt: skip
    exchanges = _shift(rank.exchanges, shift, remap, ["post_ns", "done_ns", "wait_start_ns", "wait_end_ns"])
    compute = _shift(rank.compute, shift, remap, ["order_ns", "start_ns", "end_ns"])
    syncs = _shift(rank.syncs, shift, remap, ["join_ns", "done_ns"])
    # A sync before the ring's first post and compute of an iteration opens it: the iteration starts at its
    # release (the wait there is the previous iteration's, on the rank that joined last).
    keep = np.ones(len(syncs), bool)
    for position, sync in enumerate(syncs.itertuples(index=False)):
        if sync.iteration < 0:
            continue
        first = np.nanmin(np.r_[exchanges.loc[exchanges["iteration"] == sync.iteration, "post_ns"].to_numpy(float),
                                compute.loc[compute["iteration"] == sync.iteration, "order_ns"].to_numpy(float),
                                np.inf])  # fmt: skip
        if not (sync.join_ns < first):
            continue
        keep[position] = False
        window = windows[sync.iteration]
        window[0] = int(max(window[0], sync.done_ns))
        if window[1] is not None:
            window[1] = max(window[1], window[0])
    return _Rank(rank=rank.file.rank, gpu=bool(rank.kernels), ring_tid=rank.ring_tid,
                 windows={k: tuple(v) for k, v in windows.items()},
                 messages=_shift(rank.messages, shift, remap, ["post_ns", "obs_ns"]), exchanges=exchanges,
                 compute=compute, syncs=syncs[keep].reset_index(drop=True), busy=rank.busy + shift,
                 cpu_busy=rank.cpu_busy + shift)  # fmt: skip


def _synthesize(ranks: dict[int, _Rank], matched: pd.DataFrame) -> int:
    """Give each message seen from one side only (its sender's ops not in the trace: posted by a thread the
    profiler did not follow) a row on the other side, in that rank's exchange of the same (iteration, phase,
    step): the peer's observation is then the only evidence of it. Edits ``matched`` and the tables in place."""
    added = 0
    for side, other, direction in (("send_row", "recv_row", "send"), ("recv_row", "send_row", "recv")):
        lonely = matched.index[(matched[side] < 0) & (matched[other] >= 0)]
        for m in lonely:
            row = matched.loc[m]
            owner, peer = (int(row["src"]), int(row["dst"])) if direction == "send" else (int(row["dst"]),
                                                                                           int(row["src"]))  # fmt: skip
            if owner not in ranks or peer not in ranks:
                continue
            seen = ranks[peer].messages.loc[int(row[other])]
            table = ranks[owner].exchanges
            same = table[(table["iteration"] == seen["iteration"]) & (table["phase"] == seen["phase"])
                         & (table["step"] == seen["step"]) & (table["kind"] == "p2p")]  # fmt: skip
            if seen["iteration"] < 0 or same.empty:
                continue
            group = same.iloc[0]
            messages = ranks[owner].messages
            index = int(messages.index.max()) + 1 if len(messages) else 0
            messages.loc[index] = dict(direction=direction, peer=peer, post_ns=int(group["post_ns"]), obs_ns=np.nan,
                                       obs_tid=ranks[owner].ring_tid, bytes=int(seen["bytes"]),
                                       tid=ranks[owner].ring_tid, via=_SEEN_FROM_PEER,
                                       iteration=int(seen["iteration"]), phase=seen["phase"],
                                       group=int(same.index[0]), step=int(seen["step"]))  # fmt: skip
            matched.at[m, side] = index
            added += 1
    return added


def _ready(views: dict[int, _Rank], matched: pd.DataFrame) -> np.ndarray:
    """When each message could move: the later of its two exchanges' posts (NaN sides ignored)."""
    out = np.full(len(matched), np.nan)
    for side, owner in (("send_row", "src"), ("recv_row", "dst")):
        for rank, rows in matched[matched[side] >= 0].groupby(owner):
            view = views.get(int(rank))
            if view is None:
                continue
            groups = view.messages.loc[rows[side].to_numpy(), "group"].to_numpy()
            posts = view.exchanges["post_ns"].reindex(groups).to_numpy(float)
            out[rows.index.to_numpy()] = np.fmax(out[rows.index.to_numpy()], posts)
    return out


def _windows(view: _Rank) -> np.ndarray:
    return np.array([(w[0], w[2]) for w in view.windows.values()], np.int64).reshape(-1, 2)


def _message_ids(view: _Rank, matched: pd.DataFrame) -> pd.Series:
    """Row of ``matched`` for each of the rank's messages (-1 where unmatched)."""
    ids = pd.Series(-1, index=view.messages.index, dtype="int64")
    for side, owner in (("send_row", "src"), ("recv_row", "dst")):
        mine = matched[(matched[owner] == view.rank) & (matched[side] >= 0)]
        ids[mine[side].to_numpy()] = mine.index.to_numpy()
    return ids


def _classify(view: _Rank, matched: pd.DataFrame, ids: pd.Series, residual_ns: int):
    """(waits (start, end, id), own (start, end), ids observed on another thread) of one host-side rank. Ids of
    ``matched`` rows; a rotation by all-gather has id len(matched) + its exchange index."""
    windows = _windows(view)
    # Held: in a sync point; or posting one exchange, from its first op to its last (a delayed post on one hop:
    # the time belongs to that hop's transfer, which it delays, not to the rank's own work).
    spread = _post_spread(view)
    held = union(np.r_[view.syncs["join_ns"].to_numpy(np.int64), spread["start_ns"].to_numpy(np.int64)],
                 np.r_[view.syncs["done_ns"].to_numpy(np.int64), spread["end_ns"].to_numpy(np.int64)])  # fmt: skip
    gaps = subtract(subtract(windows, view.busy), held)
    msgs = view.messages[(ids >= 0).to_numpy()]
    mids = ids[msgs.index].to_numpy()
    done = matched["done_ns"].to_numpy(float)[mids]
    seen = msgs["obs_ns"].to_numpy(float)
    times = np.where(np.isfinite(seen), seen, done)
    other = np.isfinite(seen) & (msgs["obs_tid"].to_numpy() != view.ring_tid)
    coll = view.exchanges[view.exchanges["kind"] == "collective"]
    times = np.r_[times, coll["done_ns"].to_numpy(float)]
    done = np.r_[done, coll["done_ns"].to_numpy(float)]
    all_ids = np.r_[mids, len(matched) + coll.index.to_numpy(np.int64)]
    ready = np.r_[matched["ready_ns"].to_numpy(float)[mids], coll["post_ns"].to_numpy(float)]
    late = late_tolerance(done, ready, residual_ns)
    ok = np.isfinite(times) & np.isfinite(done)
    waits, own = classify_gaps(gaps, times[ok].astype(np.int64), done[ok].astype(np.int64), all_ids[ok], late[ok])
    return waits, own, set(mids[other].tolist())


def _post_spread(view: _Rank) -> pd.DataFrame:
    """Per exchange posted on the ring thread: from its first op to its last (start_ns, end_ns), and the hop of
    the last op (src, dst): who held the exchange back."""
    posted = view.messages[(view.messages["tid"] == view.ring_tid) & (view.messages["via"] != _SEEN_FROM_PEER)]
    if posted.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "src", "dst"])
    posted = posted.sort_values("post_ns", kind="stable")
    first = posted.groupby("group")["post_ns"].min()
    last = posted.groupby("group").tail(1).set_index("group")
    send = last["direction"] == "send"
    return pd.DataFrame({"start_ns": first, "end_ns": last["post_ns"],
                         "src": np.where(send, view.rank, last["peer"]),
                         "dst": np.where(send, last["peer"], view.rank)})  # fmt: skip


def _post_rows(view: _Rank, ring: list[int]) -> list[dict]:
    """An exchange's post held back on one hop (time in no op between its first op and its last, over
    WAIT_TOL_NS): that hop's time."""
    spread = _post_spread(view)
    spread = spread[(spread["end_ns"] - spread["start_ns"]) > WAIT_TOL_NS]
    rows = []
    for group, held in spread.iterrows():
        if group not in view.exchanges.index or view.exchanges.at[group, "iteration"] < 0:
            continue
        ex = view.exchanges.loc[group]
        pieces = subtract(np.array([[held["start_ns"], held["end_ns"]]], np.int64), view.busy)
        for start, end in pieces:
            rows.append(_row(kind="post", iteration=int(ex["iteration"]), phase=ex["phase"], step=int(ex["step"]),
                             rank=view.rank, ring_position=ring.index(view.rank), start_ns=int(start),
                             end_ns=int(end), src=int(held["src"]), dst=int(held["dst"])))  # fmt: skip
    return rows


def _exchange_rows(view: _Rank, ring: list[int], matched: pd.DataFrame, ids: pd.Series, waits: np.ndarray,
                   censored: np.ndarray) -> list[dict]:  # fmt: skip
    """send / recv / wait rows per exchange, and collective rows, of one rank (vectorised over exchanges)."""
    position = ring.index(view.rank)
    exchanges = view.exchanges[view.exchanges["iteration"] >= 0]
    if exchanges.empty:
        return []
    done = matched["done_ns"].to_numpy(float)
    flags = censored if not view.gpu else np.zeros(len(censored), bool)
    # The blocked time of each exchange: its last run of waits (MERGE_NS apart joined), by the exchange of the
    # message (or the collective) each wait was for.
    group_of = pd.Series(view.messages["group"].to_numpy(), index=ids.to_numpy())
    group_of = group_of[group_of.index >= 0]
    blocked = pd.DataFrame(waits, columns=["start", "end", "id"])
    collective = blocked["id"] >= len(matched)
    blocked["group"] = np.where(collective, blocked["id"] - len(matched),
                                group_of.reindex(blocked["id"].where(~collective, -1)).to_numpy())  # fmt: skip
    last = _last_runs(blocked.dropna(subset=["group"]).astype({"group": "int64"}))
    msgs = view.messages.assign(mid=ids.to_numpy())
    msgs = msgs[(msgs["mid"] >= 0) & msgs["group"].isin(exchanges.index)]
    msgs = msgs.assign(done=done[msgs["mid"].to_numpy()], flag=flags[msgs["mid"].to_numpy()],
                       bytes=msgs["bytes"].clip(lower=0))  # fmt: skip
    msgs = msgs[np.isfinite(msgs["done"])].sort_values("done", kind="stable")
    msgs = msgs.assign(measured_done=msgs["done"].where(~msgs["flag"]))
    sides = msgs.groupby(["group", "direction", "peer"], sort=False).agg(
        end=("done", "last"), bytes=("bytes", "sum"), seen=("obs_ns", "max"), measured=("measured_done", "max"),
    ).reset_index()  # fmt: skip
    # A side's completion is measured when a message measured completed with its last one (within a late take's
    # tolerance: K waited for, V in hand the moment after), else it is a bound.
    sides["censored"] = ~(sides["end"] - sides["measured"] <= LATE_NS).to_numpy() if not view.gpu else False
    sides["seen"] = sides["seen"].fillna(sides["end"])
    ex = exchanges.reindex(sides["group"])
    rows = []
    for side, e in zip(sides.itertuples(index=False), ex.itertuples(index=False), strict=True):
        at = dict(iteration=int(e.iteration), phase=e.phase, step=int(e.step), rank=view.rank, ring_position=position)
        post = int(e.post_ns)
        src, dst = (view.rank, int(side.peer)) if side.direction == "send" else (int(side.peer), view.rank)
        rows.append(_row(kind=side.direction, start_ns=post, end_ns=max(int(side.end), post), src=src, dst=dst,
                         bytes=int(side.bytes), censored=bool(side.censored), **at))  # fmt: skip
        if side.direction != "recv":
            continue
        if view.gpu and np.isfinite(getattr(e, "wait_start_ns", np.nan)):
            start, stop = int(e.wait_start_ns), int(e.wait_end_ns)
        elif side.group in last.index:
            start, stop = int(last.at[side.group, "start"]), int(last.at[side.group, "end"])
        else:  # where the rank came to take it: zero-length
            start = stop = int(_came_to(view.busy, float(side.seen)))
        rows.append(_row(kind="wait", start_ns=start, end_ns=stop, src=src, dst=view.rank, **at))
    for group, e in exchanges[exchanges["kind"] == "collective"].iterrows():
        at = dict(iteration=int(e["iteration"]), phase=e["phase"], step=int(e["step"]), rank=view.rank,
                  ring_position=position)  # fmt: skip
        if group in last.index:
            start, stop = int(last.at[group, "start"]), int(last.at[group, "end"])
        else:
            start = stop = int(e["done_ns"])
        rows.append(_row(kind="collective", start_ns=start, end_ns=stop, dst=view.rank, bytes=int(e["bytes"]), **at))
    return rows


def _last_runs(blocked: pd.DataFrame) -> pd.DataFrame:
    """Per exchange (``group``), the last run of its waits: consecutive waits less than MERGE_NS apart are one."""
    if blocked.empty:
        return pd.DataFrame(columns=["start", "end"])
    blocked = blocked.sort_values(["group", "start"], kind="stable")
    previous_end = blocked.groupby("group")["end"].shift()
    new_run = previous_end.isna() | (blocked["start"] - previous_end > MERGE_NS)
    blocked = blocked.assign(run=new_run.astype(int).groupby(blocked["group"]).cumsum())
    final = blocked[blocked["run"] == blocked.groupby("group")["run"].transform("max")]
    return final.groupby("group").agg(start=("start", "min"), end=("end", "max"))


def _came_to(busy: np.ndarray, seen: float) -> float:
    """When the rank came to take a block it observed at ``seen``: then, or at the end of the op it was in (an
    observation on another thread while the ring thread computed)."""
    if not len(busy) or not np.isfinite(seen):
        return seen
    slot = np.searchsorted(busy[:, 0], seen, side="right") - 1
    return float(busy[slot, 1]) if slot >= 0 and busy[slot, 1] > seen else seen


def _own_rows(view: _Rank, ring: list[int], own: np.ndarray) -> list[dict]:
    """The rank's own work beside its compute spans: other ops and unprofiled time that was no wait."""
    compute = union(view.compute["start_ns"], view.compute["end_ns"]) if len(view.compute) else np.empty((0, 2))
    windows = _windows(view)
    others = subtract(view.busy, compute.astype(np.int64))
    spans = union(np.r_[own[:, 0], others[:, 0]], np.r_[own[:, 1], others[:, 1]])
    spans = _clip(spans, windows)
    if not len(spans):
        return []
    starts = np.array([w[0] for w in view.windows.values()], np.int64)
    numbers = np.array(list(view.windows), np.int64)
    order = np.argsort(starts)
    slot = order[np.clip(np.searchsorted(starts[order], spans[:, 0], side="right") - 1, 0, None)]
    iteration = numbers[slot]
    backward = np.array([view.windows[n][1] if view.windows[n][1] is not None else np.iinfo(np.int64).max
                         for n in iteration], np.int64)  # fmt: skip
    phase = np.where(spans[:, 0] >= backward, "bwd", "fwd")
    anchors = pd.concat([
        view.compute[view.compute["iteration"] >= 0].assign(time_ns=view.compute["start_ns"])[
            ["iteration", "phase", "time_ns", "step"]],
        view.exchanges[view.exchanges["iteration"] >= 0].assign(time_ns=view.exchanges["post_ns"])[
            ["iteration", "phase", "time_ns", "step"]],
    ])  # fmt: skip
    steps = step_of(anchors, iteration, phase, spans[:, 0])
    position = ring.index(view.rank)
    return [_row(kind="own", iteration=int(i), phase=str(p), step=int(s), rank=view.rank, ring_position=position,
                 start_ns=int(a), end_ns=int(b), src=view.rank, dst=view.rank)
            for (a, b), i, p, s in zip(spans, iteration, phase, steps, strict=True)]  # fmt: skip


def _clip(spans: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """``spans`` cut to the union of ``windows``."""
    if not len(spans) or not len(windows):
        return np.empty((0, 2), np.int64)
    outside = subtract(np.array([[min(spans[:, 0].min(), windows[:, 0].min()) - 1,
                                  max(spans[:, 1].max(), windows[:, 1].max()) + 1]], np.int64),
                       union(windows[:, 0], windows[:, 1]))  # fmt: skip
    return subtract(spans.astype(np.int64), outside)


def _sync_rows(view: _Rank, ring: list[int], world: int) -> list[dict]:
    position = ring.index(view.rank)
    rows = []
    syncs = view.syncs[view.syncs["iteration"] >= 0].sort_values("join_ns", kind="stable")
    for (iteration, phase), group in syncs.groupby(["iteration", "phase"], sort=False):
        for j, sync in enumerate(group.itertuples(index=False)):
            rows.append(_row(kind="sync", iteration=int(iteration), phase=phase, step=world + j, rank=view.rank,
                             ring_position=position, start_ns=int(sync.join_ns),
                             end_ns=int(max(sync.join_ns, sync.done_ns)), dst=view.rank))  # fmt: skip
    return rows


def _sync_phase(view: _Rank) -> None:
    if view.syncs.empty:
        view.syncs["phase"] = pd.Series(dtype=object)
        return
    backward = view.syncs["iteration"].map(lambda i: (view.windows.get(i) or (0, None, 0))[1])
    bwd = backward.notna() & (view.syncs["join_ns"] >= backward.fillna(np.inf))
    view.syncs["phase"] = np.where(bwd, "bwd", "fwd")


def _share(spans: np.ndarray, windows: np.ndarray) -> float:
    total = float((windows[:, 1] - windows[:, 0]).sum()) if len(windows) else 0.0
    inside = _clip(spans, windows)
    return float((inside[:, 1] - inside[:, 0]).sum()) / total if total > 0 else 0.0


def assemble(ranks, ring: list[int], clock, labels: list[str], numbers: list[int]) -> Assembled:
    """The events rows of every rank (module doc); ``clock``: traces.clocks.ClockFit."""
    world = len(ring)
    views: dict[int, _Rank] = {}
    for rank in ranks:
        index = {label: i for i, label in enumerate(rank.iterations.labels)}
        remap = {index[label]: number for number, label in zip(numbers, labels, strict=True)}
        view = _on_clock(rank, clock.offsets_ns[rank.file.rank], remap, labels, numbers)
        view.compute = view.compute.sort_values("order_ns", kind="stable")
        view.compute["step"] = view.compute.groupby(["iteration", "phase"]).cumcount() if len(view.compute) else []
        view.exchanges["step"] = number_steps(view.exchanges, view.compute, world)
        view.messages["step"] = view.exchanges["step"].reindex(view.messages["group"]).to_numpy()
        _sync_phase(view)
        views[view.rank] = view
    matched = match_messages({r: v.messages for r, v in views.items()})
    synthesized = _synthesize(views, matched)
    matched["ready_ns"] = _ready(views, matched)
    ids = {r: _message_ids(v, matched) for r, v in views.items()}
    waits, owns, observers = {}, {}, {}
    for r, view in views.items():
        if view.gpu:
            waits[r], owns[r] = np.empty((0, 3), np.int64), np.empty((0, 2), np.int64)
            continue
        waits[r], owns[r], observers[r] = _classify(view, matched, ids[r], int(clock.residual_ns or 0))
    proved = measured(matched, {r: w[w[:, 2] < len(matched)] for r, w in waits.items()}, observers)
    censored = ~proved
    origin = min(w[0] for v in views.values() for w in v.windows.values())
    rows = []
    out = Assembled(rows=rows, origin_ns=int(origin), synthesized=synthesized)
    for r, view in views.items():
        rows += iteration_rows(r, ring.index(r), view.windows)
        rows.append(compute_rows(r, ring, view.compute))
        rows += _exchange_rows(view, ring, matched, ids[r], waits[r], censored)
        rows += _sync_rows(view, ring, world)
        if not view.gpu:
            rows += _post_rows(view, ring)
            mine = _own_rows(view, ring, owns[r])
            rows += mine
            gaps_own = _clip(owns[r], _windows(view))
            per_iteration = (gaps_own[:, 1] - gaps_own[:, 0]).sum() / 1e6 / max(len(view.windows), 1)
            out.own_ms[r] = float(per_iteration)
            out.busy_share[r] = _share(view.cpu_busy, _windows(view))
    kept = matched[(matched["send_row"] >= 0) & (matched["recv_row"] >= 0)]
    in_window = [views[int(d)].messages.at[int(i), "iteration"] >= 0 if int(d) in views else False
                 for d, i in zip(kept["dst"], kept["recv_row"], strict=True)]  # fmt: skip
    kept = kept[np.asarray(in_window, bool)] if len(kept) else kept
    host_side = [not views[int(d)].gpu for d in kept["dst"]]
    out.transfers = int(np.sum(host_side))
    out.censored = int(np.sum(censored[kept.index.to_numpy()][np.asarray(host_side, bool)])) if len(kept) else 0
    return out


__all__ = ["Assembled", "assemble"]
