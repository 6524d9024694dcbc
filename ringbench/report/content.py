"""What a report says, independent of its format: the answers, the verdict, sections of figures and tables.

The content model (sections, tables, cells) is model.py; this module assembles the page from it, in order: the
label (INTERRUPTED, SIMULATED / EMULATED, faults), the answers block (the same one that ends ``ringbench run``), the verdict, the
step time per case, the cases table, the cases that matter in detail (case_sections.py), overlap, the mask
plans and balance (plans.py), numerics,
implementations, extra sections (placement, scale) and the run's metadata (run_info.py). Imports run one way:
model <- sections <- content <- writer.
"""

from __future__ import annotations

import pandas as pd

from ringbench.analysis.answers import answers, case_labels
from ringbench.analysis.findings import RunAnalysis, interrupted_line, label_line, verdict_lines
from ringbench.analysis.implementations import implementations_table
from ringbench.report import charts
from ringbench.report.case_sections import case_sections
from ringbench.report.hops_on_topology import placement_section
from ringbench.report.model import (
    Cases,
    Cell,
    ReportContent,
    Section,
    Table,
    cases_of,
    culprit_text,
    fmt,
    frame_rows,
    table,
)
from ringbench.report.plans import plans_section
from ringbench.report.run_info import run_section
from ringbench.report.scale import scale_section
from ringbench.vocab import TOLERANCE


def build_content(analysis: RunAnalysis) -> ReportContent:
    run = analysis.run
    label = label_line(analysis)
    top = " — ".join(line for line in (interrupted_line(run), label) if line)  # an interruption is said first
    content = ReportContent(run_id=run.run_id, label=top or None)
    cases = cases_of(analysis)
    block = answers(analysis, str(run.path)).lines()
    detail = case_sections(analysis, cases)
    if block and block[-1].startswith("next: ringbench report"):  # this is that report: point into it instead
        below = "read the cases in detail below; " if detail.children else ""
        block[-1] = f"next: {below}open trace.json (next to this report) in https://ui.perfetto.dev for every span"
    verdict = [line for line in verdict_lines(analysis) if line != label]  # the label has its own banner
    content.sections.append(Section("Answers", lead=block[0] if block else "", lines=tuple(block[1:]),
                                    anchor="answers"))  # fmt: skip
    content.sections.append(Section("Verdict", lines=tuple(verdict), anchor="verdict"))
    chart = charts.step_time_chart(_chart_rows(cases))
    if chart:
        png = charts.Png("step_time", "Median step time per case, p10–p90", chart)
        content.sections.append(Section("Step time per case", figures=(png,), anchor="step-time"))
    content.sections.append(_cases_section(analysis, cases, {c.anchor for c in detail.children}))
    if detail.children or detail.lines:
        content.sections.append(detail)
    plans = plans_section(analysis, case_labels(run.cases) if len(run.cases) else {}, table)
    if plans is not None:
        content.sections.append(plans)
    content.sections += _run_level_sections(analysis)
    placement = placement_section(run, analysis.hops)
    if placement is not None:
        content.sections.append(placement)
    scale = scale_section((run.meta.get("simulation") or {}).get("scale"))
    if scale is not None:
        content.sections.append(scale)
    content.sections.append(run_section(run))
    return content


