"""`ringbench simulate`: calibration, the record and its labels, --json, the scale view, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ringbench.calibration.calibrate import calibrate
from ringbench.cli.app import app
from ringbench.record.schema import CASE_COLUMNS
from ringbench.record.store import load_run
from ringbench.report.markdown import render_section
from ringbench.report.scale import scale_figure, scale_section
from ringbench.scenario.workload import Workload
from ringbench.simulate import Costs, LinkCost, SimCase, run_data, simulate_case, write_run

TOPOLOGY = Path(__file__).parent / "data" / "topology" / "two_host_slow_net.yaml"
HOST = {"enter_ms": 0.1, "pre_ms": 0.05, "mid_ms": 0.07, "post_ms": 0.03}
LINK = LinkCost(latency_us=200, bandwidth_gbps=0.8)
TRUE = Costs(gflops=50.0, call_ms={"fwd": 0.2, "bwd": 0.3}, links={"local": LINK},
             host_ms={p: {b: dict(HOST) for b in ("sync", "double")} for p in ("fwd", "bwd")},
             start_skew_ms=(0.0, 0.5), gap_ms=0.2)  # fmt: skip


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A record made by known costs, stored as if measured (an emulated run at 50 GFLOP/s)."""
    results = [simulate_case(SimCase(workload=Workload(world=4, seq=seq, heads=2, head_dim=32, dtype="bfloat16",
                                                       layout=layout, buffer=buffer), iterations=3), TRUE)
               for seq in (512, 1024) for layout in ("zigzag", "contiguous")
               for buffer in ("double", "sync")]  # fmt: skip
    run = run_data(results, TRUE, run_id="measured")
    run.meta.update(simulated=False, kind="run", source="ringbench")
    run.cases["kernel"] = "emulated:50"
    folder = tmp_path_factory.mktemp("measured") / "measured"
    write_run(folder, run)
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | {"simulated": False, "kind": "run"}))
    return folder


def test_calibration_recovers_the_costs_that_made_the_record(measured):
    cal = calibrate(load_run(measured))
    costs = cal.costs
    assert costs.gflops == pytest.approx(50.0)
    for phase in ("fwd", "bwd"):
        assert costs.call_ms[phase] == pytest.approx(TRUE.call_ms[phase], rel=0.02)
        for kind in ("full", "causal"):
            assert costs.efficiency[phase][kind] == pytest.approx(1.0, rel=0.02)
        for buffer in ("sync", "double"):
            got = costs.host(phase, buffer)
            for name in ("pre_ms", "post_ms"):
                assert got[name] == pytest.approx(HOST[name], abs=2e-6), (phase, buffer, name)
    assert costs.host("bwd", "double")["mid_ms"] == pytest.approx(HOST["mid_ms"], abs=2e-6)
    local = costs.links["local"]
    assert local.latency_us == pytest.approx(200, rel=0.01) and local.bandwidth_gbps == pytest.approx(0.8, rel=0.01)
    assert set(cal.rank_factors) == {0, 1, 2, 3} and max(cal.rank_factors.values()) == pytest.approx(1.0, rel=0.01)
    assert max(costs.start_skew_ms) == pytest.approx(0.5)


