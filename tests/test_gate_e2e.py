"""The CI gate end to end on real runs: `ringbench run --json` -> `ringbench compare` / `baseline save`.

Three real runs of one small emulated scenario (2 local gloo ranks, 5 to 15 s each on 2 busy cores): two alike
(an A/A pair, must pass) and one with every rank's compute slowed down 4x by fault injection (must fail). Runs go
through the CLI in a subprocess, exactly as docs/ci-gate.md's GitHub Actions job does, and find their run directory
from the `--json` document on stdout; `compare` runs in process (it is cheap, and stdout/stderr stay separate).

These tests check the pipeline, not the machine's noise: the development and CI machines are shared 2-core VMs,
where two runs of the same code measured up to 1.5x apart (other jobs' ranks competing for the cores). So the
comparisons here use --max-regression 50, and the slow run is about 3x slower: a wide margin on both sides. The gate's noise at its real settings is measured with scenarios/gate.yaml and
reported in docs/ci-gate.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from ringbench.cli.app import app
from ringbench.gate.samples import iteration_samples, sample_set_from_run
from ringbench.record.store import load_run
from ringbench.scenario.scenario import load_scenario

REPO = Path(__file__).resolve().parent.parent
ITERS, REPEATS, WORLD = 6, 2, 2
# Emulated compute, so that the step is mostly sleep (about 100 ms of it per step) and steady on a busy machine.
SCENARIO = f"""
name: gate-e2e
world: {WORLD}
seq: 256
heads: 2
head_dim: 16
mask: causal
layout: zigzag
buffer: double
kernel: emulated:0.075
iters: {ITERS}
warmup: 2
repeat: {REPEATS}
check: false
"""
SLOW_EVERY_RANK = [arg for rank in range(WORLD) for arg in ("--fault", f"slow-rank:{rank}:4")]
LOOSE = ("--max-regression", "50")  # see the module docstring
META_KEYS = {"backend", "device_kind", "torch_version", "emulated", "run_id", "command", "created"}

runner = CliRunner()


def _start(scenario: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "ringbench", "run", str(scenario), "--no-trace", "--out", str(out), "--json",
               *extra]  # as in the docs  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def _finish(process: subprocess.Popen, out: Path) -> Path:
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr[-2000:]
    run_dir = Path(json.loads(stdout)["run_dir"])  # stdout is the JSON document alone
    assert run_dir.parent == out and (run_dir / "meta.json").is_file()
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The three runs at once: the A/A pair under the same load, and the slow run's 4x is far beyond the noise."""
    root = tmp_path_factory.mktemp("gate-e2e")
    scenario = root / "gate-e2e.yaml"
    scenario.write_text(SCENARIO)
    extra = {"base": (), "same": (), "slow": ("--repeat", "1", *SLOW_EVERY_RANK)}  # a 4x slowdown needs no repeats
    started = {name: _start(scenario, root / name, *args) for name, args in extra.items()}
    return {name: _finish(process, root / name) for name, process in started.items()}


def _compare(*args):
    return runner.invoke(app, ["compare", *map(str, args), *LOOSE])


def test_real_run_has_what_the_gate_reads(runs):
    run = load_run(runs["base"])
    assert set(run.meta) >= META_KEYS and run.meta["emulated"] is True
    assert run.meta["backend"] == "gloo" and run.meta["device_kind"] == "cpu"
    iterations = run.events[run.events["kind"] == "iteration"]
    assert set(iterations["phase"]) == {"fwd", "bwd"}  # one row per phase, rank, repeat and iteration
    assert len(iterations) == 2 * WORLD * REPEATS * ITERS
    assert sorted(run.cases["repeat"]) == list(range(REPEATS))
    # The gate's samples (max end - min start over ranks and phases) give the run's own per-repeat median.
    samples = iteration_samples(run)
    medians = samples.groupby("repeat")["step_ms"].median().to_numpy()
    np.testing.assert_allclose(medians, run.cases.sort_values("repeat")["step_ms"].to_numpy(), rtol=1e-9)
    bwd = iterations[iterations["phase"] == "bwd"]
    per_iteration = samples.set_index(["repeat", "iteration"])["step_ms"]
    last_end = bwd.groupby(["repeat", "iteration"])["end_ns"].max()
    first_start = iterations.groupby(["repeat", "iteration"])["start_ns"].min()
    np.testing.assert_allclose(per_iteration, (last_end - first_start) / 1e6)
    (case,) = sample_set_from_run(run).cases
    assert case.n_repeats == REPEATS and all(len(r) == ITERS for r in case.repeats) and case.emulated


def test_two_runs_of_the_same_code_pass(runs):
    result = _compare(runs["base"], runs["same"], "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (case,) = document["cases"]
    assert case["unit"] == "clustered" and case["n_baseline"] == case["n_current"] == REPEATS * ITERS
    assert document["emulated"] is True and document["differences"] == []


def test_every_rank_slowed_down_fails(runs):
    done = _compare(runs["base"], runs["slow"], "--json")
    assert done.exit_code == 1, done.output
    document = json.loads(done.stdout)
    (case,) = document["cases"]
    assert case["verdict"] == "regression" and case["ratio"] > 1.5
    assert case["axes"]["faults"] == "slow-rank:0:4;slow-rank:1:4"
    (difference,) = document["differences"]
    assert "injected faults differ" in difference and "none (baseline)" in difference
    assert "injected faults differ" in done.stderr and "FAIL: 1 of 1 cases regressed" in done.stderr


def test_missing_baseline_is_exit_2_with_one_line(runs, tmp_path):
    done = _compare(tmp_path / "baselines" / "gate-cpu.json", runs["same"], "--json")
    assert done.exit_code == 2 and done.stdout == ""
    (line,) = [line for line in done.stderr.splitlines() if line.strip()]
    assert line.startswith("error:") and "gate-cpu.json" in line and "does not exist" in line


def test_baseline_file_then_compare(runs, tmp_path):
    path = tmp_path / "baselines" / "gate-cpu.json"
    saved = runner.invoke(app, ["baseline", "save", str(runs["base"]), str(path)])
    assert saved.exit_code == 0, saved.output
    assert f"saved 1 cases ({REPEATS * ITERS} samples)" in saved.output
    document = json.loads(path.read_text())
    assert document["meta"]["emulated"] is True and document["source"]["run_id"] == runs["base"].name
    assert _compare(path, runs["same"]).exit_code == 0
    assert _compare(path, runs["slow"]).exit_code == 1
    identical = _compare(path, runs["base"], "--json")
    assert identical.exit_code == 0 and json.loads(identical.stdout)["cases"][0]["ratio"] == pytest.approx(1.0)


def test_shipped_gate_scenario_is_a_gate_scenario():
    scenario = load_scenario(REPO / "scenarios" / "gate.yaml")
    assert load_scenario("gate") == scenario  # also shipped by name
    cases = scenario.cases()
    assert 1 <= len(cases) <= 4 and all(case.emulated for case in cases)
    assert scenario.iters >= 20 and scenario.repeat >= 3 and not scenario.check and not scenario.faults
    assert len({case.world for case in cases}) == 1  # one process group per repeat


def test_cases_table_has_the_gate_columns(runs):
    cases = pd.read_parquet(runs["base"] / "cases.parquet")
    assert {"case_id", "repeat", "emulated", "faults", "status", "world", "dtype", "kernel"} <= set(cases.columns)
