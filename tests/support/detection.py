"""Detection quality of the straggler verdict, measured on simulated rings with injected faults.

Each trial draws a seed, a buffer strategy, a ring order and a jitter in [2%, 5%], then simulates three runs of
the same ring: a slow rank (random rank, factor in [1.5, 3]), a slow link (random hop, extra time in [20%, 100%]
of a step's compute), and a fault-free control. A hit names exactly the injected rank (kind compute) or hop
(kind link, no rank blamed); anything named in the control, or a wrong name, is a false alarm.

The rate over N trials is a benchmark: ``python benchmarks/detection_rate.py 20``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.analysis.stragglers import culprits, straggler_table
from ringbench.figures.critical_path import transfers
from support.given import SimConfig, simulate

TRIAL_COLUMNS = ["trial", "fault", "injected", "named_kind", "named", "hit", "false_alarm", "ratio", "cost_ms"]


def _verdict(cfg: SimConfig) -> pd.Series:
    events, _ = simulate(cfg)
    table = straggler_table(events, transfers(events))
    return culprits(table).iloc[0]


def _named(row: pd.Series) -> str | None:
    if row["straggler_kind"] == "compute":
        return f"rank {int(row['straggler_rank'])}"
    if row["straggler_kind"] == "link":
        return f"hop {int(row['slow_hop_src'])}->{int(row['slow_hop_dst'])}"
    return None


def detection_trials(trials: int = 20, *, world: int = 8, iterations: int = 8, seed: int = 0) -> pd.DataFrame:
    """One row per simulated run (3 per trial): what was injected, what was named, hit / false alarm."""
    rng = np.random.default_rng(seed)
    rows = []
    compute_ms = 2.0
    for trial in range(trials):
        order = tuple(int(r) for r in rng.permutation(world)) if rng.random() < 0.5 else None
        base = SimConfig.of(
            world=world, order=order, buffer=str(rng.choice(["double", "sync"])), iterations=iterations,
            backward=bool(rng.random() < 0.5), compute_ms=compute_ms, link_ms=float(rng.uniform(0.3, 1.0)),
            jitter=float(rng.uniform(0.02, 0.05)), seed=int(rng.integers(1 << 31)),
        )  # fmt: skip
        rank = int(rng.integers(world))
        factor = float(rng.uniform(1.5, 3.0))
        hop = base.hops()[int(rng.integers(world))]
        extra = float(rng.uniform(0.2, 1.0)) * compute_ms
        runs = [
            ("rank", f"rank {rank}", _replace(base, slow_rank=rank, slow_factor=factor)),
            ("link", f"hop {hop[0]}->{hop[1]}", _replace(base, slow_link=hop, slow_link_extra_ms=extra)),
            ("none", None, base),
        ]
        for fault, injected, cfg in runs:
            row = _verdict(cfg)
            named = _named(row)
            rows.append(
                {
                    "trial": trial,
                    "fault": fault,
                    "injected": injected,
                    "named_kind": row["straggler_kind"],
                    "named": named,
                    "hit": fault != "none" and named == injected,
                    "false_alarm": named is not None and named != injected,
                    "ratio": row["ratio"],
                    "cost_ms": row["cost_ms"],
                }
            )
    return pd.DataFrame(rows, columns=TRIAL_COLUMNS)


def _replace(cfg: SimConfig, **changes) -> SimConfig:
    from dataclasses import replace

    return replace(cfg, **changes)
