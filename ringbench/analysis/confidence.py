"""Confidence: can a case's timings support naming a straggler or a slow hop? If not, why, and how to fix it.

A verdict names a rank or a link only when the measurement could have seen one. A case is *inconclusive* when

  saturated       the emulated kernel outlasted its modelled time in more than SATURATION_SHARE of the case's
                  emulated kernel calls (cases ``saturated_blocks`` / ``emulated_blocks``): real arithmetic on
                  contended cores, not the model, set those spans. Records without ``emulated_blocks`` compare the
                  calls with the compute spans (a span holds one or more calls: errs on the side of caution).
  oversubscribed  real compute on more ranks per host than CPU cores: the ranks take turns on the cores, so a span
                  stretches while its rank is descheduled and the timings measure the scheduler
  clocks          more than CLOCK_VIOLATION_SHARE of its blocks arrive before their sender posted them
  clock bound     the ranks' clocks are aligned to no better than twice the stored residual, and that bound is not
                  small (CLOCK_BOUND_SHARE) against a step's compute: cross-rank order and transfer times are noise
  iterations      fewer than MIN_ITERATIONS timed iterations: a straggler must stand out in most of them
  untraced        no spans were recorded (``run --no-trace``)
  one rank        a ring of one rank has no peers to compare with
  compute         (imported traces) the compute cannot be found: a rank has no compute span, or the median rank's
                  compute spans cover less than COMPUTE_MIN_SHARE of its time, so a wait cannot be told from work
  few_ranks       (set by findings.analyze when nothing is named) in a ring of 2 or 3 ranks a rank passes the
                  alarm's ratio and extra time, but neither its peers nor the wait it causes its successor show it
                  slower in most iterations (analysis/few_ranks.py)
  censored        (imported traces, set by findings.analyze when nothing else is named) a hop's transfers are
                  censored -- nobody waited when its blocks completed -- and their bounds would make it slow: a
                  slow link cannot be told from ranks that took their blocks late

Each reason is one sentence: why, then how to fix it. ``case_confidence`` is a pure function of the events,
cases and metadata (and the clock check's shares, from stragglers.clock_violations).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.record.meta import RunMeta

CONFIDENCE_COLUMNS = ["case_id", "confidence", "inconclusive_reasons", "reason_codes", "reason_details", "reason_fixes"]
CONCLUSIVE, INCONCLUSIVE = "conclusive", "inconclusive"
SATURATION_SHARE = 0.05  # more saturated kernel calls than this share of compute spans: the model did not hold
MIN_ITERATIONS = 3  # consistency across iterations needs at least this many
CLOCK_BOUND_SHARE = 0.10  # the clock alignment bound must be under this share of a median compute span
CLOCK_VIOLATION_SHARE = 0.05  # more transfers than this arriving before they were sent: clocks disagree
COMPUTE_MIN_SHARE = 0.05  # imported: compute and wait spans must cover at least this share of the median rank's time


def oversubscribed_cases(cases: pd.DataFrame, meta: RunMeta) -> frozenset[str]:
    """Cases with real (not emulated) compute on more ranks per host than CPU cores, on CPU.

    There the ranks take turns on the cores: a transfer waits until both of its ranks are scheduled and a
    compute span stretches while its rank is descheduled, so the timings measure the scheduler as much as the
    ranks and links, and neither can be blamed honestly. A run counts its ranks with real compute; an imported
    trace cannot say which ranks compute for real, so it counts the cores its ranks kept busy (their summed share
    of time in CPU ops, per host: meta ``imported.busy_ranks``), the same rule measured.
    """
    return frozenset(_crowding(cases, RunMeta(meta)))


def _crowding(cases: pd.DataFrame, meta: RunMeta) -> dict[str, str]:
    """case id -> the figures that make it oversubscribed (oversubscribed_cases)."""
    cores = meta.cpu_count
    if not cores or meta.device_kind != "cpu" or cases.empty or "world" not in cases:
        return {}
    busy = meta.busy_ranks
    if busy is not None:
        host, demand = max(busy.items(), key=lambda item: item[1])
        if demand <= cores:
            return {}
        where = f" on host {host}" if len(busy) > 1 else ""
        detail = f"{demand:.1f} ranks' worth of CPU work{where} (their time in CPU ops) on {cores} CPU cores"
        return {str(case_id): detail for case_id in cases["case_id"].astype(str).unique()}
    hosts = max(1, len(meta.ranks(int(cases["world"].max())).get("hosts", [1])))
    crowded = (~cases["emulated"].astype(bool)) & (cases["world"] / hosts > cores)
    rows = cases.loc[crowded].drop_duplicates("case_id")
    return {str(r.case_id): f"{int(r.world)} ranks with real compute on {cores} CPU cores" for r in rows.itertuples()}


def _saturated(cases: pd.DataFrame, meta: RunMeta, ids: list[str], world: pd.Series) -> pd.Series:
    """Saturated kernel calls per case: the cases table's column, or (older records) the metadata's per world."""
    out = pd.Series(np.nan, index=pd.Index(ids, dtype=object), dtype=float)
    if not cases.empty and "saturated_blocks" in cases:
        counts = pd.to_numeric(cases["saturated_blocks"], errors="coerce")
        out = counts.groupby(cases["case_id"].astype(str)).sum(min_count=1).reindex(out.index).astype(float)
    for case_id in out.index[out.isna()]:
        value = meta.saturated_blocks(world.get(case_id, ""))
        out[case_id] = float(value) if value is not None else 0.0
    return out


def _case_column(cases: pd.DataFrame, column: str, ids: list[str]) -> pd.Series:
    """A count column of the cases table summed per case (0 where absent: older records)."""
    if cases.empty or column not in cases:
        return pd.Series(0.0, index=pd.Index(ids, dtype=object))
    counts = pd.to_numeric(cases[column], errors="coerce")
    return counts.groupby(cases["case_id"].astype(str)).sum().reindex(ids).fillna(0.0)


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3g} ms"


# code -> (what, why it defeats attribution, how to fix it). A reason reads "<what>: <why> (<figures>); <fix>".
REASONS = {
    "untraced": ("not traced", "only iteration times were recorded", "run again without --no-trace"),
    "saturated": (
        "emulation saturated",
        "real arithmetic on contended cores, not the model, set the compute times",
        "lower the emulated rate (emulated:GFLOPS), use emulated:auto, or run fewer ranks per core",
    ),
    "oversubscribed": (
        "CPU oversubscribed",
        "the ranks' real compute takes turns on the cores, so compute and transfer times include scheduling delays",
        "use an emulated kernel (emulated:auto) or fewer ranks per core",
    ),
    "clocks": (
        "clocks disagree",
        "blocks arrive before their sender posted them",
        "run the ranks on one host or align the hosts' clocks",
    ),
    "clock_bound": (
        "clocks aligned too loosely",
        "the ranks' order in time is not known at the scale of a step",
        "use larger shapes (longer steps) or ranks on one host",
    ),
    "iterations": (
        "too few timed iterations",
        "a straggler must stand out in most of them to be told from noise",
        f"run at least {MIN_ITERATIONS} (--iters)",
    ),
    "one_rank": ("one rank", "a ring of one has no peers to compare with", "run 2 or more ranks"),
    "compute": (
        "compute not found",
        "the ranks' time is mostly in no op the trace names, so a wait cannot be told from work",
        "pass --compute-pattern REGEX naming the attention ops or kernels (or the record_function range around them)",
    ),
    "few_ranks": (
        "too few ranks to decide",
        "with fewer than 4 ranks no majority of peers can outvote a culprit, and the ring's own structure (the "
        "wait a slow rank causes the next) did not settle it either",
        "profile more iterations (a straggler must hold its successor waiting in most of them), give each rank a "
        "core of its own (real compute sharing cores blurs both), or run more ranks",
    ),
    "censored": (
        "transfers censored",
        "no rank was waiting when a hop's blocks completed, so a slow link cannot be told from ranks that took "
        "their blocks late",
        "to tell them apart, wait on the exchange before other work, or put that work in a record_function range, "
        "so the trace shows who waited",
    ),
}


# What fixes a reason in a profiler trace of someone else's program, where ringbench's own remedies (an emulated
# kernel, --iters) do not apply: how to capture a trace that can be judged.
TRACE_FIXES = {
    "oversubscribed": (
        "to make the trace judgeable, capture it with one rank per core (on this host at most {cores} ranks, or "
        "ranks pinned to their own cores, e.g. taskset), with fewer ranks, or on GPUs (a trace with GPU kernels "
        "times the compute on the device, not on shared cores)"
    ),
    "iterations": "profile at least 3 iterations (torch.profiler's schedule with active=3 or more) and import again",
}


def trace_fix(code: str, cores: int | None = None) -> str | None:
    """The fix of a reason for an imported trace (TRACE_FIXES), or None when ringbench's own applies."""
    fix = TRACE_FIXES.get(code)
    return None if fix is None else fix.format(cores=cores if cores else "as many as it has cores")


