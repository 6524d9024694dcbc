"""Simulated cases -> the record a run writes (events, cases, meta), labelled SIMULATED everywhere.

Every case row carries kernel ``simulated`` and ``emulated: true``; meta.json carries ``simulated: true``,
``emulated: true`` and, under ``simulation``, the costs used (the calibration), whether the events are full or
bounded, and the per-step profile. The figures of a case row are ringbench/figures/metrics.py's: computed from the
events when they are full; when bounded, step times still come from every rank's ``iteration`` rows and the
exposed communication from the engine's own walk of the critical path (walk.py, the same definition).
"""

from __future__ import annotations

import dataclasses
import math
import socket
from collections.abc import Sequence
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.figures.metrics import CASE_FIGURES, bytes_moved, case_balance, case_figures, max_over_mean, rank_balance
from ringbench.record.folder import RecordFolder
from ringbench.record.schema import CASE_COLUMNS, ERROR_COLUMNS, SCHEMA_VERSION
from ringbench.record.store import RunData
from ringbench.simulate.case import Cluster, SimCase, class_flops
from ringbench.simulate.case_result import CaseResult, case_axes
from ringbench.simulate.costs import Costs
from ringbench.simulate.events import bounded_events, full_events
from ringbench.simulate.ring_timeline import Timeline, simulate_timeline

MAX_EVENTS = 1_000_000
"""Above this many rows a case's events are bounded (docs/simulate.md, "Events at scale")."""
SAMPLE_RANKS = 8
NOTE = "simulated: not checked"


def rows_estimate(case: SimCase) -> int:
    """Events of the full record: per iteration and rank, 4 spans per step per exchange plus compute."""
    exchanges = 1 + (2 if case.backward else 0)
    return case.iterations * case.world * (case.world * (1 + 3 * exchanges) + 2)


def kept_positions(case: SimCase, cluster: Cluster) -> np.ndarray:
    """The positions a bounded record keeps: faulty ranks and links with their neighbours, and a sample."""
    world = case.world
    ring = np.asarray(case.ring)
    position = np.empty(world, np.int64)
    position[ring] = np.arange(world)
    marked = []
    hosts = cluster.hosts(world)
    for fault in case.parsed_faults():
        if fault.kind == "slow-rank":
            marked.append(position[fault.rank])
        elif fault.kind == "slow-link":
            marked.append(position[fault.dst])
        elif fault.kind == "slow-host":
            on_host = np.flatnonzero(hosts[ring] == fault.host)
            marked.extend(on_host[[0, -1]] if len(on_host) else [])
    around = [m + d for m in marked for d in (-1, 0, 1)]
    sample = np.linspace(0, world - 1, min(world, SAMPLE_RANKS)).astype(np.int64)
    return np.unique(np.concatenate([np.asarray(around, np.int64), sample]) % world)


