"""What a report says, independent of its format: labels, verdict, figures, tables and extra sections.

Both report.html and report.md render one ``ReportContent``, so the two always carry the same verdicts and the
same tables. Cells are plain strings here; each renderer escapes them for its format.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ringbench.analysis.findings import RunAnalysis, label_line, verdict_lines
from ringbench.analysis.implementations import implementations_table
from ringbench.analysis.stragglers import (
    CONSISTENCY,
    LINK_MARGIN,
    LINK_MIN_EXCESS,
    MIN_EXTRA_SHARE,
    RANK_MARGIN,
    UNIT_QUANTILE,
)
from ringbench.fmt import number
from ringbench.report import figures


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    highlight: tuple[int, ...] = ()  # indices of rows to emphasise (e.g. flagged hops)


@dataclass(frozen=True, slots=True)
class Section:
    """A titled part of the report after the main tables (e.g. placement): summary lines, tables, notes."""

    title: str
    lines: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(slots=True)
class ReportContent:
    run_id: str
    label: str | None
    verdict: list[str]
    figures: list[figures.Png] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    meta: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def fmt(value, spec: str = ".2f") -> str:
    """A cell: numbers with ``spec``, NaN / None as an en dash, everything else as str."""
    if isinstance(value, str):
        return value
    return number(value, spec, missing="–")


def _table(title: str, frame: pd.DataFrame, columns: dict[str, tuple[str, str]], note: str = "") -> Table:
    """columns: source column -> (header, format spec)."""
    rows = [[fmt(row[c], spec) for c, (_, spec) in columns.items()] for _, row in frame.iterrows()]
    return Table(title, [header for header, _ in columns.values()], rows, note)


def _culprit(row) -> str:
    if row["straggler_kind"] == "compute":
        return f"rank {int(row['straggler_rank'])} (compute)"
    if row["straggler_kind"] == "link":
        return f"hop {int(row['slow_hop_src'])} -> {int(row['slow_hop_dst'])} (link)"
    if row.get("confidence") == "inconclusive":
        return "inconclusive"  # the measurement could not have shown one: never "none"
    return "none"


def ring_of(analysis: RunAnalysis, case_id: str) -> list[int]:
    """Ranks in ring order for a case, from the events' ring_position column."""
    rows = analysis.run.events.loc[analysis.run.events["case_id"] == case_id, ["ring_position", "rank"]]
    return [int(r) for r in rows.drop_duplicates().sort_values("ring_position")["rank"]]


def build_content(analysis: RunAnalysis) -> ReportContent:
    from ringbench.report.placement import placement_section

    run = analysis.run
    label = label_line(analysis)
    verdict = [line for line in verdict_lines(analysis) if line != label]  # the label has its own banner
    content = ReportContent(run_id=run.run_id, label=label, verdict=verdict)
    placement = placement_section(run, analysis.hops)
    content.sections = [placement] if placement is not None else []
    focus = analysis.focus_case()
    top = analysis.headline()
    if focus is not None:
        ring = ring_of(analysis, focus)
        iteration = figures.representative_iteration(run.events, focus)
        straggler = None if top is None or top["straggler_kind"] != "compute" else int(top["straggler_rank"])
        hop = None if top is None or top["straggler_kind"] != "link" else (top["slow_hop_src"], top["slow_hop_dst"])
        shown = f"case {focus}" + (f", iteration {int(iteration['iteration'].iloc[0])}" if len(iteration) else "")
        candidates = [
            ("timeline", f"Per-rank timeline ({shown})", lambda: figures.timeline(iteration, analysis.transfers, ring)),
            ("ring", f"Ring and hop latency ({shown})", lambda: figures.ring_diagram(analysis.hops, ring, focus, straggler, hop)),
            ("hops", f"Hop latency heatmap (case {focus})", lambda: figures.hop_heatmap(analysis.hops, focus)),
            ("compute_wait", f"Compute vs wait per rank (case {focus})", lambda: figures.compute_wait_bars(analysis.overlap_steps, ring, focus)),
        ]  # fmt: skip
    else:
        candidates = []
    candidates += [
        ("overlap", "Overlap efficiency per buffer strategy", lambda: figures.overlap_bars(analysis.overlap_buffers)),
        ("errors", "Error against world size", lambda: figures.error_by_world(analysis.numerics)),
    ]
    for name, title, draw in candidates:
        data = draw()
        if data:
            content.figures.append(figures.Png(name, title, data))
    if focus is not None and len(analysis.summary) > 1:
        content.notes.append(f"Per-case figures and tables show case {focus} (the headline straggler's, or the first).")
    content.tables = _tables(analysis, focus)
    content.meta = _meta(run)
    return content


