"""Reports: files, self-containment, escaping, the Perfetto trace, `ringbench report` (browser: test_report_browser.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.given import SimConfig, simulate_run
from typer.testing import CliRunner

from ringbench.cli.app import app
from ringbench.record.store import load_run
from ringbench.report import write_report

FIXTURE = Path(__file__).parent / "data" / "analysis" / "sim_w4_slow_rank"
EVIL = '<img src=x onerror="alert(1)">|"&'


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    return write_report(load_run(FIXTURE), out)


def test_report_files_and_answers_first(report):
    assert report.name == "sim_w4_slow_rank"
    for name in ("report.html", "report.md", "trace.json"):
        assert (report / name).stat().st_size > 0
    names = sorted(p.stem for p in (report / "figures").glob("*.png"))
    per_case = ["compute_wait", "hops", "ring", "timeline"]
    # Both cases could be judged: each gets its figures; the fixture's errors are synthetic, so errors.png is drawn.
    assert names == sorted(["step_time", "overlap", "errors", *(f"case{n}_{f}" for n in (1, 2) for f in per_case)])
    html = (report / "report.html").read_text()
    assert html.index('id="label"') < html.index('id="contents"') < html.index('id="answers"')
    assert html.index('id="answers"') < html.index('id="verdict"') < html.index("<img")
    assert "SIMULATED" in html and "slow_rank:rank=2,factor=2" in html
    assert "Straggler: rank 2 (compute)" in html
    assert html.count('src="data:image/png;base64,') == len(names)
    md = (report / "report.md").read_text()
    assert "Straggler: rank 2 (compute)" in md and "| # | case | kernel |" in md
    assert md.index("## Answers") < md.index("## Verdict") < md.index("![")
    assert all(f"](figures/{name}.png)" in md for name in names)


def test_html_is_self_contained(report):
    html = (report / "report.html").read_text()
    assert "<script" not in html.lower() and "<link" not in html.lower() and "@import" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "url(" not in html


def test_user_strings_are_escaped(tmp_path):
    cfg = SimConfig.of(world=2, iterations=2, case_id=EVIL)
    run = simulate_run(cfg, run_id=f"../{EVIL}", path=tmp_path / EVIL)
    run.meta["command"] = ["ringbench", "run", "--scenario", EVIL]
    run.meta["faults"] = [EVIL]
    folder = write_report(run, tmp_path / "out")
    assert folder.parent == tmp_path / "out"  # the run id cannot escape the output folder
    html = (folder / "report.html").read_text()
    assert EVIL not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    md = (folder / "report.md").read_text()
    assert "\\|" in md  # a pipe in a cell would split the table
    json.loads((folder / "trace.json").read_text())  # escaped inside JSON strings too


def test_trace_has_processes_threads_steps_and_matching_flows(report):
    trace = json.loads((report / "trace.json").read_text())
    events = trace["traceEvents"]
    names = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(names) == 4 + 2  # one process per rank per case
    track = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"iterations", "compute / wait", "fwd K/V send", "fwd K/V recv"} <= set(track.values())
    spans = [e for e in events if e["ph"] == "X"]
    assert {"compute", "send", "recv", "wait", "iteration"} <= {e["cat"] for e in spans}
    assert any(e["ph"] == "i" and "step" in e["name"] for e in events)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and starts.keys() == finishes.keys()
    for flow_id, start in starts.items():
        finish = finishes[flow_id]
        assert " send" in track[start["pid"], start["tid"]] and " recv" in track[finish["pid"], finish["tid"]]
        assert finish["bp"] == "e" and finish["ts"] >= start["ts"]


def test_cli_report(tmp_path):
    result = CliRunner().invoke(app, ["report", str(FIXTURE), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sim_w4_slow_rank" / "report.html").exists()
    bad = CliRunner().invoke(app, ["report", str(tmp_path / "missing")])
    assert bad.exit_code == 2
