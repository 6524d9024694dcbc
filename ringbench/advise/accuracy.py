"""The simulator's measured accuracy per strategy: what ``ringbench plan`` quotes in its confidence line.

Filled from ``python benchmarks/validate_strategies.py`` (measured runs on an emulated two-host cluster, predicted
with ``simulate --like ... --from ...``; docs/simulate.md, "Accuracy against measurement"). Each entry: the cases
compared, the median and worst |error| of the predicted step time, and where and when it was measured.
"""

from __future__ import annotations

from ringbench.fmt import number

_WHERE = "8 ranks as 2 emulated hosts x 4 on a 2-core CPU, S 4096 and 16384, 7 December 2026"
MEASURED: dict[str, dict] = {
    "ring": {"cases": 2, "median_pct": 0.6, "worst_pct": 1.2, "where": _WHERE},
    "allgather": {"cases": 2, "median_pct": 6.1, "worst_pct": 6.7, "where": _WHERE},
    "ulysses": {"cases": 2, "median_pct": 1.9, "worst_pct": 3.0, "where": _WHERE},
    "hybrid": {"cases": 8, "median_pct": 1.5, "worst_pct": 6.4, "where": _WHERE},
    "double-ring": {"cases": 8, "median_pct": 1.9, "worst_pct": 11.2, "where": _WHERE},
}


def accuracy_line(kind: str) -> str:
    """One phrase: the measured accuracy of the simulator for a strategy kind (or that it was not measured)."""
    entry = MEASURED.get(kind)
    if not entry:
        return f"{kind}: not measured"
    return (f"{kind}: step time |error| median {number(entry['median_pct'], '.1f')}%, worst "
            f"{number(entry['worst_pct'], '.1f')}% over {entry['cases']} measured cases ({entry['where']})")  # fmt: skip


__all__ = ["MEASURED", "accuracy_line"]
