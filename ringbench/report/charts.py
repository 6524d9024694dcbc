"""Run-level figures of the report (step time per case, overlap, numerics) and the style every figure shares.

Each function returns PNG bytes, or None when there is nothing to show (``.figure(...)`` gives the Figure).
Matplotlib runs headless: figures are built on ``matplotlib.figure.Figure`` (the Agg canvas), never through
pyplot's global state. The per-case figures (timeline, ring, hops, compute vs wait) are in case_charts.py.

Resolution: figures are saved at ``DPI`` = 2 x 96 and shown at half their pixel size (report.html sets the image's
width), so a label of ``MIN_FONT_PT`` points is that size on screen at 100% zoom and stays sharp on a 2x display.
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

DPI = 192
MIN_FONT_PT = 9
STYLE = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": MIN_FONT_PT,
    "ytick.labelsize": MIN_FONT_PT,
    "legend.fontsize": MIN_FONT_PT,
    "figure.titlesize": 11,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "text.parse_math": False,  # labels come from the run: a "$" in a case name is a dollar sign, not TeX
}
COLORS = {
    "compute": "#4C72B0",
    "transfer": "#DD8452",
    "transfer_dkv": "#B07AA1",
    "wait": "#5A5A5A",  # grey: red is kept for the culprit
    "own": "#9DB5DA",  # a rank's own work outside its compute spans (imported traces): the compute's hue, lighter
    "sync": "#A9A9A9",  # waiting at a barrier or another collective: the wait's grey, lighter
    "collective": "#7F7F7F",  # an all-gather rotation (no hop), waited on
    "post": "#F2B68C",  # an exchange's post held back on one hop: the transfer's hue, lighter
    "hidden": "#55A868",
    "unjudged": "#A7B0BA",
}
HIGHLIGHT = "#D62728"
MAX_BARS = 80  # cases drawn in the step-time chart (the cases table lists every one)


@dataclass(frozen=True, slots=True)
class Png:
    """One rendered figure: a file stem, a caption, the PNG bytes; ``half``: may sit beside another figure."""

    name: str
    title: str
    data: bytes
    half: bool = False

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels, from the PNG header."""
        return struct.unpack(">II", self.data[16:24])


@dataclass(frozen=True, slots=True)
class Culprit:
    """What a case's figures highlight: a rank (compute) or a hop (link), or neither."""

    rank: int | None = None
    hop: tuple[int, int] | None = None

    @property
    def text(self) -> str:
        if self.rank is not None:
            return f"rank {self.rank} (compute)"
        return f"hop {self.hop[0]} → {self.hop[1]} (link)" if self.hop else "none"

    def touches(self, rank: int) -> bool:
        return rank == self.rank or (self.hop is not None and rank in self.hop)


def rendered(draw):
    """``draw`` builds a Figure (or None: nothing to show) under the report's style (labels of at least MIN_FONT_PT);
    the decorated function returns its PNG bytes, and ``.figure(...)`` the Figure itself (tests read its axes)."""

    @functools.wraps(draw)
    def figure(*args, **kwargs) -> Figure | None:
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    @functools.wraps(draw)
    def to_png(*args, **kwargs) -> bytes | None:
        fig = figure(*args, **kwargs)
        return None if fig is None else png(fig)

    to_png.figure = figure
    return to_png


def png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    # Every figure has a layout engine: no second, "tight" draw. zlib level 1: the same pixels, encoded several
    # times faster than the default level 6 for a file some 20% larger.
    fig.savefig(buffer, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})
    return buffer.getvalue()


@rendered
def step_time_chart(rows: pd.DataFrame) -> Figure | None:
    """Median step time per case with p10–p90 error bars, one horizontal bar per case.

    ``rows``, in display order: label, panel (one panel per value, each with its own scale: e.g. the kernel, since
    emulated and real compute differ by orders of magnitude), group (a line separates groups), step_ms,
    step_ms_p10, step_ms_p90, emulated, judged.
    """
    rows = rows[rows["step_ms"].notna()].head(MAX_BARS)
    if rows.empty:
        return None
    panels = list(dict.fromkeys(rows["panel"]))
    counts = [int((rows["panel"] == p).sum()) for p in panels]
    fig = Figure(figsize=(10.5, 0.75 + 0.34 * len(rows) + 0.55 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, height_ratios=counts, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels, strict=True):
        part = rows[rows["panel"] == panel]
        y = np.arange(len(part))
        median = part["step_ms"].to_numpy(float)
        low = np.clip(median - part["step_ms_p10"].fillna(part["step_ms"]).to_numpy(float), 0, None)
        high = np.clip(part["step_ms_p90"].fillna(part["step_ms"]).to_numpy(float) - median, 0, None)
        judged = part["judged"].to_numpy(bool)
        colors = np.where(judged, COLORS["compute"], COLORS["unjudged"])
        bars = ax.barh(y, median, 0.68, color=colors, xerr=[low, high], error_kw={"ecolor": "#333", "capsize": 3})
        for bar, emulated in zip(bars, part["emulated"].to_numpy(bool), strict=True):
            if emulated:
                bar.set_hatch("///")
                bar.set_edgecolor("white")
        right = float(np.nanmax(median + high))
        for yi, value, extra in zip(y, median, high, strict=True):
            ax.text(value + extra + right * 0.01, yi, f"{value:,.1f} ms", va="center", fontsize=MIN_FONT_PT)
        groups = part["group"].to_numpy()
        for yi in range(1, len(part)):
            if groups[yi] != groups[yi - 1]:
                ax.axhline(yi - 0.5, color="#999", linewidth=0.8, linestyle=":")
        ax.set_yticks(y, part["label"])
        ax.set_ylim(len(part) - 0.5, -0.5)
        ax.set_xlim(0, right * 1.16)
        ax.grid(axis="x", alpha=0.3)
        if len(panels) > 1 or panel:
            ax.set_title(str(panel), loc="left", fontsize=10, weight="bold")
    axes[-1].set_xlabel("median step time per iteration, ms (error bars: p10–p90 over iterations)")
    handles = [Patch(color=COLORS["compute"], label="could be judged")]
    if not rows["judged"].all():
        handles.append(Patch(color=COLORS["unjudged"], label="could not be judged (see the cases table)"))
    if rows["emulated"].any():
        handles.append(
            Patch(facecolor="#777", edgecolor="white", hatch="///", label="modelled compute (emulated or simulated)")
        )
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)
    scales = " (one panel per kernel: each has its own scale)" if len(panels) > 1 else ""
    fig.suptitle(f"Step time per case{scales}", x=0.0, ha="left")
    return fig


