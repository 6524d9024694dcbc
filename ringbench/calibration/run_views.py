"""A measured run as the calibration reads it, derived once: its ring cases, transfers, topology and cores; and its
cases as the model's (``--like``).

``run_views`` splits the record into the ring's cases (what the ring's fit reads: a Ulysses block or an all-to-all
chunk is no ring pair nor hop, strategy_fit.py) and matches its transfers across ranks once
(ringbench.figures.critical_path.transfers); the compute fit, the links, the host gaps, the noise and the coverage
all read these views. ``cases_like`` and ``run_cores`` turn a record into the simulator's cases and cluster: what
the run really did, at the rates its emulated kernels ran, on the cores its ranks shared.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pandas as pd

from ringbench.errors import UsageError
from ringbench.scenario.workload import Workload
from ringbench.simulate import SimCase


@dataclass(frozen=True, kw_only=True)
class RunViews:
    """The views of one measured run that every part of the fit reads."""

    run: object
    """The record restricted to its ring and all-gather cases (a RunData)."""
    others: list[str] = field(default_factory=list)
    """The case ids of other strategies (Ulysses, the hybrid, the double ring), left out of the ring's fit."""
    transfers: pd.DataFrame
    """One row per received block of the ring's cases (ringbench.figures.critical_path.transfers)."""
    topology: object = None
    """The topology the run's meta.json records, or None."""
    cores: int | None = None
    """The CPU cores the ring cases' ranks shared (``run_cores``), or None."""


def run_views(run) -> RunViews:
    """The views of ``run`` (a RunData; ringbench.record.store.load_run)."""
    from ringbench.figures.critical_path import transfers

    ring, others = ring_cases(run)
    return RunViews(run=ring, others=others, transfers=transfers(ring.events) if len(ring.events) else pd.DataFrame(),
                    topology=run_topology(ring), cores=run_cores(ring))  # fmt: skip


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


def run_topology(run):
    """The topology a run's meta.json records, or None."""
    document = run.meta.get("topology")
    if not document:
        return None
    from ringbench.topology import Topology

    return Topology.from_dict(document, "meta.json:topology")


def run_cores(run) -> int | None:
    """The CPU cores a CPU run's ranks shared (cores x hosts), or None (a GPU run, or not recorded)."""
    meta = run.meta
    if meta.device_kind != "cpu" or not meta.cpu_count:
        return None
    worlds = [int(w) for w in run.cases["world"]] if len(run.cases) else [1]
    hosts = len(meta.ranks(max(worlds)).get("hosts") or [None])
    return int(meta.cpu_count) * max(1, hosts)


def cases_like(run, iterations: int | None = None) -> list[SimCase]:
    """The cases of a measured run, at the rates its emulated kernels ran (what the run really did)."""
    faults = tuple(str(f) for f in run.meta.get("faults") or [])
    cases = []
    for row in run.cases.drop_duplicates("case_id").to_dict("records"):
        if str(row.get("buffer")) not in ("sync", "double", "allgather", "sync-short", "double-short"):
            continue
        if str(row.get("layers") or "1") not in ("1", "nan"):
            continue  # a multi-layer case: the simulator runs one layer
        rate = row.get("emulated_gflops")
        rate = float(rate) if rate is not None and rate == rate and float(rate) > 0 else None
        auto = rate is not None and str(row.get("kernel")) == "emulated:auto"
        floor = float(run.meta.get("emulated_auto_floor_ms") or 0.0) if auto else 0.0
        if str(row.get("mask")) in ("unknown", "nan", "None"):
            raise UsageError(f"like={str(run.path)!r}: the record does not say which mask its attention used (an "
                             "imported trace); simulate its cases with --mask and --seq instead of --like")  # fmt: skip
        workload = Workload(world=int(row["world"]), seq=int(row["seq"]), heads=int(row["heads"]),
                            head_dim=int(row["head_dim"]), batch=int(row["batch"]), dtype=str(row["dtype"]),
                            mask=str(row["mask"]), layout=str(row["layout"]), buffer=str(row["buffer"]),
                            order=str(row["order"]), docs=str(row.get("docs") or "none"), **_strategy_of(row))  # fmt: skip
        cases.append(SimCase(workload=workload, backward=bool(row["backward"]),
                             iterations=iterations or int(row.get("iters") or 1), faults=faults, gflops=rate,
                             floor_ms=floor, kernel=str(row.get("kernel") or "")))  # fmt: skip
    if not cases:
        raise UsageError(f"like={str(run.path)!r}: the run has no cases to predict")
    return cases


def _strategy_of(row: dict) -> dict:
    """A measured case's strategy and placement (records from before strategies: the ring)."""
    strategy = row.get("strategy")
    if not isinstance(strategy, str) or not strategy:
        return {}
    placement = row.get("placement")
    return {"strategy": strategy, "placement": placement if isinstance(placement, str) else ""}


__all__ = ["RING_STRATEGIES", "RunViews", "cases_like", "is_ring", "ring_cases", "run_cores", "run_topology",
           "run_views"]  # fmt: skip
