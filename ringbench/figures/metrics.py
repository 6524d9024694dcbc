"""Every figure ringbench reports, defined once as a function of the record (ringbench/record/schema.py).

The run summary (results.summarize_case), the analyses, the simulator's own summary, the report and the CI gate call
these functions; none computes a figure of its own. docs/results.md ("Figures: one definition each") says why each
definition is the one chosen.

  step time        per iteration: last end - first start over every rank's ``iteration`` rows (both phases); a
                   case reports the median over its iterations, with p10 / p90
  fwd / bwd time   the same over the iteration rows of one phase
  exposed comm     per iteration: the wait / collective time that lies on the iteration's critical path
                   (ringbench/figures/critical_path.py); ``exposed_comm_frac`` = median exposed ms / median step ms
  overlap          overlap efficiency = hidden / comm, with comm the exchanges' time from post to block in hand
                   (summed over ranks and steps) and hidden the part of it during which the rank was not blocked
  imbalance        max / mean over ranks of compute ms per iteration (median over iterations); predicted: the same
                   ratio of the visible score entries the mask plan gives each rank (meta.json ``plans``; the
                   ``flops`` column's FLOPs where the record has no plan), what the plan alone implies
  bytes moved      per iteration: the bytes of every send and collective row, all ranks and phases; a case reports
                   the median over its iterations
  tokens/s         batch x seq / median step time
  TFLOP/s          useful (non-masked) FLOPs per iteration / median step time
  transfer time    per received block: recv end - max(recv post, the sender's post); bandwidth = bytes / that

A record without ``iteration`` rows (an imported trace) times its iterations by the extent of its spans, sends
excepted (a send completes on the receiver's clock and may run past the end). Every function returns the columns
it names, in that order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ringbench.figures.critical_path import (  # noqa: F401 (transfer_window: a figure)
    DEFAULT_TOL_NS,
    critical_path,
    transfer_window,
    with_layer,
)

ITER_KEYS = ["case_id", "repeat", "iteration"]
ITERATION_COLUMNS = [*ITER_KEYS, "step_ms", "fwd_ms", "bwd_ms", "exposed_comm_ms", "gflop"]
FIGURE_COLUMNS = [
    "iterations",
    "step_ms",
    "step_ms_p10",
    "step_ms_p90",
    "fwd_ms",
    "bwd_ms",
    "tokens_per_s",
    "tflops",
    "exposed_comm_ms",
    "exposed_comm_frac",
    "exposed_comm_frac_p10",
    "exposed_comm_frac_p90",
]
# The figures of the cases table (schema.CASE_COLUMNS) that case_figures defines.
CASE_FIGURES = (
    "step_ms",
    "step_ms_p10",
    "step_ms_p90",
    "fwd_ms",
    "bwd_ms",
    "tokens_per_s",
    "tflops",
    "exposed_comm_ms",
    "exposed_comm_frac",
)
COMM_STEP_KEYS = [*ITER_KEYS, "layer", "phase", "step", "rank"]
COMM_STEP_COLUMNS = [*COMM_STEP_KEYS, "compute_ms", "comm_ms", "waited_ms", "hidden_ms"]
RANK_WORK_COLUMNS = ["case_id", "rank", "gflop", "compute_ms"]
IMBALANCE_COLUMNS = ["case_id", "imbalance", "predicted_imbalance", "slowest_rank", "busiest_rank"]
BALANCE_RANK_COLUMNS = ["case_id", "rank", "predicted", "compute_ms", "predicted_share", "time_share"]
LAYER_COLUMNS = ["case_id", "layer", "phase", "compute_ms", "waited_ms", "gflop", "bytes", "computed_pairs"]


def _ms(frame: pd.DataFrame) -> pd.Series:
    return (frame["end_ns"] - frame["start_ns"]) / 1e6


# -- time per iteration -------------------------------------------------------------------------------------------
def _timed_rows(events: pd.DataFrame) -> pd.DataFrame:
    """The rows that time an iteration: ``iteration`` rows, or a case's spans (sends excepted) when it has none."""
    columns = [*ITER_KEYS, "phase", "start_ns", "end_ns"]
    is_iteration = events["kind"] == "iteration"
    rows = events.loc[is_iteration, columns]
    untimed = ~events["case_id"].isin(rows["case_id"].unique()) & ~events["kind"].isin(["send", "iteration"])
    return pd.concat([rows, events.loc[untimed, columns]]) if untimed.any() else rows


