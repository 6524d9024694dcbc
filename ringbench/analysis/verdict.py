"""The verdict of a run: every analysis once, a per-case summary, and the answer in words and as JSON.

``analyze(run)`` runs the analyses (each a pure DataFrame -> DataFrame function) and keeps their tables for the
report; ``verdict_lines`` / ``verdict_line`` put the answer in words; ``verdict_document`` is the `--json` form.
Run-level figures: the headline straggler is the flagged culprit that costs its case the most time per
iteration; the exposed-communication share is the median over cases; the imbalance is the worst case's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.analysis.balance import balance_cases, balance_ranks
from ringbench.analysis.hops import hop_table, transfers
from ringbench.analysis.numerics import numerics_table, worst_error
from ringbench.analysis.overlap import overlap_by_buffer, overlap_cases, overlap_steps
from ringbench.analysis.stragglers import (
    CLOCK_VIOLATION_SHARE,
    clock_tolerance_ns,
    clock_violations,
    critical_path,
    culprits,
    oversubscribed_cases,
    straggler_table,
)
from ringbench.store import RunData

SUMMARY_COLUMNS = [
    "case_id",
    "buffer",
    "world",
    "mask",
    "layout",
    "step_ms",
    "straggler_kind",
    "straggler_rank",
    "slow_hop_src",
    "slow_hop_dst",
    "ratio",
    "cost_ms",
    "cost_ms_p10",
    "cost_ms_p90",
    "exposed_comm_frac",
    "overlap_efficiency",
    "imbalance",
    "predicted_imbalance",
    "fwd_max_abs_err",
    "bwd_max_abs_err",
    "faults",
    "traced",
    "clock_violations",
]


@dataclass(frozen=True, slots=True)
class RunAnalysis:
    """Every analysis table of one run (see each module for columns) and the per-case summary."""

    run: RunData
    transfers: pd.DataFrame
    hops: pd.DataFrame
    critical_path: pd.DataFrame
    stragglers: pd.DataFrame
    culprits: pd.DataFrame
    overlap_steps: pd.DataFrame
    overlap_cases: pd.DataFrame
    overlap_buffers: pd.DataFrame
    balance_ranks: pd.DataFrame
    balance_cases: pd.DataFrame
    numerics: pd.DataFrame
    worst_error: pd.DataFrame
    summary: pd.DataFrame

    @property
    def simulated(self) -> bool:
        return bool(self.run.meta.get("simulated", False))

    @property
    def faults(self) -> list[str]:
        """Injected fault specs from the metadata and the cases' ``faults`` column, de-duplicated."""
        meta = self.run.meta.get("faults") or []
        specs = [meta] if isinstance(meta, str) else [str(f) for f in meta]
        if "faults" in self.run.cases:
            for value in self.run.cases["faults"].dropna().astype(str):
                specs.extend(part for part in value.split(";") if part)
        return list(dict.fromkeys(_canonical(s) for s in specs if s))

    def headline(self) -> pd.Series | None:
        """The summary row of the case whose culprit costs the most per iteration (None: no culprit)."""
        named = self.summary[self.summary["straggler_kind"].notna()]
        if named.empty:
            return None
        order = named.assign(_c=named["cost_ms"].fillna(0.0), _r=named["ratio"].fillna(0.0))
        return order.sort_values(["_c", "_r"], ascending=False).iloc[0]

    def focus_case(self) -> str | None:
        """The case the report's per-case figures show: the headline's, else the first case with events."""
        top = self.headline()
        if top is not None:
            return str(top["case_id"])
        return str(self.summary["case_id"].iloc[0]) if len(self.summary) else None


def _canonical(spec: str) -> str:
    """A fault spec as the run's parser writes it ("slow-rank:3:2.60" -> "slow-rank:3:2.6"); others unchanged."""
    from ringbench.errors import UsageError
    from ringbench.faults import parse_fault

    try:
        return parse_fault(spec).spec
    except (UsageError, ValueError):
        return spec


def analyze(run: RunData) -> RunAnalysis:
    """Run every analysis on a loaded run (pure: reads run.events / run.cases, writes nothing)."""
    events, cases = run.events, run.cases
    xfers = transfers(events)
    tol_ns = clock_tolerance_ns(run.meta)
    path = critical_path(events, xfers, tol_ns)
    crowded = oversubscribed_cases(cases, run.meta)
    table = straggler_table(events, xfers, path, tol_ns=tol_ns, no_blame=crowded)
    blame = culprits(table, clock_violations(xfers, tol_ns))
    steps = overlap_steps(events, xfers)
    per_case = overlap_cases(events, steps, cases)
    ranks = balance_ranks(events, cases)
    balance = balance_cases(ranks, events, cases)
    summary = _summary(events, cases, blame, per_case, balance)
    return RunAnalysis(
        run=run,
        transfers=xfers,
        hops=hop_table(xfers),
        critical_path=path,
        stragglers=table,
        culprits=blame,
        overlap_steps=steps,
        overlap_cases=per_case,
        overlap_buffers=overlap_by_buffer(per_case),
        balance_ranks=ranks,
        balance_cases=balance,
        numerics=numerics_table(cases),
        worst_error=worst_error(cases),
        summary=summary,
    )


