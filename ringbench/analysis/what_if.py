"""What fixing a straggler would save: each iteration replayed from its record, as it ran and with the culprit
brought to its peers' speed.

A straggler's cost is the time the ring would save without it. The critical path says where the time went, but not
what the ring would do instead: behind a slow rank the others' transfers hide, and a fixed rank exposes them again;
a held-back send delays its receiver and, through it, the whole ring; a barrier waits for whoever is last. So the
cost is measured on the ring's own dependencies, replayed:

* Each rank's iteration is its sequence of spans in time order. Its own work (``compute``, ``own``) and the time it
  held an exchange back (``post``) last what they lasted; the gaps between spans too (work the trace does not name).
  A ``wait`` ends when its exchange completes -- the later of the two posts plus the transfer -- and then as long
  after as it did (a wake-up). A ``sync`` (barrier) or ``collective`` ends when its last rank joins, likewise.
* A transfer lasts what it was measured to last; a censored one (its end only a bound: nobody waited for it) the
  median of its hop's measured transfers, else of every measured one of its phase.
* The replay runs each rank forward until it needs a post another rank has not reached yet (a discrete-event walk,
  in the order the dependencies allow; posts happen where they happened in the rank's sequence).

``savings`` replays each iteration twice: as recorded (which reproduces the recorded iteration up to the gaps the
trace cannot place) and with the fixes -- a rank's own work scaled to its peers' in that iteration (its own time
per unit of work against their median), a hop's transfers cut to the other hops' median (same phase and exchange)
and its held-back posts removed -- and the cost is the difference. The same walk for every record: ringbench's runs
(compute, wait), imported traces (own, post, sync) and simulated ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

BUSY = ("compute", "own", "post")
BLOCKED = ("wait", "sync", "collective")
GROUP = ["case_id", "repeat", "iteration"]
TOLERANCE_NS = 20_000  # a send that completed this close after a wait ended was still waited for
SAVINGS_COLUMNS = [*GROUP, "replayed_ms", "fixed_ms", "saved_ms"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Fix:
    """What a fix changes: per (repeat, iteration, rank) the factor its own work is scaled by; hops (src, dst) whose
    transfers take their peers' median and whose held-back posts vanish."""

    scales: dict[tuple[int, int, int], float] = field(default_factory=dict)
    hops: frozenset[tuple[int, int]] = frozenset()


@dataclass(slots=True)
class _Item:
    kind: str  # a BUSY or BLOCKED kind, or "mark" (a post: zero length)
    gap_ns: float  # from the previous item's end (or the rank's start) to this one's start, as recorded
    ms_ns: float  # recorded length
    key: object = None  # wait: transfer rows; sync / collective: the (phase, step) it joins; mark: its post id
    tail_ns: float = 0.0  # blocked: recorded end - max(recorded start, recorded release)
    hop: tuple[int, int] | None = None
    rank: int = -1
    iteration: int = 0
    inside_ns: float = -1.0  # mark: how far into the span before it the post happened (-1: after that span)


def _transfer_ms(xfers: pd.DataFrame) -> np.ndarray:
    """Each transfer's length for the replay: measured, or for a censored one the median of its hop's measured
    transfers (else of its phase's)."""
    ms = xfers["transfer_ms"].to_numpy(float).copy()
    if "censored" not in xfers:
        return ms
    cut = xfers["censored"].to_numpy(bool)
    if not cut.any():
        return ms
    good = xfers[~cut]
    by_hop = good.groupby(["phase", "src", "dst"], observed=True)["transfer_ms"].median()
    by_phase = good.groupby("phase", observed=True)["transfer_ms"].median()
    for i in np.nonzero(cut)[0]:
        row = xfers.iloc[i]
        value = by_hop.get((row["phase"], row["src"], row["dst"]), by_phase.get(row["phase"], np.nan))
        ms[i] = min(ms[i], value) if np.isfinite(value) else ms[i]
    return ms


