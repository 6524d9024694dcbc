"""The report's picture of the mask plan: which (query rank, key rank) pairs compute what, and how the work falls.

``plans_section(analysis)`` gives one section when the record holds plans (meta.json ``plans``; runs and the
simulator write them): for every distinct (mask, layout, ranks, documents) the N x N grid of pair kinds (full /
causal / partial / skip; rows are query ranks, columns key ranks; per layer when the layers differ), and for the
cases traced with more than one rank each rank's predicted work (the plan's visible score entries, as a share of
the case's) beside its measured compute time (a share too), with the imbalance of both (max / mean,
ringbench/figures/metrics.py). Grids are drawn for rings of up to 64 ranks (the plan keeps them that far).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ringbench.analysis.balance import plan_grid
from ringbench.report import charts
from ringbench.report.charts import COLORS, MIN_FONT_PT, rendered
from ringbench.report.model import Section

KINDS = ("skip", "full", "causal", "partial")
KIND_COLORS = ("#F2F2F2", "#4C72B0", "#8FB3DE", "#DD8452")
MAX_GRIDS = 12  # grids in the figure (the most distinct plans first)
MAX_BALANCE = 8  # cases in the balance figure


def _distinct_grids(analysis) -> list[tuple[str, np.ndarray]]:
    """(title, (N, N) kind codes) per distinct plan of the run, in case order."""
    plans = analysis.run.meta.plans
    cases = analysis.run.cases.drop_duplicates("case_id")
    seen, out = set(), []
    for row in cases.to_dict("records"):
        grid = plan_grid(plans, str(row["case_id"]))
        if grid.empty:
            continue
        layers = grid.groupby("layer", sort=True)
        distinct_layers = {tuple(g["kind"]) for _, g in layers}
        docs = str(row.get("docs") or "none")
        for layer, part in layers:
            key = (tuple(part["kind"]), str(row.get("layout")), docs)
            if key in seen:
                continue
            seen.add(key)
            world = int(part["q_rank"].max()) + 1
            codes = np.zeros((world, world), dtype=int)
            codes[part["q_rank"], part["k_rank"]] = [KINDS.index(k) if k in KINDS else 0 for k in part["kind"]]
            where = f"layer {layer}: " if len(distinct_layers) > 1 else ""
            title = f"{where}{part['mask'].iloc[0]} · {row.get('layout')} · {world} ranks"
            if docs != "none":
                title += "\n" + docs[:40]
            out.append((title, codes))
    return out[:MAX_GRIDS]


@rendered
def plan_grids(grids: list[tuple[str, np.ndarray]]) -> Figure | None:
    """Small multiples: one N x N grid of pair kinds per plan (rows: query rank, columns: key rank)."""
    if not grids:
        return None
    columns = min(4, len(grids))
    rows = -(-len(grids) // columns)
    fig = Figure(figsize=(3.1 * columns, 3.3 * rows + 0.9), layout="constrained")
    fig.get_layout_engine().set(h_pad=0.12, w_pad=0.12)
    axes = np.atleast_1d(fig.subplots(rows, columns, squeeze=False)).ravel()
    cmap = ListedColormap(KIND_COLORS)
    for ax, (title, codes) in zip(axes, grids, strict=False):
        world = codes.shape[0]
        ax.imshow(codes, cmap=cmap, vmin=0, vmax=len(KINDS) - 1, interpolation="nearest")
        ticks = np.arange(world) if world <= 16 else np.linspace(0, world - 1, 5).astype(int)
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_xlabel("key rank (block)")
        ax.set_ylabel("query rank")
        ax.set_title(title, fontsize=MIN_FONT_PT)
        for spine in ax.spines.values():
            spine.set_visible(True)
    for ax in axes[len(grids) :]:
        ax.set_visible(False)
    handles = [Patch(facecolor=c, edgecolor="#999", label=k) for k, c in zip(KINDS, KIND_COLORS, strict=True)]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    fig.suptitle("The mask plan: what each (query rank, key rank) pair computes", x=0.0, ha="left")
    return fig


@rendered
def work_against_compute(per_rank: pd.DataFrame, labels: dict[str, str], emulated: bool = False) -> Figure | None:
    """Per case: each rank's share of the predicted work beside its share of the measured compute time
    (``emulated``: the compute times are modelled, and the legend says so)."""
    cases = [c for c in dict.fromkeys(per_rank["case_id"]) if per_rank.loc[per_rank["case_id"] == c,
             "time_share"].notna().any()][:MAX_BALANCE]  # fmt: skip
    if not cases:
        return None
    fig = Figure(figsize=(10.5, 1.2 + 1.9 * len(cases)), layout="constrained")
    fig.get_layout_engine().set(h_pad=0.1)
    axes = fig.subplots(len(cases), 1, squeeze=False)[:, 0]
    for ax, case_id in zip(axes, cases, strict=True):
        part = per_rank[per_rank["case_id"] == case_id].sort_values("rank")
        x = np.arange(len(part))
        work = part["work_share"].to_numpy(float) * 100
        time = part["time_share"].to_numpy(float) * 100
        ax.bar(x - 0.2, work, 0.4, color=COLORS["compute"], label="predicted work (plan)")
        measured = "compute time (EMULATED: modelled durations)" if emulated else "measured compute time"
        ax.bar(x + 0.2, time, 0.4, color=COLORS["transfer"], label=measured)
        ax.axhline(100 / len(part), color="#555", linewidth=0.8, linestyle=":")
        ax.set_xticks(x, [str(r) for r in part["rank"]])
        ax.set_ylabel("% of the case")
        ax.set_title(labels.get(str(case_id), str(case_id)), loc="left", fontsize=MIN_FONT_PT)
    axes[-1].set_xlabel("rank (dotted: an even share)")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncols=2, frameon=False)
    fig.suptitle("Balance: each rank's predicted work beside its measured compute", x=0.0, ha="left")
    return fig


def plans_section(analysis, labels: dict[str, str], table_of):
    """The report's 'Mask plans and balance' section, or None when the record holds no plan."""
    plans = analysis.run.meta.plans
    if not plans:
        return None
    pngs = []
    chart = plan_grids(_distinct_grids(analysis))
    if chart:
        pngs.append(charts.Png("plan_grids", "The mask plan per layout and mask: pair kinds", chart))
    per_rank = analysis.balance_ranks
    per_rank = per_rank[per_rank["case_id"].astype(str).isin(plans)] if len(per_rank) else per_rank
    emulated = bool(analysis.run.emulated)
    chart = work_against_compute(per_rank, labels, emulated) if len(per_rank) else None
    if chart:
        pngs.append(charts.Png("balance", "Predicted work against measured compute per rank", chart))
    cases = analysis.run.cases.drop_duplicates("case_id").copy()
    keep = [c for c in ("case_id", "mask", "layout", "buffer", "world", "docs", "predicted_imbalance", "imbalance",
                        "ring_steps", "kernel_calls", "bytes_moved") if c in cases]  # fmt: skip
    frame = cases[keep].copy()
    frame["label"] = [labels.get(str(c), str(c)) for c in frame["case_id"]]
    frame["mb"] = pd.to_numeric(frame.get("bytes_moved"), errors="coerce") / 1e6
    balance = table_of("Balance and traffic per case", frame, {
        "label": ("case", ""),
        "predicted_imbalance": ("plan imbalance", ".2f"),
        "imbalance": ("measured imbalance", ".2f"),
        "ring_steps": ("ring steps", ".0f"),
        "kernel_calls": ("kernel calls / iteration", ".0f"),
        "mb": ("MB moved / iteration", ".2f"),
    }, "Imbalance: max / mean over ranks, of the plan's visible score entries (plan) and of measured compute "
       "time; ring steps per phase (the short ring stops early); bytes of every send per iteration.")  # fmt: skip
    lead = ("Rows are query ranks, columns the key blocks they meet; skipped pairs cost no arithmetic (and in the "
            "short ring no transfer).")  # fmt: skip
    return Section("Mask plans and balance", lead=lead, figures=tuple(pngs), tables=(balance,), anchor="plans")


__all__ = ["plan_grids", "plans_section", "work_against_compute"]
