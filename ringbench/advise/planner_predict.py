"""One candidate of `ringbench plan`, simulated: its step, phases, exposed communication, memory and network bytes.

A candidate is a strategy with its placement (grouped strategies) or ring order (ring, all-gather), a layout and a
buffer. Each layer of the model (``--layers``) is one case with its own mask; the candidate's times are the sum over
layers, its memory the largest layer's. Each layer is one ``ringbench.simulate.predict`` (the model's quick door:
no record, no critical-path walk).
"""

from __future__ import annotations

import math

from ringbench.fmt import ring_text


def sim_case(request, candidate, mask: str):
    """The SimCase of ``candidate`` for one layer with ``mask``."""
    from ringbench.simulate import SimCase

    workload = request.workload.replace(
        mask=mask, layers="1", layout=candidate.layout, strategy=candidate.strategy,
        buffer="allgather" if candidate.strategy == "allgather" else candidate.buffer,
        order=ring_text(candidate.order) if candidate.order else "identity",
        placement=ring_text(candidate.placement) if candidate.placement else "",
    )  # fmt: skip
    return SimCase(workload=workload, backward=request.backward)


def predict_layer(request, candidate, mask: str, costs, cluster) -> dict:
    """One layer of ``candidate``: step, fwd, bwd, exposed (ms, medians), memory and network MiB."""
    from ringbench.simulate import predict

    layer = predict(sim_case(request, candidate, mask), costs, cluster)
    return {"memory_mb": layer.memory_mb, "mib_by_class": layer.mib_by_class,
            "net_mb": layer.mib_by_class.get("NET", 0.0), "step_ms": layer.step_ms, "fwd_ms": layer.fwd_ms,
            "bwd_ms": layer.bwd_ms, "exposed_ms": layer.exposed_ms, "host_bound_ms": layer.host_bound_ms}  # fmt: skip


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


__all__ = ["predict", "predict_layer", "sim_case"]
