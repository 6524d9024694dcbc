"""The statistics of the gate: ratio of medians, its bootstrap interval, and the Mann–Whitney test.

Every function takes samples shaped ``(..., repeats, iterations)`` (NaN-padded where repeats are ragged) so that the
same code serves one real case and a batch of thousands of simulated comparisons (see simulate.py).

Why these choices:

* **Ratio of medians** (current / baseline): step times are right-skewed with rare stalls; the median ignores a
  stall, and a ratio is what a reader means by "5% slower" whatever the workload's size.
* **Mann–Whitney U, two-sided**: rank-based, so no normality is assumed and one 10x outlier counts as one sample.
* **The unit of noise.** Iterations of one process group share its luck, so they are positively correlated and a
  test that treats them as independent is over-confident about run-to-run differences. Three cases:

  - ``repeat``: both sides have enough repeats, and the test runs on per-repeat medians (one number per process
    group: the honest unit). "Enough" means the exact test can still reject at ``alpha`` with one pair of repeats
    out of order: for k1 vs k2 repeats, P(U <= 1) = 2 / C(k1 + k2, k1) (one arrangement each for U = 0 and
    U = 1), so the two-sided p-value of U = 1 is 4 / C(k1 + k2, k1) and must be below alpha. At alpha = 0.01
    that takes 6 repeats a side; 3 vs 3 could never reject (smallest p-value 2 / C(6, 3) = 0.1).
  - ``clustered``: both sides have 2+ repeats, but not enough for the above. The test runs on pooled iterations,
    and its p-value is raised to the two-stage bootstrap's p-value when that is larger (see below): the bootstrap
    resamples repeats, so it carries the run-to-run noise the pooled test ignores. In simulations (simulate.py)
    this cuts the A/A false-alarm rate of a workload with 5% run-to-run CV and 3 repeats from about 11% to 4%,
    while a 10% slowdown of a 2%-CV workload is still caught 99% of the time.
  - ``iteration``: a side has a single repeat; nothing in the data can show run-to-run noise, and the pooled test
    is all there is. The regression threshold (verdict.py) is then what protects against run-to-run noise, which
    is why the docs ask for workloads whose run-to-run CV is well below the threshold.

* **Bootstrap interval**: percentile interval of the log ratio of medians. With two or more repeats on a side, it
  resamples repeats first and then iterations within each drawn repeat (a two-stage cluster bootstrap), so the
  interval widens with run-to-run noise instead of pretending it away.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

import numpy as np
from scipy.stats import mannwhitneyu

from ringbench.figures.bootstrap import (  # the one bootstrap of a ratio of medians (also the answers')
    bootstrap_log_ratios,
    percentile_interval,
    pooled,
    pooled_median,
)

UNIT_REPEAT = "repeat"
UNIT_CLUSTERED = "clustered"
UNIT_ITERATION = "iteration"


def repeat_medians(samples: np.ndarray) -> np.ndarray:
    """Median of each repeat; shape (..., repeats)."""
    return np.nanmedian(samples, axis=-1) if np.isnan(samples).any() else np.median(samples, axis=-1)


def ratio_of_medians(baseline: np.ndarray, current: np.ndarray) -> np.ndarray:
    """current / baseline of the pooled medians: > 1 means the current code is slower."""
    return pooled_median(current) / pooled_median(baseline)


def uses_repeat_unit(repeats_baseline: int, repeats_current: int, alpha: float) -> bool:
    """True when the test runs on per-repeat medians: it can reject at ``alpha`` with one pair of repeats swapped."""
    if min(repeats_baseline, repeats_current) < 2:
        return False
    return 4 / comb(repeats_baseline + repeats_current, repeats_baseline) < alpha


def min_repeats(alpha: float) -> int:
    """The fewest repeats per side (equal on both sides) for which the test runs on per-repeat medians."""
    k = 2
    while not uses_repeat_unit(k, k, alpha):
        k += 1
    return k


def mann_whitney_p(baseline: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Two-sided Mann–Whitney p-value along the last axis; NaN (padding) is dropped in the 1-D case."""
    if baseline.ndim == 1 and (np.isnan(baseline).any() or np.isnan(current).any()):
        baseline, current = baseline[~np.isnan(baseline)], current[~np.isnan(current)]
    if baseline.shape[-1] == 0 or current.shape[-1] == 0:
        return np.full(np.broadcast_shapes(baseline.shape[:-1], current.shape[:-1]), np.nan)
    return np.asarray(mannwhitneyu(current, baseline, alternative="two-sided", axis=-1).pvalue, dtype=float)