@rendered
def overlap_bars(buffers: pd.DataFrame) -> Figure | None:
    """Overlap efficiency (hidden / total communication) per buffer strategy."""
    if buffers.empty:
        return None
    fig = Figure(figsize=(4.8, 3.2), layout="constrained")
    ax = fig.subplots()
    values = buffers["overlap_efficiency"].fillna(0.0).to_numpy() * 100
    ax.bar(buffers["buffer"].astype(str), values, color=COLORS["hidden"], width=0.6)
    for i, value in enumerate(values):
        ax.text(i, value + 2, f"{value:.0f}%", ha="center", fontsize=MIN_FONT_PT)
    ax.set_ylim(0, 112)
    ax.set_xlim(-0.8, len(values) - 0.2)  # one strategy: a bar, not a wall
    ax.set_ylabel("% of communication hidden")
    ax.set_title("Overlap efficiency per buffer strategy")
    return fig


@rendered
def error_figure(numerics: pd.DataFrame, tolerance: dict[str, tuple[float, float]]) -> Figure | None:
    """Worst |error| against the float64 reference (log scale) with each dtype's tolerance; None when nothing
    was checked. One world size: bars per dtype and phase; several: one line per dtype and phase over world."""
    checked = numerics[numerics["checked"] > 0] if len(numerics) else numerics
    if checked.empty:
        return None
    worlds = sorted(int(w) for w in checked["world"].unique())
    fig = Figure(figsize=(5.6, 3.4), layout="constrained")
    ax = fig.subplots()
    if len(worlds) == 1:
        labels, values, limits = [], [], []
        for dtype, group in checked.groupby("dtype", sort=True):
            for index, phase in enumerate(("fwd", "bwd")):
                value = group[f"{phase}_max_abs_err"].astype(float).max()
                if value == value:
                    labels.append(f"{dtype} {phase}")
                    values.append(max(value, 1e-30))  # an exact result still gets a (tiny) bar on the log axis
                    limits.append(tolerance.get(str(dtype), (np.nan, np.nan))[index])
        x = np.arange(len(values))
        ax.bar(x, values, 0.55, color=COLORS["compute"], label="worst |ring - reference|")
        ax.scatter(x, limits, marker="_", s=900, linewidths=2, color=HIGHLIGHT, zorder=3, label="tolerance")
        for xi, value in zip(x, values, strict=True):
            ax.text(xi, value * 1.25, f"{value:.1e}", ha="center", va="bottom", fontsize=MIN_FONT_PT)
        known = [v for v in (*values, *limits) if v == v and v > 0]
        ax.set_ylim(min(known) / 6, max(known) * 6)
        ax.set_xlim(-0.7, len(values) - 0.3)
        ax.set_xticks(x, labels)
        ax.set_title(f"Error against the float64 reference ({worlds[0]} ranks)")
    else:
        for dtype, group in checked.groupby("dtype", sort=True):
            group = group.sort_values("world")
            for phase, style in (("fwd", "-o"), ("bwd", "--s")):
                values = group[f"{phase}_max_abs_err"].astype(float)
                if (values > 0).any():
                    ax.plot(group["world"], values.where(values > 0), style, label=f"{dtype} {phase}")
            limit = tolerance.get(str(dtype), (np.nan, np.nan))[1]
            ax.axhline(limit, color=HIGHLIGHT, linestyle=":", linewidth=1.2, label=f"{dtype} tolerance (bwd)")
        ax.set_xticks(worlds, [str(w) for w in worlds])
        ax.set_xlabel("world size (ranks)")
        ax.set_title("Error against the float64 reference")
    ax.set_yscale("log")
    ax.set_ylabel("max |ring - reference|")
    fig.legend(loc="outside lower center", ncols=3, frameon=False)
    return fig
