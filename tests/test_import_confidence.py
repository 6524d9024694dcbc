"""Imported records are judged by the same confidence rules as runs (analysis/confidence.py): cores kept busy by
more ranks than there are, too few iterations (said up front at import), compute that cannot be found."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from cli_helpers import invoke

from ringbench.analysis.confidence import case_confidence, oversubscribed_cases

GLOO = Path(__file__).parent / "data" / "kineto" / "gloo_ring_w4"


def _events(compute_ms: float, iteration_ms: float = 10.0, iterations: int = 4, world: int = 3) -> pd.DataFrame:
    rows = []
    for i in range(iterations):
        for rank in range(world):
            base = dict(case_id="c", repeat=0, iteration=i, phase="fwd", rank=rank, src=rank, dst=rank, flops=1e9)
            start = int(i * iteration_ms * 1e6)
            rows.append(base | dict(kind="iteration", step=-1, start_ns=start, end_ns=start + int(iteration_ms * 1e6)))
            rows.append(base | dict(kind="compute", step=0, start_ns=start, end_ns=start + int(compute_ms * 1e6)))
    return pd.DataFrame(rows)


def _meta(busy: float | None, cores: int | None = 2, source: str = "profiler") -> dict:
    meta = {"schema_version": 3, "source": source, "device_kind": "cpu", "cpu_count": cores,
            "ranks": {"3": {"hosts": ["h"]}}}  # fmt: skip
    if busy is not None:
        meta["imported"] = {"busy_ranks": {"h": busy}}
    return meta


CASES = pd.DataFrame([{"case_id": "c", "world": 3, "emulated": False}])


def test_an_import_whose_ranks_keep_more_cores_busy_than_there_are_is_inconclusive():
    row = case_confidence(_events(8.0), CASES, _meta(busy=2.7)).iloc[0]
    assert row["confidence"] == "inconclusive" and "oversubscribed" in row["reason_codes"], row
    assert "2.7 ranks' worth of CPU work" in row["inconclusive_reasons"][0]
    # Someone else's program cannot take ringbench's emulated kernel: the fix says how to capture a judgeable trace.
    fix = row["inconclusive_reasons"][0]
    assert "one rank per core (on this host at most 2 ranks" in fix and "on GPUs" in fix and "emulated" not in fix
    # The same ring with modelled (sleeping) compute keeps the cores free: judged, as `run` judges emulated cases.
    assert case_confidence(_events(8.0), CASES, _meta(busy=0.3)).iloc[0]["confidence"] == "conclusive"
    assert oversubscribed_cases(CASES, _meta(busy=2.7)) == {"c"}
    assert oversubscribed_cases(CASES, _meta(busy=2.7, cores=None)) == frozenset()  # cores unknown: not checked


def test_an_import_whose_compute_cannot_be_found_is_inconclusive():
    row = case_confidence(_events(0.1), CASES, _meta(busy=0.1)).iloc[0]
    assert row["confidence"] == "inconclusive" and row["reason_codes"] == ["compute"], row
    assert "--compute-pattern" in row["inconclusive_reasons"][0]
    run = case_confidence(_events(0.1), CASES, _meta(busy=None, cores=None, source="ringbench")).iloc[0]
    assert run["confidence"] == "conclusive"  # a run's compute spans are its own: the rule is the import's


def test_one_captured_iteration_is_said_at_import_and_judged_inconclusive(tmp_path):
    result = invoke("import", str(GLOO), "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    note = next(n for n in document["notes"] if "iteration(s) captured" in n)
    assert note.startswith("1 iteration(s) captured: too few") and "active=3" in note, note
    analyzed = json.loads(invoke("analyze", document["run_dir"], "--json").stdout)
    assert analyzed["confidence"] == "inconclusive" and analyzed["straggler_kind"] is None
    assert any(r.startswith("too few timed iterations") for r in analyzed["inconclusive_reasons"]), analyzed