def _peer_ms(xfers: pd.DataFrame, hops: frozenset) -> dict:
    """(phase, exchange) -> the median measured transfer of the hops not being fixed."""
    if not hops:
        return {}
    good = xfers[~xfers["censored"].astype(bool)] if "censored" in xfers else xfers
    others = good[[(int(s), int(d)) not in hops for s, d in zip(good["src"], good["dst"], strict=True)]]
    return others.groupby(["phase", "exchange"], observed=True)["transfer_ms"].median().to_dict()


def _sequences(rows: pd.DataFrame, xfers: pd.DataFrame) -> tuple[dict[int, list[_Item]], dict[int, float]]:
    """Per rank: its items in time order (spans and post marks), and its first time (the replay's origin)."""
    spans = rows[rows["kind"].isin(BUSY + BLOCKED)]
    post_rank = np.r_[xfers["dst"].to_numpy(float), xfers["src"].to_numpy(float)]
    post_time = np.r_[xfers["recv_start_ns"].to_numpy(float), xfers["send_start_ns"].to_numpy(float)]
    ok = np.isfinite(post_time) & np.isfinite(post_rank)
    marks = np.unique(np.c_[post_rank[ok], post_time[ok]], axis=0) if ok.any() else np.empty((0, 2))
    kind = np.r_[spans["kind"].astype(str).to_numpy(object), np.full(len(marks), "mark", object)]
    rank = np.r_[spans["rank"].to_numpy(float), marks[:, 0]].astype(np.int64)
    start = np.r_[spans["start_ns"].to_numpy(float), marks[:, 1]]
    end = np.r_[spans["end_ns"].to_numpy(float), marks[:, 1]]
    phase = np.r_[spans["phase"].astype(str).to_numpy(object), np.full(len(marks), "", object)]
    step = np.r_[spans["step"].to_numpy(float), np.full(len(marks), np.nan)]
    iteration = np.r_[spans["iteration"].to_numpy(np.int64), np.full(len(marks), -1)]
    src = np.r_[spans["src"].to_numpy(float), np.full(len(marks), -1.0)]
    dst = np.r_[spans["dst"].to_numpy(float), np.full(len(marks), -1.0)]
    # Marks before spans that start at the same time: a post at a wait's start comes before the wait.
    order = np.lexsort((kind != "mark", start, rank))
    out: dict[int, list[_Item]] = {}
    origin: dict[int, float] = {}
    previous = last_start = 0.0
    for i in order:
        r = int(rank[i])
        if r not in out:
            out[r], origin[r], previous = [], float(start[i]), float(start[i])
            last_start = previous
        gap = max(0.0, start[i] - previous)
        if kind[i] == "mark":
            inside = start[i] - last_start if start[i] < previous else -1.0  # posted while that span ran
            out[r].append(_Item(kind="mark", gap_ns=gap, ms_ns=0.0, key=(r, float(start[i])), inside_ns=inside))
            previous = max(previous, start[i])
            continue
        last_start = start[i]
        hop = (int(src[i]), int(dst[i])) if kind[i] == "post" else None
        out[r].append(_Item(kind=kind[i], gap_ns=gap, ms_ns=max(0.0, end[i] - max(start[i], previous)),
                            key=(int(iteration[i]), phase[i], step[i], float(start[i])), hop=hop, rank=r,
                            iteration=int(iteration[i])))  # fmt: skip
        previous = max(previous, end[i])
    for r in [r for r, items in out.items() if not any(item.kind != "mark" for item in items)]:
        del out[r], origin[r]
    return out, origin


