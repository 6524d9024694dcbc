"""Figures of one case: the timeline of its median iteration, the ring, its hops and compute vs wait per rank.

Drawn from analysis tables and, for the timeline, the events of one chosen iteration. Every figure marks the
case's culprit (``charts.Culprit``) in red: the rank's row and label, or the slow hop's transfers and bar.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Patch

from ringbench.analysis.hops import hop_matrix
from ringbench.report.charts import COLORS, HIGHLIGHT, MIN_FONT_PT, Culprit, rendered

PHASES = {"fwd": "Forward", "bwd": "Backward"}
EXCHANGES = {"kv": "K/V", "dkv": "dK/dV"}
KEYS = ["case_id", "repeat", "iteration"]


def representative_iteration(events: pd.DataFrame, case_id: str) -> pd.DataFrame:
    """Events of the median-length iteration of repeat 0 of a case (what the timeline draws: one iteration)."""
    rows = events[(events["case_id"] == case_id) & (events["repeat"] == events["repeat"].min())]
    if rows.empty:
        return rows
    spans = rows.groupby("iteration")[["start_ns", "end_ns"]].agg({"start_ns": "min", "end_ns": "max"})
    length = (spans["end_ns"] - spans["start_ns"]).sort_values(kind="stable")
    chosen = length.index[len(length) // 2]
    return rows[rows["iteration"] == chosen]


def _bars(ax, frame: pd.DataFrame, start: str, end: str, origin: int, lane: tuple[float, float], color) -> None:
    if frame.empty:
        return
    x0 = (frame[start].to_numpy(float) - origin) / 1e6
    width = (frame[end].to_numpy(float) - frame[start].to_numpy(float)) / 1e6
    keep = width > 0
    ax.broken_barh(list(zip(x0[keep], width[keep], strict=True)), lane, facecolors=color, edgecolor="white",
                   linewidth=0.4)  # fmt: skip


def _lanes(names: list[str]) -> dict[str, tuple[float, float]]:
    """(bottom, height) of each lane inside a rank's row (row spans y-0.42..y+0.42; compute is the thickest)."""
    weights = [2.0 if name == "compute" else 1.0 for name in names]
    unit, top, out = 0.84 / sum(weights), -0.42, {}
    for name, weight in zip(names, weights, strict=True):
        out[name] = (top + 0.04 * unit, weight * unit - 0.08 * unit)
        top += weight * unit
    return out


def _boundary(ax, x: float, text: str, right: bool) -> None:
    ax.axvline(x, color="#444", linestyle="--", linewidth=1.1)
    ax.text(x, 1.0, f" {text} " if right else f" {text}", transform=ax.get_xaxis_transform(), ha="right" if right
            else "left", va="bottom", fontsize=MIN_FONT_PT, color="#444")  # fmt: skip


@rendered
def timeline(iteration: pd.DataFrame, xfers: pd.DataFrame, ring: list[int], culprit: Culprit) -> Figure | None:
    """Per-rank timeline of one iteration, one panel per phase: compute (numbered by ring step within the phase),
    each exchange's transfer into the rank, and the exposed wait. Dashed lines mark where a phase ends and the
    other begins; the culprit rank's row, or the slow hop's transfers, are red."""
    spans = iteration[iteration["kind"].isin(["compute", "own", "wait", "sync", "post"])]
    phases = [phase for phase in PHASES if (spans["phase"] == phase).any()]
    if not phases or not ring:
        return None
    origin = int(iteration["start_ns"].min())
    if len(xfers):  # this iteration's transfers (filtered first: the table holds every iteration's)
        xfers = xfers[xfers["iteration"].isin(iteration["iteration"].unique())]
    moved = xfers.merge(iteration[KEYS].drop_duplicates(), on=KEYS) if len(xfers) else xfers
    extent = {p: (spans.loc[spans["phase"] == p, "start_ns"].min(), spans.loc[spans["phase"] == p, "end_ns"].max())
              for p in phases}  # fmt: skip
    row_in = 0.62 if len(ring) <= 8 else max(0.16, 5.0 / len(ring))
    exchanges = {p: [e for e in EXCHANGES if len(moved) and ((moved["phase"] == p) & (moved["exchange"] == e)).any()]
                 for p in phases}  # fmt: skip
    heights = [len(ring) * row_in * (1 + 0.25 * max(0, len(exchanges[p]) - 1)) + 0.7 for p in phases]
    fig = Figure(figsize=(11.5, sum(heights) + 0.6), layout="constrained")
    axes = fig.subplots(len(phases), 1, height_ratios=heights, squeeze=False)[:, 0]
    for ax, phase in zip(axes, phases, strict=True):
        ins = moved[moved["phase"] == phase] if len(moved) else moved
        _phase_panel(ax, phase, spans[spans["phase"] == phase], ins, exchanges[phase], ring, culprit, origin, extent)
    axes[-1].set_xlabel("ms since the iteration began (numbers on compute: the ring step within the phase)")
    _timeline_legend(fig, exchanges, culprit, set(spans["kind"].astype(str)))
    return fig


