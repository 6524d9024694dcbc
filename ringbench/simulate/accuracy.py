"""The simulator's measured accuracy per strategy: what ``ringbench plan`` quotes in its confidence line.

Filled from ``python benchmarks/validate_strategies.py`` (measured runs on an emulated two-host cluster, predicted
with ``simulate --like ... --from ...``; docs/simulate.md, "Accuracy against measurement"). Each entry: the cases
compared, the median and worst |error| of the predicted step time, and where and when it was measured.
"""

from __future__ import annotations

from ringbench.fmt import number

MEASURED: dict[str, dict] = {}


def accuracy_line(kind: str) -> str:
    """One phrase: the measured accuracy of the simulator for a strategy kind (or that it was not measured)."""
    entry = MEASURED.get(kind)
    if not entry:
        return f"{kind}: not measured"
    return (f"{kind}: step time |error| median {number(entry['median_pct'], '.1f')}%, worst "
            f"{number(entry['worst_pct'], '.1f')}% over {entry['cases']} measured cases ({entry['where']})")  # fmt: skip


__all__ = ["MEASURED", "accuracy_line"]
