"""A results folder being written: `results/<run-id>/` with the record (events, cases, meta), case by case.

Every producer that measures -- a local run, a launched (torchrun/SLURM) run, a resumed run, a probe -- opens its
folder here, so each writes the same meta.json (ringbench/record/meta.py) the same way. Each finished case is one atomic
rewrite of events.parquet, cases.parquet/csv and meta.json, so an interrupted sweep loses nothing and `--resume`
runs only what is missing. A case is stored whole before a stop signal takes effect (``shielded``), and under the
folder's lock, which a launched rank's signal thread takes before it writes the interrupted state. ``summarize_case`` turns the ranks' reports of one case into its events table and its
case row (the figures of ringbench/figures/metrics.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.figures.critical_path import clock_tolerance_ns
from ringbench.figures.metrics import CASE_FIGURES, bytes_moved, case_balance, case_figures, rank_balance
from ringbench.kernels import get_kernel
from ringbench.rank.rank_report import RankReport
from ringbench.record.folder import RecordFolder
from ringbench.record.rows import case_row
from ringbench.record.schema import ERROR_COLUMNS, EVENT_COLUMNS
from ringbench.run.interrupt import shielded
from ringbench.scenario.scenario import Case, Scenario
from ringbench.vocab import tolerance


@dataclass(slots=True)
class ResultsFolder(RecordFolder):
    """A measured run's folder: the record folder (record/folder.py) plus its cases' figures, notes and resume."""

    @classmethod
    def reopen(cls, run_dir: str | Path) -> ResultsFolder:
        """An existing run's folder, to add its missing cases (UsageError when it is not one)."""
        base = RecordFolder.reopen(run_dir)
        folder = cls(run_dir=base.run_dir, meta=base.meta, cases=base.cases, events=base.events)
        folder.meta.pop("failure", None)  # this attempt may well finish; a new failure is recorded anew
        folder.meta.pop("finished", None)
        stopped = folder.meta.pop("interrupted", None)
        if isinstance(stopped, dict):
            during = f" during case {stopped['case']}" if stopped.get("case") else ""
            folder.notes.append(f"resume: the run was interrupted by {stopped.get('signal', 'a signal')}{during}; "
                                f"{stopped.get('kept', 0)} of {stopped.get('total', '?')} case(s) were kept")  # fmt: skip
        return folder

    def done(self) -> set[tuple[str, int]]:
        """(case id, repeat) already stored and ok."""
        ok = self.cases[self.cases["status"] == "ok"] if len(self.cases) else self.cases
        return {(row.case_id, int(row.repeat)) for row in ok.itertuples()}

    def add_case(self, case: Case, per_rank: list[RankReport], scenario: Scenario, repeat: int) -> dict:
        """Store one finished case (events, its case row, what the ranks reported); returns the case row."""
        plan = case_plan(case)
        events, row = summarize_case(case, per_rank, scenario, repeat, plan=plan)
        with self.lock, shielded():
            self._store(events, row, case, per_rank, plan)
        return row

    def _store(self, events: pd.DataFrame, row: dict, case: Case, per_rank: list[RankReport], plan) -> None:
        note = (per_rank[0].device_info or {}).get("backend_note")
        if note and note not in self.notes:  # e.g. why ranks that see GPUs run gloo on the CPU
            self.notes.append(note)
        if case.impl != "ringbench" and case.mask != "none":
            note = (f"impl {case.impl!r}, mask {case.mask!r}: its per-step spans come from a profiler trace, which "
                    "cannot tell which keys each block masked; their FLOPs count whole blocks and no plan predicts "
                    "its balance")  # fmt: skip
            if note not in self.notes:
                self.notes.append(note)
        self.add(events, row)
        _note_ranks(self.meta, case.world, per_rank)
        _note_case(self.meta, case, row)
        note_plan(self.meta, case, plan)
        self.save_meta()

    def interrupt(self, state: dict) -> None:
        """Record that a signal stopped the run (meta.json ``interrupted``; the caller holds the lock if needed)."""
        self.meta["interrupted"] = state
        self.save_meta()

    def fail(self, message: str) -> None:
        self.meta["failure"] = message
        self.save_meta()


def case_plan(case: Case) -> dict | None:
    """What ringbench's mask plan predicts for ``case`` (ringbench.engine.plan_summary), None for another
    implementation's case (its plan is its own)."""
    if case.impl != "ringbench":
        return None
    from ringbench.engine.layout import resolve_layout
    from ringbench.engine.plan_summary import plan_summary
    from ringbench.rank.layer_checks import layer_rules

    rules = layer_rules(case)
    layout = resolve_layout(case.layout, case.seq, case.world, tuple(rules))
    return plan_summary(rules, layout, case.seq, case.world, case.ring, case.buffer, case.backward)


