"""Placement: the run's ring hops against the topology's link classes.

For each case of a run whose meta.json records a topology (``ringbench run --topology FILE``, or a probe run), the
hops of its ring in order (position p sends to p+1), each with its link class, the cost model's price, and the
measured transfer (`ringbench.analysis.hops`: from the block's post on both ends to its arrival, so a late sender
is not blamed on the link). Two flags:

  avoidable  the hop's link is at least as slow as a class the best ring needs fewer of: this ring has more hops at
             this cost or worse than the recommended ring (e.g. stride:2 on two hosts: four NET hops where two do)
  outlier    measured more than OUTLIER_FACTOR times (and OUTLIER_FLOOR_MS more than) the median of the ring's other
             hops of the same class (of worse classes when it is alone): the link is slower than its class says

The predicted ratio of communication per step against the recommended ring prices NET hops between the same two
hosts as sharing that network link (`shared_hop_costs`), as ``--emulate-links`` realises them.

Cases of other strategies (ulysses, hybrid, double ring) are not one ring: their traffic is summarised by what
moved over which link class (``StrategyTraffic``: per exchange and class, the pairs, bytes per iteration and the
median transfer), so a reader sees whether the all-to-all stayed inside a host and how often the network was crossed.

and the recommended order (`recommend`). `placement(run)` is None when the run records no topology; the report
renders it (ringbench/report/hops_on_topology.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pandas as pd

OUTLIER_FACTOR = 2.0
OUTLIER_FLOOR_MS = 0.1
MAX_CASES = 8


@dataclass(frozen=True, kw_only=True, slots=True)
class PlacedHop:
    position: int
    src: int
    dst: int
    link_class: str
    model_us: float
    transfer_ms: float = math.nan
    transfer_ms_p10: float = math.nan
    transfer_ms_p90: float = math.nan
    bandwidth_gbps: float = math.nan
    share: int = 1
    """Ring hops crossing from this hop's source host to its destination host (NET hops share that network link)."""
    avoidable: bool = False
    outlier_ratio: float = math.nan
    """Measured / median of the ring's other hops on the same or better classes (NaN when not comparable)."""
    outlier: bool = False
    """outlier_ratio > OUTLIER_FACTOR and the excess over that median > OUTLIER_FLOOR_MS."""

    @property
    def flags(self) -> list[str]:
        flags = []
        if self.avoidable:
            flags.append("avoidable class")
        if self.outlier:
            flags.append(f"measured outlier ×{self.outlier_ratio:.1f}")
        return flags


@dataclass(frozen=True, kw_only=True, slots=True)
class CasePlacement:
    case_id: str
    order: str
    """The case's order spec (``stride:2``) as recorded."""
    ring: tuple[int, ...]
    step_ms: float
    phase: str
    """Phase whose measured transfers are shown (fwd when recorded)."""
    hops: tuple[PlacedHop, ...]
    worst_hop_class: str
    worst_hop_us: float
    predicted_speedup: float
    """This ring's worst hop / the recommended ring's worst hop: the cost model, with NET hops between the same two
    hosts sharing that network link's bandwidth (as `--emulate-links` realises them)."""
    class_counts: dict[str, int] = field(default_factory=dict)

    @property
    def flagged(self) -> list[PlacedHop]:
        return [hop for hop in self.hops if hop.flags]


