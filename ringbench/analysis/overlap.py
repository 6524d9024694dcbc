"""Overlap: how much of the ring's communication was hidden behind compute, per rank and step, case and strategy.

Per (rank, ring step), with the spans recorded at that step (metrics.comm_by_step):

    comm_ms     = sum of recv spans (post .. block in hand): what the exchange took as seen by this rank
    waited_ms   = sum of wait spans (time blocked on the exchange)
    hidden_ms   = max(comm_ms - waited_ms, 0)
    overlap efficiency = sum hidden_ms / sum comm_ms          (1: fully hidden; 0: ``sync``, fully exposed)

``transfer_ms`` (the link's own part of comm_ms, see hops.py) is carried alongside. A ``collective`` span (the
all-gather baseline) blocks the rank: it counts as comm and as waited.

A case's *exposed* communication is not the sum of every rank's waits: it is the wait / collective time on the
critical path of each iteration (metrics.exposed_comm), what perfect overlap would win. A fast rank waiting for a
straggler waits off the path; that time is the straggler's, not the network's. ``exposed_comm_frac`` is the median
exposed ms over the median step time (metrics.case_figures), the same figure as in the cases table; per case the
other columns are medians per iteration of the mean over ranks.

A case recorded without spans (``run --no-trace``: iteration rows only) keeps its iteration time and has NaN for
every communication figure ("not traced"), never a made-up zero.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.figures.critical_path import STEP_KEYS
from ringbench.figures.metrics import case_figures, comm_by_step, overlap_efficiency

RANK_STEP_KEYS = [*STEP_KEYS, "rank"]
OVERLAP_STEP_COLUMNS = [*RANK_STEP_KEYS, "compute_ms", "comm_ms", "transfer_ms", "waited_ms", "hidden_ms"]
OVERLAP_CASE_COLUMNS = [
    "case_id",
    "buffer",
    "iterations",
    "iteration_ms",
    "compute_ms",
    "comm_ms",
    "transfer_ms",
    "waited_ms",
    "hidden_ms",
    "exposed_ms",
    "overlap_efficiency",
    "exposed_comm_frac",
    "exposed_comm_frac_p10",
    "exposed_comm_frac_p90",
]
OVERLAP_BUFFER_COLUMNS = ["buffer", "cases", "comm_ms", "exposed_ms", "overlap_efficiency", "exposed_comm_frac"]
_RANK_MEANS = ["compute_ms", "comm_ms", "transfer_ms", "waited_ms", "hidden_ms"]


def overlap_steps(events: pd.DataFrame, xfers: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (case, repeat, iteration, phase, step, rank): compute, comm, transfer, waited and hidden ms."""
    out = comm_by_step(events)
    out["transfer_ms"] = 0.0
    if xfers is not None and not xfers.empty and len(out):
        moved = xfers.groupby([*STEP_KEYS, "dst"], observed=True)["transfer_ms"].sum()
        moved.index = moved.index.rename(RANK_STEP_KEYS)
        index = pd.MultiIndex.from_frame(out[RANK_STEP_KEYS])
        out["transfer_ms"] = moved.reindex(index).fillna(0.0).to_numpy()
    return out[OVERLAP_STEP_COLUMNS]


def _buffers(cases: pd.DataFrame | None) -> pd.Series:
    if cases is None or cases.empty or "buffer" not in cases:
        return pd.Series(dtype=object)
    return cases.drop_duplicates("case_id").set_index("case_id")["buffer"].astype(str)


def overlap_cases(
    events: pd.DataFrame,
    steps: pd.DataFrame,
    cases: pd.DataFrame | None = None,
    path: pd.DataFrame | None = None,
    tol_ns: int | None = None,
    figures: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per case: step time and exposed share (metrics.case_figures), overlap efficiency, and the medians per
    iteration of the mean over ranks of compute, comm, transfer, waited and hidden ms.

    ``path``: the run's critical_path table when already computed (it carries the exposed time); ``figures``:
    case_figures(events, cases) when already computed.
    """
    if figures is None:
        figures = case_figures(events, cases, path=path, tol_ns=tol_ns)
    if figures.empty:
        return pd.DataFrame(columns=OVERLAP_CASE_COLUMNS)
    out = figures.set_index("case_id").rename(columns={"step_ms": "iteration_ms", "exposed_comm_ms": "exposed_ms"})
    iter_keys = ["case_id", "repeat", "iteration"]
    if len(steps):
        ranks = steps.groupby(iter_keys, observed=True)["rank"].nunique()
        sums = steps.groupby(iter_keys, observed=True)[_RANK_MEANS].sum()
        per_iter = sums.div(ranks.reindex(sums.index), axis=0)  # mean over ranks
        out = out.join(per_iter.groupby(level="case_id", observed=True).median())
        out["overlap_efficiency"] = overlap_efficiency(steps).reindex(out.index)
    out["buffer"] = _buffers(cases).reindex(out.index).fillna("?").to_numpy()
    return out.reset_index().reindex(columns=OVERLAP_CASE_COLUMNS)


def overlap_by_buffer(per_case: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per buffer strategy, over its cases: comm and exposed ms, overlap efficiency, median exposed share.

    With ``steps`` (overlap_steps), the efficiency is metrics.overlap_efficiency over every step of the strategy's
    cases; without, the same ratio of the cases' per-iteration medians.
    """
    if per_case.empty:
        return pd.DataFrame(columns=OVERLAP_BUFFER_COLUMNS)
    grouped = per_case.groupby("buffer", sort=True)
    out = grouped.agg(
        cases=("case_id", "size"),
        comm_ms=("comm_ms", "sum"),
        exposed_ms=("exposed_ms", "sum"),
        exposed_comm_frac=("exposed_comm_frac", "median"),
    )
    if steps is not None and len(steps):
        buffer_of = per_case.set_index("case_id")["buffer"]
        tagged = steps.assign(buffer=buffer_of.reindex(steps["case_id"]).fillna("?").to_numpy())
        out["overlap_efficiency"] = overlap_efficiency(tagged, by=("buffer",)).reindex(out.index)
    else:
        hidden = grouped["hidden_ms"].sum()
        out["overlap_efficiency"] = hidden / out["comm_ms"].where(out["comm_ms"] > 0)
    out = out.replace([np.inf, -np.inf], np.nan)
    return out.reset_index()[OVERLAP_BUFFER_COLUMNS]
