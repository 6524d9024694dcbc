"""One simulated case's result (its events, its cases row, what the JSON and the scale view add) and the columns
every simulated cases row opens with: shared by the ring's results (simulated_record.py) and the other strategies'
(strategy_results.py), which import it rather than each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringbench.record.rows import case_row
from ringbench.simulate.case import SimCase

if TYPE_CHECKING:
    import pandas as pd


@dataclass(kw_only=True)
class CaseResult:
    """One simulated case: its events, its cases row and what the JSON / scale view add."""

    case: SimCase
    events: pd.DataFrame
    row: dict
    bounded: bool
    exposed_ms: list[float] = field(default_factory=list)
    critical: dict = field(default_factory=dict)
    """Where the critical path spent its time: the top ranks (compute) and hops (transfer), ms per iteration."""
    profile: dict = field(default_factory=dict)


def case_axes(case: SimCase, repeat: int, case_id: str | None = None) -> dict:
    """The opening columns of a simulated case's cases row: its measured twin's axes (record/rows.py, kernel
    ``simulated``) and the simulation's settings."""
    return case_row(case.case, repeat, case_id=case_id or case.case_id, emulated=True, faults=";".join(case.faults),
                    iters=case.iterations, warmup=0)  # fmt: skip


__all__ = ["CaseResult", "case_axes"]
