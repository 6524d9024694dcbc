"""Per-iteration step-time samples of each case, grouped by repeat: what the gate compares.

A *sample* is one timed iteration of one case in one repeat, measured the way a user feels it: from the first
rank entering the iteration to the last rank leaving it, i.e. ``max(end_ns) - min(start_ns)`` over the
``iteration`` events of all ranks (the clock is aligned across ranks, see schema.py). Repeats (``run --repeat K``,
each a fresh process group) keep their own list, because iterations of one process group share its luck
(placement, warm caches, a noisy neighbour) and are not independent of each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ringbench.figures.metrics import step_times
from ringbench.fmt import native
from ringbench.record.schema import CASE_AXES
from ringbench.record.store import RunData

# A case is identified across runs by its axes (never by its case_id, which a run may number differently). The
# injected faults are kept with the axes; whether they take part in matching is decided in match.py (only when a
# side mixes fault sets: they are otherwise one run-level setting per side, reported rather than matched).
MATCH_FIELDS = (*CASE_AXES, "faults")
# Axes before records had them (kv_heads 0: as many as heads).
AXIS_DEFAULTS = {"impl": "ringbench", "placement": "", "docs": "none", "layers": "1", "kv_heads": 0}

SAMPLE_COLUMNS = ("case_id", "repeat", "iteration", "step_ms")


def iteration_samples(run: RunData) -> pd.DataFrame:
    """Per-(case, repeat, iteration) step time in ms: max(end_ns) - min(start_ns) over ranks' iteration events
    (metrics.step_times).

    Returns a DataFrame with columns ``case_id, repeat, iteration, step_ms`` sorted by those keys.
    """
    events = run.events
    if events.empty or "kind" not in events:
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    times = step_times(events)  # the one definition of step time (ringbench/figures/metrics.py)
    return times.sort_values(["case_id", "repeat", "iteration"]).reset_index(drop=True)[list(SAMPLE_COLUMNS)]


@dataclass(frozen=True, kw_only=True)
class CaseSamples:
    """The step-time samples of one case on one side of a comparison."""

    axes: Mapping[str, object]
    """Values of MATCH_FIELDS (CASE_AXES plus ``faults``), as plain Python values."""
    emulated: bool
    """Compute time was modelled, not measured; such a case is only comparable with another emulated one."""
    case_ids: tuple[str, ...]
    """The case_id(s) the samples came from (one, unless a run repeated a case under several ids)."""
    repeats: tuple[np.ndarray, ...] = field(repr=False)
    """One 1-D float array of per-iteration step times (ms) per repeat; never empty arrays."""
    emulated_gflops: float | None = None
    """The emulated kernel's rate (GFLOP/s), notably the one ``emulated:auto`` chose; None when not emulated."""

    @property
    def key(self) -> tuple:
        return tuple(self.axes.get(name) for name in MATCH_FIELDS)

    @property
    def n_repeats(self) -> int:
        return len(self.repeats)

    @property
    def n_samples(self) -> int:
        return sum(len(r) for r in self.repeats)

    def padded(self) -> np.ndarray:
        """Samples as a (repeats, max iterations) array, NaN where a repeat has fewer iterations."""
        width = max((len(r) for r in self.repeats), default=0)
        out = np.full((len(self.repeats), width), np.nan)
        for index, values in enumerate(self.repeats):
            out[index, : len(values)] = values
        return out


@dataclass(frozen=True, kw_only=True)
class SampleSet:
    """One side of a comparison: where it came from, its must-match metadata and its cases."""

    source: str
    """The path given by the user."""
    kind: str
    """``run`` (a results directory) or ``baseline`` (a baseline file)."""
    run_id: str
    meta: Mapping[str, object]
    """The run's metadata record (a baseline file keeps only the keys the gate needs)."""
    cases: tuple[CaseSamples, ...]
    caveats: tuple[str, ...] = ()
    """Why some of this side's timings are not trustworthy (analysis/confidence.py: saturated emulation,
    disagreeing clocks); empty when nothing is known against them (always, for a baseline file)."""

    @property
    def emulated(self) -> bool:
        return bool(self.meta.get("emulated", False)) or any(case.emulated for case in self.cases)


