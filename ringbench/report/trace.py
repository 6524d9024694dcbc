"""Chrome / Perfetto trace of a run (JSON object format, ``{"traceEvents": [...]}``).

Processes: one per (case, repeat, rank), named "rank R", or "rank R · LABEL" when the trace holds several cases,
LABEL being what tells the cases apart (the parts of their ids that differ, e.g. "zigzag double"). Perfetto titles
a process by its name and pid and shows no process args from JSON, so the name stays short; the full case id is
in the process labels (shown by chrome://tracing), in the args of every iteration slice and in ``otherData``.
Processes sort by case (run order), repeat and rank.

Tracks (threads) of a process, named and in this order (``thread_sort_index``; tids follow the same order):

    iterations         a slice per phase of each timed iteration; an instant at each ring step
    compute / wait     what the rank itself did: block arithmetic, and the time it sat blocked on an exchange
    fwd K/V send, fwd K/V recv, bwd K/V send, bwd K/V recv, bwd dK/dV send, bwd dK/dV recv
    collectives        the all-gather / all-reduce of the ``allgather`` strategy

The send and the receive of one exchange run at once, and the backward's dK/dV exchange overlaps the next K/V
exchange, hence a track each. Nesting guarantee: on every track any two slices are disjoint (one may end where the
next starts). Where the record says otherwise (a simulator's late send completions, a clock quirk), the slices
that would overlap move to overflow tracks "<track> (2)", "(3)", ... so Perfetto drops none ("X" events that
partially overlap on one track are dropped). On send and recv tracks no two slices start at the same nanosecond
either: Perfetto binds a flow event to the slice begun last on its track, so a zero-length slice sharing a start
could steal a flow.

Times are integer nanoseconds, written as exact decimal microseconds ("12.345"): nothing is rounded, so what is
disjoint in the record stays disjoint after Perfetto's parse (it rounds ts x 1000 to the nearest ns).

Flows: one per transfer, as ringbench/figures/critical_path.py matches them (``transfers``): "s" 1 ns into the sender's
send slice, "f" with "bp": "e" 1 ns before the end of the receiver's recv slice, ids 1..n.

Cases are laid one after another on the time axis (each keeps its own origin, shifted), since their clocks are
separate. Large runs are capped: whole iterations are kept in order until ``max_events`` spans are in (the report
says so). Speed: a record's name, track and args are written once per distinct combination (a few per ring step
and rank), and only times and iteration numbers row by row: about 0.6 s for a 100,000-span trace.
"""

from __future__ import annotations

import heapq
import json

import numpy as np
import pandas as pd

DEFAULT_MAX_EVENTS = 100_000
LANES = (
    "iterations",
    "compute / wait",
    "fwd K/V send",
    "fwd K/V recv",
    "bwd K/V send",
    "bwd K/V recv",
    "bwd dK/dV send",
    "bwd dK/dV recv",
    "collectives",
)
FLOW_LANES = frozenset(range(2, 8))  # send and recv tracks: flows bind to their slices
EXCHANGE_LABELS = {"kv": "K/V", "dkv": "dK/dV"}
CASE_GAP_NS = 1_000_000
STEP_KEYS = ["case_id", "repeat", "iteration", "phase", "step"]


