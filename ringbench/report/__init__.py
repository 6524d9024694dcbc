"""Reports: report.html (self-contained), report.md, trace.json (Perfetto) and figures, from a run's analyses.

May import: the vocabulary, the record, the figures and the analyses. Never a producer or the engine.
"""

from ringbench.report.writer import write_report

__all__ = ["write_report"]