def _chart_rows(cases: Cases) -> pd.DataFrame:
    """The step-time chart's rows: one panel per kernel when the kernel varied, sorted by the varied axes."""
    frame = cases.frame.copy()
    by_kernel = "kernel" in cases.varied
    within = [a for a in cases.varied if a != "kernel"] if by_kernel else list(cases.varied)
    frame["panel"] = ""
    if by_kernel:  # titled by the kernel and whatever else its cases share
        for _, part in frame.groupby(frame["kernel"].astype(str), sort=False):
            same = [str(part[a].iloc[0]) for a in within if part[a].astype(str).nunique() == 1]
            frame.loc[part.index, "panel"] = " · ".join([str(part["kernel"].iloc[0]), *same])
    for axis in within:  # the sweep's order of values, not the alphabet's
        order = {value: i for i, value in enumerate(dict.fromkeys(frame[axis].astype(str)))}
        frame[f"_{axis}"] = frame[axis].astype(str).map(order)
    panels = {value: i for i, value in enumerate(dict.fromkeys(frame["panel"]))}
    frame["_panel"] = frame["panel"].map(panels)
    frame = frame.sort_values(["_panel", *(f"_{a}" for a in within), "number"], kind="stable")
    frame["group"] = frame[within[0]].astype(str) if within else ""
    if by_kernel:  # inside a kernel's panel, the kernel need not be repeated
        labels = {}
        for _, part in frame.groupby("panel", sort=False):
            labels.update(case_labels(part.assign(**{"kernel": ""})) if len(within) else {})
        frame["label"] = [labels.get(cid) or lbl for cid, lbl in zip(frame["case_id"], frame["label"], strict=True)]
    frame["label"] = [f"{n}. {lbl}" for n, lbl in zip(frame["number"], frame["label"], strict=True)]
    return frame


def _cases_section(analysis: RunAnalysis, cases: Cases, detailed: set[str]) -> Section:
    frame = cases.frame.copy()
    frame["culprit"] = frame.apply(culprit_text, axis=1) if len(frame) else []
    frame["exposed_pct"] = frame["exposed_comm_frac"] * 100
    frame["overlap_pct"] = frame["overlap_efficiency"] * 100
    frame["spread"] = [
        f"{fmt(a, '.1f')}–{fmt(b, '.1f')}" for a, b in zip(frame["step_ms_p10"], frame["step_ms_p90"], strict=True)
    ]
    columns = {"kernel": ("kernel", "")}
    if "impl" in frame and frame["impl"].astype(object).fillna("ringbench").nunique() > 1:
        columns["impl"] = ("impl", "")
    columns |= {
        "step_ms": ("step ms", ".2f"),
        "spread": ("p10–p90", ""),
        "confidence": ("confidence", ""),
        "culprit": ("culprit", ""),
        "ratio": ("x peers", ".2f"),
        "cost_ms": ("cost ms/iter", ".2f"),
        "exposed_pct": ("exposed comm %", ".1f"),
        "overlap_pct": ("hidden comm %", ".0f"),
        "imbalance": ("imbalance", ".2f"),
        "predicted_imbalance": ("plan imbalance", ".2f"),
        "fwd_max_abs_err": ("fwd err", ".1e"),
        "bwd_max_abs_err": ("bwd err", ".1e"),
    }
    if frame["faults"].fillna("").astype(str).str.len().gt(0).any():
        columns["faults"] = ("faults", "")
    # Figures no case has (nothing checked against float64, no mask plan: an import) are left out, not dashed.
    for name in ("predicted_imbalance", "fwd_max_abs_err", "bwd_max_abs_err"):
        if name in frame and pd.to_numeric(frame[name], errors="coerce").isna().all():
            columns.pop(name)
    headers, body = frame_rows(frame, columns)
    rows = []
    for (_, row), cells in zip(frame.iterrows(), body, strict=True):
        anchor = f"case-{row['number']}"
        number = Cell(str(row["number"]), href=f"#{anchor}" if anchor in detailed else "")
        rows.append([number, Cell(str(row["label"]), title=str(row["case_id"])), *cells])
    reasons = {}
    for _, row in frame.iterrows():
        if row["confidence"] == "inconclusive" and isinstance(row["inconclusive_reasons"], list):
            reasons.setdefault("; ".join(row["inconclusive_reasons"]), []).append(str(row["number"]))
    why = " | ".join(f"case {', '.join(numbers)}: {text}" for text, numbers in reasons.items())
    note = (
        "case: the axes that varied (full ids below; hover for the id). Figures as defined in ringbench/figures/metrics.py (docs/results.md); "
        "exposed comm: wait time on the critical path; x peers and cost: the culprit's. Inconclusive: the timings "
        "cannot support naming a rank or a hop" + (f" ({why})." if why else ".")
    )
    main = Table("", ["#", "case", *headers], rows, note)  # the section is its title
    ids = Table("Case ids", ["#", "case", "case id"],
                [[str(n), str(lbl), str(cid)] for n, lbl, cid in zip(frame["number"], frame["label"],
                                                                    frame["case_id"], strict=True)],
                monospace=(2,))  # fmt: skip
    shared = _shared_axes(analysis.run.cases, cases.varied)
    lines = (f"Every case: {shared}",) if shared else ()
    return Section("Cases", lines=lines, tables=(main, ids), anchor="cases")