def _cap(events: pd.DataFrame, max_events: int) -> tuple[pd.DataFrame, bool]:
    """Whole iterations, in (case, repeat, iteration) order, until max_events rows."""
    if len(events) <= max_events:
        return events, False
    keys = ["case_id", "repeat", "iteration"]
    sizes = events.groupby(keys, observed=True, sort=True).size()
    keep = sizes[sizes.cumsum() <= max(max_events, int(sizes.iloc[0]))].index
    # Spread the budget across cases: never let the first case eat all of it.
    per_case = max(1, max_events // max(1, events["case_id"].nunique()))
    first = sizes.groupby(level="case_id", observed=True).cumsum() <= per_case
    keep = keep.union(sizes[first].index)
    index = pd.MultiIndex.from_frame(events[keys])
    return events[index.isin(keep)], True


def build_trace(events: pd.DataFrame, xfers: pd.DataFrame, run_id: str, max_events: int = DEFAULT_MAX_EVENTS,
                label: dict | None = None) -> str:  # fmt: skip
    """The trace as a JSON string (see the module docstring); ``xfers`` is critical_path.transfers(events);
    ``label``: where the record came from and what was modelled (source, simulated, emulated), into otherData."""
    events, capped = _cap(events, max_events)
    ev = _slices(events)
    procs, labels = _processes(ev)
    ev = ev.merge(procs[["case_id", "repeat", "rank", "pid"]], on=["case_id", "repeat", "rank"])
    ev["sub"] = _sub_lanes(ev)
    tracks = _tracks(ev)
    ev = ev.merge(tracks[["pid", "lane", "sub", "tid"]], on=["pid", "lane", "sub"])
    ev = ev.sort_values(["pid", "tid", "start", "end"], kind="stable").reset_index(drop=True)
    parts = [_span_records(ev), _step_marks(ev), *_flows(xfers, ev)]
    body = ",".join(part for part in parts if part)
    other = {"capped": capped, "max_events": max_events, "run_id": run_id, "source": "ringbench",
             **(label or {}), "cases": labels}  # fmt: skip
    head = json.dumps(_metadata(procs, tracks))[1:-1]
    return (
        '{"displayTimeUnit": "ms", "otherData": '
        + json.dumps(other)
        + ', "traceEvents": ['
        + head
        + ("," + body if body and head else body)
        + "]}"
    )


def _ints(values: pd.Series) -> np.ndarray:
    """An integer column as int64, nulls as -1."""
    return pd.to_numeric(values, errors="coerce").fillna(-1).to_numpy(dtype=np.int64)


def _slices(events: pd.DataFrame) -> pd.DataFrame:
    """The spans with their lane, exchange and ordinal, and times as integer ns on the trace's axis."""
    ev = events.reset_index(drop=True).copy()
    ev["case_order"] = ev.groupby(["case_id", "repeat"], sort=False, observed=True).ngroup()  # run order
    for column in ("repeat", "iteration", "step", "rank", "src", "dst", "bytes", "block", "start_ns", "end_ns"):
        ev[column] = _ints(ev[column])
    for column in ("case_id", "phase", "kind", "pair"):
        ev[column] = ev[column].fillna("").astype(str)
    # Ordinal of each exchange in its step, in posting order (critical_path.transfers matches sends and recvs by
    # it); the last one posted in a backward step is dK/dV, as in critical_path.exchange_kind.
    ev = ev.sort_values("start_ns", kind="stable")
    keys = [*STEP_KEYS, "rank", "kind"]
    ev["ordinal"] = ev.groupby(keys, sort=False).cumcount()
    last = ev.groupby(keys, sort=False)["ordinal"].transform("max")
    is_transfer = ev["kind"].isin(["send", "recv", "wait"]).to_numpy()
    dkv = is_transfer & (ev["phase"].to_numpy() == "bwd") & (ev["ordinal"] == last).to_numpy()
    ev["exchange"] = np.where(dkv, "dkv", np.where(is_transfer, "kv", ""))
    kind = ev["kind"].to_numpy()
    exchange_lane = 2 + 2 * np.where(dkv, 2, np.where(ev["phase"].to_numpy() == "bwd", 1, 0)) + (kind == "recv")
    ev["lane"] = np.select(
        [kind == "iteration", np.isin(kind, ["compute", "wait"]), np.isin(kind, ["send", "recv"])],
        [0, 1, exchange_lane],
        default=len(LANES) - 1,
    )
    # Cases one after another in run order, CASE_GAP_NS apart, each from its own first start.
    spans = ev.groupby("case_order").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    spans["shift"] = (spans["hi"] - spans["lo"] + CASE_GAP_NS).cumsum().shift(fill_value=0) - spans["lo"]
    ev = ev.merge(spans["shift"].reset_index(), on="case_order")
    ev["start"] = ev["start_ns"] + ev["shift"]
    ev["end"] = np.maximum(ev["end_ns"] + ev["shift"], ev["start"])
    return ev


def _case_labels(case_ids: list[str]) -> dict[str, str]:
    """Short labels that tell the cases apart: the '-'-separated parts of their ids that differ (the trailing
    hash only if nothing else does), else "case k"."""
    if len(case_ids) <= 1:
        return dict.fromkeys(case_ids, "")
    parts = [case_id.split("-") for case_id in case_ids]
    labels = [f"case {k + 1}" for k in range(len(case_ids))]
    if len({len(p) for p in parts}) == 1:
        differ = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
        shown = [i for i in differ if i != len(parts[0]) - 1] or differ
        short = [" ".join(p[i] for i in shown) for p in parts]
        if len(set(short)) == len(short) and all(len(s) <= 40 for s in short):
            labels = short
    return dict(zip(case_ids, labels, strict=True))


def _processes(ev: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """One row per (case, repeat, rank): pid, sort index (case run order, then rank) and name; and the map from
    case label to case id."""
    procs = ev[["case_order", "case_id", "repeat", "rank"]].drop_duplicates()
    procs = procs.sort_values(["case_order", "rank"]).reset_index(drop=True)
    labels = _case_labels(list(pd.unique(procs["case_id"])))
    # Perfetto shows "name pid": pid = case number x 1000 + rank reads as such, and stays above every tid (a
    # thread whose tid equals its pid would count as the process's main thread).
    scale = 10 ** max(3, len(str(int(procs["rank"].max()) + 1))) if len(procs) else 1000
    procs["pid"] = (procs["case_order"] + 1) * scale + procs["rank"]
    procs["sort_index"] = np.arange(1, len(procs) + 1)
    repeated = procs["repeat"].nunique() > 1
    names = []
    for case_id, repeat, rank in procs[["case_id", "repeat", "rank"]].itertuples(index=False):
        tags = [labels[case_id]] if labels[case_id] else []
        tags += [f"repeat {repeat}"] if repeated else []
        names.append(" · ".join([f"rank {rank}", *tags]))
    procs["name"] = names
    return procs, {label or case_id: case_id for case_id, label in labels.items()}


def _sub_lanes(ev: pd.DataFrame) -> np.ndarray:
    """Sub-lane of each slice within its (pid, lane): 0 unless its slice would overlap an earlier one there."""
    sub = np.zeros(len(ev), dtype=np.int64)
    if ev.empty:
        return sub
    order = np.lexsort((ev["end"].to_numpy(), ev["start"].to_numpy(), ev["lane"].to_numpy(), ev["pid"].to_numpy()))
    track = ev["pid"].to_numpy()[order] * len(LANES) + ev["lane"].to_numpy()[order]
    start, end = ev["start"].to_numpy()[order], ev["end"].to_numpy()[order]
    first = np.r_[True, track[1:] != track[:-1]]
    # Latest end among the earlier slices of the same track (-1 before the first).
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(track)), 0))
    running = pd.Series(end).groupby(group_start).cummax().to_numpy()
    prev_end = np.where(first, -1, np.r_[-1, running[:-1]])
    prev_start = np.where(first, -1, np.r_[-1, start[:-1]])
    strict = np.isin(track % len(LANES), list(FLOW_LANES))
    conflict = (start < prev_end) | (strict & (start == prev_start))
    if not conflict.any():
        return sub
    for group in np.unique(group_start[conflict]):
        rows = np.flatnonzero(group_start == group)
        sub[order[rows]] = _first_fit(start[rows], end[rows], strict[rows[0]])
    return sub