@dataclass(frozen=True, kw_only=True, slots=True)
class TrafficRow:
    """One exchange of a strategy's case over one link class."""

    exchange: str
    link_class: str
    pairs: int
    """Distinct (src, dst) pairs of this class that carried the exchange."""
    mb_per_iteration: float
    transfer_ms: float
    """Median transfer time (post on both ends to arrival) of one message."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategyTraffic:
    case_id: str
    strategy: str
    placement: str
    step_ms: float
    rows: tuple[TrafficRow, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    topology_text: str
    recommended: str
    recommended_classes: dict[str, int]
    recommended_worst_class: str
    recommended_worst_us: float
    method: str
    model: str
    emulated_links: bool
    cases: tuple[CasePlacement, ...]
    notes: tuple[str, ...] = ()
    traffic: tuple[StrategyTraffic, ...] = ()
    """Cases of strategies other than one ring: what moved over which link class."""


def strategy_traffic(run, topology, case_ids: list[str]) -> tuple[StrategyTraffic, ...]:
    """Per case: its transfers grouped by exchange and link class (pairs, MB per iteration, median transfer)."""
    from ringbench.figures.critical_path import transfers

    if run.events.empty or not (run.events["kind"] == "recv").any():
        return ()
    xfers = transfers(run.events[run.events["case_id"].isin(case_ids)])
    out = []
    cases = run.cases.drop_duplicates("case_id").set_index("case_id")
    for case_id, part in xfers.groupby("case_id", sort=False):
        labels = [topology.link(int(a), int(b)).label for a, b in zip(part["src"], part["dst"], strict=True)]
        part = part.assign(link_class=labels)
        iterations = max(1, part[["repeat", "iteration"]].drop_duplicates().shape[0])
        rows = []
        for (exchange, label), group in part.groupby(["exchange", "link_class"], sort=True):
            rows.append(TrafficRow(exchange=str(exchange), link_class=str(label),
                                   pairs=int(group[["src", "dst"]].drop_duplicates().shape[0]),
                                   mb_per_iteration=float(group["bytes"].sum()) / iterations / 2**20,
                                   transfer_ms=float(group["transfer_ms"].median())))  # fmt: skip
        row = cases.loc[case_id]
        out.append(StrategyTraffic(case_id=str(case_id), strategy=str(row.get("strategy")),
                                   placement=str(row.get("placement") or ""),
                                   step_ms=float(run.cases.loc[run.cases["case_id"] == case_id, "step_ms"].median()),
                                   rows=tuple(rows)))  # fmt: skip
    return tuple(out)


def shared_hop_costs(topology, ring) -> tuple[list[int], list[float]]:
    """Per hop of ``ring``: how many ring hops share its network link, and its cost with that sharing (us), at the
    topology's reference message: the link model of `ringbench.topology.linkmodel` (what `--emulate-links` injects,
    what the simulator and `recommend` price)."""
    from ringbench.topology.linkmodel import ring_links

    links = ring_links(topology, ring)
    costs = links.transfer_us(topology.cost_model.message_bytes)
    return [int(share) for share in links.shares], [float(cost) for cost in costs]


def _hop_stats(events: pd.DataFrame) -> pd.DataFrame:
    from ringbench.analysis.hops import hop_table
    from ringbench.figures.critical_path import transfers

    if events.empty or not (events["kind"] == "recv").any():
        return pd.DataFrame()
    return hop_table(transfers(events))


def placement(run, hops: pd.DataFrame | None = None) -> Placement | None:
    """The placement of every case of ``run`` (a RunData); None when its meta.json records no topology.

    ``hops``: the analysis's hop table (`ringbench.analysis.hops.hop_table`), if already computed.
    """
    from ringbench.topology.model import Topology
    from ringbench.topology.optimize import recommend

    document = run.meta.topology_document
    if not document:
        return None
    topology = Topology.from_dict(document, "meta.json:topology")
    cost = topology.cost_matrix()
    stats = _hop_stats(run.events) if hops is None else hops
    notes: list[str] = []
    rings, grouped = _rings(run, topology.world, notes)
    best = recommend(topology, list(rings[0].ring) if rings else None)
    best_costs = np.sort([hop.cost_us for hop in best.hops])
    best_shared = max(shared_hop_costs(topology, best.order)[1], default=0.0)
    placed = [_case_placement(topology, cost, stats, best_costs, best_shared, case) for case in rings]
    if stats is None or len(stats) == 0:
        notes.append("no per-step transfers recorded (--no-trace or a probe run): classes and model costs only")
    return Placement(
        topology_text=topology.describe(),
        recommended=best.order_arg,
        recommended_classes=best.hop_class_counts(),
        recommended_worst_class=best.worst_hop_class or "-",
        recommended_worst_us=best.worst_hop_us,
        method=best.method + ("; every order equivalent: " + best.equivalence_reason if best.all_equivalent else ""),
        model=best.model,
        emulated_links=run.meta.emulated_links,
        cases=tuple(placed),
        notes=tuple(notes),
        traffic=strategy_traffic(run, topology, grouped[:MAX_CASES]) if grouped else (),
    )


class _RingCase(NamedTuple):
    case_id: str
    order: str
    ring: tuple[int, ...]
    step_ms: float
    """The median step time of the case's measured steps."""


def _rings(run, world: int, notes: list[str]) -> tuple[list[_RingCase], list[str]]:
    """The run's one-ring cases that span the topology (at most MAX_CASES), and the case_ids of the strategies that
    are not one ring. What is skipped or cut is said in ``notes``."""
    cases_table = run.cases.drop_duplicates("case_id") if len(run.cases) else run.cases
    rings: list[_RingCase] = []
    grouped: list[str] = []  # cases of strategies that are not one ring
    for row in cases_table.to_dict("records"):
        if str(row.get("strategy") or "ring") not in ("ring", "allgather", "nan"):
            grouped.append(str(row["case_id"]))
            continue
        try:
            ring = tuple(int(rank) for rank in str(row.get("ring", "")).split("-"))
        except ValueError:
            continue
        if len(ring) != world or sorted(ring) != list(range(world)):
            notes.append(f"case {row['case_id']} ran on {len(ring)} ranks; the topology has {world} devices: skipped")
            continue
        step = run.cases.loc[run.cases["case_id"] == row["case_id"], "step_ms"].astype(float).median()
        rings.append(_RingCase(str(row["case_id"]), str(row.get("order", "")), ring, float(step)))
    if len(rings) > MAX_CASES:
        notes.append(f"{len(rings)} cases: the first {MAX_CASES} are shown")
        rings = rings[:MAX_CASES]
    return rings, grouped


