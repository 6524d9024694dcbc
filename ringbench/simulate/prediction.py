"""One case's predicted times without its record: the quick door of the model, for answers that price many cases.

``predict`` runs a case on the model and returns its figures (SIMULATED): the step, each phase, the exposed
communication, what the host's floor added, the memory and the bytes over each link class. The ring and the
all-gather baseline run on the phase ring (phase_ring.py) without the critical-path walk; the grouped strategies
(Ulysses, the hybrid, the double ring) on grouped.py. A case whose events and record row are wanted goes through
``simulate_case`` (simulated_record.py) instead: same model, plus the walk, the events and the case row.

    prediction = predict(SimCase(workload=Workload(world=64, seq=1 << 20)), costs, Cluster())
    prediction.step_ms, prediction.exposed_ms, prediction.mib_by_class
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ringbench.simulate.case import Cluster, SimCase, phase_models, start_skew
from ringbench.simulate.costs import Costs
from ringbench.simulate.grouped import predicted_memory_mb, simulate_strategy
from ringbench.simulate.host_floor import host_floor_ms
from ringbench.simulate.phase_ring import PhaseEngine, Window
from ringbench.simulate.ring_timeline import simulate_timeline
from ringbench.simulate.traffic import ring_traffic


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """What the model predicts for one case (SIMULATED): medians over its iterations, ms."""

    case: SimCase
    step_ms: float
    """One iteration, the host's floor included."""
    fwd_ms: float
    bwd_ms: float
    """NaN without the backward."""
    exposed_ms: float
    """The step less the busiest rank's compute (communication nothing hid)."""
    host_bound_ms: float
    """What the framework's host time added where it outlasted the device's phase (host_floor.py)."""
    memory_mb: float
    """The attention's own memory on one rank (grouped.py ``predicted_memory_mb``)."""
    mib_by_class: dict[str, float]
    """Link class label -> MiB one rank sends per iteration over it."""


def predict(case: SimCase, costs: Costs, cluster: Cluster | None = None) -> Prediction:
    """``case`` on the model, without its record (see the module docstring)."""
    cluster = cluster or Cluster()
    if case.strategy in ("ring", "allgather"):
        times, compute, traffic = _ring_times(case, costs, cluster)
    else:
        timeline = simulate_strategy(case, costs, cluster)
        times = {"step": timeline.iteration_ms}
        times.update({ph: timeline.phase_end[ph].max(axis=1) - timeline.phase_start[ph].min(axis=1)
                      for ph in case.phases})  # fmt: skip
        compute = timeline.compute_ms.max(axis=1)
        traffic = timeline.bytes_by_class
    # the framework's host time is the least a phase takes (host_floor.py)
    phases = {ph: float(np.median(times[ph])) for ph in case.phases}
    waited = 0.0
    for phase, device_ms in phases.items():
        floor = host_floor_ms(case, costs, phase)
        if floor > device_ms:
            waited += floor - device_ms
            phases[phase] = floor
    step = times["step"] + waited
    return Prediction(case=case, step_ms=float(np.median(step)), fwd_ms=phases["fwd"],
                      bwd_ms=phases.get("bwd", math.nan), exposed_ms=float(np.median(np.clip(step - compute, 0.0, None))),
                      host_bound_ms=waited, memory_mb=predicted_memory_mb(case),
                      mib_by_class={label: nbytes / case.world / 2**20 for label, nbytes in traffic.items()})  # fmt: skip


def _ring_times(case: SimCase, costs: Costs, cluster: Cluster) -> tuple[dict, np.ndarray, dict[str, float]]:
    """The ring (or all-gather) case on the phase ring, without the walk: phase times, each rank's compute, and
    the bytes per iteration over each link class (what the exchanges were priced for)."""
    if case.buffer == "allgather":
        timeline = simulate_timeline(case, costs, cluster)
        times = {ph: timeline.phase_end[ph].max(axis=1) - timeline.phase_start[ph].min(axis=1) for ph in case.phases}
        spent = sum(np.asarray(c.compute_ms, float) for cells in (timeline.full or {}).values() for c in cells)
        traffic = ring_traffic(timeline.models, cluster.topology, allgather=True)
        return ({"step": timeline.iteration_ms, **times}, np.asarray(spent).reshape(case.iterations, -1).max(axis=1),
                traffic)  # fmt: skip
    rng = np.random.default_rng([case.seed, 7])
    models = phase_models(case, costs, cluster, rng)
    origin = start_skew(case, costs, rng)
    start, times, spent = origin, {}, np.zeros(origin.shape)
    for phase, model in models.items():
        engine = PhaseEngine(model)
        window = Window.ring(case.world, case.iterations)
        state = engine.begin(start)
        for step in range(model.n_steps):
            spent = spent + np.broadcast_to(model.compute(step, window), spent.shape)
            engine.advance(state, step, window, record=False)
        end, _ = engine.finish(state)
        times[phase] = end.max(axis=1) - start.min(axis=1)
        start = end
    traffic = ring_traffic(models, cluster.topology)
    return {"step": start.max(axis=1) - origin.min(axis=1), **times}, spent.max(axis=1), traffic


__all__ = ["Prediction", "predict"]