def _extent_ms(rows: pd.DataFrame) -> pd.Series:
    grouped = rows.groupby(ITER_KEYS, observed=True, sort=True)
    return (grouped["end_ns"].max() - grouped["start_ns"].min()).astype("float64") / 1e6


def step_times(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, repeat, iteration): ``step_ms``, ``fwd_ms``, ``bwd_ms`` (NaN without that phase)."""
    if events.empty:
        return pd.DataFrame(columns=[*ITER_KEYS, "step_ms", "fwd_ms", "bwd_ms"])
    rows = _timed_rows(events)
    out = pd.DataFrame({"step_ms": _extent_ms(rows)})
    for phase in ("fwd", "bwd"):
        out[f"{phase}_ms"] = _extent_ms(rows[rows["phase"] == phase]).reindex(out.index)
    return out.reset_index()[[*ITER_KEYS, "step_ms", "fwd_ms", "bwd_ms"]]


def exposed_comm(events: pd.DataFrame, path: pd.DataFrame | None = None, tol_ns: int | None = None) -> pd.DataFrame:
    """Per (case, repeat, iteration): ``exposed_comm_ms``, the wait / collective time on the critical path.

    NaN for an iteration recorded without spans (``run --no-trace``): not traced, never a made-up zero.
    ``path``: an already computed critical_path(events) table (it carries the figure per iteration).
    """

    if path is None:
        path = critical_path(events, tol_ns=DEFAULT_TOL_NS if tol_ns is None else tol_ns)
    if path.empty:
        return pd.DataFrame(columns=[*ITER_KEYS, "exposed_comm_ms"])
    exposed = path.groupby(ITER_KEYS, observed=True, sort=True)["exposed_ms"].sum(min_count=1)
    return exposed.rename("exposed_comm_ms").reset_index()


def iteration_figures(events: pd.DataFrame, path: pd.DataFrame | None = None, tol_ns: int | None = None):
    """Per (case, repeat, iteration): step, fwd and bwd ms, exposed communication ms and useful GFLOP."""
    times = step_times(events)
    if times.empty:
        return pd.DataFrame(columns=ITERATION_COLUMNS)
    spans = events["kind"].isin(["compute", "wait", "collective"])
    exposed = exposed_comm(events, path, tol_ns) if spans.any() else pd.DataFrame(columns=[*ITER_KEYS])
    times = times.merge(exposed, on=ITER_KEYS, how="left") if len(exposed) else times.assign(exposed_comm_ms=np.nan)
    comp = events.loc[events["kind"] == "compute", [*ITER_KEYS, "flops"]]
    gflop = (comp.groupby(ITER_KEYS, observed=True)["flops"].sum() / 1e9).rename("gflop")
    times = times.merge(gflop.reset_index(), on=ITER_KEYS, how="left") if len(gflop) else times.assign(gflop=np.nan)
    return times.astype({"exposed_comm_ms": float, "gflop": float})[ITERATION_COLUMNS]


# -- the figures of a case ----------------------------------------------------------------------------------------
def case_figures(
    events: pd.DataFrame,
    cases: pd.DataFrame | None = None,
    *,
    by: Sequence[str] = ("case_id",),
    path: pd.DataFrame | None = None,
    tol_ns: int | None = None,
) -> pd.DataFrame:
    """Per case (``by``: ``("case_id",)`` over all repeats, or ``("case_id", "repeat")``): FIGURE_COLUMNS.

    Medians over timed iterations. ``cases`` supplies batch and seq for tokens/s (NaN without them).
    """
    by = list(by)
    per_iter = iteration_figures(events, path, tol_ns)
    if per_iter.empty:
        return pd.DataFrame(columns=[*by, *FIGURE_COLUMNS])
    per_iter["frac"] = per_iter["exposed_comm_ms"] / per_iter["step_ms"].where(per_iter["step_ms"] > 0)
    grouped = per_iter.groupby(by, observed=True, sort=False)
    out = grouped[["step_ms", "fwd_ms", "bwd_ms", "exposed_comm_ms"]].median()
    out["iterations"] = grouped.size()
    steps = grouped["step_ms"].quantile([0.1, 0.9]).unstack()
    out["step_ms_p10"], out["step_ms_p90"] = steps[0.1], steps[0.9]
    fracs = grouped["frac"].quantile([0.1, 0.9]).unstack()
    out["exposed_comm_frac_p10"], out["exposed_comm_frac_p90"] = fracs[0.1], fracs[0.9]
    step_s = out["step_ms"].where(out["step_ms"] > 0) / 1e3
    out["exposed_comm_frac"] = out["exposed_comm_ms"] / out["step_ms"].where(out["step_ms"] > 0)
    gflop = grouped["gflop"].sum(min_count=1) / out["iterations"]  # useful work per timed iteration
    out["tflops"] = gflop.where(gflop > 0) / step_s / 1e3
    out["tokens_per_s"] = _tokens(out.index, by, cases) / step_s
    return out.reset_index()[[*by, *FIGURE_COLUMNS]]


def _tokens(index: pd.Index, by: list[str], cases: pd.DataFrame | None) -> np.ndarray:
    """batch x seq per row of ``index`` (NaN where the cases table does not say)."""
    ids = index.get_level_values("case_id") if isinstance(index, pd.MultiIndex) else index
    if cases is None or cases.empty or not {"case_id", "batch", "seq"} <= set(cases.columns):
        return np.full(len(ids), np.nan)
    first = cases.drop_duplicates("case_id").set_index("case_id")
    tokens = pd.to_numeric(first["batch"], errors="coerce") * pd.to_numeric(first["seq"], errors="coerce")
    return tokens.reindex(ids).to_numpy(float)


# -- overlap: how much of the exchanges' time the ranks did not spend blocked --------------------------------------
def comm_by_step(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, repeat, iteration, phase, step, rank): compute ms, comm ms (recv spans: post .. block in hand,
    plus collectives), waited ms (wait spans plus collectives: blocked) and hidden ms = max(comm - waited, 0)."""
    kinds = ["compute", "recv", "wait", "collective"]
    events = with_layer(events)
    mask = events["kind"].isin(kinds).to_numpy()
    spans = events.loc[mask, [*COMM_STEP_KEYS, "kind"]]
    if spans.empty:
        return pd.DataFrame(columns=COMM_STEP_COLUMNS)
    spans = spans.assign(ms=(events["end_ns"].to_numpy()[mask] - events["start_ns"].to_numpy()[mask]) / 1e6)
    table = spans.groupby([*COMM_STEP_KEYS, "kind"], observed=True, sort=False)["ms"].sum().unstack("kind")
    table = table.reindex(columns=kinds).fillna(0.0).sort_index()
    out = pd.DataFrame(index=table.index)
    out["compute_ms"] = table["compute"]
    out["comm_ms"] = table["recv"] + table["collective"]  # a collective blocks the rank: comm and waited
    out["waited_ms"] = table["wait"] + table["collective"]
    out["hidden_ms"] = (out["comm_ms"] - out["waited_ms"]).clip(lower=0.0)
    return out.reset_index()[COMM_STEP_COLUMNS]


