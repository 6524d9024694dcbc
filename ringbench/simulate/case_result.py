"""One simulated case's result (its events, its cases row, what the JSON and the scale view add) and the axes
columns every simulated cases row opens with: shared by the ring's results (simulated_record.py) and the other strategies'
(strategy_results.py), which import it rather than each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ringbench.orders import format_ring
from ringbench.simulate.case import SIMULATED_KERNEL, SimCase

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
    """The axes columns of a simulated case's cases row (the same columns a measured case's row has)."""
    ring = format_ring(case.ring)
    return {
        "case_id": case_id or case.case_id, "repeat": repeat, "world": case.world, "seq": case.seq, "heads": case.heads,
        "head_dim": case.head_dim, "batch": case.batch, "dtype": case.dtype, "mask": case.mask,
        "layout": case.layout, "buffer": case.buffer, "order": case.order, "kernel": SIMULATED_KERNEL,
        "impl": "ringbench", "backward": case.backward, "ring": ring, "emulated": True, "faults": ";".join(case.faults),
        "iters": case.iterations, "warmup": 0, "strategy": case.strategy, "placement": case.placement,
        "docs": case.docs, "layers": "1",
    }  # fmt: skip


__all__ = ["CaseResult", "case_axes"]