def _first_fit(start: np.ndarray, end: np.ndarray, strict: bool) -> np.ndarray:
    """Interval partitioning of slices sorted by (start, end): each goes to the lane that freed up earliest if it
    fits there (strict: also not starting where that lane's last slice started), else to a new lane."""
    lanes: list[tuple[int, int, int]] = []  # heap of (last end, last start, lane)
    out = np.empty(len(start), dtype=np.int64)
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist(), strict=True)):
        if lanes and lanes[0][0] <= s and not (strict and lanes[0][1] == s):
            lane = heapq.heappop(lanes)[2]
        else:
            lane = len(lanes)
        out[i] = lane
        heapq.heappush(lanes, (e, s, lane))
    return out


def _tracks(ev: pd.DataFrame) -> pd.DataFrame:
    """One row per (pid, lane, sub): tid 1.. in display order within the process, and the track's name. Every
    process has an iterations track (it carries the step marks)."""
    iterations = pd.DataFrame({"pid": pd.unique(ev["pid"]), "lane": 0, "sub": 0})
    tracks = pd.concat([ev[["pid", "lane", "sub"]], iterations]).drop_duplicates()
    tracks = tracks.sort_values(["pid", "lane", "sub"]).reset_index(drop=True)
    tracks["tid"] = tracks.groupby("pid").cumcount() + 1
    base = tracks["lane"].map(dict(enumerate(LANES)))
    tracks["name"] = np.where(tracks["sub"] > 0, base + " (" + (tracks["sub"] + 1).astype(str) + ")", base)
    return tracks