def _phase_panel(ax, phase: str, mine: pd.DataFrame, ins: pd.DataFrame, exchanges: list[str], ring: list[int],
                 culprit: Culprit, origin: int, extent: dict[str, tuple[int, int]]) -> None:  # fmt: skip
    """One phase of the timeline: a row per rank in ring order (``mine``: the phase's compute and wait spans,
    ``ins``: its transfers), the phase boundaries and the title."""
    lanes = _lanes(["compute", *exchanges, "wait"])
    start, end = ((v - origin) / 1e6 for v in extent[phase])
    pad = (end - start) * 0.015
    for y, rank in enumerate(ring):
        if rank == culprit.rank:
            ax.axhspan(y - 0.5, y + 0.5, color=HIGHLIGHT, alpha=0.09, linewidth=0)
        own = mine[mine["rank"] == rank]
        compute = own[own["kind"] == "compute"]
        work_lane = (y + lanes["compute"][0], lanes["compute"][1])
        # A rank's own work outside its compute spans (imported traces: other ops, unprofiled code) is its time
        # too: drawn in the compute lane, lighter, so a rank late outside its compute is not an empty row.
        _bars(ax, own[own["kind"] == "own"], "start_ns", "end_ns", origin, work_lane, COLORS["own"])
        _bars(ax, compute, "start_ns", "end_ns", origin, work_lane, COLORS["compute"])
        for exchange in exchanges:
            _transfers_into(ax, ins, rank, exchange, (y + lanes[exchange][0], lanes[exchange][1]), origin, culprit)
        held = own[own["kind"] == "post"]  # a send held back on one hop: that hop's time, on the sender's row
        slow = held["dst"].to_numpy() == culprit.hop[1] if culprit.hop and rank == culprit.hop[0] else None
        _bars(ax, held, "start_ns", "end_ns", origin, work_lane, COLORS["post"] if slow is None else
              [HIGHLIGHT if s else COLORS["post"] for s in slow[(held["end_ns"] > held["start_ns"]).to_numpy()]])  # fmt: skip
        wait_lane = (y + lanes["wait"][0], lanes["wait"][1])
        _bars(ax, own[own["kind"] == "sync"], "start_ns", "end_ns", origin, wait_lane, COLORS["sync"])
        _bars(ax, own[own["kind"] == "wait"], "start_ns", "end_ns", origin, wait_lane, COLORS["wait"])
        if len(ring) <= 16:
            _step_numbers(ax, compute, y + lanes["compute"][0] + lanes["compute"][1] / 2, origin, end - start)
    ax.set_xlim(start - pad, end + pad)
    _phase_boundaries(ax, phase, extent, origin, start, end)
    ax.set_yticks(range(len(ring)), [f"rank {r}" for r in ring])
    for label, rank in zip(ax.get_yticklabels(), ring, strict=True):
        if culprit.touches(rank):
            label.set_color(HIGHLIGHT)
            label.set_fontweight("bold")
    ax.set_ylim(len(ring) - 0.5, -0.5)
    steps = mine.loc[mine["kind"] == "compute", "step"].dropna()
    numbered = f": ring steps {int(steps.min())}–{int(steps.max())}" if len(steps) else ""
    ax.set_title(f"{PHASES[phase]}{numbered}", loc="left", fontsize=10, weight="bold", pad=16)
    ax.grid(axis="x", alpha=0.3)


