"""The verdict of a run: every analysis once, a per-case summary, and the answer in words and as JSON.

``analyze(run)`` runs the analyses (each a pure DataFrame -> DataFrame function) and keeps their tables for the
report; ``verdict_lines`` / ``verdict_line`` put the answer in words; ``verdict_document`` is the `--json` form.
Run-level figures: the headline straggler is the flagged culprit that costs its case the most time per
iteration; the exposed-communication share is the median over cases; the imbalance is the worst case's. Per-case
figures are those of ringbench/figures/metrics.py, the same the cases table holds.

Confidence (analysis/confidence.py): a case whose timings cannot support attribution is *inconclusive*; nothing
is flagged there. The run is conclusive when it names a culprit, or when every traced case could be judged;
otherwise it is inconclusive, names nobody, and says why and how to fix it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.analysis.balance import balance_cases, balance_ranks
from ringbench.analysis.confidence import (
    CONCLUSIVE,
    INCONCLUSIVE,
    SATURATION_SHARE,
    case_confidence,
    inconclusive_cases,
    run_reasons,
    with_reason,
)
from ringbench.analysis.hops import hop_table
from ringbench.analysis.numerics import numerics_table, worst_error
from ringbench.analysis.overlap import overlap_by_buffer, overlap_cases, overlap_steps
from ringbench.analysis.stragglers import censored_suspects, clock_violations, culprits, straggler_table
from ringbench.figures.critical_path import clock_tolerance_ns, critical_path_segments, transfers
from ringbench.figures.metrics import case_figures
from ringbench.fmt import number
from ringbench.record.store import RunData, as_categories

SUMMARY_COLUMNS = [
    "case_id",
    "buffer",
    "world",
    "mask",
    "layout",
    "step_ms",
    "step_ms_p10",
    "step_ms_p90",
    "fwd_ms",
    "bwd_ms",
    "tokens_per_s",
    "tflops",
    "confidence",
    "inconclusive_reasons",
    "straggler_kind",
    "straggler_rank",
    "slow_hop_src",
    "slow_hop_dst",
    "ratio",
    "cost_ms",
    "cost_ms_p10",
    "cost_ms_p90",
    "exposed_comm_ms",
    "exposed_comm_frac",
    "overlap_efficiency",
    "imbalance",
    "predicted_imbalance",
    "peak_mem_mb",
    "fwd_max_abs_err",
    "bwd_max_abs_err",
    "faults",
    "traced",
    "clock_violations",
    "straggler_ranks",
    "slow_hops",
    "unattributed_frac",
    "ratio_p10",
    "ratio_p90",
    "hop_cause",
    "hop_cause_note",
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
    confidence: pd.DataFrame
    numerics: pd.DataFrame
    worst_error: pd.DataFrame
    summary: pd.DataFrame

    @property
    def simulated(self) -> bool:
        return self.run.meta.simulated

    @property
    def faults(self) -> list[str]:
        """Injected fault specs from the metadata and the cases' ``faults`` column, de-duplicated."""
        specs = self.run.meta.faults  # canonical specs (ringbench.scenario.faults), as every producer writes them
        if "faults" in self.run.cases:
            for value in self.run.cases["faults"].dropna().astype(str):
                specs.extend(part for part in value.split(";") if part)
        return list(dict.fromkeys(spec for spec in specs if spec))

    def headline(self) -> pd.Series | None:
        """The summary row of the case whose culprit costs the most per iteration (None: no culprit)."""
        named = self.summary[self.summary["straggler_kind"].notna()]
        if named.empty:
            return None
        order = named.assign(_c=named["cost_ms"].fillna(0.0), _r=named["ratio"].fillna(0.0))
        return order.sort_values(["_c", "_r"], ascending=False).iloc[0]

    def confidence_reasons(self) -> tuple[str, list[str]]:
        """The run's confidence and, when inconclusive, the distinct reasons of its inconclusive cases."""
        if self.headline() is not None:
            return CONCLUSIVE, []
        reasons = run_reasons(self.confidence)
        return (INCONCLUSIVE, reasons) if reasons else (CONCLUSIVE, [])

    def focus_case(self) -> str | None:
        """The case the report's per-case figures show: the headline's, else the first case with events."""
        top = self.headline()
        if top is not None:
            return str(top["case_id"])
        return str(self.summary["case_id"].iloc[0]) if len(self.summary) else None


