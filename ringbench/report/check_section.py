"""The conformance section of a report (`ringbench check --report DIR`): findings, the matrix as a grid, the
low-precision error against world size (table and figure), CP-degree invariance.

Built from the check's tables only (ringbench/analysis/conformance.py defines them); every string is escaped by
the renderers (html.py, markdown.py) like the rest of the report.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from ringbench.analysis.conformance import grid_table, precision_table
from ringbench.record.atomic import write_bytes
from ringbench.report.charts import HIGHLIGHT, Png, rendered
from ringbench.report.html import render_html
from ringbench.report.markdown import render_markdown
from ringbench.report.model import Cell, ReportContent, Section, Table, fmt

SHORT = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
PASS_TEXT = "every case passes: no finding"


@rendered
def precision_figure(precision: pd.DataFrame, rtol: dict[str, float]) -> Figure | None:
    """Worst relative error of out and of the gradients against world size, per low-precision dtype, with each
    dtype's tolerance (a share of the tensor's scale)."""
    if precision.empty:
        return None
    fig = Figure(figsize=(5.6, 3.4), layout="constrained")
    ax = fig.subplots()
    for dtype, group in precision.groupby("dtype", sort=True):
        group = group.sort_values("world")
        label = SHORT.get(str(dtype), str(dtype))
        ax.plot(group["world"], group["out_rel"].clip(lower=1e-12), "-o", label=f"{label} out")
        ax.plot(group["world"], group["grad_rel"].clip(lower=1e-12), "--s", label=f"{label} dq/dk/dv")
        if dtype in rtol:
            ax.axhline(rtol[dtype], color=HIGHLIGHT, linestyle=":", linewidth=1.2, label=f"{label} tolerance")
    worlds = sorted(int(w) for w in precision["world"].unique())
    ax.set_xticks(worlds, [str(w) for w in worlds])
    ax.set_xlabel("CP degree (ranks)")
    ax.set_yscale("log")
    ax.set_ylabel("max |err| / max |ref|")
    ax.set_title("Low-precision error against the CP degree")
    fig.legend(loc="outside lower center", ncols=3, frameon=False)
    return fig


def conformance_section(cases: pd.DataFrame, findings: pd.DataFrame, invariance: pd.DataFrame, *, impl: str,
                        verdict: str, note: str, rtol: dict[str, float] | None = None) -> Section:  # fmt: skip
    rtol = rtol or {}
    ran = cases[cases["status"] != "skip"] if len(cases) else cases
    passed = int((ran["status"] == "pass").sum()) if len(ran) else 0
    lead = f"{impl}: {verdict.upper()} -- {len(findings)} finding(s); {passed} of {len(ran)} case(s) pass. {note}"
    lines = []
    for index, finding in enumerate(findings.to_dict("records"), start=1):
        error = (f"; max abs err {finding['max_abs_err']:.2e} (rel {finding['max_rel_err']:.1e}) against "
                 f"{finding['tolerance']:.1e}" if finding["max_abs_err"] == finding["max_abs_err"] else "")  # fmt: skip
        lines.append(f"{index}. {finding['tensor']} {finding['kind']} on rank(s) "
                     f"{', '.join(map(str, finding['ranks'])) or '-'} in {finding['case_count']} case(s){error}; "
                     f"worst in {finding['worst_case']}; where: {finding['where'][:200]}"
                     + (f"; diagnosis: {finding['diagnosis']}" if finding["diagnosis"] else ""))  # fmt: skip
    if not lines:
        lines.append(PASS_TEXT)
    tables = []
    grid = grid_table(cases)
    if len(grid):
        rows = [[str(v) for v in row] for row in grid.itertuples(index=False)]
        flagged = tuple(i for i, row in enumerate(rows) if any(c and not c.startswith("ok") for c in row[2:]))
        tables.append(Table("The matrix: mask x layout against the CP degree", list(grid.columns), rows,
                            note="ok n: n cases, all pass; KIND f/n: f of n fail, the worst kind shown",
                            highlight=flagged))  # fmt: skip
    precision = precision_table(cases)
    figures = ()
    if len(precision):
        precision = precision.assign(rtol=precision["dtype"].map(rtol).astype(float))
        tables.append(Table("Low precision: worst relative error against the CP degree",
                            ["dtype", "N", "cases", "out", "dq/dk/dv", "tolerance"],
                            [[SHORT.get(r["dtype"], r["dtype"]), str(int(r["world"])), str(int(r["cases"])),
                              fmt(r["out_rel"], ".1e"), fmt(r["grad_rel"], ".1e"), fmt(r["rtol"], ".1e")]
                             for r in precision.to_dict("records")]))  # fmt: skip
        data = precision_figure(precision, rtol)
        if data is not None:
            figures = (Png("check-precision", "Low-precision error against the CP degree", data),)
    if len(invariance):
        rows = [[Cell(str(r["case_id"]), title=str(r["case_id"])), str(r["tensor"]), str(int(r["other_world"])),
                 str(int(r["world"])), fmt(r["max_abs_diff"], ".1e"), fmt(r["tolerance"], ".1e"),
                 "yes" if r["agree"] else "NO"] for r in invariance.to_dict("records")]  # fmt: skip
        tables.append(Table("CP-degree invariance: the same global inputs at two CP degrees",
                            ["case", "tensor", "CP", "against CP", "max |diff|", "tolerance", "agree"], rows,
                            highlight=tuple(i for i, r in enumerate(rows) if r[-1] == "NO"), monospace=(0,)))  # fmt: skip
    failing = cases[cases["status"] == "fail"] if len(cases) else cases
    if len(failing):
        rows = [[Cell(str(r["case_id"]), title=str(r["case_id"])), r["failure"] or "tensors",
                 *(str(r.get(f"{t}_kind", "") or "") for t in ("out", "lse", "dq", "dk", "dv")),
                 str(r["failure_line"])[:120]] for r in failing.to_dict("records")]  # fmt: skip
        tables.append(Table("Failing cases", ["case", "failure", "out", "lse", "dq", "dk", "dv", "line"], rows,
                            monospace=(0,)))  # fmt: skip
    return Section(title=f"Conformance: {impl}", anchor="conformance", lead=lead, lines=tuple(lines),
                   tables=tuple(tables), figures=figures)  # fmt: skip


def write_check_report(cases, findings, invariance, out_dir: str | Path, *, impl: str, verdict: str, note: str,
                       rtol: dict[str, float] | None = None) -> Path:  # fmt: skip
    """``out_dir``/report.html (self-contained) and report.md with the conformance section; returns the HTML path.
    ``rtol``: each dtype's tolerance as a share of the tensor's scale (drawn beside the errors)."""
    section = conformance_section(cases, findings, invariance, impl=impl, verdict=verdict, note=note, rtol=rtol)
    content = ReportContent(run_id=f"check {impl}", label=None, sections=[section])
    folder = Path(out_dir)
    write_bytes(folder / "report.md", render_markdown(content).encode())
    write_bytes(folder / "report.html", render_html(content).encode())
    return folder / "report.html"


__all__ = ["conformance_section", "precision_figure", "write_check_report"]