def _transfers_into(ax, ins: pd.DataFrame, rank: int, exchange: str, lane: tuple[float, float], origin: int,
                    culprit: Culprit) -> None:  # fmt: skip
    """The transfers of ``exchange`` into ``rank``; those over the culprit hop in red."""
    into = ins[(ins["dst"] == rank) & (ins["exchange"] == exchange)]
    slow = (into["src"] == culprit.hop[0]) if culprit.hop and rank == culprit.hop[1] else None
    color = COLORS["transfer"] if exchange == "kv" else COLORS["transfer_dkv"]
    _bars(ax, into if slow is None else into[~slow], "transfer_start_ns", "recv_end_ns", origin, lane, color)
    if slow is not None:
        _bars(ax, into[slow], "transfer_start_ns", "recv_end_ns", origin, lane, HIGHLIGHT)


def _step_numbers(ax, compute: pd.DataFrame, y: float, origin: int, span_ms: float) -> None:
    """Each compute bar's ring step, written on the bar where it fits (``span_ms``: the panel's width)."""
    for s, e, step in zip(compute["start_ns"], compute["end_ns"], compute["step"], strict=True):
        width = (e - s) / 1e6
        if width >= span_ms * 0.011 * (len(str(step)) + 1):
            ax.text((s - origin) / 1e6 + width / 2, y, str(int(step)), ha="center", va="center", color="white",
                    fontsize=MIN_FONT_PT, weight="bold")  # fmt: skip


def _phase_boundaries(ax, phase: str, extent: dict[str, tuple[int, int]], origin: int, start: float, end: float
                      ) -> None:  # fmt: skip
    """The phase boundary (dashed): where this phase ends or begins; dotted: where the other phase begins or ends
    when the two overlap across ranks (a rank may start its backward before the last ends its forward)."""
    if phase == "fwd":
        first = (extent["bwd"][0] - origin) / 1e6 if "bwd" in extent else end
        overlap = first < end - (end - start) * 0.02
        _boundary(ax, end, "forward ends" + ("; dotted: first backward begins" if overlap else ""), right=True)
        if overlap:
            ax.axvline(first, color="#444", linestyle=":", linewidth=1.1)
    else:
        last = (extent["fwd"][1] - origin) / 1e6 if "fwd" in extent else start
        overlap = last > start + (end - start) * 0.02
        _boundary(ax, start, "backward begins" + ("; dotted: last forward ends" if overlap else ""), right=False)
        if overlap:
            ax.axvline(last, color="#444", linestyle=":", linewidth=1.1)


def _timeline_legend(fig: Figure, exchanges: dict[str, list[str]], culprit: Culprit, kinds: set[str]) -> None:
    handles = [Patch(color=COLORS["compute"], label="compute")]
    if "own" in kinds:
        handles.append(Patch(color=COLORS["own"], label="own work outside compute"))
    if "post" in kinds:
        handles.append(Patch(color=COLORS["post"], label="send held back"))
    if any("kv" in e for e in exchanges.values()):
        handles.append(Patch(color=COLORS["transfer"], label="K/V transfer into the rank"))
    if any("dkv" in e for e in exchanges.values()):
        handles.append(Patch(color=COLORS["transfer_dkv"], label="dK/dV transfer into the rank"))
    handles.append(Patch(color=COLORS["wait"], label="exposed wait"))
    if "sync" in kinds:
        handles.append(Patch(color=COLORS["sync"], label="barrier"))
    if culprit.rank is not None or culprit.hop:
        handles.append(Patch(color=HIGHLIGHT, alpha=0.5, label=f"culprit: {culprit.text}"))
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 5), frameon=False)


