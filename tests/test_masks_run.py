"""Document and window masks, layers and the short ring through the command line: one end-to-end run, the record it
writes (layer column, plans, balance, bytes), bad specs (one line, exit 2), and old records still loading."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from ringbench.cli.app import app
from ringbench.record.schema import EVENT_COLUMNS, SCHEMA_VERSION
from ringbench.record.store import load_run

runner = CliRunner()
SMALL = ["--seq", "64", "--heads", "2", "--head-dim", "8", "--iters", "2", "--warmup", "1"]
DOCS = "lengths:3,21,1,2,30,7"


def test_one_run_of_documents_windows_layers_and_the_short_ring(tmp_path):
    result = runner.invoke(app, [
        "run", "--world", "2", "--seq", "64", "--heads", "2", "--head-dim", "8", "--iters", "1", "--warmup", "0",
        "--kernel", "torch", "--mask", "causal-document", "--docs", DOCS,
        "--layout", "contiguous", "--layout", "doc-balanced", "--buffer", "double", "--buffer", "double-short",
        "--layers", "causal-document+window:12 x1, mask x1", "--out", str(tmp_path), "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    cases = {(c["layout"], c["buffer"]): c for c in document["cases"]}
    assert len(cases) == 4 and all(c["passed"] is True for c in cases.values())  # float64-checked, both layers
    for case in cases.values():
        assert case["docs"] == DOCS and case["layers"] == "causal-document+window:12 x1, mask x1"
        assert case["docs_count"] == 6 and case["docs_max"] == 30
        assert case["predicted_imbalance"] >= 1 and case["imbalance"] >= 1 and case["kernel_calls"] > 0
    short, full = cases[("contiguous", "double-short")], cases[("contiguous", "double")]
    assert short["ring_steps"] <= full["ring_steps"] == 2 and short["bytes_moved"] <= full["bytes_moved"]
    assert full["short_ring_bytes"] == short["short_ring_bytes"] == short["bytes_moved"]  # predicted = measured
    assert cases[("doc-balanced", "double")]["predicted_imbalance"] < full["predicted_imbalance"]
    assert any(line.startswith("balance: causal-document (2 ranks") for line in document["answers"]["balance"])
    run = load_run(tmp_path / Path(document["run_dir"]).name)
    assert tuple(run.events.columns) == EVENT_COLUMNS and set(run.events["layer"]) == {0, 1}
    assert run.meta["schema_version"] == SCHEMA_VERSION == 4
    plan = run.meta.plans[full["case_id"]]
    assert [layer["mask"] for layer in plan["layers"]] == ["causal-document+window:12", "causal-document"]
    assert len(plan["layers"][0]["grid"]) == 2 and len(plan["visible"]) == 2
    assert run.meta["docs"][f"{DOCS}@64"]["lengths"] == [3, 21, 1, 2, 30, 7]
    compute = run.events[run.events["kind"] == "compute"]
    assert set(compute.groupby("layer")["phase"].unique().explode()) == {"fwd", "bwd"}


@pytest.mark.parametrize(("args", "message"), [
    (["--mask", "causal-document", "--docs", "lengths:10,20"], "docs='lengths:10,20' is not allowed; expected lengths summing to seq=64 (they sum to 30)"),
    (["--mask", "window:0"], "mask='window:0' is not allowed; expected window:W with an integer W >= 1"),
    (["--mask", "window:-3"], "mask='window:-3' is not allowed"),
    (["--mask", "causal-document", "--docs", "lognormal:64:-1:3"], "docs='lognormal:64:-1:3' is not allowed; expected lognormal:MEAN:SIGMA:SEED with 0 <= SIGMA <= 10"),
    (["--mask", "causal-document", "--docs", "uniform:9:2:1"], "docs='uniform:9:2:1' is not allowed; expected uniform:MIN:MAX:SEED with integers 1 <= MIN <= MAX"),
    (["--layout", "doc-balanced", "--mask", "causal"], "layout='doc-balanced' is not allowed; expected a layout other than doc-balanced with mask causal"),
    (["--mask", "causal-document"], "mask='causal-document' is not allowed; expected a mask without documents, or documents given with docs (--docs)"),
    (["--layers", "window:64 x0"], "layers='window:64 x0' is not allowed"),
    (["--layers", "dense x2"], "layers='dense x2' is not allowed; expected a count L >= 1"),
    (["--buffer", "double-long"], "buffer='double-long' is not allowed; expected one of: sync, double, allgather, sync-short, double-short"),
])  # fmt: skip
def test_bad_mask_document_and_layer_specs_are_one_line_and_exit_2(args, message):
    result = runner.invoke(app, ["run", "--world", "2", *SMALL, *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_an_emulated_step_longer_than_half_the_timeout_is_refused_not_stalled():
    # 1e-5 GFLOP/s models the one causal block at about 13 s: a peer would wait for it past --timeout.
    result = runner.invoke(app, ["run", "--world", "1", *SMALL, "--kernel", "emulated:0.00001", "--timeout", "10"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "kernel='emulated:1e-05' is not allowed" in lines[0]
    assert "rank 0's fwd step 0 would take" in lines[0] and "Traceback" not in result.output


def test_simulate_refuses_bad_specs_the_same_way():
    result = runner.invoke(app, ["simulate", "--world", "8", "--seq", "64", "--mask", "window:0"])
    assert result.exit_code == 2 and "mask='window:0' is not allowed" in result.stderr


def test_records_written_before_layers_still_load():
    fixtures = sorted((Path(__file__).parent / "data" / "analysis").glob("*/meta.json"))
    assert fixtures
    for meta in fixtures:
        run = load_run(meta.parent)
        assert run.meta.schema_version < 3
        assert (run.events["layer"] == 0).all() and run.events["layer"].dtype.kind == "i"
        assert (run.cases["layers"] == "1").all() and (run.cases["docs"] == "none").all()
        assert run.cases["imbalance"].isna().all() and run.meta.plans == {}


def test_the_analyses_split_by_layer(tmp_path):
    from ringbench.analysis.balance import balance_layers, plan_grid

    events = pd.DataFrame({
        "case_id": "c", "repeat": 0, "iteration": 0, "phase": ["fwd", "fwd", "fwd", "bwd"], "rank": 0,
        "kind": ["compute", "compute", "send", "compute"], "start_ns": [0, 10, 0, 30], "end_ns": [5, 30, 8, 50],
        "flops": [1e9, 2e9, 0, 4e9], "bytes": [0, 0, 64, 0], "layer": [0, 1, 1, 1],
    })  # fmt: skip
    table = balance_layers(events).set_index(["layer", "phase"])
    assert table.loc[(0, "fwd"), "compute_ms"] == pytest.approx(5e-6) and table.loc[(1, "fwd"), "bytes"] == 64
    assert table.loc[(1, "bwd"), "gflop"] == pytest.approx(4.0)
    plans = {"c": {"layers": [{"mask": "window:4", "grid": [["causal", "skip"], ["partial", "causal"]]}]}}
    grid = plan_grid(plans, "c")
    assert list(grid["kind"]) == ["causal", "skip", "partial", "causal"] and set(grid["mask"]) == {"window:4"}