def docs_summary(case: Case) -> dict | None:
    """The documents of a document-mask case (count, mean, max, ...), None without documents."""
    if case.docs == "none":
        return None
    from ringbench.engine.documents import documents

    return documents(case.docs, case.seq).summary()


def note_plan(meta: dict, case: Case, plan: dict | None) -> None:
    """meta.json keeps each case's plan (per layer: mask, pair-kind grid, per-rank work and calls, ring steps) and
    each docs spec's documents, so that analyses and reports read them from the record."""
    if plan is not None:
        meta.setdefault("plans", {})[case.case_id] = plan
    docs = docs_summary(case)
    if docs is not None:
        meta.setdefault("docs", {})[f"{case.docs}@{case.seq}"] = docs


def summarize_case(case: Case, per_rank: list[RankReport], scenario: Scenario, repeat: int,
                   plan: dict | None = None) -> tuple[pd.DataFrame, dict]:  # fmt: skip
    """This case's events table and its summary row: the figures of ringbench/figures/metrics.py (medians over timed
    iterations, with p10/p90), the numerical check, peak memory, the emulation's saturated kernel calls, and with
    ``plan`` (case_plan) the balance against the plan's prediction."""
    rows = [row for result in per_rank for row in result.rows]
    events = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    events["layer"] = events["layer"].fillna(0).astype("int64")
    residual = max(int(r.clock_residual_ns or 0) for r in per_rank)
    tol_ns = clock_tolerance_ns(residual)
    sizes = pd.DataFrame([{"case_id": case.case_id, "batch": case.batch, "seq": case.seq}])
    figures = case_figures(events, sizes, tol_ns=tol_ns)  # the definitions every consumer shares
    figures = figures.iloc[0] if len(figures) else pd.Series(dtype=float)
    peaks = [float(r.peak_mem_mb) for r in per_rank if r.peak_mem_mb is not None]
    fwd_err = float(np.max([r.fwd_err for r in per_rank]))  # np.max: a NaN on any rank stays NaN
    bwd_err = float(np.max([r.bwd_err for r in per_rank]))
    errors = {column: float(np.max([(r.errors or {}).get(column.removesuffix("_err"), math.nan) for r in per_rank]))
              for column in ERROR_COLUMNS}  # fmt: skip
    fwd_tol, bwd_tol = tolerance(case.dtype, case.heads // case.key_value_heads)
    passed = True
    if scenario.check:
        passed = bool(fwd_err <= fwd_tol and (not case.backward or bwd_err <= bwd_tol))  # False for NaN
    row = case_row(case, repeat) | {
        "emulated": case.emulated or scenario.emulate_links,
        "faults": ";".join(scenario.faults),
        "iters": scenario.iters,
        "warmup": scenario.warmup,
        **{name: float(figures.get(name, math.nan)) for name in CASE_FIGURES},
        "fwd_max_abs_err": fwd_err,
        "bwd_max_abs_err": bwd_err,
        **errors,
        "passed": passed,
        "status": "ok",
        "peak_mem_mb": float(np.nanmax(peaks)) if peaks and not np.isnan(peaks).all() else math.nan,
        "attn_mem_mb": _largest([r.attn_mem_mb for r in per_rank]),
        "emulated_gflops": _emulated_rate(per_rank),
        "check_note": "; ".join(sorted({r.check_note for r in per_rank if r.check_note})),
        "nonfinite": _nonfinite(per_rank),
        "saturated_blocks": int(sum(int(r.saturated_blocks or 0) for r in per_rank)),
        "emulated_blocks": int(sum(int(r.paced_blocks or 0) for r in per_rank)),
        **_plan_figures(case, events, plan),
    }
    return events, row


def _nonfinite(per_rank: list[RankReport]) -> str:
    """The tensors that held a NaN or an infinity on any rank, comma-joined in a fixed order ("" when none)."""
    found = {name for r in per_rank for name in str(getattr(r, "nonfinite", "") or "").split(",") if name}
    return ",".join(name for name in ("out", "dq", "dk", "dv") if name in found)


def _largest(values: list) -> float:
    numbers = [float(v) for v in values if v is not None and v == v]
    return max(numbers) if numbers else math.nan


def _plan_figures(case: Case, events: pd.DataFrame, plan: dict | None) -> dict:
    """The case row's documents, balance, bytes, kernel calls and ring steps (NaN what the record cannot say)."""
    docs = docs_summary(case)
    predicted = {case.case_id: plan["visible"]} if plan is not None else None
    balance = case_balance(rank_balance(events, predicted))
    balance = balance.iloc[0] if len(balance) else pd.Series(dtype=float)
    moved = bytes_moved(events)
    return {
        "docs_count": float(docs["count"]) if docs else math.nan,
        "docs_mean": float(docs["mean"]) if docs else math.nan,
        "docs_max": float(docs["max"]) if docs else math.nan,
        "imbalance": float(balance.get("imbalance", math.nan)),
        "predicted_imbalance": float(balance.get("predicted_imbalance", math.nan)),
        "bytes_moved": float(moved["bytes_moved"].iloc[0]) if len(moved) else math.nan,
        "kernel_calls": float(plan["kernel_calls"]) if plan and plan.get("kernel_calls") is not None else math.nan,
        "ring_steps": float(plan["ring_steps"]) if plan else math.nan,
        "short_ring_bytes": short_ring_bytes(case, plan),
    }


def short_ring_bytes(case: Case, plan: dict | None) -> float:
    """Bytes one iteration of ``case`` would move on the short ring (sync-short / double-short), all ranks: each
    layer's short_hops K/V blocks forward and as many dK/dV accumulators home in the backward (engine/short_ring.py).
    NaN for a strategy other than one ring, or without a plan."""
    ring = case.strategy in ("ring", "", None) and case.buffer in ("sync", "double", "sync-short", "double-short")
    if plan is None or not ring or any("short_hops" not in layer for layer in plan["layers"]):
        return math.nan
    import torch

    from ringbench.kernels.base import stats_dtype

    dtype = getattr(torch, case.dtype)
    rows = case.seq // case.world
    block = 2 * case.batch * case.heads * rows * case.head_dim  # K and V of one rank: elements
    per_hop = block * dtype.itemsize + (block * stats_dtype(dtype).itemsize if case.backward else 0)
    return float(sum(layer["short_hops"] for layer in plan["layers"]) * per_hop)


def _emulated_rate(per_rank: list[RankReport]) -> float:
    """The emulated kernel's rate (every rank runs the same; emulated:auto's choice), NaN when not emulated."""
    rates = [r.emulated_gflops for r in per_rank if r.emulated_gflops is not None]
    return float(rates[0]) if rates else math.nan


def rank_summary(per_rank: list[RankReport]) -> dict:
    """What the ranks of one process group reported about where and how they ran (meta["ranks"][world])."""
    return {
        "hosts": sorted({r.host for r in per_rank}),
        "devices": sorted({r.device for r in per_rank}),
        "timeline": per_rank[0].timeline,
        "clock": per_rank[0].clock_method,
        "clock_residual_ns": max(r.clock_residual_ns for r in per_rank),
        "clock_offsets_ns": [r.clock_offset_ns for r in per_rank],
        "clock_drift_ppm": [r.clock_drift_ppm for r in per_rank],
        "emulation_saturated_blocks": sum(r.saturated_blocks for r in per_rank),
        "emulation_paced_blocks": sum(r.paced_blocks for r in per_rank),
        "peak_mem_mb": max(math.nan if r.peak_mem_mb is None else r.peak_mem_mb for r in per_rank),
        "memory_method": per_rank[0].memory_method,
    }


def device_meta(per_rank: list[RankReport]) -> dict:
    """The backend and devices the ranks actually ran on (a GPU run is labelled one, whatever the parent sees)."""
    infos = [r.device_info or {"type": "cpu"} for r in per_rank]
    if infos[0].get("type") == "cuda":
        return {"backend": "nccl", "device_kind": infos[0]["name"], "devices": [i["name"] for i in infos],
                "gpus": infos, "nccl_options": dict(infos[0].get("group_options") or {})}  # fmt: skip
    return {"backend": "gloo", "device_kind": "cpu"}


def _note_ranks(meta: dict, world: int, per_rank: list[RankReport]) -> None:
    """Fold what the ranks reported into the metadata (kept over cases: counts add up, peaks take the max)."""
    summary = rank_summary(per_rank)
    previous = meta.setdefault("ranks", {}).get(str(world))
    if previous:
        for key in ("emulation_saturated_blocks", "emulation_paced_blocks"):
            summary[key] += previous.get(key, 0)
        summary["peak_mem_mb"] = max(summary["peak_mem_mb"], previous.get("peak_mem_mb", math.nan))
    meta["ranks"][str(world)] = summary
    meta.update(device_meta(per_rank))


def _note_case(meta: dict, case: Case, row: dict) -> None:
    """Per-case facts the metadata lists: the rate emulated:auto chose, what the check left out."""
    if getattr(get_kernel(case.kernel), "auto", False):
        meta.setdefault("emulated_auto", {})[case.case_id] = row["emulated_gflops"]
    if row.get("check_note"):
        meta.setdefault("check_notes", {})[case.case_id] = row["check_note"]
