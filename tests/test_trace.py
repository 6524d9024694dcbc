"""trace.json as Perfetto reads it: named tracks, slices that nest, flows bound to the slices they link.

Perfetto's trace processor cannot run here (its Python package downloads the binary), so these tests check the JSON
rules Perfetto applies and replay its import of JSON traces (src/trace_processor/importers: ts rounded to the
nearest ns; events sorted by ts; per track a slice stack that drops an "X" event partially overlapping an open
slice; a flow event binds to the slice begun last on its track), on a real run, the simulated fixture and tables
built to break the writer.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ringbench.cli.app import app
from ringbench.figures.critical_path import transfers
from ringbench.record.schema import EVENT_COLUMNS
from ringbench.record.store import load_run
from ringbench.report.trace import LANES, build_trace

DATA = Path(__file__).parent / "data" / "analysis"


# -- the rules, and Perfetto's import replayed ----------------------------------------------------------------------
def _no_constants(name: str):
    raise AssertionError(f"{name} in trace.json")


def load(text: str) -> list[dict]:
    return json.loads(text, parse_constant=_no_constants)["traceEvents"]


def _ns(value) -> int:
    """Perfetto's conversion of a JSON ts / dur in microseconds: integers exactly, decimals rounded to the ns."""
    return value * 1000 if isinstance(value, int) else math.floor(value * 1000 + 0.5)


def check_rules(events: list[dict]) -> None:
    """What a JSON trace must satisfy for Perfetto to show every slice and flow."""
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_tids = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    flows: dict[int, dict[str, dict]] = defaultdict(dict)
    for e in events:
        assert e["ph"] in {"M", "X", "i", "s", "f"}, e
        if e["ph"] == "M":
            continue
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert e["pid"] in named_pids and (e["pid"], e["tid"]) in named_tids, e
        assert isinstance(e["ts"], int | float) and math.isfinite(e["ts"]) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int | float) and math.isfinite(e["dur"]) and e["dur"] >= 0, e
            assert isinstance(e["name"], str) and e["name"], e
        if e["ph"] in "sf":
            assert e["ph"] not in flows[e["id"]], f"flow id {e['id']} used twice"
            flows[e["id"]][e["ph"]] = e
    for pair in flows.values():
        assert pair.keys() == {"s", "f"}, pair
        start, finish = pair["s"], pair["f"]
        assert (start["cat"], start["name"]) == (finish["cat"], finish["name"])  # Perfetto keys v1 flows by them
        assert finish["bp"] == "e"


def nesting_violations(events: list[dict]) -> tuple[int, int, list]:
    """(slices, tracks, violations) over the X and instant events of every (pid, tid): two slices partially
    overlap when one starts strictly inside the other and ends strictly after it."""
    tracks = defaultdict(list)
    for e in events:
        if e["ph"] in "Xi":
            start = _ns(e["ts"])
            tracks[(e["pid"], e["tid"])].append((start, start + (_ns(e["dur"]) if e["ph"] == "X" else 0), e["name"]))
    bad = []
    for key, slices in tracks.items():
        slices.sort(key=lambda s: (s[0], -s[1]))  # parents before their children
        enclosing: list[tuple] = []
        for s in slices:
            while enclosing and enclosing[-1][1] <= s[0]:
                enclosing.pop()
            if enclosing and s[1] > enclosing[-1][1]:
                bad.append((key, enclosing[-1], s))
            else:
                enclosing.append(s)
    return sum(len(s) for s in tracks.values()), len(tracks), bad


def perfetto_import(events: list[dict]) -> dict:
    """Replay of the trace processor's JSON import: slices kept or dropped, flows bound to slices."""
    timed = sorted((e for e in events if e["ph"] != "M"), key=lambda e: _ns(e["ts"]))  # stable, like its sorter
    stacks: dict[tuple, list[dict]] = defaultdict(list)
    kept, dropped, unbound, begun, flows = [], [], [], {}, []
    for e in timed:
        track = (e["pid"], e["tid"])
        stack = stacks[track]
        ts = _ns(e["ts"])
        if e["ph"] in "Xi":
            dur = _ns(e["dur"]) if e["ph"] == "X" else 0
            overlap = False
            for i in range(len(stack) - 1, -1, -1):  # SliceTracker::MaybeCloseStack
                top_end, top_dur = stack[i]["_end"], stack[i]["_dur"]
                if top_end < ts or (top_end == ts and not (top_dur == 0 and dur == 0)):
                    stack.pop()
                elif ts < top_end < ts + dur:
                    overlap = True
                    break
            if overlap:
                dropped.append(e)
                continue
            slice_ = dict(e, _ts=ts, _dur=dur, _end=ts + dur, _depth=len(stack))
            stack.append(slice_)
            kept.append(slice_)
        elif e["ph"] in "sf":
            if not stack:  # FlowTracker binds to the slice on top of the stack, without closing anything
                unbound.append(e)
                continue
            key = (e["id"], e["cat"], e["name"])
            if e["ph"] == "s":
                begun[key] = (stack[-1], e)
            elif key in begun:
                flows.append((*begun[key], stack[-1], e))
            else:
                unbound.append(e)
    return {"slices": kept, "dropped": dropped, "unbound": unbound, "flows": flows}


