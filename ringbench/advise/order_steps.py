"""Step times of other ring orders, predicted from a measured run: what `recommend RUN_DIR` adds to its headline.

The topology's link model (topology/linkmodel.py) prices the communication of a ring step; whether a faster step of
communication makes a faster ring step depends on what hides it (compute, double buffering) and on what the link
model does not see (the transport's own cost, host gaps). The simulator, calibrated on the run, prices all of it:
the run's cases, on the same cluster (its topology, emulated links as the run had them), with the ring order
replaced. The rings are priced at the calibration's medians, without its noise: the spread a run measured on a
shared machine belongs to that ring and that moment (on 2 loaded cores, the compute spans of a ring whose ranks
all sleep on the network together had tails 20x their median), and drawn into another ring it inflates the faster
one most. SIMULATED: the figures are a model's.

    prediction = predict_orders(load_run("results/r1"), topology, ["0-4-1-5-2-6-3-7", "0-1-2-3-4-5-6-7"])
    prediction.step_ms, prediction.speedup("0-4-1-5-2-6-3-7", "0-1-2-3-4-5-6-7")
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ringbench.calibration import cases_like, fit
from ringbench.errors import UsageError
from ringbench.fmt import ring_text
from ringbench.simulate import Cluster, simulate_case

MAX_CASES = 4
"""Cases of the run predicted per order (the first ones on the topology's world)."""


@dataclass(frozen=True, kw_only=True)
class OrderPrediction:
    """Per ring order, the predicted step time of the run's cases (SIMULATED), and the run's own measurement."""

    run_id: str
    step_ms: dict[str, float]
    """Ring text -> median predicted step time over the predicted cases, ms."""
    measured_ms: dict[str, float]
    """Ring text -> the run's measured median step time on that ring (for the orders it ran)."""
    cases: int
    emulated_links: bool
    assumed: tuple[str, ...] = ()
    """The calibration's priors (cost names), for the caveat."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def speedup(self, current: str, recommended: str) -> float:
        a, b = self.step_ms.get(current, math.nan), self.step_ms.get(recommended, math.nan)
        return a / b if b > 0 else math.nan

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "simulated": True, "step_ms": dict(self.step_ms),
                "measured_ms": dict(self.measured_ms), "cases": self.cases, "emulated_links": self.emulated_links,
                "assumed": list(self.assumed), "notes": list(self.notes)}  # fmt: skip


def predict_orders(run, topology, orders: Sequence[Sequence[int]], *, iterations: int = 5) -> OrderPrediction:
    """The run's cases (up to MAX_CASES on the topology's world, without faults) simulated on each ring of
    ``orders``, with costs calibrated on the run."""
    if run.meta.get("simulated"):
        raise UsageError(f"{run.path}: a SIMULATED record; predict orders from a measured run")
    calibration = fit(run)
    quiet = {"compute_noise": (), "link_noise": (), "compute_cv": 0.0, "link_cv": 0.0}
    cases = [case for case in cases_like(run, iterations) if case.world == topology.world]
    if not cases:
        raise UsageError(f"{run.path}: no case ran on {topology.world} ranks, the topology's devices")
    notes = []
    if any(case.faults for case in cases):
        notes.append("the run's faults are left out of the prediction (they name the run's ring)")
    notes.append("both rings at the calibration's medians (its measured noise belongs to the run's own ring)")
    cases = cases[:MAX_CASES]
    cluster = Cluster(topology=topology, emulate_links=bool(run.meta.get("emulated_links")))
    rings = [ring_text(order) for order in orders]
    step_ms = {}
    for ring in dict.fromkeys(rings):
        steps = []
        for case in cases:
            costs = calibration.costs_for(case.family or calibration.family) or calibration.costs
            costs = dataclasses.replace(costs, **quiet)
            moved = case.replace(order=ring, faults=())
            steps.append(simulate_case(moved, costs, cluster, max_events=1).row["step_ms"])
        step_ms[ring] = float(np.median(steps))
    measured = {}
    table = run.cases
    for ring in rings:
        rows = table[table["ring"].astype(str) == ring]
        if len(rows):
            measured[ring] = float(rows["step_ms"].astype(float).median())
    return OrderPrediction(run_id=str(run.meta.get("run_id") or run.path), step_ms=step_ms, measured_ms=measured,
                           cases=len(cases), emulated_links=cluster.emulate_links,
                           assumed=tuple(source.cost for source in calibration.assumed()),
                           notes=tuple(notes))  # fmt: skip


__all__ = ["OrderPrediction", "predict_orders"]