def _summary(events, cases, blame, per_case, balance) -> pd.DataFrame:
    ids = list(dict.fromkeys([*events["case_id"].astype(str).unique(), *cases.get("case_id", pd.Series()).astype(str)]))
    out = pd.DataFrame({"case_id": pd.Series(ids, dtype=object)})
    if not cases.empty:
        first = cases.drop_duplicates("case_id").copy()
        first["case_id"] = first["case_id"].astype(str)
        errs = cases.groupby("case_id")[["fwd_max_abs_err", "bwd_max_abs_err"]].max()
        keep = [c for c in ("case_id", "buffer", "world", "mask", "layout", "step_ms", "faults") if c in first]
        out = out.merge(first[keep], on="case_id", how="left").merge(errs, on="case_id", how="left")
    for table in (blame, per_case.drop(columns="buffer"), balance.drop(columns="world")):
        out = out.merge(table.astype({"case_id": object}), on="case_id", how="left")
    if "step_ms" not in out or out["step_ms"].isna().all():
        out["step_ms"] = out.get("iteration_ms")
    spans = events.loc[events["kind"] != "iteration", "case_id"].astype(str).unique()
    out["traced"] = out["case_id"].isin(spans)
    return out.reindex(columns=SUMMARY_COLUMNS)


# -- words ---------------------------------------------------------------------------------------------------
def _num(value, fmt: str = ".2f", none: str = "n/a") -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return none
    return none if math.isnan(value) else format(value, fmt)


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def label_line(analysis: RunAnalysis) -> str | None:
    """SIMULATED / EMULATED and injected faults, or None for a measured run without faults."""
    parts = []
    if analysis.simulated:
        parts.append("SIMULATED run: compute and links are modelled, nothing was measured")
    elif analysis.run.emulated:
        parts.append("EMULATED compute: kernel durations are modelled, communication is real")
        saturated = sum(
            int(info.get("emulation_saturated_blocks") or 0)
            for info in (analysis.run.meta.get("ranks") or {}).values()
            if isinstance(info, dict)
        )
        if saturated:
            parts.append(
                f"{saturated} block(s) took longer than their modelled time (emulation saturated: real arithmetic "
                "showed through; lower the emulated GFLOP/s or the shapes)"
            )
    if analysis.faults:
        parts.append("injected faults: " + ", ".join(analysis.faults))
    return "; ".join(parts) if parts else None


def straggler_sentence(row: pd.Series | None, analysis: RunAnalysis) -> str:
    """The culprit in words, with its cost to the ring per iteration."""
    multi = len(analysis.summary) > 1
    if row is None:
        crowded = oversubscribed_cases(analysis.run.cases, analysis.run.meta)
        worst = analysis.culprits[~analysis.culprits["case_id"].isin(crowded)]
        closest = ""
        if len(worst) and (worst["worst_rank_ratio"].notna().any() or worst["worst_hop_ratio"].notna().any()):
            rank_r, link_r = worst["worst_rank_ratio"].max(), worst["worst_hop_ratio"].max()
            closest = f" (closest: rank at {_num(rank_r)}x, hop at {_num(link_r)}x its peers' median)"
        judged = " in the cases that could be judged" if crowded else ""
        return f"No straggler: no rank or hop crosses the alarm thresholds against its peers{judged}" + closest
    where = f" in case {row['case_id']}" if multi else ""
    cost = (
        f"costs the ring {_num(row['cost_ms'])} ms per iteration "
        f"(p10 {_num(row['cost_ms_p10'])}, p90 {_num(row['cost_ms_p90'])})"
    )
    if _num(row["cost_ms"], ".3f") == "0.000":
        cost = "costs the ring ~0 ms per iteration (hidden behind compute)"
    if row["straggler_kind"] == "compute":
        return (
            f"Straggler: rank {int(row['straggler_rank'])} (compute){where}: {_num(row['ratio'])}x the other ranks' "
            f"median compute time per unit of work; {cost}"
        )
    hop = f"{int(row['slow_hop_src'])} -> {int(row['slow_hop_dst'])}"
    return (
        f"Slow hop: {hop} (link){where}: transfer {_num(row['ratio'])}x the other hops' median per byte, "
        f"upstream waits excluded; no rank blamed; {cost}"
    )


