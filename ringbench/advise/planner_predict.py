"""One candidate of `ringbench plan`, simulated: its step, phases, exposed communication, memory and network bytes.

A candidate is a strategy with its placement (grouped strategies) or ring order (ring, all-gather), a layout and a
buffer. Each layer of the model (``--layers``) is one case with its own mask; the candidate's times are the sum over
layers, its memory the largest layer's. The ring and the all-gather baseline run on the ring engine without the
critical-path walk; the grouped strategies on simulate/grouped.py.
"""

from __future__ import annotations

import math

import numpy as np

from ringbench.fmt import ring_text


def sim_case(request, candidate, mask: str):
    """The SimCase of ``candidate`` for one layer with ``mask``."""
    from ringbench.simulate.case import SimCase

    workload = request.workload.replace(
        mask=mask, layers="1", layout=candidate.layout, strategy=candidate.strategy,
        buffer="allgather" if candidate.strategy == "allgather" else candidate.buffer,
        order=ring_text(candidate.order) if candidate.order else "identity",
        placement=ring_text(candidate.placement) if candidate.placement else "",
    )  # fmt: skip
    return SimCase(workload=workload, backward=request.backward)


def ring_prediction(case, costs, cluster) -> tuple[dict, np.ndarray, dict[str, float]]:
    """The ring (or all-gather) case on the ring engine, without the walk: phase times, each rank's compute, and
    the bytes per iteration over each link class (what the engine's exchanges were priced for)."""
    from ringbench.simulate.case import phase_models, start_skew
    from ringbench.simulate.phase_ring import PhaseEngine, Window
    from ringbench.simulate.ring_timeline import simulate_timeline
    from ringbench.simulate.traffic import ring_traffic

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


def predict_layer(request, candidate, mask: str, costs, cluster) -> dict:
    """One layer of ``candidate``: step, fwd, bwd, exposed (ms, medians), memory and network MiB."""
    from ringbench.simulate.grouped import predicted_memory_mb, simulate_strategy
    from ringbench.simulate.host_floor import host_floor_ms

    case = sim_case(request, candidate, mask)
    out = {"memory_mb": predicted_memory_mb(case)}
    if candidate.strategy in ("ring", "allgather"):
        times, compute, traffic = ring_prediction(case, costs, cluster)
    else:
        timeline = simulate_strategy(case, costs, cluster)
        times = {"step": timeline.iteration_ms}
        times.update({ph: timeline.phase_end[ph].max(axis=1) - timeline.phase_start[ph].min(axis=1)
                      for ph in case.phases})  # fmt: skip
        compute = timeline.compute_ms.max(axis=1)
        traffic = timeline.bytes_by_class
    out["mib_by_class"] = {label: nbytes / request.world / 2**20 for label, nbytes in traffic.items()}
    out["net_mb"] = out["mib_by_class"].get("NET", 0.0)
    # the framework's host time is the least a phase takes (simulate/host_floor.py)
    phases = {ph: float(np.median(times[ph])) for ph in case.phases}
    waited = 0.0
    for phase, device_ms in phases.items():
        floor = host_floor_ms(case, costs, phase)
        if floor > device_ms:
            waited += floor - device_ms
            phases[phase] = floor
    step = times["step"] + waited
    out.update(step_ms=float(np.median(step)), fwd_ms=phases["fwd"], bwd_ms=phases.get("bwd", math.nan),
               exposed_ms=float(np.median(np.clip(step - compute, 0.0, None))),
               host_bound_ms=waited)  # fmt: skip
    return out


def predict(request, candidate, costs, cluster, masks: tuple[str, ...]) -> None:
    """Fill ``candidate``'s predictions: every layer (one mask each), summed; memory: the largest layer's."""
    totals = {"step_ms": 0.0, "fwd_ms": 0.0, "bwd_ms": 0.0, "exposed_ms": 0.0, "net_mb": 0.0}
    memory = 0.0
    by_class: dict[str, float] = {}
    cache: dict[str, dict] = {}
    for mask in masks:
        layer = cache.get(mask)
        if layer is None:
            layer = cache[mask] = predict_layer(request, candidate, mask, costs, cluster)
        for name in totals:
            totals[name] += layer[name]
        for label, mib in layer["mib_by_class"].items():
            by_class[label] = by_class.get(label, 0.0) + mib
        memory = max(memory, layer["memory_mb"])
    candidate.mib_by_class = by_class
    candidate.step_ms, candidate.fwd_ms = totals["step_ms"], totals["fwd_ms"]
    candidate.bwd_ms = totals["bwd_ms"] if request.backward else math.nan
    candidate.exposed_ms, candidate.net_mb, candidate.memory_mb = totals["exposed_ms"], totals["net_mb"], memory


__all__ = ["predict", "predict_layer", "ring_prediction", "sim_case"]
