"""How noisy is a run? Per case: the CV of per-iteration step times and the CV of per-repeat medians.

Step 1 of picking gate workloads (docs/ci-gate.md): run the gate scenario on the CI machine with a few repeats and
look at both numbers. The first (``iter_cv``, within a repeat) is what 20 iterations average away; the second
(``repeat_cv``, run to run) is what only more repeats can average away, and what the threshold must sit well
above::

    ringbench baseline noise results/<run-id> [more run dirs or baseline files ...]

Samples are the gate's own (``samples.iteration_samples``); CVs use the sample standard deviation (ddof=1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ringbench.gate.samples import CaseSamples, case_label, varying_fields


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseNoise:
    label: str
    repeats: int
    iterations: int
    """Samples over all repeats."""
    median_ms: float
    iter_cv: float
    """CV of step times within a repeat (the median over repeats of each repeat's CV)."""
    pooled_cv: float
    """CV of all step times of all repeats together."""
    repeat_cv: float
    """CV of the per-repeat medians (NaN with one repeat)."""


def _cv(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float("nan")
    return float(np.std(values, ddof=1) / np.mean(values))


def case_noise(case: CaseSamples, label: str) -> CaseNoise:
    everything = np.concatenate(case.repeats)
    return CaseNoise(
        label=label,
        repeats=case.n_repeats,
        iterations=case.n_samples,
        median_ms=float(np.median(everything)),
        iter_cv=float(np.median([_cv(r) for r in case.repeats])),
        pooled_cv=_cv(everything),
        repeat_cv=_cv(np.array([np.median(r) for r in case.repeats])),
    )


def side_noise(path: str) -> list[CaseNoise]:
    from ringbench.gate.compare import load_sample_set

    side = load_sample_set(path)
    fields = varying_fields([case.axes for case in side.cases])
    return [case_noise(case, case_label(case.axes, fields)) for case in side.cases]


def format_noise(rows: list[CaseNoise]) -> str:
    lines = [f"{'case':<40} {'rep':>3} {'n':>4} {'median ms':>10} {'iter CV':>8} {'pooled CV':>9} {'repeat CV':>9}"]
    for row in rows:
        lines.append(
            f"{row.label[:40]:<40} {row.repeats:>3} {row.iterations:>4} {row.median_ms:>10.3f} "
            f"{row.iter_cv:>8.2%} {row.pooled_cv:>9.2%} {row.repeat_cv:>9.2%}"
        )
    return "\n".join(lines)


def noise_of(paths: Sequence[str]) -> dict[str, list[CaseNoise]]:
    """Each run directory's or baseline file's noise per case, by path (a bad one raises a UsageError naming it)."""
    return {str(path): side_noise(str(path)) for path in paths}