def reason_sentence(code: str, detail: str, cases: int = 1, fix: str | None = None) -> str:
    """One sentence: what, why it defeats attribution (with the figures that show it), then how to fix it
    (``fix`` instead of the reason's own, e.g. trace_fix for an imported trace)."""
    what, why, own_fix = REASONS[code]
    fix = fix or own_fix
    where = f" in {cases} cases" if cases > 1 else ""
    figures = f" ({'e.g. ' if cases > 1 else ''}{detail})" if detail else ""
    return f"{what}{where}: {why}{figures}; {fix}"


def case_confidence(
    events: pd.DataFrame,
    cases: pd.DataFrame,
    meta: RunMeta | dict | None,
    *,
    violations: pd.Series | None = None,
) -> pd.DataFrame:
    """Per case: ``confidence`` (conclusive | inconclusive), ``inconclusive_reasons`` (sentences), and the same as
    ``reason_codes`` (keys of REASONS) with ``reason_details`` (the case's figures)."""
    meta = RunMeta(meta or {})
    cases = cases if cases is not None else pd.DataFrame(columns=["case_id"])
    ids = list(dict.fromkeys([*map(str, events["case_id"].unique()), *cases.get("case_id", pd.Series()).astype(str)]))
    if not ids:
        return pd.DataFrame(columns=CONFIDENCE_COLUMNS)
    case_of = _text(events["case_id"])
    comp = events[events["kind"] == "compute"]
    spans = comp.groupby(case_of[comp.index]).size().reindex(ids).fillna(0).astype(int)
    compute_ms = ((comp["end_ns"] - comp["start_ns"]) / 1e6).groupby(case_of[comp.index]).median().reindex(ids)
    traced = events[events["kind"].isin(["compute", "wait", "collective"])]
    traced_ids = set(case_of[traced.index].unique())
    timed = events[["repeat", "iteration"]].assign(case_id=case_of).drop_duplicates()
    iterations = timed.groupby("case_id").size().reindex(ids).fillna(0).astype(int)
    world = events.groupby(case_of)["rank"].nunique().reindex(ids)
    if not cases.empty and "world" in cases:
        declared = pd.to_numeric(cases.drop_duplicates("case_id").set_index("case_id")["world"], errors="coerce")
        declared.index = declared.index.astype(str)
        world = declared.reindex(ids).fillna(world)
    world = world.fillna(0).astype(int)
    saturated = _saturated(cases, meta, ids, world)
    calls = _case_column(cases, "emulated_blocks", ids)
    crowded = _crowding(cases, meta)
    bound_ms = 2 * meta.clock_residual_ns() / 1e6
    imported = meta.get("source") == "profiler"
    missing_compute = _compute_missing(events, ids) if imported else {}
    violations = violations if violations is not None else pd.Series(dtype=float)

    rows = []
    for case_id in ids:
        found: list[tuple[str, str]] = []
        if case_id not in traced_ids:
            found.append(("untraced", ""))
        else:
            total = calls[case_id] if calls[case_id] > 0 else None
            share = saturated[case_id] / (total or max(spans[case_id], 1))
            if share > SATURATION_SHARE:
                against = f"of {total:.0f} kernel calls" if total else f"against {spans[case_id]} compute spans"
                found.append(
                    (
                        "saturated",
                        f"{saturated[case_id]:.0f} kernel calls outlasted their modelled time {against}, "
                        f"more than {SATURATION_SHARE:.0%}",
                    )
                )
            if case_id in crowded:
                found.append(("oversubscribed", crowded[case_id]))
            early = float(violations.get(case_id, 0.0) or 0.0)
            if early > CLOCK_VIOLATION_SHARE:
                found.append(("clocks", f"{early:.0%} of blocks, more than {CLOCK_VIOLATION_SHARE:.0%}"))
            median_compute = compute_ms.get(case_id)
            if bound_ms > 0 and pd.notna(median_compute) and bound_ms > CLOCK_BOUND_SHARE * median_compute:
                found.append(
                    ("clock_bound", f"+/-{_fmt_ms(bound_ms)} against {_fmt_ms(median_compute)} of compute per step")
                )
            found += _few_spans(iterations[case_id], world[case_id], missing_compute.get(case_id))
        fixes = [trace_fix(code, meta.cpu_count) if imported else None for code, _ in found]
        rows.append(
            {
                "case_id": case_id,
                "confidence": INCONCLUSIVE if found else CONCLUSIVE,
                "inconclusive_reasons": [reason_sentence(c, d, fix=f) for (c, d), f in zip(found, fixes, strict=True)],
                "reason_codes": [code for code, _ in found],
                "reason_details": [detail for _, detail in found],
                "reason_fixes": fixes,
            }
        )
    return pd.DataFrame(rows, columns=CONFIDENCE_COLUMNS)


