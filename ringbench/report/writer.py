"""write_report: `reports/<run-id>/` with report.html (self-contained), report.md, trace.json and figures/*.png.

Every file is replaced atomically (the store's writer), so a reader never sees half a report.
"""

from __future__ import annotations

import re
from pathlib import Path

from ringbench.analysis.findings import RunAnalysis, analyze
from ringbench.record.atomic import write_bytes
from ringbench.record.store import RunData
from ringbench.report.content import build_content
from ringbench.report.html import render_html
from ringbench.report.markdown import render_markdown
from ringbench.report.trace import DEFAULT_MAX_EVENTS, build_trace


def _safe_name(run_id: str) -> str:
    """A folder name from a run id: no separators, no dot-only names (a run id is user input)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip(".") or "run"
    return name[:120]


def write_report(
    run: RunData,
    out_dir: str | Path = "reports",
    *,
    analysis: RunAnalysis | None = None,
    trace_max_events: int = DEFAULT_MAX_EVENTS,
) -> Path:
    """Write the report of ``run`` under ``out_dir/<run-id>/`` and return that folder.

    ``analysis``: reuse one already computed by ``analyze(run)``.
    """
    analysis = analysis if analysis is not None else analyze(run)
    folder = Path(out_dir) / _safe_name(run.run_id)
    content = build_content(analysis)
    label = {"source": str(run.meta.get("source") or "ringbench"), "simulated": bool(run.meta.get("simulated")),
             "emulated": bool(run.emulated)}  # fmt: skip
    trace = build_trace(analysis.run.events, analysis.transfers, run.run_id, max_events=trace_max_events, label=label)
    if '"capped": true' in trace[:400]:
        content.notes.append(f"trace.json holds the first whole iterations up to {trace_max_events:,} spans.")
    for figure in content.figures:
        write_bytes(folder / "figures" / f"{figure.name}.png", figure.data)
    names = {f"{figure.name}.png" for figure in content.figures}
    for stale in (folder / "figures").glob("*.png"):  # an earlier report of the run drew other cases
        if stale.name not in names:
            stale.unlink()
    write_bytes(folder / "trace.json", trace.encode())
    write_bytes(folder / "report.md", render_markdown(content).encode())
    write_bytes(folder / "report.html", render_html(content).encode())
    return folder