def analyze(run: RunData) -> RunAnalysis:
    """Run every analysis on a loaded run (pure: reads run.events / run.cases, writes nothing). The analyses, and
    the report from the analysis's ``run``, work on the events with their few-valued text columns as categoricals
    (record.store.as_categories: the same values, integer grouping); the ``run`` passed in is left as loaded."""
    run = dataclasses.replace(run, events=as_categories(run.events))
    events, cases = run.events, run.cases
    xfers = transfers(events)
    tol_ns = clock_tolerance_ns(run.meta.clock_residual_ns())
    path, segments = critical_path_segments(events, xfers, tol_ns)
    violations = clock_violations(xfers, tol_ns)
    confidence = case_confidence(events, cases, run.meta, violations=violations)
    blind = inconclusive_cases(confidence)
    table = straggler_table(events, xfers, path, tol_ns=tol_ns, no_blame=blind, segments=segments,
                            link_floor_ms=_link_floor_ms(run.meta))  # fmt: skip
    blame = culprits(table, violations)
    named = set(table.loc[table["flagged"], "case_id"].astype(str))
    doubtful = {case: why for case, why in censored_suspects(xfers, events).items() if case not in named}
    confidence = with_reason(confidence, doubtful, "censored")
    confidence = with_reason(confidence, _undecided(table, events, named), "few_ranks")
    figures = case_figures(events, cases, path=path, tol_ns=tol_ns)
    steps = overlap_steps(events, xfers)
    per_case = overlap_cases(events, steps, cases, figures=figures)
    bounded = run.meta.bounded_cases  # simulated at scale: only some ranks' spans are in the record
    ranks = balance_ranks(events, cases, run.meta.plans)
    ranks = ranks[~ranks["case_id"].astype(str).isin(bounded)] if bounded and "case_id" in ranks else ranks
    balance = balance_cases(ranks, events, cases)
    if bounded and len(balance) and "case_id" in balance:
        balance = balance[~balance["case_id"].astype(str).isin(bounded)]
    summary = _summary(events, cases, figures, confidence, blame, per_case, balance, bounded)
    summary["unattributed_frac"] = summary["case_id"].map(_unattributed(path)).astype(float)
    _hop_causes(summary, table, events, run.meta)
    return RunAnalysis(
        run=run,
        transfers=xfers,
        hops=hop_table(xfers),
        critical_path=path,
        stragglers=table,
        culprits=blame,
        overlap_steps=steps,
        overlap_cases=per_case,
        overlap_buffers=overlap_by_buffer(per_case, steps),
        balance_ranks=ranks,
        balance_cases=balance,
        confidence=confidence,
        numerics=numerics_table(cases),
        worst_error=worst_error(cases),
        summary=summary,
    )


def _link_floor_ms(meta) -> float:
    """The shortest transfer a record resolves: an imported host-side trace observes completions when a rank comes
    to take them, so transfers shorter than a late take (traces/evidence.py LATE_NS) are noise; 0 otherwise."""
    from ringbench.traces.evidence import LATE_NS

    host_side = meta.get("source") == "profiler" and str(meta.get("device_kind", "cpu")) == "cpu"
    return LATE_NS / 1e6 if host_side else 0.0


def _hop_causes(summary: pd.DataFrame, table: pd.DataFrame, events: pd.DataFrame, meta) -> None:
    """A slow hop's cause as far as the evidence goes (analysis/hop_cause.py), per case naming one. In place."""
    from ringbench.analysis.hop_cause import hop_cause

    summary["hop_cause"], summary["hop_cause_note"] = None, None
    for index, row in summary[summary["straggler_kind"] == "link"].iterrows():
        src, dst = int(row["slow_hop_src"]), int(row["slow_hop_dst"])
        hop = table[(table["case_id"].astype(str) == str(row["case_id"])) & (table["src"] == src)
                    & (table["dst"] == dst)]  # fmt: skip
        extra = float(hop["extra_ms"].iloc[0]) if len(hop) and pd.notna(hop["extra_ms"].iloc[0]) else 0.0
        cause, note = hop_cause(events, meta, row["case_id"], src, dst, extra)
        summary.at[index, "hop_cause"], summary.at[index, "hop_cause_note"] = cause, note


