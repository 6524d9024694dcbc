"""The simulator against measurement, a fast subset of benchmarks/validate_simulate.py: calibrate on a measured
4-rank emulated run, predict a measured 2-rank one with a slow link (emulated compute at 1 GFLOP/s, low enough
that real arithmetic stays under the modelled time on 2 cores).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ringbench.advise.simulation import SimRequest, run_simulation
from ringbench.cli.app import app
from ringbench.record.store import load_run

COMMON = ["--seq", "1024", "--heads", "2", "--head-dim", "32", "--mask", "causal", "--layout", "zigzag",
          "--buffer", "double", "--buffer", "sync", "--kernel", "emulated:1", "--iters", "3", "--warmup", "1",
          "--no-check", "--json", "--quiet"]  # fmt: skip


def _run(tmp_path, name: str, *args: str):
    result = CliRunner().invoke(app, ["run", *COMMON, *args, "--out", str(tmp_path / name)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["run_dir"]


@pytest.mark.slow  # a measured step against a prediction within 25 %: the serial tier, where no other test shares the cores
@pytest.mark.timing(reason="a measured step against a prediction within 25 %")
def test_predicts_a_measured_ring_of_another_size(tmp_path):
    calibration = _run(tmp_path, "cal", "--world", "4")
    target = _run(tmp_path, "target", "--world", "2", "--fault", "slow-link:1:0:3")
    outcome = run_simulation(SimRequest(calibrate_from=calibration, like=target, iterations=3, out=tmp_path / "sim"))
    measured = load_run(target).cases.set_index("buffer")
    predicted = outcome.run.cases.set_index("buffer")
    assert predicted["faults"].eq("slow-link:1:0:3").all() and predicted["kernel"].eq("simulated").all()
    for buffer in ("double", "sync"):
        step, sim = measured.loc[buffer, "step_ms"], predicted.loc[buffer, "step_ms"]
        assert sim == pytest.approx(step, rel=0.25), (buffer, step, sim)
        frac, sim_frac = measured.loc[buffer, "exposed_comm_frac"], predicted.loc[buffer, "exposed_comm_frac"]
        assert abs(sim_frac - frac) <= 0.05, (buffer, frac, sim_frac)


@pytest.mark.slow
@pytest.mark.timing(reason="measured steps against predictions from one calibration case")
def test_single_case_calibrations_scale(tmp_path):
    """The accuracy matrix's small version (benchmarks/accuracy_matrix.py --quick): calibrate on ONE case, predict
    2x and 4x the world and 2x the sequence, measured side by side. Every prediction is made and carries its
    caveat; the median meets the target. The worst is held looser than the matrix's 25 % target: on a shared
    2-core machine a calibration case's per-call excess (the scheduler's wakeup delay under load, 2 to 100 ms per
    call) is not the target run's, and it is what the biggest misses of the full matrix are made of."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
    import accuracy_matrix

    runs = accuracy_matrix.measure(tmp_path / "matrix", quick=True)
    table = accuracy_matrix.predict(runs)
    assert len(table) == 4 * 3 and table["predicted_ms"].notna().all(), table
    assert table["assumed"].astype(bool).all()  # one block size: the emulated rate is a prior, and says so
    errors = table["error"].abs()
    assert errors.median() <= 0.10 and errors.max() <= 0.40, table[["layout", "mask", "target", "error"]]