def _few_spans(iterations: int, world: int, missing_compute: str | None) -> list[tuple[str, str]]:
    """The reasons about what the record holds: too few iterations, one rank, compute not found."""
    found = []
    if iterations < MIN_ITERATIONS:
        found.append(("iterations", f"{iterations} timed iteration(s)"))
    if world < 2:
        found.append(("one_rank", ""))
    if missing_compute is not None:
        found.append(("compute", missing_compute))
    return found


def _text(column: pd.Series) -> pd.Series:
    """A column as text; a categorical one by its categories (not row by row: a million rows)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.rename_categories([str(c) for c in column.cat.categories])
    return column.astype(str)


def _compute_missing(events: pd.DataFrame, ids: list[str]) -> dict[str, str]:
    """Imported cases whose compute the trace does not show (case id -> the figures): a rank without compute
    spans, or compute spans covering less than COMPUTE_MIN_SHARE of the median rank's iterations."""
    out = {}
    for case_id in ids:
        mine = events[_text(events["case_id"]) == case_id]
        ranks = sorted(mine["rank"].unique())
        iteration = mine[mine["kind"] == "iteration"]
        comp = mine[mine["kind"] == "compute"]
        if comp.empty or iteration.empty:
            continue
        lacking = [int(r) for r in ranks if r not in set(comp["rank"])]
        if lacking:
            out[case_id] = f"rank(s) {', '.join(map(str, lacking[:8]))} with no compute span"
            continue
        total = (iteration["end_ns"] - iteration["start_ns"]).groupby(iteration["rank"]).sum()
        named = mine[mine["kind"].isin(["compute", "wait", "collective"])]
        busy = (named["end_ns"] - named["start_ns"]).groupby(named["rank"]).sum()
        share = float((busy / total.where(total > 0)).clip(upper=1.0).median())
        if share < COMPUTE_MIN_SHARE:
            out[case_id] = f"compute and wait spans cover {share:.1%} of the median rank's time"
    return out