def _case_rows(cases: pd.DataFrame) -> pd.DataFrame:
    """One row per (case_id, repeat) of the cases table, with the columns the gate reads present."""
    rows = cases.copy()
    for name, default in (*((axis, None) for axis in MATCH_FIELDS), ("emulated", False), ("status", "ok")):
        if name not in rows:
            rows[name] = default
    for name, default in AXIS_DEFAULTS.items():  # axes added after a record was written
        rows[name] = rows[name].where(rows[name].notna(), default)
    if "buffer" in rows:  # before strategies: the ring, or the all-gather baseline of that buffer
        before = rows["buffer"].astype(str).map(lambda b: "allgather" if b == "allgather" else "ring")
        rows["strategy"] = rows["strategy"].where(rows["strategy"].notna(), before)
    if "repeat" not in rows:
        rows["repeat"] = -1  # applies to every repeat of the case
    return rows


def _rate(value) -> float | None:
    try:
        rate = float(value)
    except (TypeError, ValueError):
        return None
    return rate if rate == rate else None  # NaN: not emulated


def sample_set_from_run(run: RunData, source: str | None = None) -> SampleSet:
    """Group a run's iteration samples by case axes; (case, repeat) rows whose status is ``failed`` are left out."""
    samples = iteration_samples(run)
    rows = _case_rows(run.cases)
    failed = {(str(r.case_id), int(r.repeat)) for r in rows.itertuples() if str(r.status) == "failed"}
    described = rows.drop_duplicates("case_id").set_index("case_id")

    grouped: dict[tuple, dict] = {}
    for (case_id, repeat), frame in samples.groupby(["case_id", "repeat"], sort=True):
        if (str(case_id), int(repeat)) in failed or (str(case_id), -1) in failed:
            continue
        if case_id in described.index:
            row = described.loc[case_id]
            axes = {name: native(row[name]) for name in MATCH_FIELDS}
            emulated = bool(native(row["emulated"]) or False)
            rate = native(row["emulated_gflops"]) if "emulated_gflops" in row.index else None
        else:  # events without a cases row: still comparable by id, never silently dropped
            axes = {name: None for name in MATCH_FIELDS} | {"faults": f"case_id={case_id}"}
            emulated, rate = False, None
        key = tuple(axes[name] for name in MATCH_FIELDS)
        entry = grouped.setdefault(key, {"axes": axes, "emulated": emulated, "case_ids": [], "repeats": [],
                                         "rate": _rate(rate)})  # fmt: skip
        if case_id not in entry["case_ids"]:
            entry["case_ids"].append(str(case_id))
        entry["emulated"] = entry["emulated"] or emulated
        entry["repeats"].append(frame.sort_values("iteration")["step_ms"].to_numpy(dtype=float))

    cases = tuple(
        CaseSamples(
            axes=entry["axes"],
            emulated=entry["emulated"],
            case_ids=tuple(entry["case_ids"]),
            repeats=tuple(entry["repeats"]),
            emulated_gflops=entry["rate"],
        )
        for entry in grouped.values()
    )
    return SampleSet(
        source=str(source if source is not None else run.path),
        kind="run",
        run_id=run.run_id,
        meta=dict(run.meta),
        cases=cases,
        caveats=timing_caveats(run),
    )


# Reasons (analysis/confidence.py) that undermine step times themselves, not only the attribution of a straggler.
_TIMING_REASONS = ("saturated", "clocks", "clock_bound")


def timing_caveats(run: RunData) -> tuple[str, ...]:
    """Per case whose timings the confidence check does not trust: ``<case_id>: <reason>`` (distinct lines)."""
    from ringbench.analysis.confidence import case_confidence
    from ringbench.analysis.stragglers import clock_violations
    from ringbench.figures.critical_path import clock_tolerance_ns, transfers

    if run.events.empty or not run.events["kind"].isin(["compute", "wait"]).any():
        return ()
    violations = clock_violations(transfers(run.events), clock_tolerance_ns(run.meta.clock_residual_ns()))
    table = case_confidence(run.events, run.cases, run.meta, violations=violations)
    lines = [
        f"{row.case_id}: {reason}"
        for row in table.itertuples()
        for code, reason in zip(row.reason_codes, row.inconclusive_reasons, strict=True)
        if code in _TIMING_REASONS
    ]
    return tuple(dict.fromkeys(lines))


def case_label(axes: Mapping[str, object], fields: tuple[str, ...]) -> str:
    """A short name for a case from the fields that vary between the compared cases, e.g. ``seq=4096 mask=causal``."""
    parts = [f"{name}={axes.get(name)}" for name in fields if not (name == "faults" and not axes.get(name))]
    return " ".join(parts) if parts else "(single case)"


def varying_fields(cases: list[Mapping[str, object]]) -> tuple[str, ...]:
    """The MATCH_FIELDS whose value is not the same for every case (all of them would be noise in a label)."""
    return tuple(name for name in MATCH_FIELDS if len({repr(axes.get(name)) for axes in cases}) > 1)