def _metadata(procs: pd.DataFrame, tracks: pd.DataFrame) -> list[dict]:
    meta = []
    for case_id, pid, name, order in procs[["case_id", "pid", "name", "sort_index"]].itertuples(index=False):
        pid = int(pid)
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": int(order)}})
        meta.append({"name": "process_labels", "ph": "M", "pid": pid, "args": {"labels": case_id}})
    for pid, tid, name in tracks[["pid", "tid", "name"]].itertuples(index=False):
        pid, tid = int(pid), int(tid)
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return meta


_FRACTIONS = np.array([f".{i:03d}" for i in range(1000)], dtype=object)


def _us(ns: pd.Series | np.ndarray) -> list[str]:
    """Non-negative integer nanoseconds as exact decimal microseconds ("12.345")."""
    whole, frac = np.divmod(np.asarray(ns, dtype=np.int64), 1000)
    return [f"{w}{f}" for w, f in zip(whole.tolist(), _FRACTIONS[frac].tolist(), strict=True)]


def _name(kind: str, phase: str, exchange: str, step: int, src: int, dst: int, block: int, pair: str) -> str:
    """ "fwd K/V recv step 2 \u2190 rank 1", "bwd compute step 1 (block of rank 2, causal)"."""
    if kind == "compute":
        return f"{phase} compute step {step} (block of rank {block}{', ' + pair if pair else ''})"
    if kind in ("send", "recv", "wait"):
        peer = f"\u2192 rank {dst}" if kind == "send" else f"\u2190 rank {src}"
        return f"{phase} {EXCHANGE_LABELS.get(exchange, exchange)} {kind} step {step} {peer}"
    return f"{phase} {kind} step {step}"


def _span_records(ev: pd.DataFrame) -> str:
    """The "X" slices as comma-joined JSON objects: a span's name, track and args are made once per distinct
    (track, kind, phase, exchange, step, peers, block, pair, bytes); its times and iteration row by row."""
    if ev.empty:
        return ""
    records = []
    it_rows = ev[ev["kind"] == "iteration"]
    for pid, tid, phase, case_id, repeat, iteration, ts, dur in zip(
        it_rows["pid"].tolist(), it_rows["tid"].tolist(), it_rows["phase"].tolist(), it_rows["case_id"].tolist(),
        it_rows["repeat"].tolist(), it_rows["iteration"].tolist(), _us(it_rows["start"]),
        _us(it_rows["end"] - it_rows["start"]), strict=True,
    ):  # fmt: skip
        args = {"case": case_id, "repeat": repeat, "iteration": iteration, "phase": phase}
        records.append(f'{{"name":{json.dumps(f"{phase} iteration {iteration}")},"cat":"iteration","ph":"X",'
                       f'"pid":{pid},"tid":{tid},"ts":{ts},"dur":{dur},"args":{json.dumps(args)}}}')  # fmt: skip
    spans = ev[ev["kind"] != "iteration"]
    if len(spans):
        keys = ["pid", "tid", "kind", "phase", "exchange", "step", "src", "dst", "block", "pair", "bytes"]
        codes = spans.groupby(keys, sort=False).ngroup().to_numpy()
        combos = spans.iloc[np.unique(codes, return_index=True)[1]][keys]
        heads, tails = [], []
        for c in combos.itertuples(index=False):
            name = _name(c.kind, c.phase, c.exchange, c.step, c.src, c.dst, c.block, c.pair)
            heads.append(f'{{"name":{json.dumps(name)},"cat":{json.dumps(c.kind)},"ph":"X","pid":{c.pid},'
                         f'"tid":{c.tid},"ts":')  # fmt: skip
            tails.append(f',"step":{c.step},"src":{c.src},"dst":{c.dst},"bytes":{c.bytes},"block":{c.block},'
                         f'"pair":{json.dumps(c.pair)},"exchange":{json.dumps(c.exchange)}}}}}')  # fmt: skip
        records += [
            f'{head}{ts},"dur":{dur},"args":{{"iteration":{iteration}{tail}'
            for head, tail, iteration, ts, dur in zip(
                np.asarray(heads, dtype=object)[codes].tolist(), np.asarray(tails, dtype=object)[codes].tolist(),
                spans["iteration"].tolist(), _us(spans["start"]), _us(spans["end"] - spans["start"]), strict=True,
            )
        ]  # fmt: skip
    return ",".join(records)