def _tables(analysis: RunAnalysis, focus: str | None) -> list[Table]:
    summary = analysis.summary.copy()
    summary["culprit"] = summary.apply(_culprit, axis=1) if len(summary) else []
    summary["exposed_pct"] = summary["exposed_comm_frac"] * 100
    summary["overlap_pct"] = summary["overlap_efficiency"] * 100
    why = [
        f"{row['case_id']}: {'; '.join(row['inconclusive_reasons'])}"
        for _, row in summary.iterrows()
        if row["confidence"] == "inconclusive" and isinstance(row["inconclusive_reasons"], list)
    ]
    tables = [
        _table(
            "Cases",
            summary,
            {
                "case_id": ("case", ""),
                "buffer": ("buffer", ""),
                "world": ("world", ".0f"),
                "mask": ("mask", ""),
                "layout": ("layout", ""),
                "step_ms": ("iteration ms", ".2f"),
                "confidence": ("confidence", ""),
                "culprit": ("culprit", ""),
                "ratio": ("x peers", ".2f"),
                "cost_ms": ("cost ms/iter", ".2f"),
                "exposed_pct": ("exposed comm % (critical path)", ".1f"),
                "overlap_pct": ("hidden comm %", ".0f"),
                "imbalance": ("imbalance", ".2f"),
                "predicted_imbalance": ("plan imbalance", ".2f"),
                "fwd_max_abs_err": ("fwd err", ".1e"),
                "bwd_max_abs_err": ("bwd err", ".1e"),
                "faults": ("faults", ""),
            },
            "Figures as defined in ringbench/metrics.py (docs/results.md); exposed comm: wait time on the critical "
            "path. Inconclusive: the timings cannot support naming a rank or a hop"
            + (" (" + " | ".join(why) + ")" if why else "."),
        )
    ]
    if focus is not None:
        st = analysis.stragglers[analysis.stragglers["case_id"] == focus].copy()
        st["who"] = [
            f"rank {r}" if k == "rank" else f"hop {a} -> {b}"
            for k, r, a, b in zip(st["resource"], st["rank"], st["src"], st["dst"], strict=True)
        ]
        st["share_pct"] = st["cp_share"] * 100
        st["consistency_pct"] = st["consistency"] * 100
        tables.append(
            _table(
                f"Ranks and links against their peers (case {focus})",
                st,
                {
                    "who": ("resource", ""),
                    "unit": ("unit", ""),
                    "unit_time": ("median", ".4g"),
                    "peer_unit_time": ("peers' median", ".4g"),
                    "ratio": ("ratio", ".2f"),
                    "share_pct": ("critical path %", ".1f"),
                    "cost_ms": ("cost ms/iter", ".2f"),
                    "consistency_pct": ("iterations slower %", ".0f"),
                    "extra_ms": ("extra ms/iter", ".2f"),
                    "flagged": ("flagged", ""),
                },
                f"Unit time: per iteration the p{UNIT_QUANTILE * 100:.0f} of the spans, then the median over iterations. "
                f"Flagged: ratio >= {1 + RANK_MARGIN:.2f} (ranks) or >= {1 + LINK_MARGIN:.2f} (links), slower in "
                f">= {CONSISTENCY * 100:.0f}% of iterations, extra time >= {MIN_EXTRA_SHARE * 100:.0f}% of the "
                f"iteration (links: and >= {LINK_MIN_EXCESS * 100:.0f}% of a step's compute per transfer); a flagged "
                "rank takes precedence over its links. Cost: critical-path time x (1 - 1/ratio).",
            )
        )
        hops = analysis.hops[analysis.hops["case_id"] == focus].copy()
        hops["hop"] = hops["src"].astype(str) + " -> " + hops["dst"].astype(str)
        hops["mb"] = hops["bytes"] / 1e6
        tables.append(
            _table(
                f"Hops (case {focus}; medians)",
                hops,
                {
                    "phase": ("phase", ""),
                    "exchange": ("exchange", ""),
                    "hop": ("hop", ""),
                    "mb": ("MB", ".2f"),
                    "recv_ms": ("recv ms (naive)", ".3f"),
                    "upstream_wait_ms": ("upstream wait ms", ".3f"),
                    "transfer_ms": ("transfer ms", ".3f"),
                    "transfer_ms_p10": ("p10", ".3f"),
                    "transfer_ms_p90": ("p90", ".3f"),
                    "bandwidth_gbps": ("GB/s", ".2f"),
                },
                "transfer = recv end - max(recv post, sender's post); upstream wait = time before the sender posted. "
                "exchange: kv = the K/V block, dkv = the backward's dK/dV accumulator.",
            )
        )
        bal = analysis.balance_ranks[analysis.balance_ranks["case_id"] == focus].copy()
        bal["work_pct"], bal["time_pct"] = bal["work_share"] * 100, bal["time_share"] * 100
        tables.append(
            _table(
                f"Balance (case {focus}; per iteration, medians)",
                bal,
                {
                    "rank": ("rank", ".0f"),
                    "full": ("full", ".0f"),
                    "causal": ("causal", ".0f"),
                    "partial": ("partial", ".0f"),
                    "skip": ("skip", ".0f"),
                    "gflop": ("GFLOP", ".2f"),
                    "compute_ms": ("compute ms", ".2f"),
                    "work_pct": ("work %", ".1f"),
                    "time_pct": ("time %", ".1f"),
                },
                "Pair counts per phase from the mask plan (skip = world - computed steps).",
            )
        )
    buf = analysis.overlap_buffers.copy()
    buf["eff_pct"], buf["exp_pct"] = buf["overlap_efficiency"] * 100, buf["exposed_comm_frac"] * 100
    tables.append(
        _table(
            "Overlap per buffer strategy",
            buf,
            {
                "buffer": ("buffer", ""),
                "cases": ("cases", ".0f"),
                "comm_ms": ("comm ms", ".2f"),
                "exposed_ms": ("exposed ms", ".2f"),
                "eff_pct": ("hidden %", ".0f"),
                "exp_pct": ("exposed share of iteration %", ".1f"),
            },
        )
    )
    tables.append(
        _table(
            "Numerics (max |ring - float64 reference|)",
            analysis.numerics,
            {
                "world": ("world", ".0f"),
                "dtype": ("dtype", ""),
                "cases": ("cases", ".0f"),
                "checked": ("checked", ".0f"),
                "fwd_max_abs_err": ("fwd", ".2e"),
                "bwd_max_abs_err": ("bwd", ".2e"),
                "passed": ("passed", ""),
            },
        )
    )
    cases = analysis.run.cases
    if "impl" in cases and cases["impl"].astype(object).fillna("ringbench").nunique() > 1:
        tables.append(
            _table(
                "Implementations side by side",
                implementations_table(cases),
                {
                    "impl": ("implementation", ""),
                    "world": ("world", ".0f"),
                    "seq": ("seq", ".0f"),
                    "mask": ("mask", ""),
                    "layout": ("layout", ""),
                    "step_ms": ("step ms", ".2f"),
                    "step_ms_p10": ("p10", ".2f"),
                    "step_ms_p90": ("p90", ".2f"),
                    "tokens_per_s": ("tokens/s", ",.0f"),
                    "exposed_comm_frac": ("exposed share", ".1%"),
                    "peak_mem_mb": ("peak MiB", ".0f"),
                    "fwd_max_abs_err": ("fwd err", ".1e"),
                    "bwd_max_abs_err": ("bwd err", ".1e"),
                },
                note="Each implementation on the same workload, fastest first; errors against float64.",
            )
        )
    return tables


def _meta(run) -> list[tuple[str, str]]:
    meta = run.meta
    rows = [("run id", run.run_id), ("results", str(run.path))]
    for key in ("created", "command", "hosts", "versions", "devices", "clock_residual_ns", "faults", "kernel"):
        if key in meta:
            value = meta[key]
            rows.append((key, " ".join(value) if key == "command" and isinstance(value, list) else fmt(value)))
    rows.append(("events", f"{len(run.events):,}"))
    rows.append(("cases", f"{len(run.cases):,}"))
    return rows
