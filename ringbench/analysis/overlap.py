"""Overlap: how much of the ring's communication was hidden behind compute, per rank and step, case and strategy.

Per (rank, ring step), with the spans recorded at that step:

    comm_ms     = sum of recv spans (post .. block in hand): what the exchange took as seen by this rank
    exposed_ms  = sum of wait spans (time blocked on the exchange)
    hidden_ms   = max(comm_ms - exposed_ms, 0)
    overlap efficiency = sum hidden_ms / sum comm_ms          (1: fully hidden; 0: ``sync``, fully exposed)

``transfer_ms`` (the link's own part of comm_ms, see hops.py) is carried alongside. A ``collective`` span (the
all-gather baseline) blocks the rank: it counts as comm and as exposed.

The exposed-communication share of an iteration is the mean over ranks of the exposed ms divided by the
iteration's wall time (first span to last span across ranks); a case reports its median over iterations.

A case recorded without spans (``run --no-trace``: iteration rows only) keeps its iteration time and has NaN for
every communication figure ("not traced"), never a made-up zero.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.analysis.hops import STEP_KEYS

RANK_STEP_KEYS = [*STEP_KEYS, "rank"]
OVERLAP_STEP_COLUMNS = [*RANK_STEP_KEYS, "compute_ms", "comm_ms", "transfer_ms", "exposed_ms", "hidden_ms"]
OVERLAP_CASE_COLUMNS = [
    "case_id",
    "buffer",
    "iterations",
    "iteration_ms",
    "compute_ms",
    "comm_ms",
    "transfer_ms",
    "exposed_ms",
    "hidden_ms",
    "overlap_efficiency",
    "exposed_comm_frac",
    "exposed_comm_frac_p10",
    "exposed_comm_frac_p90",
]
OVERLAP_BUFFER_COLUMNS = ["buffer", "cases", "comm_ms", "exposed_ms", "overlap_efficiency", "exposed_comm_frac"]


def overlap_steps(events: pd.DataFrame, xfers: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (case, repeat, iteration, phase, step, rank): compute, comm, transfer, exposed and hidden ms."""
    spans = events.loc[events["kind"].isin(["compute", "recv", "wait", "collective"]), [*RANK_STEP_KEYS, "kind"]]
    spans = spans.assign(ms=(events["end_ns"] - events["start_ns"]) / 1e6)
    table = spans.groupby([*RANK_STEP_KEYS, "kind"], observed=True, sort=False)["ms"].sum().unstack("kind")
    table = table.reindex(columns=["compute", "recv", "wait", "collective"]).fillna(0.0).sort_index()
    out = pd.DataFrame(index=table.index)
    out["compute_ms"] = table["compute"]
    out["comm_ms"] = table["recv"] + table["collective"]
    out["exposed_ms"] = table["wait"] + table["collective"]
    out["hidden_ms"] = (out["comm_ms"] - out["exposed_ms"]).clip(lower=0.0)
    out["transfer_ms"] = 0.0
    if xfers is not None and not xfers.empty:
        moved = xfers.groupby([*STEP_KEYS, "dst"], observed=True)["transfer_ms"].sum()
        moved.index = moved.index.rename(RANK_STEP_KEYS)
        out["transfer_ms"] = moved.reindex(out.index).fillna(0.0).to_numpy()
    return out.reset_index()[OVERLAP_STEP_COLUMNS]


def _buffers(cases: pd.DataFrame | None) -> pd.Series:
    if cases is None or cases.empty or "buffer" not in cases:
        return pd.Series(dtype=object)
    return cases.drop_duplicates("case_id").set_index("case_id")["buffer"].astype(str)


def overlap_cases(events: pd.DataFrame, steps: pd.DataFrame, cases: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per case: medians per iteration of the totals (mean over ranks), overlap efficiency, exposed share."""
    iter_keys = ["case_id", "repeat", "iteration"]
    if steps.empty:
        return _untraced_cases(events, cases, iter_keys)
    timed = events[events["kind"] != "send"]  # a send completes on the receiver's clock; it may run past the end
    wall = timed.groupby(iter_keys, observed=True).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    wall_ms = (wall["last"] - wall["first"]) / 1e6
    ranks = steps.groupby(iter_keys, observed=True)["rank"].nunique()  # the small table: fewer rows to scan
    sums = steps.groupby(iter_keys, observed=True)[["compute_ms", "comm_ms", "transfer_ms", "exposed_ms", "hidden_ms"]]
    per_iter = sums.sum().div(ranks.reindex(sums.sum().index), axis=0)  # mean over ranks
    per_iter["iteration_ms"] = wall_ms.reindex(per_iter.index)
    per_iter["frac"] = per_iter["exposed_ms"] / per_iter["iteration_ms"]
    grouped = per_iter.groupby(level="case_id", observed=True, sort=False)
    out = grouped.median()
    out["iterations"] = grouped.size()
    totals = grouped[["comm_ms", "hidden_ms"]].sum()
    out["overlap_efficiency"] = totals["hidden_ms"] / totals["comm_ms"].where(totals["comm_ms"] > 0)
    out["exposed_comm_frac"] = out.pop("frac")
    out["exposed_comm_frac_p10"] = grouped["frac"].quantile(0.1)
    out["exposed_comm_frac_p90"] = grouped["frac"].quantile(0.9)
    out["buffer"] = _buffers(cases).reindex(out.index).fillna("?").to_numpy()
    untraced = _untraced_cases(events[~events["case_id"].isin(out.index)], cases, iter_keys)
    out = out.reset_index()[OVERLAP_CASE_COLUMNS]
    return pd.concat([out, untraced], ignore_index=True) if len(untraced) else out


def _untraced_cases(events: pd.DataFrame, cases: pd.DataFrame | None, iter_keys: list[str]) -> pd.DataFrame:
    """Cases with iteration rows but no spans: their median iteration time, NaN for what was not traced."""
    rows = events[events["kind"] == "iteration"]
    if rows.empty:
        return pd.DataFrame(columns=OVERLAP_CASE_COLUMNS)
    wall = rows.groupby(iter_keys, observed=True).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    wall_ms = ((wall["last"] - wall["first"]) / 1e6).groupby(level="case_id", observed=True)
    out = pd.DataFrame({"iteration_ms": wall_ms.median(), "iterations": wall_ms.size()})
    out["buffer"] = _buffers(cases).reindex(out.index).fillna("?").to_numpy()
    return out.reset_index().reindex(columns=OVERLAP_CASE_COLUMNS)


def overlap_by_buffer(per_case: pd.DataFrame) -> pd.DataFrame:
    """Per buffer strategy, over its cases: comm and exposed ms, overlap efficiency, median exposed share."""
    if per_case.empty:
        return pd.DataFrame(columns=OVERLAP_BUFFER_COLUMNS)
    grouped = per_case.groupby("buffer", sort=True)
    out = grouped.agg(
        cases=("case_id", "size"),
        comm_ms=("comm_ms", "sum"),
        exposed_ms=("exposed_ms", "sum"),
        exposed_comm_frac=("exposed_comm_frac", "median"),
    )
    hidden = grouped["hidden_ms"].sum()
    out["overlap_efficiency"] = hidden / out["comm_ms"].where(out["comm_ms"] > 0)
    out = out.replace([np.inf, -np.inf], np.nan)
    return out.reset_index()[OVERLAP_BUFFER_COLUMNS]
