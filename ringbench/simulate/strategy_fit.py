"""Calibration and strategies: the ring's fit reads the ring's cases; the other strategies' cases are checked.

The ring's calibration (calibrate.py) classifies each compute span as one (query rank, key rank) pair of the mask
plan and each transfer as a ring hop; a Ulysses block or an all-to-all chunk is neither. So ``ring_cases`` keeps the
ring and all-gather cases of a record for that fit, and a strategy's cases are left to be *predicted* with those
costs (docs/simulate.md: the accuracy per strategy). The costs are the same for every strategy: a FLOP, a kernel
call, a byte over a link class cost what they cost.
"""

from __future__ import annotations

import dataclasses

RING_STRATEGIES = ("ring", "allgather")


def is_ring(value) -> bool:
    """A case's strategy is one ring (records from before strategies have none: the ring)."""
    return not isinstance(value, str) or not value or value in RING_STRATEGIES


def ring_cases(run):
    """(the record restricted to its ring cases, the case ids left out)."""
    cases = run.cases
    if "strategy" not in cases or not len(cases):
        return run, []
    keep = cases["strategy"].map(is_ring)
    if bool(keep.all()):
        return run, []
    kept_ids = set(cases.loc[keep, "case_id"])
    left = sorted(set(cases.loc[~keep, "case_id"]))
    events = run.events[run.events["case_id"].isin(kept_ids)] if len(run.events) else run.events
    return dataclasses.replace(run, cases=cases[keep].reset_index(drop=True), events=events), left


__all__ = ["RING_STRATEGIES", "is_ring", "ring_cases"]
