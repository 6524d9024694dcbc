"""Analyses on simulated rings: hops, critical path, overlap, balance, numerics, verdict and `ringbench analyze`."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.given import SimConfig, simulate, simulate_run
from typer.testing import CliRunner

from ringbench.analysis.balance import balance_cases, balance_ranks
from ringbench.analysis.findings import analyze, verdict_document, verdict_line, verdict_lines
from ringbench.analysis.hops import hop_table
from ringbench.analysis.numerics import numerics_table, worst_error
from ringbench.analysis.overlap import overlap_by_buffer, overlap_cases, overlap_steps
from ringbench.analysis.stragglers import culprits, straggler_table
from ringbench.cli.app import app
from ringbench.figures.critical_path import clock_tolerance_ns, critical_path, transfers
from ringbench.record.meta import RunMeta
from ringbench.record.store import RunData, load_run

FIXTURE = Path(__file__).parent / "data" / "analysis" / "sim_w4_slow_rank"


def _culprit(**kwargs) -> pd.Series:
    return _verdict(SimConfig.of(**kwargs))


def _verdict(cfg: SimConfig) -> pd.Series:
    events, _ = simulate(cfg)
    xfers = transfers(events)
    return culprits(straggler_table(events, xfers, critical_path(events, xfers))).iloc[0]


def test_fixture_is_the_documented_simulation():
    run = load_run(FIXTURE)
    assert run.meta["simulated"] is True
    assert list(run.cases["case_id"]) == ["double-w4", "sync-w2"]


def test_hops_separate_the_transfer_from_the_wait_for_a_slow_upstream_rank():
    events, _ = simulate(SimConfig.of(world=4, iterations=3, slow_rank=2, slow_factor=3.0, link_ms=0.5, backward=False))
    hops = hop_table(transfers(events)).set_index(["src", "dst"])
    # Every link moves a block in 0.5 ms; the naive recv time behind the slow rank is much longer.
    assert hops["transfer_ms"].to_numpy() == pytest.approx(0.5)
    assert hops.loc[(2, 3), "upstream_wait_ms"] > 1.0
    assert hops.loc[(2, 3), "recv_ms"] > 3 * hops.loc[(2, 3), "transfer_ms"]
    assert hops["bandwidth_gbps"].notna().all()


def test_critical_path_accounts_for_the_whole_iteration_and_runs_through_the_slow_rank():
    events, _ = simulate(SimConfig.of(world=4, iterations=3, slow_rank=1, slow_factor=2.0))
    path = critical_path(events)
    sums = path.groupby("iteration").agg(ms=("ms", "sum"), path=("path_ms", "first"))
    assert sums["ms"].to_numpy() == pytest.approx(sums["path"].to_numpy())
    ranks = path[path["resource"] == "rank"].groupby("rank")["ms"].sum()
    assert ranks.idxmax() == 1 and ranks[1] > 0.8 * path.groupby("iteration")["path_ms"].first().sum()


def test_overlap_is_zero_for_sync_and_full_for_double_when_compute_covers_the_link():
    # Forward only: the engine's backward waits for its last dK/dV exchange after the last step, which no buffering
    # can hide (the simulator models that exchange, as ringbench simulate does).
    events, cases = simulate(
        [SimConfig.of(world=4, iterations=3, buffer=b, case_id=b, compute_ms=2.0, link_ms=1.0, backward=False)
         for b in ("sync", "double")]
    )  # fmt: skip
    xfers = transfers(events)
    steps = overlap_steps(events, xfers)
    per_case = overlap_cases(events, steps, cases).set_index("case_id")
    assert per_case.loc["sync", "overlap_efficiency"] == pytest.approx(0.0)
    assert per_case.loc["double", "overlap_efficiency"] == pytest.approx(1.0)
    assert per_case.loc["double", "exposed_comm_frac"] == pytest.approx(0.0)
    assert 0.2 < per_case.loc["sync", "exposed_comm_frac"] < 0.5
    by_buffer = overlap_by_buffer(per_case.reset_index()).set_index("buffer")
    assert by_buffer.loc["sync", "overlap_efficiency"] == 0.0 and by_buffer.loc["double", "cases"] == 1


def test_balance_counts_the_mask_plan_and_predicts_causal_contiguous_imbalance():
    events, cases = simulate(SimConfig.of(world=4, iterations=2, mask="causal", layout="contiguous"))
    ranks = balance_ranks(events, cases).set_index("rank")
    assert ranks["full"].tolist() == [0, 1, 2, 3]
    assert ranks["causal"].tolist() == [1, 1, 1, 1]
    assert ranks["skip"].tolist() == [3, 2, 1, 0]
    summary = balance_cases(ranks.reset_index(), events, cases).iloc[0]
    # Work per rank r is r + 1/2 full pairs: max / mean = 3.5 / 2.
    assert summary["predicted_imbalance"] == pytest.approx(1.75)
    assert summary["imbalance"] == pytest.approx(1.75, rel=0.01)
    zig, zig_cases = simulate(SimConfig.of(world=4, iterations=2, mask="causal", layout="zigzag"))
    zig_summary = balance_cases(balance_ranks(zig, zig_cases), zig, zig_cases).iloc[0]
    assert zig_summary["predicted_imbalance"] == pytest.approx(1.0)


def test_numerics_by_world_and_dtype():
    cases = pd.DataFrame(
        {
            "case_id": ["a", "b", "c", "d"],
            "world": [2, 4, 4, 4],
            "dtype": ["float32", "float32", "float32", "float64"],
            "fwd_max_abs_err": [1e-7, 2e-7, 4e-7, 1e-15],
            "bwd_max_abs_err": [3e-7, np.nan, 1e-7, 2e-15],
            "passed": [True, True, False, True],
        }
    )
    table = numerics_table(cases).set_index(["world", "dtype"])
    assert table.loc[(4, "float32"), "fwd_max_abs_err"] == 4e-7
    assert not table.loc[(4, "float32"), "passed"] and table.loc[(2, "float32"), "passed"]
    worst = worst_error(cases).iloc[0]
    assert (worst["case_id"], worst["phase"], worst["max_abs_err"]) == ("c", "fwd", 4e-7)
    assert worst_error(cases.assign(fwd_max_abs_err=np.nan, bwd_max_abs_err=np.nan)).empty


# -- detection quality: 8 ranks, realistic jitter ----------------------------------------------------------------
@pytest.mark.parametrize("rank", range(8))
def test_slow_rank_factor_1_5_is_named_as_a_compute_straggler(rank):
    row = _culprit(world=8, iterations=6, backward=False, jitter=0.04, slow_rank=rank, slow_factor=1.5, seed=rank)
    assert (row["straggler_kind"], row["straggler_rank"]) == ("compute", rank)
    assert row["cost_ms"] > 0


@pytest.mark.parametrize("buffer", ["double", "sync"])
@pytest.mark.parametrize("hop", [0, 3, 7])
def test_slow_link_of_20_percent_of_a_step_is_named_and_no_rank_is_blamed(hop, buffer):
    order = (0, 3, 6, 1, 4, 7, 2, 5)
    cfg = SimConfig.of(world=8, order=order, buffer=buffer, iterations=6, backward=False, jitter=0.04, seed=hop)
    src_dst = cfg.hops()[hop]
    row = _verdict(dataclasses.replace(cfg, slow_link=src_dst, slow_link_extra_ms=0.2 * cfg.compute_ms))
    assert row["straggler_kind"] == "link"
    assert (row["slow_hop_src"], row["slow_hop_dst"]) == src_dst
    assert row["straggler_rank"] is None


@pytest.mark.parametrize("seed", range(6))
def test_no_fault_raises_no_alarm(seed):
    buffer = "sync" if seed % 2 else "double"
    row = _culprit(world=8, iterations=6, jitter=0.05, buffer=buffer, seed=100 + seed, mask="causal", layout="zigzag")
    assert row["straggler_kind"] is None


@pytest.mark.parametrize(
    "trials", [pytest.param(2, id="2-trials"), pytest.param(6, id="6-trials", marks=pytest.mark.slow)]
)
def test_detection_rate_over_random_trials(trials):
    from support.detection import detection_trials

    table = detection_trials(trials, iterations=5, seed=5)
    faulty = table[table["fault"] != "none"]
    assert len(faulty) == 2 * trials and (table["fault"] == "none").sum() == trials
    assert faulty["hit"].all() and not table["false_alarm"].any()  # every fault named, no false alarm


# -- verdict and CLI -----------------------------------------------------------------------------------------------
def test_verdict_document_names_the_straggler_and_labels_the_run():
    analysis = analyze(load_run(FIXTURE))
    doc = verdict_document(analysis)
    assert (doc["straggler_rank"], doc["straggler_kind"], doc["slow_hop"]) == (2, "compute", None)
    assert doc["straggler_case"] == "double-w4" and doc["straggler_cost_ms"] > 0
    assert doc["simulated"] is True and doc["faults"] == ["slow_rank:rank=2,factor=2"]
    assert 0 <= doc["exposed_comm_frac"] <= 1 and doc["imbalance"] >= 1
    assert {c["case_id"] for c in doc["cases"]} == {"double-w4", "sync-w2"}
    json.dumps(doc, allow_nan=False)


def test_verdict_line_for_the_run_command():
    run = simulate_run(SimConfig.of(world=4, iterations=3, slow_link=(1, 2), slow_link_extra_ms=1.5, buffer="sync"))
    line = verdict_line(run)
    assert "SIMULATED" in line and "Slow hop: 1 -> 2" in line and "\n" not in line


def test_cli_analyze_words_json_and_bad_dir(tmp_path):
    runner = CliRunner()
    words = runner.invoke(app, ["analyze", str(FIXTURE)])
    assert words.exit_code == 0, words.output
    assert "Straggler: rank 2 (compute)" in words.output and "SIMULATED" in words.output
    as_json = runner.invoke(app, ["analyze", str(FIXTURE), "--json"])
    assert as_json.exit_code == 0
    doc = json.loads(as_json.stdout)
    assert doc["straggler_rank"] == 2 and doc["straggler_kind"] == "compute"
    missing = runner.invoke(app, ["analyze", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not a directory" in missing.output
    not_a_run = runner.invoke(app, ["analyze", str(tmp_path)])
    assert not_a_run.exit_code == 2 and "meta.json" in not_a_run.output


# -- real-run shapes: untraced cases, backward exchanges, collectives, clocks, one-off noise -----------------------
def _run(events: pd.DataFrame, cases: pd.DataFrame | None = None, meta: dict | None = None) -> RunData:
    cases = cases if cases is not None else pd.DataFrame(columns=["case_id"])
    return RunData(path=Path("mem"), events=events.reset_index(drop=True), cases=cases, meta=meta or {})


def test_untraced_case_says_not_traced_and_keeps_its_iteration_time():
    events, cases = simulate(SimConfig.of(world=4, iterations=3, case_id="plain"))
    only = events[events["kind"] == "iteration"]  # what `run --no-trace` records
    analysis = analyze(_run(only, cases))
    row = analysis.overlap_cases.iloc[0]
    assert row["iteration_ms"] > 0 and np.isnan(row["exposed_comm_frac"]) and row["iterations"] == 3
    lines = " | ".join(verdict_lines(analysis))
    assert "Not traced" in lines and "Straggler" not in lines
    doc = verdict_document(analysis)
    assert doc["straggler_kind"] is None and doc["cases"][0]["traced"] is False
    json.dumps(doc, allow_nan=False)
    mixed = pd.concat([only, simulate(SimConfig.of(world=4, iterations=3, case_id="traced"))[0]])
    assert set(analyze(_run(mixed)).overlap_cases["case_id"]) == {"plain", "traced"}


def test_zero_transfer_times_raise_no_warning():
    events, _ = simulate(SimConfig.of(world=4, iterations=3, link_ms=0.0, backward=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        table = straggler_table(events)
    assert not table["flagged"].any()


def test_backward_dkv_exchanges_are_their_own_hops_and_the_slow_link_is_still_named():
    cfg = SimConfig.of(world=4, iterations=5, jitter=0.03, slow_link=(1, 2), slow_link_extra_ms=0.8, seed=3)
    events = simulate(cfg)[0]  # the engine's backward: a dK/dV exchange after each step's compute
    xfers = transfers(events)
    assert set(xfers.loc[xfers["phase"] == "fwd", "exchange"]) == {"kv"}
    per_step = xfers[xfers["phase"] == "bwd"].groupby(["iteration", "step", "src", "dst"])["exchange"].agg(sorted)
    for (_, step, _, _), kinds in per_step.items():  # K/V moves on for the next step; the last step only returns dK/dV
        assert tuple(kinds) == (("dkv", "kv") if step < cfg.world - 1 else ("dkv",)), (step, kinds)
    hops = hop_table(xfers)
    assert set(zip(hops["phase"], hops["exchange"], strict=True)) == {("fwd", "kv"), ("bwd", "kv"), ("bwd", "dkv")}
    row = culprits(straggler_table(events, xfers)).iloc[0]
    assert (row["straggler_kind"], row["slow_hop_src"], row["slow_hop_dst"]) == ("link", 1, 2)


def test_allgather_collectives_are_exposed_comm_and_no_hop():
    events, cases = simulate(SimConfig.of(world=4, iterations=3, buffer="sync", backward=False, case_id="ag"))
    spans = events[~events["kind"].isin(["send", "recv", "wait"])]
    first = spans[spans["kind"] == "compute"].groupby(["iteration", "rank"])["start_ns"].min().reset_index()
    coll = first.assign(
        case_id="ag", repeat=0, phase="fwd", ring_position=first["rank"], step=0, kind="collective",
        start_ns=first["start_ns"] - 2_000_000 + first["rank"] * 100_000, end_ns=first["start_ns"], src=-1,
        dst=first["rank"], bytes=1 << 20, block=-1, pair="", flops=0.0,
    )  # fmt: skip
    analysis = analyze(_run(pd.concat([spans, coll.reindex(columns=spans.columns)]), cases))
    assert analysis.transfers.empty and analysis.hops.empty
    assert analysis.overlap_cases.iloc[0]["exposed_ms"] > 0
    path = analysis.critical_path
    assert (path["resource"] != "link").all() and (path.groupby("iteration")["ms"].sum() > 0).all()
    assert analysis.culprits.iloc[0]["straggler_kind"] is None


def test_clock_tolerance_comes_from_the_metadata_and_disagreeing_clocks_blame_no_link():
    assert clock_tolerance_ns(RunMeta({"ranks": {"8": {"clock_residual_ns": 150_000}}}).clock_residual_ns()) == 300_000
    assert clock_tolerance_ns(RunMeta({}).clock_residual_ns()) == 20_000
    cfg = SimConfig.of(world=4, iterations=4, jitter=0.02, slow_link=(2, 3), slow_link_extra_ms=1.0, backward=False)
    events, cases = simulate(cfg)
    assert culprits(straggler_table(events)).iloc[0]["straggler_kind"] == "link"
    skewed = events.copy()
    late = skewed["rank"] == 3  # rank 3's clock runs 5 ms behind: its blocks seem to arrive before they were sent
    skewed.loc[late, ["start_ns", "end_ns"]] -= 5_000_000
    analysis = analyze(_run(skewed, cases))
    assert analysis.culprits.iloc[0]["clock_violations"] > 0.05
    assert analysis.culprits.iloc[0]["straggler_kind"] is None  # inconclusive: nobody is named
    doc = verdict_document(analysis)
    assert doc["confidence"] == "inconclusive" and doc["inconclusive_reasons"][0].startswith("clocks disagree")
    assert any(line.startswith("Inconclusive") and "Clocks disagree" in line for line in verdict_lines(analysis))
    assert not any(line.startswith("No straggler") for line in verdict_lines(analysis))


def test_one_slow_iteration_is_not_a_straggler():
    events, _ = simulate(SimConfig.of(world=8, iterations=6, jitter=0.03, backward=False, seed=4))
    spike = (events["kind"] == "compute") & (events["rank"] == 2) & (events["iteration"] == 3)
    events.loc[spike, "end_ns"] += 3 * (events.loc[spike, "end_ns"] - events.loc[spike, "start_ns"])
    row = culprits(straggler_table(events)).iloc[0]
    assert row["straggler_kind"] is None


def test_a_comparison_over_some_contexts_only_says_which():
    """The default run's headline covers the emulated cases only (real compute on 2 cores cannot be compared):
    the headline and the line say so, never a bare ratio that the real rows contradict."""
    from ringbench.analysis.answers import compare_axis

    rows, samples = [], []
    for kernel in ("torch", "emulated:auto"):
        for layout, step in (("contiguous", 30.0), ("zigzag", 20.0)):
            case_id = f"{layout}-{kernel}"
            rows.append({"case_id": case_id, "layout": layout, "kernel": kernel, "mask": "causal", "world": 4})
            samples += [{"case_id": case_id, "step_ms": step + i * 0.1} for i in range(5)]
    cases, steps = pd.DataFrame(rows), pd.DataFrame(samples)
    judged = {"contiguous-emulated:auto", "zigzag-emulated:auto"}
    (comparison,) = compare_axis("layout", cases, steps, judged, {})
    assert comparison.faster == "zigzag" and comparison.contexts == 1 and comparison.untrusted == 1
    assert "only the 1 of 2 contexts whose timings can be compared (causal, 4 ranks, emulated:auto)" in comparison.scope
    assert "1 other context(s) not compared" in comparison.line()
    (everywhere,) = compare_axis("layout", cases, steps, judged | {"contiguous-torch", "zigzag-torch"}, {})
    assert everywhere.scope == "" and "not compared" not in everywhere.line()