def overlap_efficiency(steps: pd.DataFrame, by: Sequence[str] = ("case_id",)) -> pd.Series:
    """sum hidden / sum comm of comm_by_step rows per ``by`` (1: fully hidden; 0: ``sync``; NaN: no exchange)."""
    if steps.empty:
        return pd.Series(dtype=float, name="overlap_efficiency")
    totals = steps.groupby(list(by), observed=True, sort=False)[["comm_ms", "hidden_ms"]].sum()
    return (totals["hidden_ms"] / totals["comm_ms"].where(totals["comm_ms"] > 0)).rename("overlap_efficiency")


# -- balance -------------------------------------------------------------------------------------------------------
def rank_work(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, rank): GFLOP and compute ms per iteration (sums over the iteration, median over iterations)."""
    comp = events.loc[events["kind"] == "compute", [*ITER_KEYS, "rank", "flops", "start_ns", "end_ns"]]
    if comp.empty:
        return pd.DataFrame(columns=RANK_WORK_COLUMNS)
    comp = comp.assign(gflop=comp["flops"] / 1e9, compute_ms=_ms(comp))
    per_iter = comp.groupby([*ITER_KEYS, "rank"], observed=True)[["gflop", "compute_ms"]].sum()
    work = per_iter.groupby(level=["case_id", "rank"], observed=True).median()
    return work.reset_index()[RANK_WORK_COLUMNS]


def imbalance(work: pd.DataFrame) -> pd.DataFrame:
    """Per case, from rank_work rows: measured and predicted imbalance (max / mean over ranks), the slowest rank
    (most compute ms) and the busiest one (most FLOPs). 1.0 is perfect balance."""
    if work.empty:
        return pd.DataFrame(columns=IMBALANCE_COLUMNS)
    grouped = work.groupby("case_id", observed=True, sort=False)
    ms, gflop = grouped["compute_ms"], grouped["gflop"]
    out = pd.DataFrame(
        {
            "imbalance": ms.max() / ms.mean().where(ms.mean() > 0),
            "predicted_imbalance": gflop.max() / gflop.mean().where(gflop.mean() > 0),
            "slowest_rank": work.loc[ms.idxmax(), "rank"].to_numpy(np.int64),
            "busiest_rank": work.loc[gflop.idxmax(), "rank"].to_numpy(np.int64),
        }
    )
    return out.reset_index()[IMBALANCE_COLUMNS]


def max_over_mean(values) -> float:
    """The imbalance of per-rank figures: max / mean (1.0 is perfect balance; NaN when the mean is not > 0)."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not len(values) or not values.mean() > 0:
        return float("nan")
    return float(values.max() / values.mean())


