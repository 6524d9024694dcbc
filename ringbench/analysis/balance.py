"""Balance: the work the mask plan gives each rank against the compute time each rank measured.

Per rank and phase, the plan is read off the compute rows: the count of full / causal / partial pairs (the ``pair``
column), and skip pairs = layers x world - computed steps (a skip pair forwards its block, or in the short ring is
never sent, without a compute row). The predicted work is each rank's visible score entries from the plan
(meta.json ``plans``, written by the run and the simulator); a record without a plan (imported, or written before
plans were kept) predicts from the ``flops`` column instead. The measured work is the sum of compute ms.

    imbalance           = max over ranks / mean over ranks of measured compute ms per iteration
    predicted_imbalance = the same ratio of the predicted work (what the plan alone implies)

(both defined in ringbench/figures/metrics.py: rank_balance, case_balance, max_over_mean).

1.0 is perfect balance; causal + contiguous on N ranks predicts about 2N/(N+1) (rank N-1 does almost all the
work), zigzag about 1.0; a pack of documents unbalances zigzag again, which doc-balanced corrects. Medians over
iterations, so one slow iteration does not skew a rank. ``balance_layers`` splits an iteration by attention layer
and ``plan_grid`` gives the pair kinds of every (query rank, key rank) pair the plan holds, per layer.
"""

from __future__ import annotations

import pandas as pd

from ringbench.figures.metrics import case_balance, layer_figures, rank_balance, with_layer

BALANCE_RANK_COLUMNS = [
    "case_id",
    "rank",
    "full",
    "causal",
    "partial",
    "skip",
    "gflop",
    "compute_ms",
    "predicted",
    "work_share",
    "time_share",
]
BALANCE_CASE_COLUMNS = ["case_id", "world", "imbalance", "predicted_imbalance", "slowest_rank", "busiest_rank"]
GRID_COLUMNS = ["case_id", "layer", "mask", "q_rank", "k_rank", "kind"]
PAIR_COUNTED = ("full", "causal", "partial")


def _world(events: pd.DataFrame, cases: pd.DataFrame | None) -> pd.Series:
    world = events.groupby("case_id", observed=True)["rank"].nunique()
    if cases is not None and not cases.empty and "world" in cases:
        declared = cases.drop_duplicates("case_id").set_index("case_id")["world"]
        world = declared.reindex(world.index).fillna(world).astype(int)
    return world


def _predicted(plans: dict | None) -> dict:
    """case id -> each rank's visible score entries (all layers) from meta.json ``plans``."""
    out = {}
    for case_id, plan in (plans or {}).items():
        visible = plan.get("visible") if isinstance(plan, dict) else None
        if isinstance(visible, list) and visible:
            out[str(case_id)] = [float(x) for x in visible]
    return out


def balance_ranks(events: pd.DataFrame, cases: pd.DataFrame | None = None, plans: dict | None = None) -> pd.DataFrame:
    """Per case and rank: pair counts per phase (full / causal / partial / skip, summed over layers), GFLOP and
    compute ms per iteration, the plan's predicted work (visible entries; NaN without a plan) and each rank's share
    of the case's work (predicted, or GFLOP without a plan) and time."""
    events = with_layer(events)
    comp = events.loc[events["kind"] == "compute", ["case_id", "repeat", "iteration", "phase", "rank", "pair", "layer"]]
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
    layers = events.groupby("case_id", observed=True)["layer"].nunique()
    layers = layers.reindex(plan.index.get_level_values("case_id")).fillna(1).to_numpy()
    plan["skip"] = (layers * world - plan[list(PAIR_COUNTED)].sum(axis=1)).clip(lower=0)
    predicted = _predicted(plans)
    balance = rank_balance(events, predicted).set_index(["case_id", "rank"])
    work = balance[["compute_ms"]].join(_gflop(events), how="left")
    work["predicted"] = [
        balance.loc[idx, "predicted"] if idx[0] in predicted else float("nan") for idx in balance.index
    ]
    plan.index = plan.index.set_levels(plan.index.levels[0].astype(str), level=0)
    out = plan.join(work, how="outer").reset_index()
    totals = out.groupby("case_id")[["gflop", "compute_ms", "predicted"]].transform("sum")
    share_of = out["predicted"].where(out["predicted"].notna(), out["gflop"])
    share_total = totals["predicted"].where(out["predicted"].notna(), totals["gflop"])
    out["work_share"] = share_of / share_total.where(share_total > 0)
    out["time_share"] = out["compute_ms"] / totals["compute_ms"].where(totals["compute_ms"] > 0)
    ints = {column: "int64" for column in [*PAIR_COUNTED, "skip"]}
    return out.fillna({c: 0 for c in ints}).astype(ints)[BALANCE_RANK_COLUMNS]


def _gflop(events: pd.DataFrame) -> pd.DataFrame:
    from ringbench.figures.metrics import rank_work

    work = rank_work(events)
    work["case_id"] = work["case_id"].astype(str)
    return work.set_index(["case_id", "rank"])[["gflop"]]


def balance_cases(per_rank: pd.DataFrame, events: pd.DataFrame, cases: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per case: measured and predicted imbalance (metrics.case_balance: max / mean over ranks), the slowest and
    the busiest rank. The prediction is the plan's visible entries, or the GFLOP where the record has no plan."""
    if per_rank.empty:
        return pd.DataFrame(columns=BALANCE_CASE_COLUMNS)
    rows = per_rank.dropna(subset=["compute_ms"]).copy()
    rows["predicted"] = rows["predicted"].where(rows["predicted"].notna(), rows["gflop"])
    out = case_balance(rows[["case_id", "rank", "predicted", "compute_ms"]])
    world = _world(events, cases)
    world.index = world.index.astype(str)
    counted = per_rank.groupby("case_id", sort=False).size()
    out["world"] = [int(world.get(str(case_id), counted.get(case_id, 0))) for case_id in out["case_id"]]
    return out[BALANCE_CASE_COLUMNS]


def balance_layers(events: pd.DataFrame) -> pd.DataFrame:
    """Per (case, layer, phase): compute, waited, GFLOP, bytes and computed pairs (metrics.layer_figures)."""
    return layer_figures(events)


def plan_grid(plans: dict | None, case_id: str) -> pd.DataFrame:
    """The pair kind of every (query rank, key rank) pair of a case, per layer (meta.json ``plans``; rings of up
    to 64 ranks keep the grid). Empty when the record holds no grid for the case."""
    plan = (plans or {}).get(str(case_id))
    rows = []
    for layer, entry in enumerate(plan.get("layers", []) if isinstance(plan, dict) else []):
        for q, row in enumerate(entry.get("grid") or []):
            for k, kind in enumerate(row):
                rows.append((str(case_id), layer, entry.get("mask", ""), q, k, kind))
    return pd.DataFrame(rows, columns=GRID_COLUMNS)


__all__ = ["balance_cases", "balance_layers", "balance_ranks", "plan_grid"]
