"""Synthetic run directories with known step times, written through the real store writers.

For the gate's tests and for trying `ringbench compare` without torch::

    from support.synthetic import lognormal_steps, write_synthetic_run
    write_synthetic_run("results/a", {"seq": 4096}, lognormal_steps(cv=0.02, iterations=20, repeats=3, seed=1))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.record.meta import write_meta
from ringbench.record.rows import case_row
from ringbench.record.schema import CASE_COLUMNS, EVENT_COLUMNS, SCHEMA_VERSION
from ringbench.record.store import write_cases, write_events
from ringbench.scenario.workload import Case, Workload

DEFAULT_CASE = Case(workload=Workload(world=4, seq=4096, heads=8, head_dim=64, dtype="float32"), kernel="sdpa")

DEFAULT_META: dict[str, object] = {
    "schema_version": SCHEMA_VERSION,
    "backend": "gloo",
    "device_kind": "cpu",
    "torch_version": "2.13.0",
    "emulated": False,
    "command": "ringbench run (synthetic)",
    "created": "2024-01-01T00:00:00+00:00",
}


def lognormal_steps(
    *, cv: float, iterations: int = 20, repeats: int = 1, median_ms: float = 100.0, seed: int = 0
) -> np.ndarray:
    """Step times (ms), shape (repeats, iterations): lognormal with the given median and coefficient of variation."""
    sigma = math.sqrt(math.log1p(cv * cv))
    rng = np.random.default_rng(seed)
    return median_ms * np.exp(sigma * rng.standard_normal((repeats, iterations)))


def _events(case_id: str, world: int, steps_ms: np.ndarray) -> list[dict]:
    """Iteration spans whose max(end) - min(start) over ranks is exactly the step time, plus distracting spans."""
    rows = []
    origin = 0
    for repeat, iterations in enumerate(steps_ms):
        for iteration, step_ms in enumerate(iterations):
            step_ns = round(step_ms * 1e6)
            for rank in range(world):
                # Rank 0 spans the whole step; the others start a little later and end a little earlier.
                start, end = origin + 1_000 * rank, origin + step_ns - 500 * rank
                base = {"case_id": case_id, "repeat": repeat, "iteration": iteration, "phase": "fwd", "rank": rank}
                base |= {"ring_position": rank, "src": rank, "dst": rank, "bytes": 0, "block": -1, "pair": ""}
                rows.append(base | {"step": -1, "kind": "iteration", "start_ns": start, "end_ns": end, "flops": 0.0})
                # A compute span that overruns the iteration: the gate must ignore every kind but `iteration`.
                rows.append(base | {"step": 0, "kind": "compute", "start_ns": start, "end_ns": end + step_ns})
                rows[-1] |= {"block": rank, "pair": "full", "flops": 1.0}
            origin += 2 * step_ns
    return rows


def write_synthetic_run(
    run_dir: str | Path,
    cases: Mapping[str, Sequence[Mapping[str, object]] | Mapping[str, object]] | Mapping[str, object],
    steps_ms: np.ndarray | Sequence[np.ndarray] | None = None,
    *,
    meta: Mapping[str, object] | None = None,
    emulated: bool = False,
    status: str = "ok",
) -> Path:
    """Write a run directory.

    ``cases`` is either one axes override (with ``steps_ms`` its (repeats, iterations) step times) or a mapping
    ``case_id -> (axes override, steps_ms)``; an override names axes and ``faults``. Axes not given take
    DEFAULT_CASE's; meta overrides DEFAULT_META.
    """
    run_dir = Path(run_dir)
    if steps_ms is not None:
        cases = {"c0": (cases, steps_ms)}
    event_rows, case_rows = [], []
    for case_id, (override, steps) in cases.items():
        steps = np.atleast_2d(np.asarray(steps, dtype=float))
        axes = dict(override)
        faults = axes.pop("faults", "")
        case = Case.from_axes(**(DEFAULT_CASE.axes() | axes))
        event_rows += _events(case_id, case.world, steps)
        for repeat, iterations in enumerate(steps):
            row = dict.fromkeys(CASE_COLUMNS, np.nan)
            row |= case_row(case, repeat, case_id=case_id, faults=faults)
            row |= {"emulated": emulated, "iters": len(iterations), "warmup": 2, "passed": True, "status": status}
            row |= {"step_ms": float(np.median(iterations))}
            case_rows.append(row)
    events = pd.DataFrame(event_rows, columns=list(EVENT_COLUMNS))
    write_events(run_dir, events)
    write_cases(run_dir, pd.DataFrame(case_rows, columns=list(CASE_COLUMNS)))
    document = DEFAULT_META | {"run_id": run_dir.name, "emulated": emulated} | dict(meta or {})
    write_meta(run_dir, document, "simulate")  # made up, not measured
    return run_dir