@rendered
def ring_diagram(hops: pd.DataFrame, ring: list[int], case_id: str, culprit: Culprit) -> Figure | None:
    """Ranks around a circle in ring order; each hop labelled with its median forward K/V transfer ms."""
    if len(ring) < 2:
        return None
    matrix = hop_matrix(hops, case_id) if len(hops) else pd.DataFrame()
    n = len(ring)
    angle = np.pi / 2 - 2 * np.pi * np.arange(n) / n
    xy = np.c_[np.cos(angle), np.sin(angle)]
    fig = Figure(figsize=(4.2, 4.3), layout="constrained")
    ax = fig.subplots()
    small = n > 12
    for p in range(n):
        src, dst = ring[p], ring[(p + 1) % n]
        slow = culprit.hop is not None and (src, dst) == tuple(culprit.hop)
        arrow = FancyArrowPatch(
            xy[p] * 0.86, xy[(p + 1) % n] * 0.86, connectionstyle="arc3,rad=-0.18", arrowstyle="-|>",
            mutation_scale=14, lw=3.0 if slow else 1.2, color=HIGHLIGHT if slow else "#555555",
        )  # fmt: skip
        ax.add_patch(arrow)
        if small and not slow:
            continue
        ms = matrix.at[src, dst] if src in matrix.index and dst in matrix.columns else math.nan
        mid = (xy[p] + xy[(p + 1) % n]) / 2 * 1.16
        label = "n/a" if math.isnan(ms) else f"{ms:.2f} ms"
        ax.text(*mid, label, ha="center", va="center", fontsize=MIN_FONT_PT, color=HIGHLIGHT if slow else "#222",
                weight="bold" if slow else "normal")  # fmt: skip
    for p, rank in enumerate(ring):
        bad = rank == culprit.rank
        ax.scatter(*xy[p], s=200 if small else 650, color=HIGHLIGHT if bad else COLORS["compute"], zorder=3)
        ax.text(*xy[p], str(rank), ha="center", va="center", color="white", fontsize=MIN_FONT_PT if small else 11,
                weight="bold", zorder=4)  # fmt: skip
    ax.set_xlim(-1.45, 1.45)
    ax.set_ylim(-1.45, 1.45)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Ring order, median fwd K/V transfer per hop\nculprit: {culprit.text}", fontsize=10)
    return fig


def _ring_hops(rows: pd.DataFrame, ring: list[int]) -> pd.DataFrame:
    """One row per hop of the ring, in ring order (NaN where the record has no transfer on that hop)."""
    hops = pd.DataFrame({"src": ring, "dst": ring[1:] + ring[:1]})
    return hops.merge(rows, on=["src", "dst"], how="left")


