"""Reports: report.html (self-contained), report.md, trace.json (Perfetto) and figures, from a run's analyses."""

from ringbench.report.writer import write_report

__all__ = ["write_report"]
