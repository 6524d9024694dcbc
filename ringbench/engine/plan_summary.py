"""What the mask plan predicts for a whole case, as plain data for the record (meta.json ``plans``, the case row).

``plan_summary(rules, layout, seq, world, ring, buffer, backward)`` gives, per attention layer: the mask, the N x N
grid of pair kinds (``full`` / ``causal`` / ``partial`` / ``skip``, [query rank][key rank], for rings of up to
GRID_LIMIT ranks), each rank's visible score entries (its predicted work: ringbench.engine.plan.pair_visibility,
exact), its kernel calls per phase, the ring steps a phase runs (N, or D + 1 for the short ring), the K/V block
hops of one forward, and the short ring's on the same ring whatever the buffer (``short_hops``, and its depth
``short_depth``); and for the case: the per-rank sum over layers (its max / mean is the predicted imbalance,
ringbench.figures.metrics.max_over_mean) and the kernel calls of one iteration.
"""

from __future__ import annotations

import numpy as np

from ringbench.engine.plan import pair_plan, pair_visibility
from ringbench.vocab import Buffer

GRID_LIMIT = 64  # rings larger than this keep per-rank figures only (an N x N grid would outgrow meta.json)


def _steps(rule, layout, seq: int, world: int, ring: list[int], buffer: Buffer) -> tuple[int, int]:
    """(ring steps per phase, K/V block hops of one forward, all ranks)."""
    if buffer.short:
        from ringbench.engine.short_ring import short_route

        route = short_route(rule, layout, seq, world, tuple(ring))
        return route.depth + 1, route.blocks_moved()
    if buffer is Buffer.ALLGATHER:
        return world, world * (world - 1)
    return world, world * (world - 1)


def _short(rule, layout, seq: int, world: int, ring: list[int]) -> tuple[int, int]:
    """The short ring on this ring, whatever the case's buffer: (K/V block hops of one forward, its depth D: the
    last step, and the most blocks a rank keeps for the backward). The answers set it beside a full ring's bytes."""
    from ringbench.engine.short_ring import short_route

    route = short_route(rule, layout, seq, world, tuple(ring))
    return route.blocks_moved(), route.depth


def plan_summary(rules, layout, seq: int, world: int, ring: list[int], buffer, backward: bool) -> dict:
    """The plan's predictions for a case (module docstring); plain JSON-ready data."""
    buffer = Buffer.parse(buffer, "buffer")
    layers = []
    total = np.zeros(world)
    calls_total = 0
    phases = 2 if backward else 1
    for rule in rules:
        visible = pair_visibility(rule, layout, seq, world)  # (N, N) exact visible entries
        entry: dict = {"mask": rule.text, "visible": [float(x) for x in visible.sum(axis=1)],
                       "skipped_pairs": int((visible == 0).sum())}  # fmt: skip
        if world <= GRID_LIMIT:
            plans = [[pair_plan(rule, layout, seq, world, q, k) for k in range(world)] for q in range(world)]
            entry["grid"] = [[p.kind for p in row] for row in plans]
            entry["calls"] = [int(sum(p.calls for p in row)) for row in plans]
            calls_total += phases * sum(entry["calls"])
        steps, hops = _steps(rule, layout, seq, world, ring, buffer)
        entry["ring_steps"] = steps
        entry["block_hops"] = hops
        entry["short_hops"], entry["short_depth"] = _short(rule, layout, seq, world, ring)
        total += visible.sum(axis=1)
        layers.append(entry)
    return {
        "layers": layers,
        "visible": [float(x) for x in total],
        "kernel_calls": int(calls_total) if world <= GRID_LIMIT else None,
        "ring_steps": max(layer["ring_steps"] for layer in layers) if layers else world,
    }


__all__ = ["GRID_LIMIT", "plan_summary"]