def _undecided(table: pd.DataFrame, events: pd.DataFrame, named: set[str]) -> dict[str, str]:
    """Cases of small rings that name nobody although a rank passed the alarm's ratio (analysis/few_ranks.py):
    case id -> why."""
    from ringbench.analysis.few_ranks import undecided_sentence

    rows = table[table["undecided"].fillna(False).astype(bool) & ~table["case_id"].astype(str).isin(named)]
    if rows.empty:
        return {}
    world = events.groupby("case_id", observed=True)["rank"].nunique()
    top = rows.sort_values("ratio", ascending=False).drop_duplicates("case_id")
    return {str(r["case_id"]): undecided_sentence(r, int(world.get(r["case_id"], 2))) for _, r in top.iterrows()}


def _unattributed(path: pd.DataFrame) -> dict[str, float]:
    """Per case: the median over iterations of the critical path's share that is nobody's (``other``)."""
    if path.empty:
        return {}
    other = path[path["resource"] == "other"]
    share = other["ms"] / other["path_ms"].where(other["path_ms"] > 0)
    return share.groupby(other["case_id"].astype(str)).median().to_dict()


def _summary(events, cases, figures, confidence, blame, per_case, balance, bounded=frozenset()) -> pd.DataFrame:
    ids = list(dict.fromkeys([*map(str, events["case_id"].unique()), *cases.get("case_id", pd.Series()).astype(str)]))
    out = pd.DataFrame({"case_id": pd.Series(ids, dtype=object)})
    if not cases.empty:
        first = cases.drop_duplicates("case_id").copy()
        first["case_id"] = first["case_id"].astype(str)
        worst = [c for c in ("fwd_max_abs_err", "bwd_max_abs_err", "peak_mem_mb") if c in cases]
        errs = cases.assign(case_id=cases["case_id"].astype(str)).groupby("case_id")[worst].max()
        keep = [c for c in ("case_id", "buffer", "world", "mask", "layout", "faults") if c in first]
        out = out.merge(first[keep], on="case_id", how="left").merge(errs, on="case_id", how="left")
    # The figures come from the events (metrics.case_figures); a case without events keeps its cases-table ones.
    measured = figures.astype({"case_id": object}).drop(columns=["iterations"], errors="ignore")
    out = out.merge(measured, on="case_id", how="left")
    if not cases.empty:
        stored = cases.assign(case_id=cases["case_id"].astype(str)).drop_duplicates("case_id").set_index("case_id")
        whole = out["case_id"].isin(bounded)  # bounded records: the simulator's row saw every rank, the events not
        for column in measured.columns.drop("case_id"):
            if column in stored:
                from_row = out["case_id"].map(stored[column])
                out[column] = out[column].where(~whole, from_row).fillna(from_row)
    per_case = per_case.drop(columns=["buffer", "iteration_ms", "exposed_ms", "exposed_comm_frac"])
    per_case = per_case.drop(columns=[c for c in per_case.columns if c.startswith("exposed_comm_frac")])
    for table in (confidence, blame, per_case, balance.drop(columns="world")):
        out = out.merge(table.astype({"case_id": object}), on="case_id", how="left")
    spans = [str(c) for c in events.loc[events["kind"] != "iteration", "case_id"].unique()]
    out["traced"] = out["case_id"].isin(spans)
    return out.reindex(columns=SUMMARY_COLUMNS)


# -- words ---------------------------------------------------------------------------------------------------
def _num(value, fmt: str = ".2f", none: str = "n/a") -> str:
    return number(value, fmt, missing=none)


def _nan(value) -> float:
    return math.nan if value is None else float(value)


def interrupted_line(run) -> str | None:
    """What stopped an interrupted run and what its analysis holds -- said once, at the top -- or None."""
    state = run.meta.interrupted
    if state is None:
        return None
    who = f" (to rank {state['rank']})" if state.get("rank") is not None else ""
    during = f" during case {state['case']}" if state.get("case") else (
        f" during {state['where']}" if state.get("where") else " between cases")  # fmt: skip
    kept, total = state.get("kept", len(run.cases)), state.get("total", "?")
    resume = f"; resume: {state['resume']}" if state.get("resume") else ""
    return (f"INTERRUPTED by {state.get('signal', 'a signal')}{who}{during}: {kept} of {total} cases finished, "
            f"and only those are analysed{resume}")  # fmt: skip


