"""The host's own time for one attention call: the floor under a phase that the GPU cannot beat.

A framework's Python (its ring loop, the P2P set-up of every step, an all-to-all's reshapes and copies, its
dispatch) runs on the host while the GPU runs what was launched before. Where the kernels are long the host runs
ahead and its time hides; where they are short the GPU waits for the host and the phase takes the host's time.
So a phase takes

    max(the device's timeline (the simulator's), host floor)
    host floor = call + steps x step + all-to-alls x all-to-all          (ms, per phase and attention call)

with the implementation family's figures (``Costs.host_floor_ms``: ``call``, ``step``, ``alltoall``; the
catalogue's ``frameworks``, PRIOR, fitted on the dev set). The steps and all-to-alls of a phase follow the
strategy: the ring N steps (the short ring its route's D + 1), the all-gather baseline one call and one collective,
Ulysses two all-to-alls, the hybrid two all-to-alls and a ring of N / U, the double ring N steps and one outer
exchange per rotation.
"""

from __future__ import annotations

from ringbench.vocab import Strategy


def host_events(case, phase: str) -> tuple[int, int]:
    """(ring steps, all-to-alls and collectives) one ``phase`` of ``case`` runs on the host."""
    strategy = Strategy.parse(getattr(case, "strategy", "ring") or "ring")
    world = case.world
    if case.buffer == "allgather" or strategy.kind == "allgather":
        return 0, 1 if phase == "fwd" else 2  # the gather (and the backward's reduction)
    if strategy.kind == "ulysses":
        return 0, 2
    if strategy.kind == "hybrid":
        return world // strategy.degree, 2
    if strategy.kind == "double-ring":
        return world, world // strategy.degree
    route = case.route()
    return (route.depth + 1 if route is not None else world), 0


def host_floor_ms(case, costs, phase: str) -> float:
    """The host's time for ``phase`` of ``case`` (0 without an implementation family's figures)."""
    floor = getattr(costs, "host_floor_ms", None) or {}
    if not floor:
        return 0.0
    steps, collectives = host_events(case, phase)
    return floor.get("call", 0.0) + steps * floor.get("step", 0.0) + collectives * floor.get("alltoall", 0.0)


__all__ = ["host_events", "host_floor_ms"]