def rank_balance(events: pd.DataFrame, predicted: dict | None = None) -> pd.DataFrame:
    """Per (case, rank): the predicted work (``predicted``: case id -> each rank's visible score entries from the
    plan; cases without it take their GFLOP per iteration from the ``flops`` column) and the measured compute ms per
    iteration (rank_work), each as its share of the case's total."""
    work = rank_work(events)
    rows = []
    cases = list(dict.fromkeys([*work["case_id"].astype(str), *(predicted or {})]))
    for case_id in cases:
        mine = work[work["case_id"].astype(str) == case_id].set_index("rank")
        plan = (predicted or {}).get(case_id)
        ranks = range(len(plan)) if plan is not None else mine.index
        for rank in ranks:
            rows.append({
                "case_id": case_id, "rank": int(rank),
                "predicted": float(plan[rank]) if plan is not None else float(mine["gflop"].get(rank, np.nan)),
                "compute_ms": float(mine["compute_ms"].get(rank, np.nan)) if len(mine) else float("nan"),
            })  # fmt: skip
    out = pd.DataFrame(rows, columns=BALANCE_RANK_COLUMNS[:4])
    if out.empty:
        return pd.DataFrame(columns=BALANCE_RANK_COLUMNS)
    totals = out.groupby("case_id")[["predicted", "compute_ms"]].transform("sum")
    out["predicted_share"] = out["predicted"] / totals["predicted"].where(totals["predicted"] > 0)
    out["time_share"] = out["compute_ms"] / totals["compute_ms"].where(totals["compute_ms"] > 0)
    return out[BALANCE_RANK_COLUMNS]