def _replay(seqs, origin, deps, joins_of, fix_scale, fixed_hops) -> dict[int, float]:
    """Walk every rank forward (module doc) through all the iterations at once (without a barrier, ranks run into
    the next iteration while others finish this one); returns each iteration's replayed end (ns), the latest end
    of its spans over the ranks. ``fix_scale``: (iteration, rank) -> factor of its own work."""
    post_at: dict = {}  # (rank, recorded time) -> replayed time
    join_at: dict = {}  # (iteration, phase, step) -> {rank: replayed join}
    ends: dict[int, float] = {}
    cursor = {r: 0 for r in seqs}
    clock = dict(origin)
    began = dict(origin)  # each rank's last span's replayed start
    pending = set(seqs)
    while pending:
        moved = False
        for rank in sorted(pending):
            items = seqs[rank]
            while cursor[rank] < len(items):
                item = items[cursor[rank]]
                start = clock[rank] + item.gap_ns
                if item.kind == "mark":
                    post_at[item.key] = min(began[rank] + item.inside_ns, clock[rank]) if item.inside_ns >= 0 else start
                    clock[rank] = clock[rank] if item.inside_ns >= 0 else start
                    cursor[rank] += 1
                    continue
                began[rank] = start
                if item.kind in BUSY:
                    scale = 0.0 if item.hop is not None and item.hop in fixed_hops else (
                        fix_scale.get((item.iteration, rank), 1.0) if item.kind != "post" else 1.0)  # fmt: skip
                    clock[rank] = start + item.ms_ns * scale
                elif item.kind == "wait":
                    release = _released(deps.get((rank, item.key[3])), post_at)
                    if release is None:
                        break
                    clock[rank] = max(start, release) + item.tail_ns if np.isfinite(release) else start + item.ms_ns
                else:  # sync / collective: released when its last rank joins
                    joined = join_at.setdefault(item.key[:3], {})
                    joined[rank] = start
                    expected = joins_of.get(item.key[:3], set())
                    if not expected <= set(joined):
                        break
                    clock[rank] = max(start, max(joined.values())) + item.tail_ns
                ends[item.iteration] = max(ends.get(item.iteration, -np.inf), clock[rank])
                cursor[rank] += 1
                moved = True
            if cursor[rank] >= len(items):
                pending.discard(rank)
        if not moved and pending:  # a dependency the record cannot order: release the first blocked rank as recorded
            rank = min(pending)
            item = seqs[rank][cursor[rank]]
            clock[rank] = clock[rank] + item.gap_ns + item.ms_ns
            cursor[rank] += 1
            if cursor[rank] >= len(seqs[rank]):
                pending.discard(rank)
    return ends


def _released(dep, post_at) -> float | None:
    """When a wait's exchange completed in the replay: the latest of its transfers' (later post + length); NaN when
    the wait has no transfer; None while a post it needs has not been replayed yet."""
    if not dep:
        return np.nan
    latest = -np.inf
    for _, recv_post, send_post, length in dep:
        times = []
        for post in (recv_post, send_post):
            if post is None:
                continue
            if post not in post_at:
                return None
            times.append(post_at[post])
        if times:
            latest = max(latest, max(times) + length)
    return latest if np.isfinite(latest) else np.nan


def _tails(seqs, deps, joins, ready) -> None:
    """Each blocked item's wake-up: how long after its release (recorded) it ended. ``ready``: per transfer, the
    later of its two recorded posts."""
    for rank, items in seqs.items():
        clock = None
        for item in items:
            if item.kind == "wait":
                dep = deps.get((rank, item.key[3])) or []
                ends = [ready[j] + length for j, _, _, length in dep if np.isfinite(ready[j] + length)]
                start = item.key[3]
                release = max(ends) if ends else np.nan
                end = start + item.ms_ns
                item.tail_ns = max(0.0, end - max(start, release)) if np.isfinite(release) else item.ms_ns
            elif item.kind in ("sync", "collective"):
                start = item.key[3]
                release = joins.get(item.key[:3], start)
                item.tail_ns = max(0.0, start + item.ms_ns - max(start, release))
            clock = item
        del clock


