"""A simulated strategy case (ulysses, hybrid, double ring) -> the record: iteration rows and the case row.

The strategy model (strategies.py) gives every rank's phase starts and ends per iteration; the record keeps them as
``iteration`` rows (so step, forward and backward times are metrics.py's, read by analyze, report and compare like
any record) and no per-step spans. The case row's exposed communication is the model's prediction (the step less
the busiest rank's compute), its ``attn_mem_mb`` the predicted peak of the attention's tensors per rank; the meta
says ``events: iterations`` for such a case. SIMULATED, like every simulated record.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ringbench.figures.metrics import CASE_FIGURES, case_figures
from ringbench.record.schema import ERROR_COLUMNS, EVENT_COLUMNS
from ringbench.simulate.case import class_flops
from ringbench.simulate.case_result import CaseResult, case_axes
from ringbench.simulate.costs import Costs
from ringbench.simulate.grouped import StrategyTimeline, predicted_memory_mb, simulate_strategy


def _events(case, timeline: StrategyTimeline, costs: Costs, repeat: int) -> pd.DataFrame:
    iterations, world = timeline.phase_start["fwd"].shape
    offsets = np.concatenate([[0.0], np.cumsum(timeline.iteration_ms + costs.gap_ms)[:-1]])  # ms, end to end
    ring = np.asarray(case.ring)
    position = np.empty(world, np.int64)
    position[ring] = np.arange(world)
    frames = []
    for phase, start in timeline.phase_start.items():
        end = timeline.phase_end[phase]
        ranks = np.tile(np.arange(world), iterations)
        frames.append(pd.DataFrame({
            "case_id": case.case_id, "repeat": repeat, "iteration": np.repeat(np.arange(iterations), world),
            "phase": phase, "rank": ranks, "ring_position": position[ranks], "step": -1, "kind": "iteration",
            "start_ns": np.round((start + offsets[:, None]).ravel() * 1e6).astype(np.int64),
            "end_ns": np.round((end + offsets[:, None]).ravel() * 1e6).astype(np.int64),
            "src": ranks, "dst": ranks, "bytes": 0, "block": -1, "pair": "", "flops": 0.0, "nccl_ms": np.nan,
        }))  # fmt: skip
    return pd.concat(frames, ignore_index=True).reindex(columns=list(EVENT_COLUMNS))


def strategy_case(case, costs: Costs, cluster, *, repeat: int = 0, case_id: str | None = None):
    """Simulate one strategy case into its (iteration-only) events and case row (a CaseResult)."""
    timeline = simulate_strategy(case, costs, cluster)
    events = _events(case, timeline, costs, repeat)
    axes = case_axes(case, repeat, case_id)
    figures = case_figures(events, pd.DataFrame([axes]), by=("case_id", "repeat")).iloc[0]
    values = {name: float(figures[name]) for name in CASE_FIGURES}
    exposed = float(np.median(timeline.exposed_ms))
    values["exposed_comm_ms"] = exposed
    values["exposed_comm_frac"] = exposed / values["step_ms"] if values["step_ms"] > 0 else math.nan
    pairs = case.world * (case.world - 1) / 2
    gflop = sum(float(class_flops(case, ph) @ np.array([pairs, case.world, pairs])) for ph in case.phases) / 1e9
    step_s = values["step_ms"] / 1e3
    values["tflops"] = gflop / step_s / 1e3 if step_s > 0 and gflop > 0 else math.nan
    rate = case.gflops or costs.gflops
    row = axes | values | {
        "fwd_max_abs_err": math.nan, "bwd_max_abs_err": math.nan, "passed": True, "status": "ok",
        **dict.fromkeys(ERROR_COLUMNS, math.nan),  # per-tensor errors: nothing computed, nothing checked
        "peak_mem_mb": math.nan, "saturated_blocks": 0, "emulated_blocks": 0, "emulated_gflops": float(rate),
        "check_note": "simulated: not checked", "attn_mem_mb": predicted_memory_mb(case),
        "short_ring_bytes": math.nan,  # no one ring to shorten
        "nonfinite": "",
    }  # fmt: skip
    critical = {"path_ms": values["step_ms"], "ranks": [], "hops": [], "bytes_by_class": timeline.bytes_by_class}
    return CaseResult(case=case, events=events, row=row, bounded=False, exposed_ms=list(timeline.exposed_ms),
                      critical=critical, profile={"events": "iterations"})  # fmt: skip


__all__ = ["strategy_case"]
