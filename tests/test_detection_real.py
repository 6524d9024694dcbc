"""Detection on REAL runs: 8 local ranks (gloo on CPU), emulated compute, injected faults, the full verdict.

Three runs of about 15-20 s each (spawning 8 ranks dominates): a slow rank (factor 1.5) is named as a compute
straggler; a slow hop (extra time 25% of a step's compute) is named as a link and no rank is blamed; a fault-free
run names nothing. Shapes are chosen so that the real arithmetic of a block (well under 1 ms) is small against its
modelled time (~8.4 ms at emulated:1 GFLOP/s): the cores stay free for gloo and the timings mean something.
benchmarks/detection_real.py measures the detection rate over randomised trials.
"""

from __future__ import annotations

import pytest

from ringbench.analysis.findings import analyze, verdict_document, verdict_lines
from ringbench.analysis.stragglers import CLOCK_VIOLATION_SHARE
from ringbench.record.store import load_run
from ringbench.run.sweep import execute
from ringbench.scenario.scenario import Scenario

WORLD, SEQ, HEADS, HEAD_DIM = 8, 2048, 2, 32
STEP_MS = 4.0 * HEADS * (SEQ // WORLD) ** 2 * HEAD_DIM * 0.5 / 1e9 * 1e3  # zigzag: half-visible pairs, 1 GFLOP/s


def _verdict(tmp_path, *faults: str, buffer: str = "double") -> tuple[dict, list[str]]:
    scenario = Scenario(
        name="detect", world=(WORLD,), seq=(SEQ,), heads=(HEADS,), head_dim=(HEAD_DIM,), mask=("causal",),
        layout=("zigzag",), buffer=(buffer,), kernel=("emulated:1",), backward=False, iters=6, warmup=1,
        check=False, faults=faults,
    )  # fmt: skip
    state = execute(scenario, out=tmp_path)
    analysis = analyze(load_run(state.run_dir))
    return verdict_document(analysis), verdict_lines(analysis)


def test_slow_rank_is_named_as_a_compute_straggler(tmp_path):
    doc, lines = _verdict(tmp_path, "slow-rank:5:1.5")
    assert doc["emulated"] is True and doc["faults"] == ["slow-rank:5:1.5"]
    assert (doc["straggler_kind"], doc["straggler_rank"], doc["slow_hop"]) == ("compute", 5, None), lines
    assert doc["straggler_cost_ms"] > 0


def test_slow_link_is_named_and_no_rank_is_blamed(tmp_path):
    extra_ms = round(0.25 * STEP_MS, 2)  # 25% of a step's compute: hidden behind it with double buffering
    doc, lines = _verdict(tmp_path, f"slow-link:2:3:{extra_ms}")
    assert doc["cases"][0]["clock_violations"] <= CLOCK_VIOLATION_SHARE, lines  # one aligned timeline
    assert (doc["straggler_kind"], doc["slow_hop"]) == ("link", [2, 3]), lines
    assert doc["straggler_rank"] is None and doc["cases"][0]["straggler_rank"] is None


@pytest.mark.slow  # the default tier holds it on simulated records (test_analysis.py)
@pytest.mark.timing(reason="a fault-free run of 8 ranks names nothing only while no rank or hop looks slow by chance")
def test_no_fault_names_nothing(tmp_path):
    doc, lines = _verdict(tmp_path, buffer="sync")
    assert doc["faults"] == []
    assert (doc["straggler_kind"], doc["straggler_rank"], doc["slow_hop"]) == (None, None, None), lines
    assert any(line.startswith("No straggler") for line in lines)