def _case_placement(topology, cost: np.ndarray, stats: pd.DataFrame, best_costs: np.ndarray, best_shared: float,
                    case: _RingCase) -> CasePlacement:  # fmt: skip
    """One ring's hops, flagged against the recommended ring (``best_costs``: its hop costs sorted; ``best_shared``:
    its worst hop with NET sharing), with its worst hop and its predicted speedup."""
    rows, phase = _case_rows(stats, case.case_id)
    measured = {(int(r.src), int(r.dst)): r for r in rows.itertuples()} if len(rows) else {}
    shares, shared_costs = shared_hop_costs(topology, case.ring)
    hops_out = _placed_hops(topology, cost, case.ring, shares, measured, best_costs)
    worst = max(hops_out, key=lambda hop: hop.model_us) if hops_out else None
    counts: dict[str, int] = {}
    for hop in hops_out:
        counts[hop.link_class] = counts.get(hop.link_class, 0) + 1
    return CasePlacement(
        case_id=case.case_id, order=case.order, ring=case.ring, step_ms=case.step_ms, phase=phase,
        hops=tuple(hops_out),
        worst_hop_class=worst.link_class if worst else "-", worst_hop_us=worst.model_us if worst else 0.0,
        predicted_speedup=max(shared_costs) / best_shared if shared_costs and best_shared > 0 else 1.0,
        class_counts=counts,
    )  # fmt: skip


def _placed_hops(topology, cost: np.ndarray, ring: tuple[int, ...], shares: list[int], measured: dict,
                 best_costs: np.ndarray) -> list[PlacedHop]:  # fmt: skip
    """Every hop of ``ring`` in order: its class, model cost, NET sharing and measured transfer (``measured``:
    (src, dst) -> the hop table's row), flagged avoidable when the ring has more hops at its cost or worse than the
    best ring needs."""
    world = len(ring)
    tolerance = 1e-9 * max(float(cost.max()), 1e-12)
    hop_costs = [float(cost[ring[p], ring[(p + 1) % world]]) for p in range(world)] if world > 1 else []
    transfer = [
        float(measured[(ring[p], ring[(p + 1) % world])].transfer_ms)
        if (ring[p], ring[(p + 1) % world]) in measured
        else math.nan
        for p in range(len(hop_costs))
    ]
    hops_out = []
    for p, model_us in enumerate(hop_costs):
        src, dst = ring[p], ring[(p + 1) % world]
        at_least = sum(c >= model_us - tolerance for c in hop_costs)
        needed = int(np.sum(best_costs >= model_us - tolerance))
        ratio, outlier = _outlier(p, hop_costs, transfer, tolerance)
        stat = measured.get((src, dst))
        hops_out.append(
            PlacedHop(
                position=p, src=src, dst=dst, link_class=topology.link(src, dst).label, model_us=model_us,
                transfer_ms=transfer[p],
                transfer_ms_p10=float(stat.transfer_ms_p10) if stat is not None else math.nan,
                transfer_ms_p90=float(stat.transfer_ms_p90) if stat is not None else math.nan,
                bandwidth_gbps=float(stat.bandwidth_gbps) if stat is not None else math.nan,
                share=shares[p], avoidable=at_least > needed,
                outlier_ratio=ratio, outlier=outlier,
            )
        )  # fmt: skip
    return hops_out


def _outlier(p: int, hop_costs: list[float], transfer: list[float], tolerance: float) -> tuple[float, bool]:
    """Hop ``p``'s measured transfer against the median of the ring's other hops of its class (of worse classes when
    it is alone): the ratio (NaN when not comparable) and whether it is an outlier."""
    model_us = hop_costs[p]
    same = [transfer[q] for q in range(len(hop_costs)) if q != p and abs(hop_costs[q] - model_us) <= tolerance]
    worse = [transfer[q] for q in range(len(hop_costs)) if q != p and hop_costs[q] >= model_us - tolerance]
    peers = [t for t in (same or worse) if math.isfinite(t)]
    if not (peers and math.isfinite(transfer[p])):
        return math.nan, False
    reference = float(np.median(peers))
    ratio = transfer[p] / reference if reference > 0 else math.inf
    return ratio, ratio > OUTLIER_FACTOR and transfer[p] - reference > OUTLIER_FLOOR_MS


def _case_rows(stats: pd.DataFrame, case_id: str) -> tuple[pd.DataFrame, str]:
    if stats is None or len(stats) == 0:
        return pd.DataFrame(), "-"
    rows = stats[stats["case_id"] == case_id]
    if rows.empty:
        return rows, "-"
    if "exchange" in rows.columns and (rows["exchange"] == "kv").any():
        rows = rows[rows["exchange"] == "kv"]  # the K/V block; the backward's dK/dV accumulator is another message
    phase = "fwd" if (rows["phase"] == "fwd").any() else str(rows["phase"].iloc[0])
    return rows[rows["phase"] == phase], phase
