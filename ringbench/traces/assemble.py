"""Every rank's reduced trace put on one clock and one iteration numbering, its messages matched across ranks,
its time in no op classified by evidence (evidence.py), and the events rows written (reconstruct.py's layout).

``assemble(ranks, ring, clock, labels, numbers)`` takes the importer's ``RankImport`` per rank and returns the rows,
the origin of the record's clock and what the notes of the import should say.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ringbench.traces.evidence import (
    WAIT_TOL_NS,
    classify_gaps,
    late_tolerance,
    match_messages,
    measured,
    subtract,
    union,
)
from ringbench.traces.rank_rows import (
    SEEN_FROM_PEER,
    clip,
    exchange_rows,
    own_rows,
    post_rows,
    post_spread,
    sync_rows,
    windows_of,
)
from ringbench.traces.reconstruct import compute_rows, iteration_rows, number_steps


@dataclass(kw_only=True, slots=True)
class Assembled:
    rows: list[pd.DataFrame]  # in the record's order of ties (events_frame sorts stably)
    origin_ns: int
    transfers: int = 0  # messages matched on both sides, in the kept iterations
    censored: int = 0
    own_ms: dict[int, float] = field(default_factory=dict)  # rank -> unprofiled own time per iteration (median)
    busy_share: dict[int, float] = field(default_factory=dict)  # rank -> share of its iterations in CPU ops
    synthesized: int = 0  # sends or receives seen only from their peer's side
    unseen_sides: list = field(default_factory=list)  # [{"src", "dst", "side", "count"}] of those, per hop


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


def _synthesize(ranks: dict[int, _Rank], matched: pd.DataFrame, hops: Counter | None = None) -> int:
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
                                       tid=ranks[owner].ring_tid, via=SEEN_FROM_PEER,
                                       iteration=int(seen["iteration"]), phase=seen["phase"],
                                       group=int(same.index[0]), step=int(seen["step"]))  # fmt: skip
            matched.at[m, side] = index
            added += 1
            if hops is not None:
                hops[(int(row["src"]), int(row["dst"]), direction)] += 1
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


def _message_ids(view: _Rank, matched: pd.DataFrame) -> pd.Series:
    """Row of ``matched`` for each of the rank's messages (-1 where unmatched)."""
    ids = pd.Series(-1, index=view.messages.index, dtype="int64")
    for side, owner in (("send_row", "src"), ("recv_row", "dst")):
        mine = matched[(matched[owner] == view.rank) & (matched[side] >= 0)]
        ids[mine[side].to_numpy()] = mine.index.to_numpy()
    return ids


def _classify(view: _Rank, matched: pd.DataFrame, ids: pd.Series, residual_ns: int, spread: pd.DataFrame):
    """(waits (start, end, id), own (start, end), ids observed on another thread) of one host-side rank. Ids of
    ``matched`` rows; a rotation by all-gather has id len(matched) + its exchange index. ``spread``:
    rank_rows.post_spread(view)."""
    windows = windows_of(view)
    # Held: in a sync point; or posting one exchange, from its first op to its last (a delayed post on one hop:
    # the time belongs to that hop's transfer, which it delays, not to the rank's own work).
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
    # A completion this rank did not observe (its side not in the trace) is known from the peer, who saw it a
    # little later than the rank took it: it still ends the rank's wait within a late take's tolerance.
    unseen = np.r_[~np.isfinite(seen), np.zeros(len(coll), bool)]
    slack = np.where(unseen, late, WAIT_TOL_NS)
    ready = np.where(np.isfinite(ready), ready, np.inf)  # no lower bound: within a late take only
    times = _taken_before(gaps, times, unseen, late, ready)
    waits, own = classify_gaps(gaps, times[ok].astype(np.int64), done[ok].astype(np.int64), all_ids[ok], late[ok],
                               slack[ok])  # fmt: skip
    return waits, own, set(mids[other].tolist())


