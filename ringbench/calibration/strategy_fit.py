"""Calibration and strategies: the ring's fit reads the ring's cases; the other strategies' cases are checked.

The ring's calibration (calibrate.py) classifies each compute span as one (query rank, key rank) pair of the mask
plan and each transfer as a ring hop; a Ulysses block or an all-to-all chunk is neither. So ``ring_cases``
(run_views.py) keeps the ring and all-gather cases of a record for that fit, and a strategy's cases are left to be *predicted* with those
costs (docs/simulate.md: the accuracy per strategy). The costs are the same for every strategy: a FLOP, a kernel
call, a byte over a link class cost what they cost.
"""

from __future__ import annotations

import dataclasses

from ringbench.calibration.run_views import cases_like, is_ring, run_topology


def events_per_iteration(case) -> int:
    """The strategy events one iteration has: a Ulysses / hybrid all-to-all (two per phase), a double-ring
    rotation (N/W per phase)."""
    from ringbench.vocab import Strategy

    strategy = Strategy.parse(case.strategy)
    phases = len(case.phases)
    if strategy.kind == "double-ring":
        return phases * (case.world // strategy.group_size(case.world))
    return 2 * phases if strategy.kind in ("ulysses", "hybrid") else 0


def fit_strategy_overheads(full_run, costs, cal) -> dict[str, float]:
    """Per strategy kind: the median over the run's cases of that kind of (measured step - simulated step with the
    ring's costs) / its events per iteration, floored at 0. Noted in the calibration."""
    import numpy as np

    from ringbench.simulate import Cluster, simulate_case

    rows = full_run.cases.drop_duplicates("case_id")
    if "strategy" not in rows or rows["strategy"].map(is_ring).all():
        return {}
    topology = run_topology(full_run)
    cluster = Cluster(topology=topology, emulate_links=bool(full_run.meta.get("emulated_links")) and
                      topology is not None)  # fmt: skip
    residuals: dict[str, list[float]] = {}
    records = [r for r in rows.to_dict("records") if str(r.get("buffer")) in ("sync", "double", "allgather")]
    for row, case in zip(records, cases_like(full_run), strict=True):  # cases_like keeps the rows' order
        events = events_per_iteration(case)
        if is_ring(case.strategy) or not events or row.get("step_ms") != row.get("step_ms"):
            continue
        predicted = simulate_case(case, costs, cluster).row["step_ms"]  # a strategy's case: grouped.py
        residuals.setdefault(case.strategy.split(":")[0], []).append((float(row["step_ms"]) - predicted) / events)
    fitted = {kind: max(float(np.median(values)), 0.0) for kind, values in residuals.items()}
    for kind, value in fitted.items():
        cal.notes.append(f"{kind}: {value:.3g} ms per event beyond the ring's costs, from {len(residuals[kind])} "
                         "case(s) of the run")  # fmt: skip
    return fitted


def merge_runs(paths) -> object:
    """Several measured runs as one record to calibrate on (e.g. the ring at the workload's sizes and the other
    strategies at another): their cases and events, a case measured twice kept from the first run; the first run's
    metadata, its faults and emulated links (they must agree; UsageError otherwise)."""
    import pandas as pd

    from ringbench.errors import UsageError
    from ringbench.record.store import load_run

    runs = [load_run(path) for path in paths]
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    for run in runs[1:]:
        for key in ("emulated_links", "faults"):
            if (run.meta.get(key) or None) != (first.meta.get(key) or None):
                raise UsageError(f"{run.path}: {key} differs from {first.path}'s; calibrate on runs made alike")
    seen: set[str] = set()
    cases, events = [], []
    for run in runs:
        fresh = run.cases[~run.cases["case_id"].isin(seen)]
        seen |= set(fresh["case_id"])
        cases.append(fresh)
        events.append(run.events[run.events["case_id"].isin(set(fresh["case_id"]))])
    return dataclasses.replace(first, cases=pd.concat(cases, ignore_index=True),
                               events=pd.concat(events, ignore_index=True))  # fmt: skip


__all__ = ["events_per_iteration", "fit_strategy_overheads", "merge_runs"]
