"""One definition per figure: the run's cases rows, `analyze --json`, report.md and the simulator agree.

The simulator's own case rows are compared with the analysis of the same simulated record; a short real run
(4 local ranks, emulated compute) is compared across `run --json`, `analyze --json` and report.md.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.given import SimConfig, simulate_run
from typer.testing import CliRunner

from ringbench.analysis.findings import analyze, verdict_document
from ringbench.cli.app import app
from ringbench.figures import metrics
from ringbench.record.store import load_run

SHARED = ("step_ms", "fwd_ms", "bwd_ms", "tokens_per_s", "tflops", "exposed_comm_ms", "exposed_comm_frac")


def _same(a, b) -> bool:
    a, b = (None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v) for v in (a, b))
    return a == b or (a is not None and b is not None and a == pytest.approx(b, rel=1e-9, abs=1e-12))


def test_simulator_rows_are_the_analysis_figures():
    configs = [
        SimConfig.of(world=4, iterations=4, buffer="double", backward=True, jitter=0.03, slow_rank=1, slow_factor=1.6,
                  case_id="double-bwd", seed=1),
        SimConfig.of(world=4, iterations=4, buffer="sync", backward=False, jitter=0.03, case_id="sync-fwd", seed=2),
        SimConfig.of(world=3, iterations=4, buffer="sync", mask="causal", layout="zigzag", slow_link=(1, 2),
                  slow_link_extra_ms=1.0, case_id="sync-link", seed=3),
    ]  # fmt: skip
    run = simulate_run(configs)
    doc = verdict_document(analyze(run))
    by_case = {case["case_id"]: case for case in doc["cases"]}
    for row in run.cases.to_dict("records"):
        analysed = by_case[row["case_id"]]
        for name in SHARED:
            assert _same(row[name], analysed[name]), (row["case_id"], name, row[name], analysed[name])
    # The definitions themselves: step time from the iteration rows, exposed share = exposed ms / step ms.
    figures = metrics.case_figures(run.events, run.cases).set_index("case_id")
    it = run.events[run.events["kind"] == "iteration"]
    step = it.groupby(["case_id", "iteration"])["end_ns"].max() - it.groupby(["case_id", "iteration"])["start_ns"].min()
    assert figures["step_ms"].to_numpy() == pytest.approx((step / 1e6).groupby(level=0).median()[figures.index])
    assert figures["exposed_comm_frac"].to_numpy() == pytest.approx(figures["exposed_comm_ms"] / figures["step_ms"])


def test_untraced_figures_are_nan_not_zero():
    run = simulate_run(SimConfig.of(world=4, iterations=3, case_id="plain"))
    only = run.events[run.events["kind"] == "iteration"]
    row = metrics.case_figures(only, run.cases).iloc[0]
    assert row["step_ms"] > 0 and np.isnan(row["exposed_comm_ms"]) and np.isnan(row["tflops"])
    assert row["step_ms"] == pytest.approx(run.cases["step_ms"].iloc[0])


def test_old_cases_tables_read_the_new_columns_as_null(tmp_path):
    from support.given import write_simulated_run

    path = write_simulated_run(tmp_path / "sim", SimConfig.of(world=2, iterations=2))
    cases = pd.read_parquet(path / "cases.parquet").drop(columns=["peak_mem_mb", "saturated_blocks"])
    cases.to_parquet(path / "cases.parquet", index=False)
    loaded = load_run(path)
    assert loaded.cases["peak_mem_mb"].isna().all() and loaded.cases["saturated_blocks"].isna().all()
    assert analyze(loaded).summary["step_ms"].notna().all()


def _table_rows(text: str) -> list[dict[str, str]]:
    """The first Markdown table in ``text``, one dict per row keyed by its header."""
    lines = text.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


def _report_cases(markdown: str) -> list[dict[str, str]]:
    """report.md's cases table, each row with its full case id (from the "Case ids" table) under "case"."""
    section = markdown.split("## Cases\n", 1)[1]
    ids = {row["#"]: row["case id"] for row in _table_rows(section.split("### Case ids", 1)[1])}
    return [row | {"case": ids[re.sub(r"^\[(\d+)\].*", r"\1", row["#"])]} for row in _table_rows(section)]


def test_run_json_analyze_json_and_report_give_the_same_figures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # `run --report` writes reports/ in the working directory
    runner = CliRunner()
    result = runner.invoke(app, [
        "run", "--world", "4", "--seq", "1024", "--heads", "2", "--head-dim", "32", "--mask", "causal",
        "--layout", "zigzag", "--buffer", "sync", "--buffer", "double", "--kernel", "emulated:2", "--iters", "4",
        "--warmup", "1", "--no-check", "--out", str(tmp_path / "results"), "--json", "--report",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    ran = json.loads(result.stdout)
    run_dir = Path(ran["run_dir"])
    assert ran["answers"]["next"].startswith(f"open {Path('reports') / run_dir.name / 'report.html'}"), ran["answers"]
    analysed = runner.invoke(app, ["analyze", str(run_dir), "--json"])
    assert analysed.exit_code == 0, analysed.output
    by_case = {case["case_id"]: case for case in json.loads(analysed.stdout)["cases"]}
    report = (tmp_path / "reports" / run_dir.name / "report.md").read_text()
    in_report = {row["case"]: row for row in _report_cases(report)}
    assert len(ran["cases"]) == 2
    for row in ran["cases"]:
        case = by_case[row["case_id"]]
        for name in SHARED:
            assert _same(row[name], case[name]), (row["case_id"], name, row[name], case[name])
        shown = in_report[row["case_id"]]
        assert shown["step ms"] == f"{row['step_ms']:.2f}"
        assert shown["exposed comm %"] == f"{100 * row['exposed_comm_frac']:.1f}"
        assert row["exposed_comm_ms"] <= row["step_ms"]