def verdict_lines(analysis: RunAnalysis) -> list[str]:
    """The verdict in a few sentences: label, straggler, exposed communication, imbalance, numerics."""
    lines = []
    label = label_line(analysis)
    if label:
        lines.append(label)
    traced = analysis.summary["traced"].fillna(False).astype(bool)
    if analysis.run.events.empty:
        lines.append("No events recorded: nothing to analyse (was the run recorded, and did it finish?)")
    elif not traced.any():
        lines.append(
            "Not traced (run --no-trace): iteration times only; no straggler, hop, overlap or imbalance analysis"
        )
    else:
        if not traced.all():
            lines.append(f"Not traced: {int((~traced).sum())} case(s) have iteration times only")
        skewed = analysis.summary[analysis.summary["clock_violations"].fillna(0.0) > CLOCK_VIOLATION_SHARE]
        if len(skewed):
            worst = skewed["clock_violations"].max()
            lines.append(
                f"Clocks disagree: in {len(skewed)} case(s) up to {_num(100 * worst, '.0f')}% of blocks arrive before "
                "their sender posted them; hop figures are unreliable there and no link is blamed"
            )
        crowded = oversubscribed_cases(analysis.run.cases, analysis.run.meta)
        if crowded:
            lines.append(
                f"CPU oversubscribed: in {len(crowded)} case(s) with real compute the ranks outnumber the "
                f"{analysis.run.meta.get('cpu_count')} CPU cores, so compute and transfer times include "
                "scheduling delays; no rank or link is blamed there (the emulated kernel leaves the cores free)"
            )
        lines.append(straggler_sentence(analysis.headline(), analysis))
        doc = verdict_document(analysis)
        fracs = analysis.summary["exposed_comm_frac"].dropna()
        spread = (
            f"; range {_num(100 * fracs.min(), '.1f')}..{_num(100 * fracs.max(), '.1f')}%" if len(fracs) > 1 else ""
        )
        buffers = analysis.overlap_buffers
        hidden = ", ".join(
            f"{b} {_num(100 * e, '.0f')}%"
            for b, e in zip(buffers["buffer"], buffers["overlap_efficiency"], strict=True)
        )
        lines.append(
            f"Exposed communication: {_num(100 * _nan(doc['exposed_comm_frac']), '.1f')}% of iteration time "
            f"(median over {len(fracs)} case(s){spread}); communication hidden by overlap: {hidden or 'n/a'}"
        )
        imb = analysis.summary["predicted_imbalance"]
        lines.append(
            f"Imbalance: {_num(doc['imbalance'])} (max/mean compute per rank, worst case; the mask plan predicts "
            f"{_num(imb.max())})"
        )
    worst = analysis.worst_error
    if worst.empty:
        lines.append("Numerics: not checked in this run")
    else:
        w = worst.iloc[0]
        status = "within tolerance" if bool(w["passed"]) else "FAILED its tolerance"
        lines.append(
            f"Worst numerical error: {_num(w['max_abs_err'], '.2e')} ({w['phase']}, {w['dtype']}, world "
            f"{_num(w['world'], '.0f')}, case {w['case_id']}), {status}"
        )
    return lines


def verdict_line(run: RunData) -> str:
    """One line for the end of `ringbench run`: the verdict sentences joined."""
    return " | ".join(verdict_lines(analyze(run)))


# -- JSON ----------------------------------------------------------------------------------------------------
def _plain(value):
    """JSON-safe: numpy scalars to Python, NaN / NA to None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _hop(row) -> list[int] | None:
    if row is None or row.get("straggler_kind") != "link":
        return None
    return [int(row["slow_hop_src"]), int(row["slow_hop_dst"])]


def verdict_document(analysis: RunAnalysis) -> dict:
    """The `ringbench analyze --json` document (NaN -> null)."""
    top = analysis.headline()
    summary = analysis.summary
    cases = []
    for _, row in summary.iterrows():
        item = {c: row[c] for c in SUMMARY_COLUMNS if c not in ("slow_hop_src", "slow_hop_dst")}
        item["straggler_rank"] = None if pd.isna(row["straggler_rank"]) else int(row["straggler_rank"])
        item["slow_hop"] = _hop(row) if pd.notna(row["straggler_kind"]) else None
        item["straggler_kind"] = row["straggler_kind"] if pd.notna(row["straggler_kind"]) else None
        cases.append(item)
    worst = analysis.worst_error
    document = {
        "run_id": analysis.run.run_id,
        "simulated": analysis.simulated,
        "emulated": analysis.run.emulated,
        "faults": analysis.faults,
        "straggler_rank": None if top is None or top["straggler_kind"] != "compute" else int(top["straggler_rank"]),
        "straggler_kind": None if top is None else top["straggler_kind"],
        "slow_hop": _hop(top),
        "straggler_case": None if top is None else top["case_id"],
        "straggler_cost_ms": None if top is None else top["cost_ms"],
        "exposed_comm_frac": summary["exposed_comm_frac"].median() if len(summary) else None,
        "overlap_efficiency": summary["overlap_efficiency"].median() if len(summary) else None,
        "imbalance": summary["imbalance"].max() if len(summary) else None,
        "worst_error": None if worst.empty else worst.iloc[0].to_dict(),
        "cases": cases,
    }
    return _plain(document)
