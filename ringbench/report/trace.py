"""Chrome / Perfetto trace of a run (JSON object format, ``{"traceEvents": [...]}``).

One process per (case, repeat, rank), named "rank R · case (repeat k)"; one thread per kind (compute, send,
recv, wait, collective) plus a ``steps`` thread carrying the iterations and an instant marker at each ring step.
A flow arrow per transfer ("s" on the sender's send span, "f" bound to the receiver's recv span, one id each)
draws each hop. Cases are laid one after another on the time axis (each keeps its own origin, shifted), since
their clocks are separate. Timestamps are microseconds.

Large runs are capped: whole iterations are kept in order until ``max_events`` spans are in (the report says so).
The JSON is produced by pandas' C writer, column-wise, so a 100k-span trace takes well under a second.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

THREADS = {"steps": 0, "compute": 1, "send": 2, "recv": 3, "wait": 4, "collective": 5}
DEFAULT_MAX_EVENTS = 100_000


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


def build_trace(events: pd.DataFrame, xfers: pd.DataFrame, run_id: str, max_events: int = DEFAULT_MAX_EVENTS) -> str:
    """The trace as a JSON string (see the module docstring)."""
    events, capped = _cap(events, max_events)
    keys = ["case_id", "repeat", "rank"]
    procs = events[keys].drop_duplicates().sort_values(keys).reset_index(drop=True)
    procs["pid"] = np.arange(1, len(procs) + 1)
    # Shift each (case, repeat) after the previous one, 1 ms apart.
    spans = events.groupby(["case_id", "repeat"], observed=True).agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    spans["shift"] = (spans["hi"] - spans["lo"] + 1_000_000).cumsum().shift(fill_value=0) - spans["lo"]
    ev = events.merge(procs, on=keys).merge(spans["shift"].reset_index(), on=["case_id", "repeat"])
    ts = (ev["start_ns"] + ev["shift"]) / 1e3
    dur = (ev["end_ns"] - ev["start_ns"]).clip(lower=0) / 1e3
    parts = [_span_records(ev, ts, dur)]
    # Step markers: an instant at the first span of every (rank, phase, step).
    marks = (
        ev[ev["step"] >= 0]
        .groupby(["pid", "phase", "iteration", "step"], observed=True, as_index=False)
        .agg(t=("start_ns", "min"), shift=("shift", "first"))
    )
    parts.append(
        pd.DataFrame(
            {
                "name": marks["phase"] + " step " + marks["step"].astype(str),
                "cat": "step",
                "ph": "i",
                "s": "t",
                "ts": (marks["t"] + marks["shift"]) / 1e3,
                "pid": marks["pid"],
                "tid": THREADS["steps"],
            }
        )
    )
    kept = events[["case_id", "repeat", "iteration"]].drop_duplicates()
    parts.extend(_flows(xfers, procs, spans["shift"].reset_index(), kept))
    body = ",".join(
        p if isinstance(p, str) else p.to_json(orient="records", double_precision=15)[1:-1] for p in parts if len(p)
    )
    meta = [
        {"name": "process_name", "ph": "M", "pid": int(pid), "args": {"name": f"rank {r} · {c} (repeat {k})"}}
        for c, k, r, pid in procs.itertuples(index=False)
    ]
    meta += [
        {"name": "process_sort_index", "ph": "M", "pid": int(pid), "args": {"sort_index": int(pid)}}
        for pid in procs["pid"]
    ]
    meta += [
        {"name": "thread_name", "ph": "M", "pid": int(pid), "tid": tid, "args": {"name": kind}}
        for pid in procs["pid"]
        for kind, tid in THREADS.items()
    ]
    head = json.dumps(meta)[1:-1]
    other = json.dumps({"run_id": run_id, "capped": capped, "max_events": max_events, "source": "ringbench"})
    return (
        '{"displayTimeUnit": "ms", "otherData": '
        + other
        + ', "traceEvents": ['
        + head
        + ("," + body if body else "")
        + "]}"
    )


def _json_strings(values: pd.Series) -> pd.Series:
    """JSON-escaped strings, escaping each distinct value once (kinds, phases and pairs repeat a lot)."""
    codes, uniques = pd.factorize(values.astype(str))
    return pd.Series(np.asarray([json.dumps(u) for u in uniques], dtype=object)[codes], index=values.index)


def _span_records(ev: pd.DataFrame, ts: pd.Series, dur: pd.Series) -> str:
    """The "X" spans as comma-joined JSON objects, built column-wise with vectorised string operations."""
    kind = _json_strings(ev["kind"])
    step = ev["step"].astype(str)
    is_iter = ev["kind"] == "iteration"
    name = np.where(is_iter, '"iteration ' + ev["iteration"].astype(str) + '"', kind.str[:-1] + " " + step + '"')
    tid = ev["kind"].map(THREADS).fillna(9).astype(int).astype(str)
    args = (
        '{"phase":' + _json_strings(ev["phase"]) + ',"iteration":' + ev["iteration"].astype(str) + ',"step":' + step
        + ',"src":' + ev["src"].astype(str) + ',"dst":' + ev["dst"].astype(str) + ',"bytes":' + ev["bytes"].astype(str)
        + ',"pair":' + _json_strings(ev["pair"]) + "}"
    )  # fmt: skip
    records = (
        '{"name":' + pd.Series(name, index=ev.index) + ',"cat":' + kind + ',"ph":"X","ts":' + ts.round(3).astype(str)
        + ',"dur":' + dur.round(3).astype(str) + ',"pid":' + ev["pid"].astype(str) + ',"tid":' + tid
        + ',"args":' + args + "}"
    )  # fmt: skip
    return ",".join(records)


def _flows(
    xfers: pd.DataFrame, procs: pd.DataFrame, shifts: pd.DataFrame, iterations: pd.DataFrame
) -> list[pd.DataFrame]:
    """A flow arrow per transfer: start on the sender's send span, finish bound to the receiver's recv span."""
    rows = xfers.dropna(subset=["send_start_ns"]).merge(shifts, on=["case_id", "repeat"])
    rows = rows.merge(iterations, on=["case_id", "repeat", "iteration"])  # only the iterations kept in the trace
    send_pid = procs.rename(columns={"rank": "src", "pid": "src_pid"})
    recv_pid = procs.rename(columns={"rank": "dst", "pid": "dst_pid"})
    rows = rows.merge(send_pid, on=["case_id", "repeat", "src"]).merge(recv_pid, on=["case_id", "repeat", "dst"])
    if rows.empty:
        return []
    ids = np.arange(1, len(rows) + 1)
    name = "hop " + rows["src"].astype(str) + "->" + rows["dst"].astype(str)
    # The finish lands just inside the recv span so that "bp": "e" binds it to that slice.
    finish = np.maximum(rows["recv_end_ns"] - 1, rows["recv_start_ns"]) + rows["shift"]
    common = {"name": name, "cat": "hop", "id": ids}
    start = pd.DataFrame(
        common
        | {
            "ph": "s",
            "ts": (rows["send_start_ns"] + rows["shift"]) / 1e3,
            "pid": rows["src_pid"],
            "tid": THREADS["send"],
        }
    )
    end = pd.DataFrame(
        common | {"ph": "f", "bp": "e", "ts": finish / 1e3, "pid": rows["dst_pid"], "tid": THREADS["recv"]}
    )
    return [start, end]