def with_reason(confidence: pd.DataFrame, reasons: dict[str, str], code: str) -> pd.DataFrame:
    """``confidence`` with ``code`` (details per case id in ``reasons``) added to those cases: inconclusive."""
    if not reasons:
        return confidence
    out = confidence.copy()
    for index, row in out.iterrows():
        detail = reasons.get(str(row["case_id"]))
        if detail is None or code in row["reason_codes"]:
            continue
        out.at[index, "reason_codes"] = [*row["reason_codes"], code]
        out.at[index, "reason_details"] = [*row["reason_details"], detail]
        out.at[index, "reason_fixes"] = [*_fixes(row), None]
        out.at[index, "inconclusive_reasons"] = [*row["inconclusive_reasons"], reason_sentence(code, detail)]
        out.at[index, "confidence"] = INCONCLUSIVE
    return out


def run_reasons(confidence: pd.DataFrame, case_ids=None) -> list[str]:
    """The reasons of the inconclusive cases (of ``case_ids``, default all), one sentence per reason: how many
    cases it concerns, the figures of the first, and the fix."""
    rows = confidence[confidence["confidence"] == INCONCLUSIVE]
    if case_ids is not None:
        rows = rows[rows["case_id"].isin(set(case_ids))]
    by_code: dict[str, list[str]] = {}
    fix_of: dict[str, str | None] = {}
    for _, row in rows.iterrows():
        for code, detail, fix in zip(row["reason_codes"], row["reason_details"], _fixes(row), strict=True):
            by_code.setdefault(code, []).append(detail)
            fix_of.setdefault(code, fix)
    return [reason_sentence(code, details[0], len(details), fix_of[code]) for code, details in by_code.items()]


def _fixes(row) -> list:
    """A confidence row's fixes, one per reason (None: the reason's own); older tables have none."""
    fixes = row.get("reason_fixes") if hasattr(row, "get") else None
    codes = list(row["reason_codes"])
    if fixes is None or (isinstance(fixes, float) and np.isnan(fixes)) or len(fixes) != len(codes):
        return [None] * len(codes)
    return list(fixes)


def inconclusive_cases(confidence: pd.DataFrame) -> frozenset[str]:
    """The case ids of case_confidence rows that are inconclusive."""
    if confidence.empty:
        return frozenset()
    return frozenset(confidence.loc[confidence["confidence"] == INCONCLUSIVE, "case_id"].astype(str))