def label_line(analysis: RunAnalysis) -> str | None:
    """SIMULATED / EMULATED and injected faults, or None for a measured run without faults."""
    parts = []
    if analysis.simulated:
        parts.append("SIMULATED run: compute and links are modelled, nothing was measured")
    elif analysis.run.emulated:
        links = analysis.run.meta.emulated_links
        kernels = analysis.run.cases.get("emulated", pd.Series(dtype=bool))
        compute = bool(kernels.fillna(False).astype(bool).any()) if len(kernels) else not links
        if compute and links:
            parts.append("EMULATED compute and links: kernel durations are modelled, link costs are injected delays")
        elif links:
            parts.append("EMULATED links: link costs are injected delays (a topology's), compute is real")
        elif len(analysis.run.cases) and (analysis.run.cases["world"].astype(int) == 1).all():
            parts.append("EMULATED compute: kernel durations are modelled")  # one rank: nothing is communicated
        else:
            parts.append("EMULATED compute: kernel durations are modelled, communication is real")
        cases = analysis.run.cases
        per_case = pd.to_numeric(cases.get("saturated_blocks", pd.Series(dtype=float)), errors="coerce")
        saturated = (
            int(per_case.sum())
            if per_case.notna().any()
            else sum(  # older records: per world size
                analysis.run.meta.saturated_blocks(world) or 0 for world in analysis.run.meta.ranks()
            )
        )
        per_calls = pd.to_numeric(cases.get("emulated_blocks", pd.Series(dtype=float)), errors="coerce")
        calls = per_calls.sum()
        within = bool(per_calls.notna().all() and (per_case.fillna(0) <= SATURATION_SHARE * per_calls).all())
        if saturated and calls > 0 and within:
            parts.append(
                f"{saturated} of {int(calls)} emulated block(s) took longer than their modelled time (under the "
                f"{SATURATION_SHARE:.0%} that would make a case inconclusive)"
            )
        elif saturated:
            of = f" of {int(calls)}" if calls > 0 else ""
            parts.append(
                f"{saturated}{of} block(s) took longer than their modelled time (emulation saturated: real "
                "arithmetic showed through; lower the emulated GFLOP/s or the shapes)"
            )
    if analysis.faults:
        parts.append("injected faults: " + ", ".join(analysis.faults))
    return "; ".join(parts) if parts else None


def _judged(analysis: RunAnalysis) -> tuple[pd.Series, pd.Series]:
    """(traced cases that could be judged, traced cases that could not), as case-id Series."""
    summary = analysis.summary
    traced = summary["traced"].fillna(False).astype(bool)
    inconclusive = summary["confidence"] == INCONCLUSIVE
    return summary.loc[traced & ~inconclusive, "case_id"], summary.loc[traced & inconclusive, "case_id"]


def inconclusive_sentence(analysis: RunAnalysis) -> str | None:
    """Why traced cases could not be judged and how to fix it (None when every traced case could be)."""
    _, unjudged = _judged(analysis)
    if unjudged.empty:
        return None
    reasons = run_reasons(analysis.confidence, unjudged)
    where = "" if len(analysis.summary) == 1 else f" in {len(unjudged)} of {len(analysis.summary)} case(s)"
    there = " there" if where else ""
    return f"Inconclusive{where}, so no rank or hop is named{there}: " + ". ".join(
        r[0].upper() + r[1:] for r in reasons
    )


