"""Imports of rings written outside the project (tests/data/kineto/user_rings: user programs of tests/user_rings.py,
each with its own name for the block computation, one fault each): the compute is found from the ring's structure
whatever it is called, the verdict names what the evidence supports, and what it cannot separate is said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import invoke
from matplotlib.colors import to_rgba

from ringbench.analysis.findings import analyze
from ringbench.record.store import load_run
from ringbench.report import case_charts, charts
from ringbench.traces.importer import import_traces

USER_RINGS = Path(__file__).parent / "data" / "kineto" / "user_rings"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """Every fixture imported once: name -> (import --json document, analyze --json document)."""
    out = tmp_path_factory.mktemp("imports")
    found = {}
    for folder in sorted(p for p in USER_RINGS.iterdir() if p.is_dir()):
        done = invoke("import", str(folder), "--out", str(out), "--json")
        assert done.exit_code == 0, done.output
        document = json.loads(done.stdout)
        analyzed = invoke("analyze", document["run_dir"], "--json")
        assert analyzed.exit_code == 0, analyzed.output
        found[folder.name] = (document, json.loads(analyzed.stdout))
    return found


def test_a_users_own_range_is_the_compute_and_the_late_rank_is_named(imported):
    document, verdict = imported["w4_late_after_compute"]
    compute = document["compute"]
    assert compute["families"] == ["ring_attn.block"] and compute["how"] == "attention ops", compute
    assert compute["per_iteration"] == {"0": 4.0, "1": 4.0, "2": 4.0, "3": 4.0}, compute
    assert (verdict["straggler_kind"], verdict["straggler_rank"]) == ("compute", 2), verdict
    assert verdict["straggler_ratio_p10"] <= verdict["straggler_ratio"] <= verdict["straggler_ratio_p90"]


def test_a_send_held_back_by_its_rank_is_said_to_be_the_senders_code(imported):
    _, verdict = imported["w4_held_back_send"]
    assert verdict["slow_hop"] == [1, 2] and verdict["straggler_rank"] is None, verdict
    assert verdict["hop_cause"] == "held_back", verdict


def test_a_send_the_trace_does_not_hold_is_the_link_or_the_senders_code(imported):
    document, verdict = imported["w3_late_send_thread"]
    assert document["compute"]["how"] == "attention ops", document["compute"]  # no range: the SDPA op and its pad
    assert verdict["slow_hop"] == [0, 1] and verdict["hop_cause"] == "link_or_sender", verdict
    answers = invoke("analyze", document["run_dir"]).stdout
    assert "hop 0 → 1 (link, or rank 0's code: the trace cannot tell)" in answers, answers
    assert "ringbench probe" in answers and "GPU kernels" in answers, answers


def test_a_clean_user_ring_names_nobody(imported):
    """The clean program of tests/test_user_rings.py, recorded: no fault, so no rank and no hop (on a live launch
    that assertion rests on the machine's load, so there it is a timing test)."""
    document, verdict = imported["w3_clean"]
    assert document["emulated"] is True, document
    assert (verdict["straggler_kind"], verdict["straggler_rank"], verdict["slow_hop"]) == (None, None, None), verdict
    assert verdict["confidence"] == "conclusive", verdict


def test_two_ranks_of_real_compute_are_never_judged_confidently_wrong(imported):
    """Rank 1 computes every block twice (real matmuls, no attention op): either it is named, or the case is
    inconclusive and says why -- never "no straggler"."""
    document, verdict = imported["w2_matmul_twice"]
    assert document["compute"]["families"] == ["attn_block"], document["compute"]
    if verdict["straggler_kind"] is not None:
        assert (verdict["straggler_kind"], verdict["straggler_rank"]) == ("compute", 1), verdict
    else:
        assert verdict["confidence"] == "inconclusive" and verdict["inconclusive_reasons"], verdict


def test_import_q_prints_only_where_it_wrote(tmp_path):
    done = invoke("import", str(USER_RINGS / "w3_late_send_thread"), "--out", str(tmp_path), "-q")
    assert done.exit_code == 0, done.output
    (line,) = done.stdout.splitlines()
    assert Path(line).is_dir() and Path(line).parent == tmp_path and done.stderr == "", done.output


def test_the_timeline_draws_a_ranks_own_time_and_its_compute_vs_wait(tmp_path):
    run = load_run(import_traces([USER_RINGS / "w4_late_after_compute"], out=tmp_path).run_dir)
    analysis = analyze(run)
    case_id = str(analysis.summary["case_id"].iloc[0])
    culprit = charts.Culprit(rank=2)
    iteration = case_charts.representative_iteration(analysis.run.events, case_id)
    timeline = case_charts.timeline.figure(iteration, analysis.transfers, [0, 1, 2, 3], culprit)
    drawn = {tuple(round(v, 3) for v in c) for coll in timeline.axes[0].collections for c in coll.get_facecolors()}
    own = tuple(round(v, 3) for v in to_rgba(charts.COLORS["own"]))
    assert own in drawn  # the late rank's time outside its compute is on its row
    bars = case_charts.compute_wait_bars.figure(analysis.run.events, [0, 1, 2, 3], case_id, culprit)
    labels = {text.get_text() for text in bars.legends[0].get_texts()}
    assert {"compute", "own work", "wait (exchange)", "barrier"} <= labels, labels
