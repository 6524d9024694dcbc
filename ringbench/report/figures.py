"""Figures of the report, drawn from analysis tables (never from raw events beyond one chosen iteration).

Each function returns PNG bytes, or None when its table is empty. Matplotlib runs headless: figures are built
on ``matplotlib.figure.Figure`` (the Agg canvas), never through pyplot's global state.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from ringbench.analysis.hops import hop_matrix

COLORS = {"compute": "#4C72B0", "transfer": "#DD8452", "wait": "#C44E52", "hidden": "#55A868", "path": "#8172B3"}
HIGHLIGHT = "#D62728"


@dataclass(frozen=True, slots=True)
class Png:
    """One rendered figure: a file stem, a caption, and the PNG bytes."""

    name: str
    title: str
    data: bytes


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    return buffer.getvalue()


def representative_iteration(events: pd.DataFrame, case_id: str) -> pd.DataFrame:
    """Events of the median-length iteration of repeat 0 of a case (what the timeline draws: one iteration)."""
    rows = events[(events["case_id"] == case_id) & (events["repeat"] == events["repeat"].min())]
    if rows.empty:
        return rows
    spans = rows.groupby("iteration")[["start_ns", "end_ns"]].agg({"start_ns": "min", "end_ns": "max"})
    length = (spans["end_ns"] - spans["start_ns"]).sort_values(kind="stable")
    chosen = length.index[len(length) // 2]
    return rows[rows["iteration"] == chosen]


def timeline(iteration: pd.DataFrame, xfers: pd.DataFrame, ring: list[int]) -> bytes | None:
    """Per-rank timeline of one iteration: compute, the link's transfer into the rank, exposed wait."""
    if iteration.empty:
        return None
    origin = iteration["start_ns"].min()
    keys = ["case_id", "repeat", "iteration"]
    moved = xfers.merge(iteration[keys].drop_duplicates(), on=keys)
    fig = Figure(figsize=(11, 0.55 * len(ring) + 1.6))
    ax = fig.subplots()
    lanes = {"compute": -0.30, "transfer": 0.0, "wait": 0.30}  # the y axis is inverted: compute on top
    for y, rank in enumerate(ring):
        mine = iteration[iteration["rank"] == rank]
        for kind, frame, start, end in (
            ("compute", mine[mine["kind"] == "compute"], "start_ns", "end_ns"),
            ("transfer", moved[moved["dst"] == rank], "transfer_start_ns", "recv_end_ns"),
            ("wait", mine[mine["kind"] == "wait"], "start_ns", "end_ns"),
        ):
            if frame.empty:
                continue
            x0 = (frame[start].to_numpy(float) - origin) / 1e6
            width = (frame[end].to_numpy(float) - frame[start].to_numpy(float)) / 1e6
            bars = [(a, w) for a, w in zip(x0, width, strict=True) if w > 0]
            ax.broken_barh(
                bars,
                (y + lanes[kind] - 0.13, 0.26),
                facecolors=COLORS[kind],
                edgecolor="white",
                linewidth=0.4,
                label=kind,
            )
        for _, row in mine[mine["kind"] == "compute"].iterrows() if len(ring) <= 16 else []:
            x = (row["start_ns"] - origin) / 1e6
            ax.text(x, y - 0.47, str(int(row["step"])), fontsize=6, color="#333333", va="center")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="upper right", fontsize=8, ncols=3)
    ax.set_yticks(range(len(ring)), [f"rank {r}" for r in ring])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the iteration began (numbers: ring step of each compute)")
    ax.set_title(f"Timeline of iteration {int(iteration['iteration'].iloc[0])} (ranks in ring order)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def hop_heatmap(hops: pd.DataFrame, case_id: str) -> bytes | None:
    """src x dst heatmap of the median transfer time (forward phase), annotated in ms."""
    matrix = hop_matrix(hops, case_id)
    if matrix.empty:
        return None
    values = matrix.to_numpy(float)
    n = len(matrix)
    fig = Figure(figsize=(1.0 + 0.55 * n, 0.8 + 0.5 * n))
    ax = fig.subplots()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis")
    for (i, j), value in np.ndenumerate(values):
        if not math.isnan(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(n), matrix.columns)
    ax.set_yticks(range(n), matrix.index)
    ax.set_xlabel("dst rank")
    ax.set_ylabel("src rank")
    ax.set_title("Median transfer time per hop (ms, fwd)")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return _png(fig)


def ring_diagram(
    hops: pd.DataFrame, ring: list[int], case_id: str, straggler_rank: int | None, slow_hop: tuple | None
) -> bytes | None:
    """Ranks around a circle in ring order; each hop labelled with its median transfer ms; culprit in red."""
    if not ring:
        return None
    matrix = hop_matrix(hops, case_id) if len(hops) else pd.DataFrame()
    n = len(ring)
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / n
    xy = np.c_[np.cos(angle), np.sin(angle)]
    fig = Figure(figsize=(5.2, 5.2))
    ax = fig.subplots()
    for p in range(n):
        src, dst = ring[p], ring[(p + 1) % n]
        if n == 1:
            break
        slow = slow_hop is not None and (src, dst) == tuple(slow_hop)
        arrow = FancyArrowPatch(
            xy[p] * 0.86, xy[(p + 1) % n] * 0.86, connectionstyle="arc3,rad=-0.18", arrowstyle="-|>",
            mutation_scale=14, lw=3.0 if slow else 1.2, color=HIGHLIGHT if slow else "#555555",
        )  # fmt: skip
        ax.add_patch(arrow)
        ms = matrix.at[src, dst] if src in matrix.index and dst in matrix.columns else float("nan")
        mid = (xy[p] + xy[(p + 1) % n]) / 2 * 1.12
        label = "n/a" if math.isnan(ms) else f"{ms:.2f} ms"
        ax.text(*mid, label, ha="center", va="center", fontsize=8, color=HIGHLIGHT if slow else "#222222")
    for p, rank in enumerate(ring):
        bad = straggler_rank is not None and rank == straggler_rank
        ax.scatter(*xy[p], s=700, color=HIGHLIGHT if bad else COLORS["compute"], zorder=3)
        ax.text(*xy[p], str(rank), ha="center", va="center", color="white", fontsize=10, weight="bold", zorder=4)
    ax.set_xlim(-1.4, 1.4)
    ax.set_ylim(-1.4, 1.4)
    ax.set_aspect("equal")
    ax.axis("off")
    culprit = f"rank {straggler_rank}" if straggler_rank is not None else None
    culprit = culprit or (f"hop {slow_hop[0]} -> {slow_hop[1]}" if slow_hop else "none")
    ax.set_title(f"Ring order and hop latency (fwd); culprit: {culprit}", fontsize=10)
    return _png(fig)


def compute_wait_bars(steps: pd.DataFrame, ring: list[int], case_id: str) -> bytes | None:
    """Per rank: median per iteration of compute ms and of the time the rank sat waiting (on or off the path)."""
    rows = steps[steps["case_id"] == case_id]
    if rows.empty:
        return None
    per_iter = rows.groupby(["repeat", "iteration", "rank"])[["compute_ms", "waited_ms"]].sum()
    per_rank = per_iter.groupby(level="rank").median().reindex(ring)
    x = np.arange(len(ring))
    fig = Figure(figsize=(max(5.0, 0.6 * len(ring) + 2), 3.4))
    ax = fig.subplots()
    ax.bar(x - 0.2, per_rank["compute_ms"], 0.4, label="compute", color=COLORS["compute"])
    ax.bar(x + 0.2, per_rank["waited_ms"], 0.4, label="wait", color=COLORS["wait"])
    ax.set_xticks(x, [str(r) for r in ring])
    ax.set_xlabel("rank (ring order)")
    ax.set_ylabel("ms per iteration (median)")
    ax.set_title("Compute vs wait per rank")
    ax.legend(fontsize=8)
    return _png(fig)


def overlap_bars(buffers: pd.DataFrame) -> bytes | None:
    """Overlap efficiency (hidden / total communication) per buffer strategy."""
    if buffers.empty:
        return None
    fig = Figure(figsize=(4.6, 3.2))
    ax = fig.subplots()
    values = buffers["overlap_efficiency"].fillna(0.0).to_numpy() * 100
    ax.bar(buffers["buffer"].astype(str), values, color=COLORS["hidden"])
    for i, value in enumerate(values):
        ax.text(i, value + 1, f"{value:.0f}%", ha="center", fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_ylabel("% of communication hidden")
    ax.set_title("Overlap efficiency per buffer strategy")
    return _png(fig)


def error_by_world(numerics: pd.DataFrame) -> bytes | None:
    """Worst |error| against the float64 reference vs world size, one line per dtype and phase (log scale)."""
    fig = Figure(figsize=(5.4, 3.4))
    ax = fig.subplots()
    drawn = False
    for dtype, group in numerics.groupby("dtype"):
        group = group.sort_values("world")
        for phase, style in (("fwd", "-o"), ("bwd", "--s")):
            values = group[f"{phase}_max_abs_err"].astype(float)
            if values.notna().any() and (values > 0).any():
                ax.plot(group["world"], values.where(values > 0), style, label=f"{dtype} {phase}")
                drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no numerical checks in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    else:
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.set_xlabel("world size")
        ax.set_ylabel("max |ring - reference|")
    ax.set_title("Error against the float64 reference")
    return _png(fig)