def smallest_p_value(n_baseline: int, n_current: int) -> float:
    """The smallest two-sided Mann–Whitney p-value two samples of these sizes can give (complete separation,
    no ties, exact test): 2 / C(n_baseline + n_current, n_baseline). When it is not below alpha, no data of that
    size can show a change, however large."""
    if n_baseline < 1 or n_current < 1:
        return 1.0
    return min(1.0, 2.0 / comb(n_baseline + n_current, n_baseline))


def geometric_mean(log_ratios: np.ndarray) -> np.ndarray:
    """exp(mean log ratio) over the first axis (cases): the summary of ratios that treats 2x and 0.5x alike."""
    return np.exp(np.mean(log_ratios, axis=0))


def bootstrap_p_value(log_ratios: np.ndarray) -> np.ndarray:
    """Two-sided bootstrap p-value of "no change" from log-ratio replicates (last axis).

    Twice the smaller tail mass on either side of 0, with the usual +1 so that it is never exactly 0: the
    (1 - alpha) percentile interval excludes a ratio of 1 exactly when this is below alpha (up to that +1).
    """
    resamples = log_ratios.shape[-1]
    below = np.sum(log_ratios <= 0.0, axis=-1)
    above = np.sum(log_ratios >= 0.0, axis=-1)
    return np.minimum(1.0, 2.0 * (np.minimum(below, above) + 1) / (resamples + 1))


def noise_unit(repeats_baseline: int, repeats_current: int, alpha: float) -> str:
    """``repeat``, ``clustered`` or ``iteration``: what the test treats as independent (module docstring)."""
    if uses_repeat_unit(repeats_baseline, repeats_current, alpha):
        return UNIT_REPEAT
    if min(repeats_baseline, repeats_current) >= 2:
        return UNIT_CLUSTERED
    return UNIT_ITERATION


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseStatistics:
    """Statistics of baseline vs current; arrays have the batch shape (scalars, as 0-d arrays, for one case)."""

    ratio: np.ndarray
    """current / baseline of the pooled medians."""
    p_value: np.ndarray
    """Two-sided p-value of the test chosen by ``unit``."""
    unit: str
    log_ratios: np.ndarray | None
    """Bootstrap replicates of the log ratio, shape (..., resamples); None when not computed."""
    ci_low: np.ndarray
    ci_high: np.ndarray


def case_statistics(
    baseline: np.ndarray,
    current: np.ndarray,
    *,
    alpha: float,
    resamples: int,
    rng: np.random.Generator,
    interval: bool = True,
) -> CaseStatistics:
    """Ratio, p-value and bootstrap interval for samples shaped (..., repeats, iterations).

    With ``interval=False`` (for batches) the interval is NaN and the bootstrap runs only where it can change the
    verdict: unit ``clustered`` and a pooled p-value below alpha (elsewhere the p-value stays the pooled one, which
    is already >= alpha). Simulations use that to check thousands of comparisons quickly with the same verdict.
    """
    unit = noise_unit(baseline.shape[-2], current.shape[-2], alpha)
    ratio = ratio_of_medians(baseline, current)
    if unit == UNIT_REPEAT:
        p_value = mann_whitney_p(repeat_medians(baseline), repeat_medians(current))
    else:
        p_value = mann_whitney_p(pooled(baseline), pooled(current))
    log_ratios = None
    if interval:
        log_ratios = bootstrap_log_ratios(baseline, current, resamples=resamples, rng=rng)
        if unit == UNIT_CLUSTERED:
            p_value = np.maximum(p_value, bootstrap_p_value(log_ratios))
    elif unit == UNIT_CLUSTERED:
        # Raising p can only matter where the pooled test rejects; bootstrap just those comparisons.
        p_value = np.array(p_value, dtype=float, copy=True)
        rejects = p_value < alpha
        if rejects.any():
            replicates = bootstrap_log_ratios(baseline[rejects], current[rejects], resamples=resamples, rng=rng)
            p_value[rejects] = np.maximum(p_value[rejects], bootstrap_p_value(replicates))
    if log_ratios is not None:
        ci_low, ci_high = percentile_interval(log_ratios, 1.0 - alpha)
    else:
        ci_low = ci_high = np.full(np.shape(ratio), np.nan)
    return CaseStatistics(
        ratio=np.asarray(ratio),
        p_value=np.asarray(p_value),
        unit=unit,
        log_ratios=log_ratios,
        ci_low=np.asarray(ci_low),
        ci_high=np.asarray(ci_high),
    )