@rendered
def hop_bars(hops: pd.DataFrame, case_id: str, ring: list[int], culprit: Culprit) -> Figure | None:
    """Median transfer time of each ring hop in ring order, p10–p90 error bars, one panel per exchange (fwd K/V,
    bwd K/V, bwd dK/dV). Only the ring's hops: an N x N matrix of a ring is mostly empty."""
    rows = hops[hops["case_id"] == case_id]
    if rows.empty or len(ring) < 2:
        return None
    groups = [(p, e) for p in PHASES for e in EXCHANGES if ((rows["phase"] == p) & (rows["exchange"] == e)).any()]
    if not groups:
        return None
    n = len(ring)
    width = min(11.5, 1.0 + len(groups) * (0.28 * n + 0.6))
    fig = Figure(figsize=(max(width, 4.8), 3.5), layout="constrained")
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    step = max(1, math.ceil(n / 16))  # tick labels stay legible on large rings
    for ax, (phase, exchange) in zip(axes, groups, strict=True):
        part = _ring_hops(rows[(rows["phase"] == phase) & (rows["exchange"] == exchange)], ring)
        x = np.arange(n)
        median = part["transfer_ms"].to_numpy(float)
        low = np.clip(median - part["transfer_ms_p10"].to_numpy(float), 0, None)
        high = np.clip(part["transfer_ms_p90"].to_numpy(float) - median, 0, None)
        slow = [culprit.hop is not None and (s, d) == tuple(culprit.hop) for s, d in zip(part["src"], part["dst"],
                                                                                         strict=True)]  # fmt: skip
        color = COLORS["transfer"] if exchange == "kv" else COLORS["transfer_dkv"]
        ax.bar(x, np.nan_to_num(median), 0.7, color=[HIGHLIGHT if s else color for s in slow],
               yerr=[np.nan_to_num(low), np.nan_to_num(high)], error_kw={"ecolor": "#333", "capsize": 2})  # fmt: skip
        labels = [f"{s}→{d}" if i % step == 0 or slow[i] else "" for i, (s, d) in enumerate(zip(part["src"],
                  part["dst"], strict=True))]  # fmt: skip
        ax.set_xticks(x, labels, rotation=90 if n > 8 else 0)
        for label, s, d, bad in zip(ax.get_xticklabels(), part["src"], part["dst"], slow, strict=True):
            if bad or culprit.rank in (s, d):
                label.set_color(HIGHLIGHT)
                label.set_fontweight("bold")
        ax.set_title(f"{phase} {EXCHANGES[exchange]}", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("transfer ms (median, p10–p90)")
    note = {True: "hops touching it labelled red", False: "in red"}[culprit.rank is not None]
    culprit_text = f"culprit: {culprit.text}, {note}" if culprit.rank is not None or culprit.hop else "no culprit"
    fig.suptitle(f"Transfer time per ring hop, in ring order\n{culprit_text}", fontsize=10)
    return fig


@rendered
def compute_wait_bars(events: pd.DataFrame, ring: list[int], case_id: str, culprit: Culprit) -> Figure | None:
    """Per rank, medians per iteration, stacked: its own time (compute, and own work outside compute spans in an
    imported trace) beside the time it sat blocked (waiting on an exchange, at a barrier or collective)."""
    rows = events[(events["case_id"] == case_id) & events["kind"].isin(list(WORK_STACK) + list(WAIT_STACK))]
    if rows.empty:
        return None
    ms = (rows["end_ns"] - rows["start_ns"]) / 1e6
    per_iter = ms.groupby([rows["repeat"], rows["iteration"], rows["rank"], rows["kind"].astype(str)]).sum()
    wide = per_iter.unstack("kind").fillna(0.0)
    per_rank = wide.groupby(level="rank").median().reindex(ring).fillna(0.0)
    x = np.arange(len(ring))
    fig = Figure(figsize=(max(4.8, 0.45 * len(ring) + 2.4), 3.6), layout="constrained")
    ax = fig.subplots()
    bad = [culprit.touches(r) for r in ring]
    edges = [HIGHLIGHT if b else "none" for b in bad]
    for offset, stack in ((-0.2, WORK_STACK), (0.2, WAIT_STACK)):
        bottom = np.zeros(len(ring))
        for kind, label in stack.items():
            if kind not in per_rank or not (per_rank[kind] > 0).any():
                continue
            values = per_rank[kind].to_numpy(float)
            ax.bar(x + offset, values, 0.4, bottom=bottom, label=label, color=COLORS[kind], edgecolor=edges,
                   linewidth=2)  # fmt: skip
            bottom += values
    step = max(1, math.ceil(len(ring) / 24))
    ax.set_xticks(x, [str(r) if i % step == 0 or bad[i] else "" for i, r in enumerate(ring)])
    for label, b in zip(ax.get_xticklabels(), bad, strict=True):
        if b:
            label.set_color(HIGHLIGHT)
            label.set_fontweight("bold")
    ax.set_xlabel("rank (ring order); left: its own time, right: blocked")
    ax.set_ylabel("ms per iteration (median)")
    suffix = f"\nculprit: {culprit.text}, in red" if culprit.rank is not None or culprit.hop else ""
    ax.set_title(f"Compute vs wait per rank{suffix}", fontsize=10)
    fig.legend(loc="outside lower center", ncols=3, frameon=False)
    return fig


WORK_STACK = {"compute": "compute", "own": "own work", "post": "send held back"}
WAIT_STACK = {"wait": "wait (exchange)", "sync": "barrier", "collective": "collective"}
