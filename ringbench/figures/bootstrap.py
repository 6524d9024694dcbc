"""The ratio of two medians and its bootstrap: the one definition the answers and the CI gate share.

Samples are shaped ``(..., repeats, iterations)`` (NaN-padded where repeats are ragged), so the same code serves
one case and a batch of thousands of simulated comparisons. With two or more repeats on a side the bootstrap
resamples repeats first and then iterations within each drawn repeat (a two-stage cluster bootstrap: the interval
widens with run-to-run noise instead of pretending it away); with one, it resamples iterations.
"""

from __future__ import annotations

import numpy as np

# Upper bound on floats gathered at once by the bootstrap (about 32 MB); resamples are processed in chunks.
_BOOTSTRAP_CHUNK_FLOATS = 4_000_000


def pooled(samples: np.ndarray) -> np.ndarray:
    """(..., repeats, iterations) -> (..., repeats * iterations): every iteration of every repeat."""
    return samples.reshape(*samples.shape[:-2], -1)


def pooled_median(samples: np.ndarray) -> np.ndarray:
    """Median over all iterations of all repeats, ignoring NaN padding; shape (...)."""
    flat = pooled(samples)
    return np.nanmedian(flat, axis=-1) if np.isnan(flat).any() else np.median(flat, axis=-1)


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


def ratio_interval(slow: np.ndarray, fast: np.ndarray, *, resamples: int, seed: int,
                   confidence: float = 0.9) -> tuple[float, float, float]:  # fmt: skip
    """median(slow) / median(fast) of two 1-D samples, and its equal-tailed bootstrap interval."""
    slow, fast = np.asarray(slow, float), np.asarray(fast, float)
    point = float(np.median(slow) / np.median(fast))
    logs = bootstrap_log_ratios(fast[None, :], slow[None, :], resamples=resamples, rng=np.random.default_rng(seed))
    low, high = percentile_interval(logs, confidence)
    return point, float(low), float(high)


__all__ = ["bootstrap_log_ratios", "percentile_interval", "pooled", "pooled_median", "ratio_interval"]
