"""The simulator's "scale" view in a report: step time, exposed communication and efficiency against N, the blast
radius of one slow rank, and ring orders on the topology -- every number SIMULATED (ringbench simulate).

It reads only the record (meta.json ``simulation.scale``), like every other section.
"""

from __future__ import annotations

import io
import math

from ringbench.report import charts
from ringbench.report.model import Section, Table

TITLE = "Scale (SIMULATED)"


def _cell(value, spec: str) -> str:
    return "–" if value is None or value != value else format(value, spec)


def scale_section(view: dict | None) -> Section | None:
    """The section for a simulated record's scale view; None without one."""
    if not view or not (view.get("curves") or view.get("blast") or view.get("orders")):
        return None
    tables = []
    if view.get("curves"):
        rows = [[str(r["world"]), r["buffer"], r["layout"], str(r["seq"]), _cell(r["step_ms"], ".3f"),
                 _cell(r["exposed_comm_ms"], ".3f"), _cell(100 * r["exposed_comm_frac"], ".1f"),
                 _cell(100 * r["efficiency"], ".1f")] for r in view["curves"]]  # fmt: skip
        tables.append(Table("Step time against N", ["N", "buffer", "layout", "S", "step ms", "exposed ms",
                                                     "exposed %", "efficiency %"], rows))  # fmt: skip
    if view.get("blast"):
        factors = sorted({r["factor"] for r in view["blast"]})
        rows = []
        for world in sorted({r["world"] for r in view["blast"]}):
            by = {r["factor"]: r["slowdown"] for r in view["blast"] if r["world"] == world}
            rows.append([str(world), *(f"×{by.get(f, math.nan):.3f}" for f in factors)])
        tables.append(Table("Blast radius: ring step time with one rank k× slower / healthy step time",
                            ["N", *(f"k = {f:g}" for f in factors)], rows))  # fmt: skip
    if view.get("orders"):
        rows = [[r["order"], _cell(r["step_ms"], ".3f"), _cell(100 * r["exposed_comm_frac"], ".1f"),
                 f"×{_cell(r['vs_identity'], '.3f')}"] for r in view["orders"]]  # fmt: skip
        tables.append(Table("Ring orders on the topology", ["order", "step ms", "exposed %", "vs identity"], rows))
    data = scale_figure(view)
    pngs = (charts.Png("scale", "Step time, efficiency and blast radius against N (SIMULATED)", data),) if data else ()
    return Section(TITLE, lead="SIMULATED: every number below is a model's prediction, not a measurement.",
                   tables=tuple(tables), figures=pngs, anchor="scale")  # fmt: skip


def scale_figure(view: dict) -> bytes | None:
    """PNG: step time and efficiency against N per buffer and layout, and the blast radius (None: no data)."""
    if not view.get("curves") and not view.get("blast"):
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.6))
    axes = fig.subplots(1, 3)
    series: dict[tuple[str, str], list[dict]] = {}
    for r in view.get("curves", []):
        series.setdefault((r["buffer"], r["layout"]), []).append(r)
    for (buffer, layout), rows in series.items():
        rows = sorted(rows, key=lambda r: r["world"])
        worlds = [r["world"] for r in rows]
        axes[0].plot(worlds, [r["step_ms"] for r in rows], marker="o", label=f"{layout}/{buffer}")
        axes[1].plot(worlds, [100 * r["efficiency"] for r in rows], marker="o", label=f"{layout}/{buffer}")
    for factor in sorted({r["factor"] for r in view.get("blast", [])}):
        rows = sorted((r for r in view["blast"] if r["factor"] == factor), key=lambda r: r["world"])
        axes[2].plot([r["world"] for r in rows], [r["slowdown"] for r in rows], marker="o", label=f"k = {factor:g}")
    for ax, title, label in ((axes[0], "step time (SIMULATED)", "ms"), (axes[1], "efficiency (SIMULATED)", "%"),
                             (axes[2], "one slow rank: ring slowdown", "× healthy")):  # fmt: skip
        ax.set_xscale("log", base=2)
        if ax is axes[0]:
            ax.set_yscale("log")
        ax.set_xlabel("ranks N")
        ax.set_ylabel(label)
        ax.set_title(title, fontsize=10)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=192, bbox_inches="tight")
    return buffer.getvalue()