SHARED_ORDER = ("world", "seq", "heads", "head_dim", "batch", "dtype", "mask", "layout", "buffer", "order", "kernel",
                "impl", "backward")  # fmt: skip


def _shared_axes(cases: pd.DataFrame, varied: list[str]) -> str:
    """The sweep axes every case shares, in a few words (the table's labels carry the ones that varied)."""
    if cases.empty:
        return ""
    first = cases.iloc[0]
    words = {
        "world": lambda v: f"{v} ranks",
        "seq": lambda v: f"S={v}",
        "heads": lambda v: (
            f"{v} heads" + (f" × {first['head_dim']}" if "head_dim" in first and "head_dim" not in varied else "")
        ),
        "head_dim": lambda v: f"head dim {v}",
        "batch": lambda v: f"batch {v}",
        "mask": lambda v: "no mask" if str(v) == "none" else f"{v} mask",
        "order": lambda v: f"order {v}",
        "impl": lambda v: f"implementation {v}",
        "backward": lambda v: "forward and backward" if str(v).lower() in ("true", "1") else "forward only",
    }
    parts = []
    for axis in SHARED_ORDER:
        if axis not in cases or axis in varied or pd.isna(first[axis]) or (axis, first[axis]) == ("impl", "ringbench"):
            continue
        if axis == "head_dim" and "heads" not in varied:
            continue  # said with the heads: "8 heads × 64"
        parts.append(words.get(axis, str)(first[axis]))
    return ", ".join(parts)


def _run_level_sections(analysis: RunAnalysis) -> list[Section]:
    sections = []
    buf = analysis.overlap_buffers.copy()
    if len(buf):
        buf["eff_pct"], buf["exp_pct"] = buf["overlap_efficiency"] * 100, buf["exposed_comm_frac"] * 100
        chart = charts.overlap_bars(buf)
        overlap = table("Per buffer strategy", buf, {
            "buffer": ("buffer", ""),
            "cases": ("cases", ".0f"),
            "comm_ms": ("comm ms", ".2f"),
            "exposed_ms": ("exposed ms", ".2f"),
            "eff_pct": ("hidden %", ".0f"),
            "exp_pct": ("exposed share of iteration %", ".1f"),
        })  # fmt: skip
        pngs = (charts.Png("overlap", "Overlap efficiency per buffer strategy", chart, half=True),) if chart else ()
        sections.append(Section("Overlap", figures=pngs, tables=(overlap,), anchor="overlap"))
    numerics = table("Max |ring - float64 reference| per world size and dtype", analysis.numerics, {
        "world": ("world", ".0f"),
        "dtype": ("dtype", ""),
        "cases": ("cases", ".0f"),
        "checked": ("checked", ".0f"),
        "fwd_max_abs_err": ("fwd", ".2e"),
        "bwd_max_abs_err": ("bwd", ".2e"),
        "passed": ("passed", ""),
    })  # fmt: skip
    chart = charts.error_figure(analysis.numerics, TOLERANCE)
    pngs = (charts.Png("errors", "Error against the float64 reference", chart, half=True),) if chart else ()
    unchecked = () if chart else ("No case was checked against the float64 reference (run --check), so no figure.",)
    sections.append(Section("Numerics", figures=pngs, tables=(numerics,), notes=unchecked, anchor="numerics"))
    cases = analysis.run.cases
    if "impl" in cases and cases["impl"].astype(object).fillna("ringbench").nunique() > 1:
        impls = table("Implementations side by side", implementations_table(cases), {
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
        }, note="Each implementation on the same workload, fastest first; errors against float64.")  # fmt: skip
        sections.append(Section("Implementations", tables=(impls,), anchor="implementations"))
    return sections