def _step_marks(ev: pd.DataFrame) -> str:
    """An instant on the iterations track (tid 1) at the first span of every (rank, phase, iteration, step)."""
    spans = ev[ev["step"] >= 0]
    if spans.empty:
        return ""
    marks = spans.groupby(["pid", "phase", "iteration", "step"], as_index=False)["start"].min()
    return ",".join(
        f'{{"name":"{phase} step {step}","cat":"step","ph":"i","s":"t","ts":{ts},"pid":{pid},"tid":1}}'
        for phase, step, ts, pid in zip(
            _json_escaped(marks["phase"]),
            marks["step"].tolist(),
            _us(marks["start"]),
            marks["pid"].tolist(),
            strict=True,
        )
    )


def _json_escaped(values: pd.Series) -> list[str]:
    """Strings escaped for a JSON string literal (without the quotes), each distinct value once."""
    codes, uniques = pd.factorize(values.astype(str))
    return np.asarray([json.dumps(u)[1:-1] for u in uniques], dtype=object)[codes].tolist()


def _flows(xfers: pd.DataFrame, ev: pd.DataFrame) -> list[str]:
    """A flow per transfer, from the sender's send slice to the receiver's recv slice (both in the trace)."""
    if xfers is None or xfers.empty or ev.empty:
        return []
    keys = [*STEP_KEYS, "ordinal"]
    columns = [*keys, "rank", "pid", "tid", "start", "end"]
    sends = ev.loc[ev["kind"] == "send", columns].rename(columns={"rank": "src"})
    recvs = ev.loc[ev["kind"] == "recv", columns].rename(columns={"rank": "dst"})
    rows = xfers[[*keys, "src", "dst", "exchange"]].copy()
    for column in ("repeat", "iteration", "step", "ordinal", "src", "dst"):
        rows[column] = _ints(rows[column])
    rows["case_id"] = rows["case_id"].astype(str)
    rows["phase"] = rows["phase"].astype(str)
    rows = rows.merge(sends, on=[*keys, "src"]).merge(recvs, on=[*keys, "dst"], suffixes=("_send", "_recv"))
    if rows.empty:
        return []
    rows = rows.sort_values(["start_send", "pid_send"], kind="stable").reset_index(drop=True)
    # 1 ns inside each slice, so that the flow binds to it whatever the order of events with equal timestamps.
    send_dur = (rows["end_send"] - rows["start_send"]).to_numpy()
    recv_dur = (rows["end_recv"] - rows["start_recv"]).to_numpy()
    out_ts = rows["start_send"].to_numpy() + (send_dur >= 2)
    in_ts = np.where(recv_dur >= 2, rows["end_recv"].to_numpy() - 1, rows["start_recv"].to_numpy())
    exchanges = _json_escaped(rows["phase"] + " " + rows["exchange"].map(EXCHANGE_LABELS).fillna(rows["exchange"]))
    fields = zip(
        range(1, len(rows) + 1), exchanges, rows["step"].tolist(), rows["src"].tolist(), rows["dst"].tolist(),
        _us(out_ts), rows["pid_send"].tolist(), rows["tid_send"].tolist(),
        _us(in_ts), rows["pid_recv"].tolist(), rows["tid_recv"].tolist(), strict=True,
    )  # fmt: skip
    starts, ends = [], []
    for flow_id, exchange, step, src, dst, out_at, out_pid, out_tid, in_at, in_pid, in_tid in fields:
        common = f'{{"name":"{exchange} step {step}: rank {src} \\u2192 rank {dst}","cat":"transfer","id":{flow_id}'
        starts.append(f'{common},"ph":"s","ts":{out_at},"pid":{out_pid},"tid":{out_tid}}}')
        ends.append(f'{common},"ph":"f","bp":"e","ts":{in_at},"pid":{in_pid},"tid":{in_tid}}}')
    return [",".join(starts), ",".join(ends)]