def case_balance(per_rank: pd.DataFrame) -> pd.DataFrame:
    """Per case, from rank_balance rows: ``imbalance`` (max / mean measured compute), ``predicted_imbalance``
    (max / mean predicted work), the slowest rank (most compute ms) and the busiest one (most predicted work)."""
    if per_rank.empty:
        return pd.DataFrame(columns=IMBALANCE_COLUMNS)
    rows = []
    for case_id, group in per_rank.groupby("case_id", sort=False):
        ms, work = group["compute_ms"].to_numpy(float), group["predicted"].to_numpy(float)
        rows.append({
            "case_id": case_id, "imbalance": max_over_mean(ms), "predicted_imbalance": max_over_mean(work),
            "slowest_rank": int(group["rank"].iloc[int(np.nanargmax(ms))]) if np.isfinite(ms).any() else -1,
            "busiest_rank": int(group["rank"].iloc[int(np.nanargmax(work))]) if np.isfinite(work).any() else -1,
        })  # fmt: skip
    return pd.DataFrame(rows, columns=IMBALANCE_COLUMNS)


def bytes_moved(events: pd.DataFrame) -> pd.DataFrame:
    """Per case: ``bytes_moved``, the median over iterations of the bytes of every send and collective row (all
    ranks, both phases, every layer); cases without such rows (untraced, one rank) are absent."""
    rows = events.loc[events["kind"].isin(["send", "collective"]), [*ITER_KEYS, "bytes"]]
    if rows.empty:
        return pd.DataFrame(columns=["case_id", "bytes_moved"])
    per_iter = rows.groupby(ITER_KEYS, observed=True)["bytes"].sum().astype(float)
    return per_iter.groupby(level="case_id", observed=True).median().rename("bytes_moved").reset_index()


def layer_figures(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, layer, phase), medians over iterations of the sums over ranks: compute ms, waited ms, useful
    GFLOP, bytes sent and computed (query rank, key rank) pairs: the analyses' split of an iteration by layer."""
    events = with_layer(events)
    spans = events[events["kind"].isin(["compute", "wait", "send", "collective"])]
    if spans.empty:
        return pd.DataFrame(columns=LAYER_COLUMNS)
    spans = spans.assign(
        ms=_ms(spans),
        compute_ms=lambda f: np.where(f["kind"] == "compute", f["ms"], 0.0),
        waited_ms=lambda f: np.where(f["kind"].isin(["wait", "collective"]), f["ms"], 0.0),
        gflop=lambda f: np.where(f["kind"] == "compute", f["flops"], 0.0) / 1e9,
        sent=lambda f: np.where(f["kind"].isin(["send", "collective"]), f["bytes"], 0).astype(float),
        computed=lambda f: (f["kind"] == "compute").astype(float),
    )
    keys = ["case_id", "repeat", "iteration", "layer", "phase"]
    per_iter = spans.groupby(keys, observed=True)[["compute_ms", "waited_ms", "gflop", "sent", "computed"]].sum()
    out = per_iter.groupby(level=["case_id", "layer", "phase"], observed=True).median().reset_index()
    out = out.rename(columns={"sent": "bytes", "computed": "computed_pairs"})
    return out[LAYER_COLUMNS]


# -- hops ----------------------------------------------------------------------------------------------------------
def bandwidth_gbps(nbytes, transfer_ms) -> np.ndarray:
    """Achieved bandwidth, GB/s: bytes / transfer time (NaN for a zero time)."""
    seconds = np.asarray(transfer_ms, float) / 1e3
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(seconds > 0, np.asarray(nbytes, float) / seconds / 1e9, np.nan)
