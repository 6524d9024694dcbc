"""The predict wing's doors: ``ringbench.simulate.predict`` and ``ringbench.calibration.fit``.

The advisers reach the model and its calibration only through these names (the wings' independence contract in
pyproject.toml holds that); here, that the doors are what they say: ``predict`` is the function (a submodule of
that name would shadow it), it prices the ring and the grouped strategies, and a fit matches the run's transfers
across ranks once, however many parts of the fit read them.
"""

import math
from pathlib import Path

import pytest

from ringbench.record.store import load_run
from ringbench.scenario import Workload

MEASURED = Path(__file__).parent / "data" / "analysis" / "real_w8_slow_link"


@pytest.mark.parametrize("strategy", ["ring", "allgather", "ulysses", "hybrid:2", "double-ring:2"])
def test_predict_prices_every_strategy_without_a_record(strategy):
    from ringbench.simulate import DEFAULTS, Cluster, Prediction, SimCase, predict

    buffer = "allgather" if strategy == "allgather" else "double"
    case = SimCase(workload=Workload(world=4, seq=4096, heads=4, strategy=strategy, buffer=buffer))
    prediction = predict(case, DEFAULTS, Cluster())
    assert isinstance(prediction, Prediction) and prediction.case is case
    assert prediction.step_ms > 0 and prediction.fwd_ms > 0 and prediction.bwd_ms > 0
    assert 0 <= prediction.exposed_ms <= prediction.step_ms
    assert prediction.memory_mb > 0 and prediction.mib_by_class


def test_predict_agrees_with_the_record_door_on_a_quiet_ring():
    """Without noise the two doors run the same model: the quick step is the record's (whose events are whole ns)."""
    import dataclasses

    from ringbench.simulate import DEFAULTS, Cluster, SimCase, predict, simulate_case

    quiet = dataclasses.replace(DEFAULTS, compute_cv=0.0, link_cv=0.0, compute_noise=(), link_noise=())
    case = SimCase(workload=Workload(world=4, seq=4096, heads=4), iterations=1)
    quick = predict(case, quiet, Cluster())
    assert quick.host_bound_ms == 0.0
    assert math.isclose(quick.step_ms, simulate_case(case, quiet).row["step_ms"], abs_tol=1e-5)


def test_fit_matches_the_runs_transfers_once(monkeypatch):
    import ringbench.figures.critical_path as critical_path
    from ringbench.calibration import Calibration, fit
    from ringbench.calibration.calibrate import calibrate

    calls = []
    matched = critical_path.transfers
    monkeypatch.setattr(critical_path, "transfers", lambda events: calls.append(len(events)) or matched(events))
    calibration = fit(load_run(MEASURED))
    assert isinstance(calibration, Calibration) and calibration.link_fit and calibration.coverage["message_bytes"]
    assert len(calls) == 1, f"the run's transfers were matched {len(calls)} times"
    assert calibrate is fit  # the name docs/simulate.md's example and older callers use


def test_a_measured_run_becomes_the_models_cases_through_the_calibration():
    from ringbench.calibration import cases_like, run_cores

    run = load_run(MEASURED)
    cases = cases_like(run, iterations=2)
    assert cases and all(case.iterations == 2 and case.world == 8 for case in cases)
    assert run_cores(run) is None or run_cores(run) >= 1
