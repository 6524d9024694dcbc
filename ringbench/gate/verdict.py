"""The decision rule of the gate and its settings.

A case *regressed* when its slowdown is both **significant** (Mann–Whitney p < alpha) and **large** (the point
estimate of the ratio of medians exceeds 1 + max_regression); *improved* symmetrically (ratio below
1 / (1 + max_regression), so that a 5% tolerance is the same distance from 1 in log space both ways); otherwise
*no change*. Why these defaults (numbers from ``python benchmarks/gate_power.py``, docs/ci-gate.md):

* ``alpha = 0.01``: the gate fails when *any* case regresses, so per-case false alarms add up over a sweep of
  m cases (about m * alpha / 2 for a one-directional false alarm). At the default sample size (20 iterations, one
  repeat) a 10% slowdown of a 2%-CV workload is caught in 2000 of 2000 simulations with alpha = 0.01; alpha = 0.05
  buys power only on workloads too noisy to gate on anyway (9% CV: 0.68 -> 0.85), for six times the false alarms
  (0.003 -> 0.019).
* **Point estimate, not the interval's lower bound, against the threshold**: requiring the lower bound above
  1.05 makes the gate blind to a real 10% slowdown on noisier workloads (power 0.99 -> 0.38 at 5% CV, 0.69 -> 0.11
  at 9% CV), while the false alarms it would save are already none in A/A simulations thanks to the test. The
  interval is reported next to every verdict so that a reader sees the uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from ringbench.errors import bad_value


class Verdict(str, Enum):
    """Outcome for one case."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    NO_CHANGE = "no change"
    NO_DATA = "no data"  # matched, but one side has no timed iteration (e.g. the case failed)
    TOO_FEW = "too few samples"  # the test cannot reach p < alpha with this many samples, whatever they are


@dataclass(frozen=True, kw_only=True, slots=True)
class GateConfig:
    """Settings of one comparison."""

    alpha: float = 0.01
    """Significance level of the two-sided Mann–Whitney test; the interval's confidence is 1 - alpha."""
    max_regression: float = 0.05
    """Tolerated slowdown as a fraction (0.05 = 5%); a larger, significant slowdown is a regression."""
    resamples: int = 4000
    """Bootstrap resamples per case (the interval's tails at 1 - alpha = 99% need a few thousand)."""
    seed: int = 0
    """Seed of the bootstrap; each case also mixes in a hash of its axes, so results do not depend on case order."""
    allow_mismatch: bool = False
    """Compare even when must-match metadata (device, backend, torch, world, dtype, emulation) differ."""

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise bad_value("alpha", self.alpha, "a number in (0, 0.5), e.g. 0.01")
        if not 0.0 <= self.max_regression < 1.0:
            raise bad_value("max_regression", self.max_regression, "a fraction in [0, 1), e.g. 0.05 for 5%")
        if self.resamples < 100:
            raise bad_value("resamples", self.resamples, "an integer >= 100")

    @property
    def confidence(self) -> float:
        return 1.0 - self.alpha


def decide(ratio: np.ndarray, p_value: np.ndarray, *, alpha: float, max_regression: float) -> np.ndarray:
    """Vectorised verdicts from ratios current/baseline and p-values: an array of Verdict *values* (plain str).

    NaN in either input gives ``no data``. Plain strings (not enum members) keep numpy from mangling them;
    ``Verdict(value)`` turns one back into a member, and members compare equal to their values.
    """
    ratio = np.asarray(ratio, dtype=float)
    p_value = np.asarray(p_value, dtype=float)
    significant = p_value < alpha
    slower = significant & (ratio > 1.0 + max_regression)
    faster = significant & (ratio < 1.0 / (1.0 + max_regression))
    missing = np.isnan(ratio) | np.isnan(p_value)
    out = np.where(slower, Verdict.REGRESSION.value, Verdict.NO_CHANGE.value)
    out = np.where(faster, Verdict.IMPROVEMENT.value, out)
    return np.where(missing, Verdict.NO_DATA.value, out)


def describe_change(ratio: float, significant: bool) -> str:
    """``12.3% slower (significant)`` / ``1.0% faster (not significant)``: a change always says its significance."""
    if ratio != ratio:  # NaN
        return "n/a"
    word = "slower" if ratio >= 1.0 else "faster"
    amount = abs(ratio - 1.0) * 100.0
    return f"{amount:.1f}% {word} ({'significant' if significant else 'not significant'})"
