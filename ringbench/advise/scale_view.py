"""The scale view: what the model predicts as the ring grows (SIMULATED), as data and as a table or figure.

  curves   step time, exposed communication and efficiency against N for each buffer and layout
           (efficiency: useful FLOPs per second / (N x the nominal compute rate), the share of the ring's
           arithmetic rate that does useful work)
  blast    the blast radius of one slow rank: the ring's step time with one rank k times slower over the
           healthy ring's, for k = 1.1, 1.5 and 2, against N
  orders   on a topology: the recommended ring order against identity and a stride order

The rings of one view share everything but the axis that varies; tokens per rank stay fixed (weak scaling) unless
``fixed_seq``. ``scale_view`` returns a JSON-ready dict (stored in meta.json under ``simulation.scale`` and
printed by ``--json`` under ``scale``); ringbench/report/scale.py renders it in reports and on the terminal.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ringbench.simulate import Cluster, Costs, SimCase, simulate_case

BLAST_FACTORS = (1.1, 1.5, 2.0)
SCALE_MAX_EVENTS = 1  # the view keeps figures, not events: always the bounded record, smallest row budget


def _at(base: SimCase, world: int, fixed_seq: bool, **changes) -> SimCase | None:
    """``base`` on ``world`` ranks (None when the layout cannot split the sequence that way)."""
    parts = 2 * world if changes.get("layout", base.layout) == "zigzag" else world
    seq = base.seq if fixed_seq else base.seq // base.world * world
    seq = seq // parts * parts
    if seq < parts:
        return None
    try:
        return base.replace(world=world, seq=seq, faults=(), order="identity", **changes)
    except ValueError:
        return None


def _figures(case: SimCase, costs: Costs, cluster: Cluster | None) -> dict:
    row = simulate_case(case, costs, cluster, max_events=SCALE_MAX_EVENTS).row
    rate = case.gflops or costs.gflops
    efficiency = row["tflops"] * 1e3 / (case.world * rate) if row["tflops"] == row["tflops"] else math.nan
    return {"step_ms": row["step_ms"], "exposed_comm_ms": row["exposed_comm_ms"],
            "exposed_comm_frac": row["exposed_comm_frac"], "efficiency": efficiency, "seq": case.seq}  # fmt: skip


def scale_view(base: SimCase, costs: Costs, cluster: Cluster | None = None, *, worlds: Sequence[int],
               buffers: Sequence[str] = ("double", "sync"), layouts: Sequence[str] = ("zigzag", "contiguous"),
               factors: Sequence[float] = BLAST_FACTORS, fixed_seq: bool = False) -> dict:  # fmt: skip
    """The three tables of the scale view (see the module docstring). Rings at other sizes than the topology's
    run without it (its links then say nothing); ``orders`` needs the topology's own size."""
    topology = cluster.topology if cluster is not None else None
    plain = Cluster(gpus_per_host=cluster.gpus_per_host) if cluster is not None else Cluster()
    curves, blast = [], []
    for world in worlds:
        on = cluster if topology is not None and topology.world == world else plain
        for buffer in buffers:
            for layout in layouts:
                case = _at(base, world, fixed_seq, buffer=buffer, layout=layout)
                if case is not None:
                    curves.append({"world": world, "buffer": buffer, "layout": layout, **_figures(case, costs, on)})
        healthy = _at(base, world, fixed_seq)
        if healthy is None or world < 2:
            continue
        reference = _figures(healthy, costs, on)["step_ms"]
        rank = world // 2
        for factor in factors:
            slowed = dataclasses.replace(healthy, faults=(f"slow-rank:{rank}:{factor:g}",))
            step = _figures(slowed, costs, on)["step_ms"]
            blast.append({"world": world, "factor": factor, "rank": rank, "step_ms": step,
                          "healthy_step_ms": reference, "slowdown": step / reference})  # fmt: skip
    view = {"base": base.case.axes(), "fixed_seq": fixed_seq, "curves": curves, "blast": blast,
            "orders": order_comparison(base, costs, cluster) if topology is not None else []}  # fmt: skip
    return view


def order_comparison(base: SimCase, costs: Costs, cluster: Cluster) -> list[dict]:
    """identity, stride (one rank per host in turn: the topology-hostile order) and the recommended order."""
    from ringbench.topology import recommend

    topology = cluster.topology
    world = topology.world
    hosts = len(topology.hosts)
    stride = max(2, world // max(hosts, 1)) if hosts > 1 else 2
    best = recommend(topology)
    rows = []
    for name, order in (("identity", "identity"), (f"stride:{stride}", f"stride:{stride}"),
                        ("recommended", best.order_arg)):  # fmt: skip
        case = base.replace(world=world, order=order)
        rows.append({"order": name, "ring": order,
                     **_figures(case, costs, cluster)})  # fmt: skip
    identity = rows[0]["step_ms"]
    for row in rows:
        row["vs_identity"] = row["step_ms"] / identity if identity > 0 else math.nan
    return rows
