"""A straggler's cost is what fixing it saves (analysis/what_if.py), checked against the truth where it is known:
the same simulation with and without the fault (same seed, same jitter), so the difference is exactly what the
fault cost."""

from __future__ import annotations

import pandas as pd
import pytest
from support.given import SimConfig, simulate

from ringbench.analysis.stragglers import culprits, straggler_table
from ringbench.analysis.what_if import Fix, savings
from ringbench.figures.critical_path import critical_path, transfers
from ringbench.figures.metrics import step_times


def _step_ms(events: pd.DataFrame) -> float:
    return float(step_times(events)["step_ms"].median())


def test_the_replay_as_recorded_reproduces_every_iteration():
    events, _ = simulate(SimConfig.of(world=4, iterations=6, jitter=0.05, slow_rank=1, slow_factor=1.7, seed=3))
    xfers = transfers(events)
    case_id = events["case_id"].iloc[0]
    replayed = savings(events, xfers, case_id, Fix())
    recorded = step_times(events).set_index("iteration")["step_ms"]
    assert (replayed["saved_ms"] == 0).all()
    pd.testing.assert_series_equal(replayed.set_index("iteration")["replayed_ms"], recorded.reindex(
        replayed["iteration"]), check_names=False, rtol=0.02)  # fmt: skip
    # An imported ring is replayed through all its iterations at once: their lengths add up to the whole run.


CASES = [
    dict(slow_rank=2, slow_factor=1.6, buffer="double"),
    dict(slow_rank=0, slow_factor=2.0, buffer="sync"),
    dict(slow_link=(1, 2), slow_link_extra_ms=3.0, buffer="sync"),
    dict(slow_link=(3, 0), slow_link_extra_ms=4.0, buffer="double", link_ms=2.5),
]


@pytest.mark.parametrize("fault", CASES, ids=["rank-double", "rank-sync", "link-sync", "link-double"])
def test_the_replayed_cost_matches_the_simulation_without_the_fault(fault):
    common = dict(world=4, iterations=12, jitter=0.02, seed=5, backward=False)
    with_fault, _ = simulate(SimConfig.of(**common, **fault))
    without, _ = simulate(SimConfig.of(**common, **{k: v for k, v in fault.items() if k in ("buffer", "link_ms")}))
    truth = _step_ms(with_fault) - _step_ms(without)
    xfers = transfers(with_fault)
    table = straggler_table(with_fault, xfers, critical_path(with_fault, xfers))
    top = culprits(table).iloc[0]
    assert top["straggler_kind"] == ("compute" if "slow_rank" in fault else "link"), top
    assert top["cost_ms"] == pytest.approx(truth, rel=0.05), (top["cost_ms"], truth)  # measured: within 0.5%
    named = table[table["flagged"]].iloc[0]
    assert bool(named["cost_replayed"]) and named["ratio_p10"] <= named["ratio"] <= named["ratio_p90"]
