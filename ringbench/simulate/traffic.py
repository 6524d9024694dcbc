"""The bytes a simulated ring moves per iteration over each link class: the messages its engine prices, counted.

The grouped strategies count theirs where they price them (simulate/flows.py ``Prices.count``); the ring and the
all-gather baseline run on the ring engine, whose phase models say which exchanges reach which position. Each
message is counted on the hop that carries it (the hop into the receiving position, from its predecessor, or from
its successor for the short ring's backward), so a class's bytes are exactly the bytes its links were priced for:

  ring, full       K/V: N - 1 messages into every position per phase; dK/dV (backward): N
  short ring       the exchanges its route's masks say reach each position (``PhaseModel.receiving``)
  all-gather       N - 1 K/V blocks over every hop per phase; the backward's all-reduce 2 (N - 1) dK/dV blocks
"""

from __future__ import annotations

import numpy as np


def ring_traffic(models: dict, topology, allgather: bool = False) -> dict[str, float]:
    """Link class -> bytes per iteration over all ranks, for the phase models of one ring case (``allgather``: the
    all-gather baseline's); ``topology``: the cluster's, or None (every hop is ``local``)."""
    out: dict[str, float] = {}
    for model in models.values():
        world = model.world
        if world < 2:
            continue
        ring = np.asarray(model.ring)
        for name, lane in model.lanes.items():
            counts = _messages(model, name, allgather)
            source = np.roll(ring, model.direction)  # the hop into position p comes from p - direction
            labels = _labels(topology, source, ring)
            for label, count in zip(labels, counts, strict=True):
                if count:
                    out[label] = out.get(label, 0.0) + float(count) * lane.nbytes
    return out


def _messages(model, lane: str, gathered: bool) -> np.ndarray:
    """(N,) messages of ``lane`` into every position in this phase."""
    world = model.world
    if gathered:
        per = (world - 1) if lane == "kv" else 2 * (world - 1)
        return np.full(world, per)
    masks = (model.receiving or {}).get(lane)
    if masks is not None:
        return np.asarray(masks, bool).sum(axis=0)
    if lane == "kv":
        return np.full(world, model.hops)
    return np.full(world, model.n_steps if model.dkv_posts is None else model.dkv_posts)


def _labels(topology, src: np.ndarray, dst: np.ndarray) -> list[str]:
    if topology is None:
        return ["local"] * len(src)
    return [topology.link(int(a), int(b)).label for a, b in zip(src, dst, strict=True)]


__all__ = ["ring_traffic"]
