"""Rings too small for a majority (analysis/few_ranks.py): a slow rank of 2 is named when the ring's structure
shows it (its peer waits for it), and a rank that is slower only now and then leaves the case inconclusive --
never a confident "no straggler"."""

from __future__ import annotations

import dataclasses

import pandas as pd
from support.given import SimConfig, simulate, simulate_run

from ringbench.analysis.few_ranks import downstream_structure
from ringbench.analysis.findings import analyze
from ringbench.analysis.stragglers import rank_steps


def _two(**kwargs) -> pd.DataFrame:
    events, _ = simulate(SimConfig.of(world=2, iterations=8, jitter=0.02, seed=4, backward=False, buffer="sync",
                                   case_id="w2", **kwargs))  # fmt: skip
    return events


def test_a_slow_rank_of_two_holds_its_peer_waiting():
    events = _two(slow_rank=1, slow_factor=2.0)
    found = downstream_structure(events, rank_steps(events), margin=0.25).set_index("rank")["structure"]
    assert found[1] >= 0.8 and found[0] == 0.0, found
    run = simulate_run([SimConfig.of(world=2, iterations=8, jitter=0.02, seed=4, backward=False, buffer="sync",
                                  slow_rank=1, slow_factor=2.0)])  # fmt: skip
    row = analyze(run).summary.iloc[0]
    assert (row["straggler_kind"], row["straggler_rank"]) == ("compute", 1), row


def test_a_rank_of_two_slow_in_some_iterations_only_is_inconclusive_not_absent():
    slow, clean = _two(slow_rank=1, slow_factor=2.0), _two()
    # Iterations 0-4 from the ring with the slow rank, 5-7 from the same ring without: slower in 5 of 8.
    events = pd.concat([slow[slow["iteration"] < 5], clean[clean["iteration"] >= 5]], ignore_index=True)
    run = simulate_run([SimConfig.of(world=2, iterations=8, backward=False, buffer="sync", case_id="w2")])
    analysis = analyze(dataclasses.replace(run, events=events))
    row = analysis.summary.iloc[0]
    assert row["straggler_kind"] is None or pd.isna(row["straggler_kind"]), row
    assert row["confidence"] == "inconclusive", row
    reasons = " ".join(row["inconclusive_reasons"])
    assert "too few ranks to decide" in reasons and "rank 1's own time" in reasons, reasons