def savings(events: pd.DataFrame, xfers: pd.DataFrame, case_id, fix: Fix) -> pd.DataFrame:
    """Per (case, repeat, iteration) of ``case_id``: the iteration replayed as recorded and with ``fix``, in ms,
    and what the fix saves (SAVINGS_COLUMNS). An iteration's length runs from the previous iteration's replayed
    end (the first: from the earliest rank's start)."""
    mine = events[events["case_id"] == case_id]
    moved = xfers[xfers["case_id"] == case_id] if len(xfers) else xfers
    # Times relative to the case's first span: ns since the epoch would lose precision as floats.
    base = int(mine["start_ns"].min()) if len(mine) else 0
    mine = mine.assign(start_ns=mine["start_ns"] - base, end_ns=mine["end_ns"] - base)
    if len(moved):
        shift = {c: moved[c] - base for c in ("recv_start_ns", "send_start_ns", "recv_end_ns", "wait_start_ns")}
        moved = moved.assign(**shift)
    rows = []
    # Each iteration is replayed on its own, from where it began: a record does not always hold what happens between
    # iterations (a barrier that opens one is its start; a run's harness barrier is not recorded). Where iterations
    # overlap (no barrier: a rank runs into the next while the others finish this one) a late rank's delay is partly
    # hidden by that overlap, which this replay does not see: its cost is then too high (docs/import.md, limits).
    continuous = False
    keys = ["repeat"] if continuous else ["repeat", "iteration"]
    mine, moved = mine[mine["iteration"] >= 0], moved[moved["iteration"] >= 0] if len(moved) else moved
    grouped = dict(iter(moved.groupby(keys, sort=False))) if len(moved) else {}
    for key, part in mine.groupby(keys, sort=True):
        repeat = key[0] if isinstance(key, tuple) else key
        those = grouped.get(key, moved.iloc[0:0]).reset_index(drop=True)
        seqs, origin = _sequences(part, those)
        if len(seqs) < 2:
            continue
        deps, _ = _dependencies(those)
        joins_of, first_join = _joins(part)
        ready = np.fmax(those["recv_start_ns"].to_numpy(float), those["send_start_ns"].fillna(-np.inf).to_numpy(float))
        _tails(seqs, deps, first_join, ready)
        scale = {(i, r): f for (rep, i, r), f in fix.scales.items() if rep == int(repeat)}
        replayed = _lengths(_replay(seqs, origin, deps, joins_of, {}, frozenset()), origin)
        fixed = _lengths(_replay(seqs, origin, _fixed(deps, those, fix.hops), joins_of, scale, fix.hops), origin)
        for iteration, length in replayed.items():
            saved = (length - fixed.get(iteration, length)) / 1e6
            rows.append(dict(case_id=case_id, repeat=int(repeat), iteration=int(iteration), replayed_ms=length / 1e6,
                             fixed_ms=fixed.get(iteration, length) / 1e6, saved_ms=max(0.0, saved)))  # fmt: skip
    return pd.DataFrame(rows, columns=SAVINGS_COLUMNS)


def _lengths(ends: dict[int, float], origin: dict[int, float]) -> dict[int, float]:
    """Each iteration's length from the replayed ends: from the previous iteration's end (the first: from the
    earliest rank's start), so the sum over iterations is the whole replayed run."""
    out, previous = {}, min(origin.values())
    for iteration in sorted(i for i in ends if i >= 0):
        out[iteration] = ends[iteration] - previous
        previous = ends[iteration]
    return out


def _dependencies(xfers: pd.DataFrame):
    """(wait -> [(transfer index, recv post, send post, length ns)], recorded completions in ns). A wait is keyed
    by (its rank, its recorded start); posts by (rank, recorded time). A wait holds for the block it receives and
    for the one it sends in the same step (the later of the two releases it). A completion is known from the
    earliest observation of it, an upper bound: where that lies after the wait ended, the rank had the block by the
    wait's end, and the transfer's length for this wait runs to there (so the record replays as it ran)."""
    base = _transfer_ms(xfers) * 1e6 if len(xfers) else np.empty(0)
    ends = xfers["recv_end_ns"].to_numpy(float) if len(xfers) else np.empty(0)
    deps: dict = {}
    if xfers.empty:
        return deps, ends
    keys = ["phase", "step", "ordinal"] + (["layer"] if "layer" in xfers else [])
    sends = {}
    for i, row in enumerate(xfers[["src", *keys]].itertuples(index=False)):
        sends.setdefault((int(row[0]), *row[1:]), []).append(i)
    wait_end = xfers["wait_end_ns"].to_numpy(float)
    src, dst = xfers["src"].to_numpy(), xfers["dst"].to_numpy()
    recv_post, send_post = xfers["recv_start_ns"].to_numpy(float), xfers["send_start_ns"].to_numpy(float)
    ready = np.fmax(recv_post, np.nan_to_num(send_post, nan=-np.inf))
    for i, row in enumerate(xfers.itertuples(index=False)):
        if not np.isfinite(row.wait_start_ns):
            continue
        mine = deps.setdefault((int(row.dst), float(row.wait_start_ns)), [])
        for j in [i, *sends.get((int(row.dst), *(getattr(row, k) for k in keys)), [])]:
            recv = (int(dst[j]), float(recv_post[j]))
            send = (int(src[j]), float(send_post[j])) if np.isfinite(send_post[j]) else None
            length = min(base[j], max(0.0, wait_end[i] - ready[j])) if j != i else base[j]
            mine.append((j, recv, send, length))
    return deps, ends