def straggler_sentence(row: pd.Series | None, analysis: RunAnalysis) -> str | None:
    """The culprit in words, with its cost to the ring per iteration; None when no case could be judged."""
    multi = len(analysis.summary) > 1
    if row is None:
        judged, unjudged = _judged(analysis)
        if judged.empty:
            return None  # the inconclusive sentence says why; never "No straggler" on what could not show one
        worst = analysis.culprits[analysis.culprits["case_id"].isin(set(judged))]
        closest = ""
        if len(worst) and (worst["worst_rank_ratio"].notna().any() or worst["worst_hop_ratio"].notna().any()):
            rank_r, link_r = worst["worst_rank_ratio"].max(), worst["worst_hop_ratio"].max()
            closest = f" (closest: rank at {_num(rank_r)}x, hop at {_num(link_r)}x its peers' median)"
        where = f" in the {len(judged)} case(s) that could be judged" if len(unjudged) else ""
        return f"No straggler: no rank or hop crosses the alarm thresholds against its peers{where}" + closest
    where = f" in case {row['case_id']}" if multi else ""
    tied = tied_names(row)
    together = " together" if tied else ""
    cost = (
        f"costs the ring {_num(row['cost_ms'])} ms per iteration{together} "
        f"(p10 {_num(row['cost_ms_p10'])}, p90 {_num(row['cost_ms_p90'])})"
    )
    if _num(row["cost_ms"], ".3f") == "0.000":
        cost = "costs the ring ~0 ms per iteration (hidden behind compute)"
    alone = "; equally to blame: fixing one alone does not help" if tied else ""
    if row["straggler_kind"] == "compute":
        who = f"ranks {tied} (compute)" if tied else f"rank {int(row['straggler_rank'])} (compute)"
        own = " (its compute and its work outside any op)" if _has_own(analysis) else ""
        return (
            f"Straggler{'s' if tied else ''}: {who}{where}: {_num(row['ratio'])}x{_interval(row)} the other ranks' "
            f"median own time per unit of work{own}{alone}; {cost}"
        )
    hop = f"{int(row['slow_hop_src'])} -> {int(row['slow_hop_dst'])}"
    who = f"{tied} (links)" if tied else f"{hop} ({_hop_kind(row)})"
    cause = row.get("hop_cause_note")
    why = f"; {cause}" if isinstance(cause, str) and cause and row.get("hop_cause") != "link" else ""
    return (
        f"Slow hop{'s' if tied else ''}: {who}{where}: transfer {_num(row['ratio'])}x{_interval(row)} the other "
        f"hops' median per byte, upstream waits excluded; no rank blamed{why}{alone}; {cost}"
    )


def _hop_kind(row) -> str:
    """How a slow hop is named: the link, the sender's code, or either (analysis/hop_cause.py)."""
    cause = row.get("hop_cause")
    if cause == "held_back":
        return f"held back by rank {int(row['slow_hop_src'])}'s code"
    if cause == "link_or_sender":
        return f"link, or rank {int(row['slow_hop_src'])}'s code: the trace cannot tell"
    return "link"


def _interval(row) -> str:
    """ " (p10-p90 a-b)" of a culprit's ratio over iterations, when known."""
    low, high = row.get("ratio_p10"), row.get("ratio_p90")
    if low is None or high is None or pd.isna(low) or pd.isna(high):
        return ""
    return f" (p10-p90 {_num(low)}-{_num(high)}x)"


def tied_names(row) -> str:
    """ "1 and 3" / "3 -> 4 and 7 -> 0" when the culprit shares the blame equally with others, else ""."""
    ranks, hops = row.get("straggler_ranks"), row.get("slow_hops")
    if row.get("straggler_kind") == "compute" and isinstance(ranks, (list, tuple, np.ndarray)) and len(ranks) > 1:
        names = [str(int(r)) for r in ranks]
    elif row.get("straggler_kind") == "link" and isinstance(hops, (list, tuple, np.ndarray)) and len(hops) > 1:
        names = [f"{int(a)} -> {int(b)}" for a, b in hops]
    else:
        return ""
    return ", ".join(names[:-1]) + " and " + names[-1]


def _has_own(analysis: RunAnalysis) -> bool:
    return bool((analysis.run.events["kind"] == "own").any())


def overlap_words(analysis: RunAnalysis) -> str:
    """What is known of the communication hidden by overlap: per buffer strategy where the record knows it; an
    imported ring's figure alone (its strategy is not in a trace), as a range when some transfers are censored
    (they never blocked a rank, but their length is only bounded)."""
    buffers = analysis.overlap_buffers
    known = buffers[~buffers["buffer"].isin(["unknown", "?"])]
    if len(known):
        return ", ".join(
            f"{b} {_num(100 * e, '.0f')}%" for b, e in zip(known["buffer"], known["overlap_efficiency"], strict=True)
        )
    xfers = analysis.transfers
    if xfers.empty:
        return "n/a"
    comm = xfers["recv_ms"].clip(lower=0.0)
    hidden = (comm - xfers["wait_ms"]).clip(lower=0.0)
    cut = xfers["censored"].astype(bool) if "censored" in xfers else pd.Series(False, index=xfers.index)
    measured_comm, measured_hidden = comm[~cut].sum(), hidden[~cut].sum()
    if not cut.any():
        return f"{_num(100 * measured_hidden / measured_comm, '.0f')}%" if measured_comm > 0 else "n/a"
    high = (measured_hidden + comm[cut].sum()) / (measured_comm + comm[cut].sum())
    low = measured_hidden / measured_comm if measured_comm > 0 else 0.0
    return (
        f"{_num(100 * low, '.0f')}-{_num(100 * high, '.0f')}% ({int(cut.sum())} of {len(xfers)} transfers never "
        "blocked a rank but their length is only bounded)"
    )