def check_flows_bind_their_transfers(imported: dict) -> None:
    """Every flow goes from a send slice to the recv slice of the same exchange, sender to receiver."""
    for out, start, into, finish in imported["flows"]:
        assert out["cat"] == "send" and into["cat"] == "recv", (start, finish)
        for key in ("iteration", "step", "exchange", "src", "dst"):
            assert out["args"][key] == into["args"][key], (out, into)
        assert out["_ts"] <= _ns(start["ts"]) <= out["_end"] and into["_ts"] <= _ns(finish["ts"]) <= into["_end"]


def check_trace(text: str) -> tuple[list[dict], dict]:
    events = load(text)
    check_rules(events)
    _, _, bad = nesting_violations(events)
    assert bad == []
    imported = perfetto_import(events)
    assert imported["dropped"] == [] and imported["unbound"] == []
    check_flows_bind_their_transfers(imported)
    return events, imported


def trace_of(events: pd.DataFrame, **kwargs) -> str:
    return build_trace(events, transfers(events), "test", **kwargs)


def track_names(events: list[dict]) -> dict[int, list[str]]:
    """Thread names per pid, in sort-index order."""
    names, order = {}, {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        if e["ph"] == "M" and e["name"] == "thread_sort_index":
            order[(e["pid"], e["tid"])] = e["args"]["sort_index"]
    out = defaultdict(list)
    for key in sorted(names, key=lambda k: (k[0], order[k])):
        out[key[0]].append(names[key])
    return dict(out)


# -- a real run -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """4 local gloo ranks, forward and backward, sync / double / allgather (~8 s)."""
    out = tmp_path_factory.mktemp("results")
    args = ["run", "--world", "4", "--seq", "64", "--heads", "2", "--head-dim", "8", "--iters", "3", "--warmup",
            "1", "--kernel", "emulated:50", "--layout", "zigzag", "--buffer", "sync", "--buffer", "double",
            "--buffer", "allgather", "--no-check", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    return load_run(run_dir)


def test_a_real_runs_trace_nests_on_every_track_and_binds_every_flow(real_run):
    text = trace_of(real_run.events)
    events, imported = check_trace(text)
    slices, tracks, bad = nesting_violations(events)
    assert bad == [] and slices >= len(real_run.events) and tracks >= 3 * 4 * 5
    assert len(imported["slices"]) == slices  # nothing dropped
    assert len(imported["flows"]) == len(transfers(real_run.events))  # one flow per transfer
    names = track_names(events)
    double = [pid for pid, lanes in names.items() if "bwd dK/dV recv" in lanes and "collectives" not in lanes]
    assert names[double[0]] == list(LANES[:-1])  # every lane once, no overflow, in order
    assert any("collectives" in lanes for lanes in names.values())
    assert all(len(lanes) == len(set(lanes)) and "(2)" not in " ".join(lanes) for lanes in names.values())
    timed = [e for e in events if e["ph"] != "M"]
    assert min(e["pid"] for e in timed) > max(e["tid"] for e in timed)  # no track reads as a main thread


def test_slices_say_phase_exchange_and_peer(real_run):
    events = load(trace_of(real_run.events))
    names = {e["name"] for e in events if e["ph"] == "X"}
    ring = [int(r) for r in real_run.cases["ring"].iloc[0].split("-")]
    nxt, prev = ring[(ring.index(0) + 1) % 4], ring[(ring.index(0) - 1) % 4]
    assert f"fwd K/V recv step 1 \u2190 rank {prev}" in names
    assert f"bwd dK/dV send step 0 \u2192 rank {nxt}" in names
    assert f"bwd K/V wait step 2 \u2190 rank {prev}" in names
    assert "fwd iteration 2" in names and "bwd collective step 0" in names
    assert any(n.startswith("fwd compute step 1 (block of rank ") and n.endswith(", full)") for n in names)
    processes = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert processes[:4] == ["rank 0 · sync", "rank 1 · sync", "rank 2 · sync", "rank 3 · sync"]  # run order
    assert {p.split(" · ")[1] for p in processes} == {"sync", "double", "allgather"}
    labels = [e["args"]["labels"] for e in events if e["ph"] == "M" and e["name"] == "process_labels"]
    assert set(labels) == set(real_run.events["case_id"].astype(str))  # the full case id stays available


# -- simulated and hand-built records ---------------------------------------------------------------------------------
def test_late_send_completions_move_to_an_overflow_track():
    run = load_run(DATA / "sim_w4_slow_rank")  # the simulator's sends end when the receiver has the block
    events, imported = check_trace(trace_of(run.events))
    lanes = [name for names in track_names(events).values() for name in names]
    assert "fwd K/V send (2)" in lanes and "compute / wait (2)" not in lanes
    assert len(imported["flows"]) == len(transfers(run.events))


def _row(**values) -> dict:
    row = {"case_id": "c", "repeat": 0, "iteration": 0, "phase": "fwd", "rank": 0, "ring_position": 0, "step": 0,
           "kind": "send", "start_ns": 0, "end_ns": 0, "src": 0, "dst": 1, "bytes": 8, "block": -1, "pair": "",
           "flops": 0.0, "nccl_ms": np.nan}  # fmt: skip
    return row | values


def _exchange(step: int, start: int, send_end: int, recv_end: int, phase: str = "fwd", **extra) -> list[dict]:
    """One exchange between two ranks: rank 0 sends to 1 and receives from 1, and vice versa."""
    rows = []
    for rank, peer in ((0, 1), (1, 0)):
        common = {"phase": phase, "step": step, "rank": rank, "ring_position": rank, "start_ns": start} | extra
        rows.append(_row(**common, kind="send", end_ns=send_end, src=rank, dst=peer))
        rows.append(_row(**common, kind="recv", end_ns=recv_end, src=peer, dst=rank))
    return rows


def test_overlaps_ties_zero_lengths_and_sub_microsecond_times_stay_valid():
    rows = [
        _row(kind="iteration", step=-1, start_ns=0, end_ns=20_000, dst=0),
        _row(kind="iteration", step=-1, start_ns=0, end_ns=20_000, dst=0),  # a duplicate: overflow, not a drop
        _row(kind="compute", start_ns=0, end_ns=1_499, dst=0, block=0, pair="full"),
        _row(kind="wait", start_ns=1_499, end_ns=1_499, src=1, dst=0),  # zero length where compute starts
        _row(kind="compute", step=1, start_ns=1_499, end_ns=2_501, dst=0, block=1, pair="causal"),
        _row(kind="compute", step=1, start_ns=2_000, end_ns=2_600, dst=0, block=1, pair="causal"),  # overlaps
    ]
    rows += _exchange(0, 0, 5_000, 1_999)  # sends outlast the next exchange's post
    rows += _exchange(1, 1_999, 2_000, 2_001)  # 1 ns and 2 ns spans
    rows += _exchange(2, 1_999, 1_999, 1_999)  # zero length, starting where others start
    rows += _exchange(3, 2_000, 9_000, 9_000)
    rows += [r | {"rank": 1, "dst": 1} for r in rows[:1]]
    events = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    events, imported = check_trace(trace_of(events))
    lanes = {name for names in track_names(events).values() for name in names}
    assert {"iterations (2)", "compute / wait (2)", "fwd K/V send (2)", "fwd K/V recv (2)"} <= lanes
    assert len(imported["flows"]) == 8  # 4 exchanges x 2 directions, every one bound
    ts = {e["name"]: (e["ts"], e["dur"]) for e in events if e["ph"] == "X" and e["cat"] == "compute"}
    assert ts["fwd compute step 0 (block of rank 0, full)"] == (0.0, 1.499)  # exact to the ns


def test_backward_exchanges_get_their_own_tracks():
    rows = _exchange(0, 0, 900, 1_000, phase="bwd")  # sync step 0: dK/dV only
    rows += _exchange(1, 1_000, 1_900, 2_000, phase="bwd")  # K/V, then dK/dV of the same step, overlapping it
    rows += _exchange(1, 1_500, 2_900, 3_000, phase="bwd")
    events = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    events, imported = check_trace(trace_of(events))
    lanes = ["iterations", "bwd K/V send", "bwd K/V recv", "bwd dK/dV send", "bwd dK/dV recv"]
    assert list(track_names(events).values()) == [lanes, lanes]  # both ranks
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"bwd dK/dV send step 0 \u2192 rank 1", "bwd K/V recv step 1 \u2190 rank 1"} <= names
    assert len(imported["flows"]) == 6


def test_the_cap_keeps_whole_iterations_and_their_flows(real_run):
    events = real_run.events
    per_iteration = events.groupby(["case_id", "iteration"], observed=True).size()
    limit = int(per_iteration.max()) * 3  # the budget is spread over the 3 cases: each keeps its first iteration
    text = trace_of(events, max_events=limit)
    assert '"capped": true' in text[:400]  # what the report looks for
    spans, imported = check_trace(text)
    kept = [e for e in spans if e["ph"] == "X"]
    assert len(kept) < len(events) and len(kept) <= limit + per_iteration.max()
    assert 0 < len(imported["flows"]) == sum(e["cat"] == "recv" for e in kept)  # whole iterations: all hops in


def test_empty_and_untraced_records():
    empty = pd.DataFrame(columns=list(EVENT_COLUMNS))
    assert load(trace_of(empty)) == []
    rows = [_row(kind="iteration", step=-1, rank=r, start_ns=0, end_ns=1_000, src=r, dst=r) for r in range(2)]
    events = load(trace_of(pd.DataFrame(rows, columns=list(EVENT_COLUMNS))))
    check_rules(events)
    assert [e["args"]["name"] for e in events if e["name"] == "process_name"] == ["rank 0", "rank 1"]