def _taken_before(gaps: np.ndarray, times: np.ndarray, unseen: np.ndarray, late: np.ndarray,
                  ready: np.ndarray) -> np.ndarray:  # fmt: skip
    """Completions this rank did not observe (its side of the message is not in its trace: a helper thread sent
    it), placed where the rank most likely took them. The peer's observation at ``times`` only bounds the
    completion from above (the peer may have taken the block late), ``ready`` (both posts) from below. When the
    rank's last gap before ``times`` ended inside those bounds and it then moved on (the gap holding ``times``
    began only after, or none does), the rank was waiting for it there -- joining the thread that sent it -- and
    took it at that gap's end."""
    out = np.asarray(times, float).copy()
    if not len(gaps) or not unseen.any():
        return out
    ends, starts = gaps[:, 1], gaps[:, 0]
    long_enough = (ends - starts) >= WAIT_TOL_NS  # not the microseconds between two ops
    for i in np.nonzero(unseen & np.isfinite(out))[0]:
        t = out[i]
        before = np.searchsorted(ends, t, side="left") - 1  # the last gap ending before t
        while before >= 0 and not long_enough[before] and ends[before] >= min(ready[i], t - late[i]):
            before -= 1
        if before < 0 or not (ends[before] >= ready[i] or t - ends[before] <= late[i]):
            continue
        holder = np.searchsorted(starts, t, side="right") - 1
        fresh = holder <= before or (t <= ends[holder] and t - starts[holder] <= late[i]) or t > ends[holder]
        if fresh:
            out[i] = ends[before] - 1  # inside that gap, not at the start of one that begins there
    return out


def _sync_phase(view: _Rank) -> None:
    if view.syncs.empty:
        view.syncs["phase"] = pd.Series(dtype=object)
        return
    backward = view.syncs["iteration"].map(lambda i: (view.windows.get(i) or (0, None, 0))[1])
    bwd = backward.notna() & (view.syncs["join_ns"] >= backward.fillna(np.inf))
    view.syncs["phase"] = np.where(bwd, "bwd", "fwd")


def _share(spans: np.ndarray, windows: np.ndarray) -> float:
    total = float((windows[:, 1] - windows[:, 0]).sum()) if len(windows) else 0.0
    inside = clip(spans, windows)
    return float((inside[:, 1] - inside[:, 0]).sum()) / total if total > 0 else 0.0


def _received_in_window(views: dict[int, _Rank], matched: pd.DataFrame) -> np.ndarray:
    """Per matched message, whether its receiver holds it in a kept iteration."""
    inside = np.zeros(len(matched), bool)
    dst = matched["dst"].to_numpy()
    for rank, view in views.items():
        mine = dst == rank
        rows = matched["recv_row"].to_numpy()[mine]
        inside[mine] = view.messages["iteration"].reindex(rows).to_numpy() >= 0
    return inside


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
    unseen: Counter = Counter()
    synthesized = _synthesize(views, matched, unseen)
    matched["ready_ns"] = _ready(views, matched)
    ids = {r: _message_ids(v, matched) for r, v in views.items()}
    waits, owns, observers, spreads = {}, {}, {}, {}
    for r, view in views.items():
        if view.gpu:
            waits[r], owns[r] = np.empty((0, 3), np.int64), np.empty((0, 2), np.int64)
            continue
        spreads[r] = post_spread(view)
        waits[r], owns[r], observers[r] = _classify(view, matched, ids[r], int(clock.residual_ns or 0), spreads[r])
    proved = measured(matched, {r: w[w[:, 2] < len(matched)] for r, w in waits.items()}, observers)
    censored = ~proved
    origin = min(w[0] for v in views.values() for w in v.windows.values())
    rows, computes = [], []
    out = Assembled(rows=rows, origin_ns=int(origin), synthesized=synthesized,
                    unseen_sides=[{"src": a, "dst": b, "side": side, "count": n}
                                  for (a, b, side), n in sorted(unseen.items())])  # fmt: skip
    for r, view in views.items():
        rows.append(pd.DataFrame(iteration_rows(r, ring.index(r), view.windows)))
        computes.append(compute_rows(r, ring, view.compute))
        rows += [exchange_rows(view, ring, matched, ids[r], waits[r], censored), sync_rows(view, ring, world)]
        if not view.gpu:
            rows += [post_rows(view, ring, spreads[r]), own_rows(view, ring, owns[r])]
            gaps_own = clip(owns[r], windows_of(view))
            per_iteration = (gaps_own[:, 1] - gaps_own[:, 0]).sum() / 1e6 / max(len(view.windows), 1)
            out.own_ms[r] = float(per_iteration)
            out.busy_share[r] = _share(view.cpu_busy, windows_of(view))
    # Every rank's compute rows after all the other rows: the order ties keep in the record.
    out.rows = [frame for frame in rows + computes if frame is not None and len(frame)]
    kept = matched[(matched["send_row"] >= 0) & (matched["recv_row"] >= 0)]
    kept = kept[_received_in_window(views, kept)]
    host_side = [not views[int(d)].gpu for d in kept["dst"]]
    out.transfers = int(np.sum(host_side))
    out.censored = int(np.sum(censored[kept.index.to_numpy()][np.asarray(host_side, bool)])) if len(kept) else 0
    return out


__all__ = ["Assembled", "assemble"]
