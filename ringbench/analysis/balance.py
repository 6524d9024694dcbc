"""Balance: the work the mask plan gives each rank against the compute time each rank measured.

Per rank and phase, the plan is read off the compute rows: the count of full / causal / partial pairs (the ``pair``
column), and skip pairs = world - computed steps (a skip pair forwards its block without a compute row). The
predicted work is the sum of the ``flops`` column per iteration; the measured work, the sum of compute ms.

    imbalance           = max over ranks / mean over ranks of measured compute ms per iteration
    predicted_imbalance = the same ratio of FLOPs per iteration (what the plan alone implies)

(both defined in ringbench/figures/metrics.py, with the per-rank work they are taken from).

1.0 is perfect balance; causal + contiguous on N ranks predicts about 2N/(N+1) (rank N-1 does almost all the
work), zigzag about 1.0. Medians over iterations, so one slow iteration does not skew a rank.
"""

from __future__ import annotations

import pandas as pd

from ringbench.figures.metrics import imbalance, rank_work

BALANCE_RANK_COLUMNS = [
    "case_id",
    "rank",
    "full",
    "causal",
    "partial",
    "skip",
    "gflop",
    "compute_ms",
    "work_share",
    "time_share",
]
BALANCE_CASE_COLUMNS = ["case_id", "world", "imbalance", "predicted_imbalance", "slowest_rank", "busiest_rank"]
PAIR_COUNTED = ("full", "causal", "partial")


def _world(events: pd.DataFrame, cases: pd.DataFrame | None) -> pd.Series:
    world = events.groupby("case_id", observed=True)["rank"].nunique()
    if cases is not None and not cases.empty and "world" in cases:
        declared = cases.drop_duplicates("case_id").set_index("case_id")["world"]
        world = declared.reindex(world.index).fillna(world).astype(int)
    return world


def balance_ranks(events: pd.DataFrame, cases: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per case and rank: pair counts per phase (full / causal / partial / skip), GFLOP and compute ms per
    iteration, and each rank's share of the case's work and time."""
    comp = events.loc[events["kind"] == "compute", ["case_id", "repeat", "iteration", "phase", "rank", "pair"]]
    if comp.empty:
        return pd.DataFrame(columns=BALANCE_RANK_COLUMNS)
    keys = ["case_id", "repeat", "iteration", "phase", "rank"]
    counts = comp.pivot_table(index=keys, columns="pair", aggfunc="size", observed=True)
    counts = counts.reindex(columns=list(PAIR_COUNTED)).fillna(0)
    # The plan is the same every iteration; the median makes a truncated iteration harmless. Phase: the first one.
    first_phase = comp.groupby("case_id", observed=True)["phase"].min()
    counts = counts.reset_index()
    counts = counts[counts["phase"].to_numpy() == first_phase.reindex(counts["case_id"]).to_numpy()]
    plan = counts.groupby(["case_id", "rank"], observed=True)[list(PAIR_COUNTED)].median()
    world = _world(events, cases).reindex(plan.index.get_level_values("case_id")).to_numpy()
    plan["skip"] = (world - plan[list(PAIR_COUNTED)].sum(axis=1)).clip(lower=0)
    work = rank_work(events).set_index(["case_id", "rank"])
    out = plan.join(work, how="outer").reset_index()
    totals = out.groupby("case_id")[["gflop", "compute_ms"]].transform("sum")
    out["work_share"] = out["gflop"] / totals["gflop"].where(totals["gflop"] > 0)
    out["time_share"] = out["compute_ms"] / totals["compute_ms"].where(totals["compute_ms"] > 0)
    ints = {column: "int64" for column in [*PAIR_COUNTED, "skip"]}
    return out.fillna({c: 0 for c in ints}).astype(ints)[BALANCE_RANK_COLUMNS]


def balance_cases(per_rank: pd.DataFrame, events: pd.DataFrame, cases: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per case: measured and predicted imbalance (metrics.imbalance: max / mean over ranks), the slowest and the
    busiest rank."""
    if per_rank.empty:
        return pd.DataFrame(columns=BALANCE_CASE_COLUMNS)
    out = imbalance(per_rank[["case_id", "rank", "gflop", "compute_ms"]].dropna(subset=["compute_ms"]))
    world = _world(events, cases)
    counted = per_rank.groupby("case_id", sort=False).size()
    out["world"] = [int(world.get(case_id, counted.get(case_id, 0))) for case_id in out["case_id"]]
    return out[BALANCE_CASE_COLUMNS]