def _fixed(deps: dict, xfers: pd.DataFrame, hops: frozenset) -> dict:
    """``deps`` with the transfers over ``hops`` cut to the other hops' median (same phase and exchange)."""
    if not hops or xfers.empty:
        return deps
    peers = _peer_ms(xfers, hops)
    cap = np.full(len(xfers), np.inf)
    for i, row in enumerate(xfers[["src", "dst", "phase", "exchange"]].itertuples(index=False)):
        if (int(row.src), int(row.dst)) in hops:
            cap[i] = peers.get((row.phase, row.exchange), np.nan) * 1e6
    cap = np.where(np.isfinite(cap) | (cap == np.inf), cap, np.inf)
    return {key: [(j, recv, send, min(length, cap[j])) for j, recv, send, length in entries]
            for key, entries in deps.items()}  # fmt: skip


def _joins(rows: pd.DataFrame) -> tuple[dict, dict]:
    """Per (iteration, phase, step) of a sync / collective: the ranks that join it, and the last recorded join."""
    joins = rows[rows["kind"].isin(("sync", "collective"))]
    keys = ["iteration", "phase", "step"]
    ranks = {(int(k[0]), k[1], k[2]): set(map(int, g["rank"])) for k, g in joins.groupby(keys, observed=True)}
    last = {(int(k[0]), k[1], k[2]): float(v) for k, v in joins.groupby(keys, observed=True)["start_ns"].max().items()}
    return ranks, last


__all__ = ["SAVINGS_COLUMNS", "Fix", "savings"]


def rank_scales(steps: pd.DataFrame, case_id, rank: int) -> dict[tuple[int, int, int], float]:
    """(repeat, iteration, rank) -> the factor that brings ``rank``'s own work to its peers' in that iteration:
    their median own time per unit of work over its own (at most 1). ``steps``: stragglers.rank_steps."""
    mine = steps[steps["case_id"] == case_id]
    per = mine.groupby(["repeat", "iteration", "rank"], observed=True)[["ms", "flops"]].sum()
    has_work = bool((per["flops"] > 0).any())
    unit = per["ms"] / ((per["flops"] / 1e9).where(per["flops"] > 0) if has_work else 1.0)
    wide = unit.unstack("rank")
    if rank not in wide.columns or wide.shape[1] < 2:
        return {}
    peers = wide.drop(columns=rank).median(axis=1)
    factor = (peers / wide[rank]).clip(upper=1.0).fillna(1.0)
    return {(int(r), int(i), int(rank)): float(f) for (r, i), f in factor.items()}


def replayed_cost(events: pd.DataFrame, xfers: pd.DataFrame, steps: pd.DataFrame, case_id,
                  members: list[tuple[str, int, int, int]]) -> tuple[float, float, float]:  # fmt: skip
    """What fixing ``members`` together saves per iteration (median, p10, p90 over iterations, ms): each member is
    (resource, rank, src, dst) of a straggler table row."""
    scales: dict = {}
    hops = set()
    for resource, rank, src, dst in members:
        if resource == "rank":
            scales |= rank_scales(steps, case_id, int(rank))
        else:
            hops.add((int(src), int(dst)))
    saved = savings(events, xfers, case_id, Fix(scales=scales, hops=frozenset(hops)))["saved_ms"]
    if saved.empty:
        return np.nan, np.nan, np.nan
    return float(saved.median()), float(saved.quantile(0.1)), float(saved.quantile(0.9))


__all__ += ["rank_scales", "replayed_cost"]