def verdict_lines(analysis: RunAnalysis) -> list[str]:
    """The verdict in a few sentences: label, confidence, straggler, exposed communication, imbalance, numerics."""
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
        headline = analysis.headline()
        for sentence in (straggler_sentence(headline, analysis), inconclusive_sentence(analysis)):
            if sentence:
                lines.append(sentence)
        doc = verdict_document(analysis)
        fracs = analysis.summary["exposed_comm_frac"].dropna()
        spread = (
            f"; range {_num(100 * fracs.min(), '.1f')}..{_num(100 * fracs.max(), '.1f')}%" if len(fracs) > 1 else ""
        )
        lines.append(
            f"Exposed communication (on the critical path): {_num(100 * _nan(doc['exposed_comm_frac']), '.1f')}% "
            f"of iteration time (median over {len(fracs)} case(s){spread}); communication hidden by overlap: "
            f"{overlap_words(analysis) or 'n/a'}"
        )
        unattributed = analysis.summary["unattributed_frac"].dropna()
        if analysis.run.meta.get("source") == "profiler" and len(unattributed):
            lines.append(
                f"Unattributed: {_num(100 * unattributed.max(), '.1f')}% of the critical path is time the trace "
                "gives to no rank and no link (a delayed post inside an exchange, a barrier's release, the start "
                "of an iteration)"
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


def _int_lists(value):
    """A list of ints / of [src, dst] pairs from a summary cell (None when the cell holds none)."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        return None
    return [_int_lists(v) if isinstance(v, (list, tuple, np.ndarray)) else int(v) for v in value]


def verdict_document(analysis: RunAnalysis) -> dict:
    """The `ringbench analyze --json` document (NaN -> null)."""
    top = analysis.headline()
    summary = analysis.summary
    cases = []
    for _, row in summary.iterrows():
        item = {c: row[c] for c in SUMMARY_COLUMNS if c not in ("slow_hop_src", "slow_hop_dst")}
        item["straggler_rank"] = None if pd.isna(row["straggler_rank"]) else int(row["straggler_rank"])
        item["slow_hop"] = _hop(row) if pd.notna(row["straggler_kind"]) else None
        item["straggler_ranks"] = _int_lists(row["straggler_ranks"])
        item["slow_hops"] = _int_lists(row["slow_hops"])
        item["straggler_kind"] = row["straggler_kind"] if pd.notna(row["straggler_kind"]) else None
        item["inconclusive_reasons"] = (
            list(row["inconclusive_reasons"]) if isinstance(row["inconclusive_reasons"], list) else []
        )
        cases.append(item)
    worst = analysis.worst_error
    confidence, reasons = analysis.confidence_reasons()
    document = {
        "run_id": analysis.run.run_id,
        "simulated": analysis.simulated,
        "emulated": analysis.run.emulated,
        "faults": analysis.faults,
        "confidence": confidence,
        "inconclusive_reasons": reasons,
        "straggler_rank": None if top is None or top["straggler_kind"] != "compute" else int(top["straggler_rank"]),
        "straggler_kind": None if top is None else top["straggler_kind"],
        "slow_hop": _hop(top),
        "straggler_case": None if top is None else top["case_id"],
        "straggler_ranks": None if top is None else _int_lists(top["straggler_ranks"]),
        "slow_hops": None if top is None else _int_lists(top["slow_hops"]),
        "straggler_cost_ms": None if top is None else top["cost_ms"],
        "straggler_ratio": None if top is None else top["ratio"],
        "straggler_ratio_p10": None if top is None else top["ratio_p10"],
        "straggler_ratio_p90": None if top is None else top["ratio_p90"],
        "hop_cause": None if top is None else top["hop_cause"],
        "exposed_comm_frac": summary["exposed_comm_frac"].median() if len(summary) else None,
        "overlap_efficiency": summary["overlap_efficiency"].median() if len(summary) else None,
        "imbalance": summary["imbalance"].max() if len(summary) else None,
        "worst_error": None if worst.empty else worst.iloc[0].to_dict(),
        "cases": cases,
    }
    return _plain(document)