def test_simulate_json_has_run_keys_labels_and_the_calibration(measured, tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--from", str(measured), "--world", "8", "--seq", "2048",
                                      "--layout", "zigzag", "--buffer", "double", "--buffer", "sync", "--iters", "2",
                                      "--fault", "slow-rank:3:1.5", "--out", str(tmp_path), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["simulated"] is True and doc["emulated"] is True
    assert doc["calibration"]["costs"]["gflops"] == pytest.approx(50.0)
    assert len(doc["cases"]) == 2
    for case in doc["cases"]:
        assert set(CASE_COLUMNS) <= set(case) and case["simulated"] is True
        assert case["kernel"] == "simulated" and case["emulated"] is True and case["faults"] == "slow-rank:3:1.5"
        assert case["ring"] == list(range(8)) and case["step_ms"] > 0
    run = load_run(doc["run_dir"])
    assert run.meta["simulated"] is True and run.meta["kind"] == "simulate"
    assert run.meta["simulation"]["costs"]["gflops"] == pytest.approx(50.0)
    analyzed = CliRunner().invoke(app, ["analyze", doc["run_dir"]])
    assert analyzed.exit_code == 0 and "SIMULATED" in analyzed.output


def test_scale_view_and_orders_on_a_topology(tmp_path):
    result = CliRunner().invoke(app, ["simulate", "--world", "4", "--seq", "1024", "--layout", "zigzag", "--buffer",
                                      "double", "--topology", str(TOPOLOGY), "--scale", "4,8", "--out",
                                      str(tmp_path), "--json", "--compute-tflops", "0.01"])  # fmt: skip
    assert result.exit_code == 0, result.output
    view = json.loads(result.stdout)["scale"]
    assert {(r["world"], r["buffer"], r["layout"]) for r in view["curves"]} >= {
        (4, "double", "zigzag"),
        (8, "sync", "contiguous"),
    }
    blast = {(r["world"], r["factor"]): r["slowdown"] for r in view["blast"]}
    assert blast[(8, 2.0)] > blast[(8, 1.5)] > blast[(8, 1.1)] > 1.0
    orders = {r["order"]: r for r in view["orders"]}
    assert set(orders) == {"identity", "stride:2", "recommended"}
    assert orders["stride:2"]["step_ms"] > orders["recommended"]["step_ms"]  # four NET hops instead of two
    table = "\n".join(render_section(scale_section(view)))
    assert "SIMULATED" in table and "Blast radius" in table and "| recommended |" in table
    assert scale_figure(view).startswith(b"\x89PNG")


@pytest.mark.parametrize(("args", "field"), [
    (["--fault", "crash:1:0"], "fault"),
    (["--world", "3", "--seq", "1000", "--layout", "zigzag"], "seq=1000"),
    (["--from", "/nonexistent/run"], "/nonexistent/run"),
    (["--scale", "8,x"], "scale"),
    (["--compute-tflops", "-1"], "compute_tflops"),
    (["--emulate-links"], "emulate_links"),
    (["--world", "8", "--topology", str(TOPOLOGY)], "world"),
    (["--world", "8", "--fault", "slow-host:3:2", "--gpus-per-host", "4"], "slow-host:3:2"),
    (["--world", "8", "--fault", "slow-link:1:4:20"], "never sends 1 -> 4"),
    (["--world", "8", "--fault", "slow-rank:1:2", "--fault", "slow-host:0:1.5", "--gpus-per-host", "4"],
     "both slow rank 1 (on host 0)"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args, field, tmp_path):
    result = CliRunner().invoke(app, ["simulate", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0], result.output


def test_calibrating_on_a_simulated_record_is_refused(tmp_path):
    first = CliRunner().invoke(app, ["simulate", "--world", "4", "--out", str(tmp_path), "--json", "--quiet"])
    run_dir = json.loads(first.stdout)["run_dir"]
    again = CliRunner().invoke(app, ["simulate", "--from", run_dir, "--out", str(tmp_path)])
    assert again.exit_code == 2 and "SIMULATED" in again.output


def test_a_bounded_record_is_analysed_without_per_rank_balance(tmp_path):
    """At scale only some ranks' spans are kept: imbalance is not computed from them (it would be made up)."""
    result = CliRunner().invoke(app, ["simulate", "--world", "16", "--seq", "4096", "--max-events", "200", "--iters", "3",
                                      "--out", str(tmp_path), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    run = load_run(json.loads(result.stdout)["run_dir"])
    assert run.meta.bounded_cases
    from ringbench.analysis.findings import analyze

    summary = analyze(run).summary
    bounded = summary[summary["case_id"].isin(run.meta.bounded_cases)]
    assert len(bounded) and bounded["imbalance"].isna().all()
    rows = run.cases.drop_duplicates("case_id").set_index("case_id")  # the figures are the simulator's, every rank
    for figure in ("step_ms", "exposed_comm_frac"):
        expected = bounded["case_id"].map(rows[figure]).to_numpy(float)
        assert bounded[figure].to_numpy(float) == pytest.approx(expected), figure