def _kept_steps(case: SimCase, keep: int, budget: int) -> np.ndarray:
    """All steps when the kept positions' rows fit half the budget, else as many first and last steps as do."""
    exchanges = 1 + (2 if case.backward else 0)
    per_step = max(1, case.iterations * keep * (1 + 3 * exchanges))
    steps = max(2, budget // (2 * per_step))
    if steps >= case.world + 1:
        return np.arange(case.world + 1)
    half = steps // 2
    return np.unique(np.r_[np.arange(half), np.arange(case.world + 1 - half, case.world + 1)])


def simulate_case(case: SimCase, costs: Costs, cluster: Cluster | None = None, *, repeat: int = 0,
                  max_events: int = MAX_EVENTS, case_id: str | None = None) -> CaseResult:  # fmt: skip
    """Simulate one case into its events and cases row (``case_id``: the record's id, default the case's own)."""
    cluster = cluster or Cluster()
    if case.strategy not in ("ring", "allgather"):  # ulysses, hybrid, double ring: ringbench/simulate/grouped.py
        from ringbench.simulate.strategy_results import strategy_case

        return strategy_case(case, costs, cluster, repeat=repeat, case_id=case_id)
    case_id = case_id or case.case_id
    bounded = rows_estimate(case) > max_events
    if not bounded:
        timeline = simulate_timeline(case, costs, cluster)
        events = full_events(timeline, case_id, repeat)
    else:
        keep = kept_positions(case, cluster)
        timeline = simulate_timeline(case, costs, cluster, bounded=True, keep=keep,
                                     keep_steps=_kept_steps(case, len(keep), max_events))  # fmt: skip
        events = bounded_events(timeline, timeline.path_rows, case_id, repeat)
    row = _row(case, costs, timeline, events, repeat, bounded, case_id=case_id)
    return CaseResult(case=case, events=events, row=row, bounded=bounded,
                      exposed_ms=[p.exposed_ms for p in timeline.paths], critical=_critical(timeline),
                      profile=timeline.profile)  # fmt: skip


def _row(case: SimCase, costs: Costs, timeline: Timeline, events: pd.DataFrame, repeat: int, bounded: bool,
         case_id: str | None = None) -> dict:  # fmt: skip
    axes = case_axes(case, repeat, case_id)
    if not bounded:
        figures = case_figures(events, pd.DataFrame([axes]), by=("case_id", "repeat")).iloc[0]
        values = {name: float(figures[name]) for name in CASE_FIGURES}
    else:
        values = _bounded_figures(case, timeline)
    rate = case.gflops or costs.gflops
    return axes | values | {
        "fwd_max_abs_err": math.nan, "bwd_max_abs_err": math.nan, "passed": True, "status": "ok",
        **dict.fromkeys(ERROR_COLUMNS, math.nan),  # per-tensor errors: nothing computed, nothing checked
        "peak_mem_mb": math.nan, "saturated_blocks": 0, "emulated_blocks": 0, "emulated_gflops": float(rate), "check_note": NOTE,
        "attn_mem_mb": _predicted_memory(case), "nonfinite": "",
    } | plan_figures(case, timeline, events, bounded, case_id or case.case_id)  # fmt: skip


@lru_cache(maxsize=64)
def _pair_counts(case: SimCase) -> np.ndarray:
    """How many (query rank, key rank) pairs fall in each pair class."""
    classes = case.classes()
    matrix = getattr(classes, "matrix", None)
    if matrix is not None:
        return np.bincount(matrix.ravel(), minlength=len(classes.classes)).astype(float)
    pairs = case.world * (case.world - 1) / 2  # k < q, k == q, k > q
    return np.array([pairs, case.world, pairs])


@lru_cache(maxsize=64)
def plan_entry(case: SimCase) -> dict:
    """meta.json's ``plans`` entry of a simulated case (one layer): as ringbench.engine.plan_summary writes it."""
    from ringbench.engine.plan_summary import GRID_LIMIT

    classes = case.classes()
    entries = np.array([sum(b.visible_pairs for b in c.blocks) for c in classes.classes])
    visible = case.per_rank(entries)
    counts = _pair_counts(case)
    route = case.route()
    hops = route.blocks_moved() if route is not None else case.world * (case.world - 1)
    layer = {"mask": case.mask, "visible": [float(x) for x in visible],
             "skipped_pairs": int(counts[entries == 0].sum()), "ring_steps": route.depth + 1 if route else case.world,
             "block_hops": int(hops)}  # fmt: skip
    short = _short_route(case)
    if short is not None:
        layer["short_hops"], layer["short_depth"] = short.blocks_moved(), short.depth
    calls = np.array([len(c.blocks) for c in classes.classes])
    if case.world <= GRID_LIMIT:
        q, k = np.meshgrid(np.arange(case.world), np.arange(case.world), indexing="ij")
        index = classes.classify(q, k)
        kinds = np.array(classes.kinds(), dtype=object)
        layer["grid"] = kinds[index].tolist()
        layer["calls"] = [int(x) for x in calls[index].sum(axis=1)]
    total_calls = float(calls @ _pair_counts(case)) * len(case.phases)
    return {"layers": [layer], "visible": layer["visible"], "kernel_calls": int(total_calls),
            "ring_steps": layer["ring_steps"]}  # fmt: skip


def plan_figures(case: SimCase, timeline: Timeline, events: pd.DataFrame, bounded: bool, case_id: str) -> dict:
    """The case row's balance, bytes, kernel calls and ring steps (the figures of ringbench/figures/metrics.py;
    a bounded record's from the model: every rank's compute and every exchange, which its events do not all hold)."""
    plan = plan_entry(case)
    route = case.route()
    docs = None
    if case.docs != "none":
        from ringbench.engine.documents import documents

        docs = documents(case.docs, case.seq)
    if not bounded:
        balance = case_balance(rank_balance(events, {case_id: plan["visible"]}))
        imbalance = float(balance["imbalance"].iloc[0]) if len(balance) else math.nan
        moved = bytes_moved(events)
        moved_bytes = float(moved["bytes_moved"].iloc[0]) if len(moved) else math.nan
    else:
        compute = sum(case.per_rank(timeline.models[phase].work_ms) for phase in case.phases)  # (N,) ms of arithmetic
        imbalance = max_over_mean(compute)
        hops = route.blocks_moved() if route is not None else case.world * (case.world - 1)
        moved_bytes = float(hops * case.block_bytes("kv"))
        if case.backward:
            back = hops if route is not None else case.world * case.world  # the full ring's dK/dV: N hops each
            moved_bytes += (0 if route is not None else hops * case.block_bytes("kv")) + back * case.block_bytes("dkv")
    return {
        "docs_count": float(docs.count) if docs else math.nan,
        "docs_mean": float(docs.mean) if docs else math.nan,
        "docs_max": float(docs.max) if docs else math.nan,
        "imbalance": imbalance,
        "predicted_imbalance": max_over_mean(plan["visible"]),
        "bytes_moved": moved_bytes,
        "kernel_calls": float(plan["kernel_calls"]),
        "ring_steps": float(plan["ring_steps"]),
        "short_ring_bytes": _short_ring_bytes(case),
    }


@lru_cache(maxsize=64)
def _short_route(case: SimCase):
    """The short ring's route on this case's ring whatever its buffer, for the ring strategy on up to GRID_LIMIT
    ranks (the route needs the N x N visibility); None otherwise."""
    from ringbench.engine.plan_summary import GRID_LIMIT
    from ringbench.engine.short_ring import route_of

    if case.strategy != "ring" or case.buffer == "allgather" or case.world > GRID_LIMIT:
        return None
    return route_of(case.visibility(), case.ring)


def _short_ring_bytes(case: SimCase) -> float:
    """What one iteration would move on the short ring (run/results.py's figure, from the same route); NaN where
    _short_route has none."""
    route = _short_route(case)
    if route is None:
        return math.nan
    return float(route.blocks_moved() * (case.block_bytes("kv") + (case.block_bytes("dkv") if case.backward else 0)))


def _predicted_memory(case: SimCase) -> float:
    from ringbench.simulate.grouped import predicted_memory_mb

    return predicted_memory_mb(case)


def _bounded_figures(case: SimCase, timeline: Timeline) -> dict:
    """metrics.py's figures from the timeline: medians over iterations, exposed from the engine's walk."""
    step = timeline.iteration_ms
    phase_ms = {ph: np.median(timeline.phase_end[ph].max(axis=1) - timeline.phase_start[ph].min(axis=1))
                for ph in case.phases}  # fmt: skip
    exposed = np.array([p.exposed_ms for p in timeline.paths])
    median_step = float(np.median(step))
    gflop = sum(float(class_flops(case, ph) @ _pair_counts(case)) for ph in case.phases) / 1e9
    step_s = median_step / 1e3
    return {
        "step_ms": median_step,
        "step_ms_p10": float(np.quantile(step, 0.1)),
        "step_ms_p90": float(np.quantile(step, 0.9)),
        "fwd_ms": float(phase_ms["fwd"]),
        "bwd_ms": float(phase_ms.get("bwd", math.nan)),
        "tokens_per_s": case.batch * case.seq / step_s if step_s > 0 else math.nan,
        "tflops": gflop / step_s / 1e3 if step_s > 0 and gflop > 0 else math.nan,
        "exposed_comm_ms": float(np.median(exposed)),
        "exposed_comm_frac": float(np.median(exposed)) / median_step if median_step > 0 else math.nan,
    }


def _critical(timeline: Timeline, top: int = 3) -> dict:
    """The ranks and hops that held the most critical-path time, ms per iteration (median over iterations)."""
    ring = np.asarray(timeline.case.ring)
    ranks: dict[int, list[float]] = {}
    hops: dict[tuple[int, int], list[float]] = {}
    for path in timeline.paths:
        for position, ms in path.compute_ms.items():
            ranks.setdefault(int(ring[position]), []).append(ms)
        for (a, b), ms in path.link_ms.items():
            hops.setdefault((int(ring[a]), int(ring[b])), []).append(ms)
    iterations = max(1, len(timeline.paths))
    rank_ms = sorted(((sum(v) / iterations, r) for r, v in ranks.items()), reverse=True)[:top]
    hop_ms = sorted(((sum(v) / iterations, h) for h, v in hops.items()), reverse=True)[:top]
    return {
        "path_ms": float(np.median([p.path_ms for p in timeline.paths])) if timeline.paths else math.nan,
        "ranks": [{"rank": r, "compute_ms": ms} for ms, r in rank_ms],
        "hops": [{"src": a, "dst": b, "transfer_ms": ms} for ms, (a, b) in hop_ms],
    }


def simulate_cases(cases: Sequence[SimCase], costs: Costs, cluster: Cluster | None = None, *,
                   max_events: int = MAX_EVENTS, on_case=None) -> list[CaseResult]:  # fmt: skip
    """Simulate every case (ids must be unique)."""
    ids = [case.case_id for case in cases]
    if len(set(ids)) != len(ids):
        raise UsageError("two cases have the same axes; give each case once")
    results = []
    for index, case in enumerate(cases):
        result = simulate_case(case, costs, cluster, max_events=max_events)
        results.append(result)
        if on_case is not None:
            on_case(result, index + 1, len(cases))
    return results


def run_data(results: Sequence[CaseResult], costs: Costs, *, run_id: str, path: Path | None = None,
             command: str = "ringbench simulate", cluster: Cluster | None = None,
             extra: dict | None = None) -> RunData:  # fmt: skip
    """The record of simulated cases (in memory; ``write_run`` stores it)."""
    events = pd.concat([r.events for r in results], ignore_index=True) if results else pd.DataFrame()
    cases = pd.DataFrame([r.row for r in results], columns=list(CASE_COLUMNS))
    faults = sorted({spec for r in results for spec in r.case.faults})
    worlds = sorted({r.case.world for r in results})
    topology = cluster.topology if cluster is not None else None
    meta = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "simulated": True,
        "emulated": True,
        "emulated_links": bool(cluster.emulate_links) if cluster is not None else False,
        "faults": faults,
        "host": socket.gethostname(),
        "source": "simulator",
        "backend": "simulated",
        "device_kind": "simulated",
        "trace": True,
        "world": worlds[0] if len(worlds) == 1 else worlds,
        "simulation": {
            "costs": costs.to_dict(),
            "cases": {
                r.case.case_id: {
                    "events": "bounded" if r.bounded else "full",
                    "critical_path": r.critical,
                    "exposed_ms": r.exposed_ms,
                    "step_profile": r.profile,  # per phase: min / mean / max over ranks of a step's length
                }
                for r in results
            },
            **(extra or {}),
        },
    }
    if topology is not None and topology.world <= 4096:
        meta["topology"] = topology.to_dict()
    plans = {r.case.case_id: plan_entry(r.case) for r in results if r.case.world <= 4096}
    if plans:
        meta["plans"] = plans
    return RunData(path=Path(path) if path else Path(run_id), events=events, cases=cases, meta=meta)


def write_run(out_dir: str | Path, run: RunData) -> Path:
    """Store a simulated record at ``out_dir`` (ringbench.record.folder: every producer's one writer)."""
    out_dir = Path(out_dir)
    RecordFolder.write(dataclasses.replace(run, path=out_dir), "simulate")
    return out_dir
