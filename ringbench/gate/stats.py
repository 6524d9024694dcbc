"""The statistics of the gate: ratio of medians, its bootstrap interval, and the Mann–Whitney test.

Every function takes samples shaped ``(..., repeats, iterations)`` (NaN-padded where repeats are ragged) so that the
same code serves one real case and a batch of thousands of simulated comparisons (see simulate.py).

Why these choices:

* **Ratio of medians** (current / baseline): step times are right-skewed with rare stalls; the median ignores a
  stall, and a ratio is what a reader means by "5% slower" whatever the workload's size.
* **Mann–Whitney U, two-sided**: rank-based, so no normality is assumed and one 10x outlier counts as one sample.
* **The unit of noise.** Iterations of one process group share its luck, so they are positively correlated and a
  test that treats them as independent is over-confident about run-to-run differences. When both sides have enough
  repeats the test runs on per-repeat medians (one number per process group: the honest unit). "Enough" means the
  exact test can still reject at ``alpha`` with one pair of repeats out of order:
  for k1 vs k2 repeats, P(U <= 1) = 2 / C(k1 + k2, k1) (one arrangement each for U = 0 and U = 1), so the two-sided
  p-value of U = 1 is 4 / C(k1 + k2, k1); below that (e.g. 3 vs 3 repeats, whose smallest possible p-value is
  2 / C(6, 3) = 0.1) a repeat-level test could never reject, and the test falls back to pooled per-iteration
  samples. The regression threshold (verdict.py) is then what protects against run-to-run noise, which is why the
  docs ask for workloads whose run-to-run CV is well below the threshold.
* **Bootstrap interval**: percentile interval of the log ratio of medians. With two or more repeats on a side, it
  resamples repeats first and then iterations within each drawn repeat (a two-stage cluster bootstrap), so the
  interval widens with run-to-run noise instead of pretending it away.
"""

from __future__ import annotations

from math import comb

import numpy as np
from scipy.stats import mannwhitneyu

UNIT_REPEAT = "repeat"
UNIT_ITERATION = "iteration"

# Upper bound on floats gathered at once by the bootstrap (about 32 MB); resamples are processed in chunks.
_BOOTSTRAP_CHUNK_FLOATS = 4_000_000


def pooled(samples: np.ndarray) -> np.ndarray:
    """(..., repeats, iterations) -> (..., repeats * iterations): every iteration of every repeat."""
    return samples.reshape(*samples.shape[:-2], -1)


def pooled_median(samples: np.ndarray) -> np.ndarray:
    """Median over all iterations of all repeats, ignoring NaN padding; shape (...)."""
    flat = pooled(samples)
    return np.nanmedian(flat, axis=-1) if np.isnan(flat).any() else np.median(flat, axis=-1)


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


def _mann_whitney(baseline: np.ndarray, current: np.ndarray) -> np.ndarray:
    """Two-sided Mann–Whitney p-value along the last axis; NaN (padding) is dropped in the 1-D case."""
    if baseline.ndim == 1 and (np.isnan(baseline).any() or np.isnan(current).any()):
        baseline, current = baseline[~np.isnan(baseline)], current[~np.isnan(current)]
    if baseline.shape[-1] == 0 or current.shape[-1] == 0:
        return np.full(np.broadcast_shapes(baseline.shape[:-1], current.shape[:-1]), np.nan)
    return np.asarray(mannwhitneyu(current, baseline, alternative="two-sided", axis=-1).pvalue, dtype=float)


def test_p_value(baseline: np.ndarray, current: np.ndarray, *, alpha: float) -> tuple[np.ndarray, str]:
    """Mann–Whitney p-value of current vs baseline and the unit it was computed on (``repeat`` or ``iteration``)."""
    if uses_repeat_unit(baseline.shape[-2], current.shape[-2], alpha):
        return _mann_whitney(repeat_medians(baseline), repeat_medians(current)), UNIT_REPEAT
    return _mann_whitney(pooled(baseline), pooled(current)), UNIT_ITERATION


test_p_value.__test__ = False  # not a pytest test despite the name


def _bootstrap_medians(samples: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap replicates of the pooled median, shape (..., resamples).

    One replicate draws ``repeats`` repeats with replacement (only when there are two or more), then, inside each
    drawn repeat, as many iterations as that repeat has, with replacement. The same index draws serve every batch
    element, which is harmless: batch elements are independent data sets.
    """
    n_repeats, width = samples.shape[-2:]
    lengths = (~np.isnan(samples)).sum(axis=-1)  # (..., repeats)
    # Ragged repeats only occur for one real case (no batch); a batch always has full rows.
    lengths = lengths.reshape(-1, n_repeats)[0]
    ragged = bool((lengths < width).any())
    batch = int(np.prod(samples.shape[:-2], dtype=int))
    chunk = max(1, _BOOTSTRAP_CHUNK_FLOATS // max(1, batch * n_repeats * width))
    out = []
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        if n_repeats > 1:
            drawn = rng.integers(0, n_repeats, size=(size, n_repeats))
        else:
            drawn = np.zeros((size, 1), dtype=int)
        drawn_lengths = lengths[drawn][..., None]  # (size, repeats, 1)
        positions = (rng.random((size, n_repeats, width)) * drawn_lengths).astype(int)
        picked = samples[..., drawn[..., None], positions]  # (..., size, repeats, width)
        if ragged:
            picked = np.where(np.arange(width) < drawn_lengths, picked, np.nan)
            out.append(np.nanmedian(picked.reshape(*picked.shape[:-2], -1), axis=-1))
        else:
            out.append(np.median(picked.reshape(*picked.shape[:-2], -1), axis=-1))
    return np.concatenate(out, axis=-1)


def bootstrap_log_ratios(
    baseline: np.ndarray, current: np.ndarray, *, resamples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of log(median(current) / median(baseline)), shape (..., resamples)."""
    return np.log(_bootstrap_medians(current, resamples, rng)) - np.log(_bootstrap_medians(baseline, resamples, rng))


def percentile_interval(log_ratios: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Equal-tailed percentile interval of the ratio from bootstrap log-ratio replicates (last axis)."""
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(log_ratios, [tail, 1.0 - tail], axis=-1)
    return np.exp(low), np.exp(high)


def geometric_mean(log_ratios: np.ndarray) -> np.ndarray:
    """exp(mean log ratio) over the first axis (cases): the summary of ratios that treats 2x and 0.5x alike."""
    return np.exp(np.mean(log_ratios, axis=0))
