"""`compare(baseline, current)`: per-case ratio, interval, test and verdict, plus a geometric-mean summary.

Either side is a results directory or a baseline file. The CLI (`ringbench compare`) is a thin wrapper; this is the
library entry point::

    from ringbench.gate.compare import compare
    result = compare("results/base", "results/pr")
    if result.regressed: ...
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ringbench.errors import UsageError
from ringbench.gate.baseline import read_baseline
from ringbench.gate.match import match_cases
from ringbench.gate.samples import CaseSamples, SampleSet, sample_set_from_run
from ringbench.gate.stats import (
    UNIT_REPEAT,
    case_statistics,
    geometric_mean,
    percentile_interval,
    pooled_median,
    smallest_p_value,
)
from ringbench.gate.verdict import GateConfig, Verdict, decide
from ringbench.record.store import load_run


def load_sample_set(path: str | Path) -> SampleSet:
    """A run directory or a baseline file as one side of a comparison; missing or unreadable -> UsageError."""
    path = Path(path)
    if path.is_dir():
        return sample_set_from_run(load_run(path), source=str(path))
    if path.is_file():
        return read_baseline(path)
    raise UsageError(f"{str(path)!r} does not exist; expected a run directory (results/<run-id>) or a baseline file")


@dataclass(frozen=True, kw_only=True)
class CaseComparison:
    """Baseline vs current for one matched case."""

    axes: dict
    case_id: str
    emulated: bool
    n_baseline: int
    """Per-iteration samples on the baseline side (all repeats)."""
    n_current: int
    repeats_baseline: int
    repeats_current: int
    baseline_ms: float
    """Median step time (ms) over all iterations of all repeats."""
    current_ms: float
    ratio: float
    """current_ms / baseline_ms: above 1 is slower."""
    ci_low: float
    """Bootstrap interval of the ratio at confidence 1 - alpha."""
    ci_high: float
    p_value: float
    """Two-sided Mann–Whitney p-value."""
    unit: str
    """What the test treats as independent: ``repeat``, ``clustered`` or ``iteration`` (see stats.py)."""
    significant: bool
    verdict: Verdict


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Geometric mean of the matched cases' ratios, with its bootstrap interval."""

    n_cases: int
    geomean_ratio: float
    ci_low: float
    ci_high: float
    significant: bool
    """The interval excludes 1."""
    regressions: int
    improvements: int


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """Everything `ringbench compare` reports."""

    baseline: SampleSet
    current: SampleSet
    config: GateConfig
    cases: tuple[CaseComparison, ...]
    only_baseline: tuple[CaseSamples, ...]
    only_current: tuple[CaseSamples, ...]
    mismatches: tuple[str, ...]
    """Must-match differences that were allowed (--allow-mismatch)."""
    summary: Summary
    differences: tuple[str, ...] = ()
    """Differences that never stop a comparison but are always shown (injected faults, see match.py)."""

    @property
    def regressed(self) -> bool:
        return self.summary.regressions > 0

    @property
    def too_few(self) -> int:
        """Cases whose sample sizes cannot reach p < alpha: the gate cannot judge them."""
        return sum(case.verdict == Verdict.TOO_FEW for case in self.cases)

    @property
    def exit_code(self) -> int:
        """1: a case regressed; 3: no regression, but some case could not be judged (too few samples); 0: pass."""
        if self.regressed:
            return 1
        return 3 if self.too_few else 0


def _case_rng(config: GateConfig, case: CaseSamples) -> np.random.Generator:
    # Seed from the case's axes, not its position, so adding a case never changes another case's interval.
    digest = zlib.crc32(repr(sorted(case.axes.items(), key=lambda item: item[0])).encode())
    return np.random.default_rng([config.seed, digest])


def _compare_case(baseline: CaseSamples, current: CaseSamples, config: GateConfig) -> tuple[CaseComparison, np.ndarray]:
    base, cur = baseline.padded(), current.padded()  # (repeats, iterations)
    stats = case_statistics(base, cur, alpha=config.alpha, resamples=config.resamples, rng=_case_rng(config, current))
    ratio, p_value = float(stats.ratio), float(stats.p_value)
    verdict = Verdict(str(decide(ratio, p_value, alpha=config.alpha, max_regression=config.max_regression)))
    units = (baseline.n_repeats, current.n_repeats) if stats.unit == UNIT_REPEAT else (
        baseline.n_samples, current.n_samples)  # fmt: skip
    if verdict == Verdict.NO_CHANGE and smallest_p_value(*units) >= config.alpha:
        verdict = Verdict.TOO_FEW  # "no change" would be a claim this sample size cannot make
    result = CaseComparison(
        axes=dict(current.axes),
        case_id=current.case_ids[0],
        emulated=current.emulated or baseline.emulated,
        n_baseline=baseline.n_samples,
        n_current=current.n_samples,
        repeats_baseline=baseline.n_repeats,
        repeats_current=current.n_repeats,
        baseline_ms=float(pooled_median(base)),
        current_ms=float(pooled_median(cur)),
        ratio=ratio,
        ci_low=float(stats.ci_low),
        ci_high=float(stats.ci_high),
        p_value=p_value,
        unit=stats.unit,
        significant=bool(p_value < config.alpha),
        verdict=verdict,
    )
    return result, stats.log_ratios


def _summary(results: list[CaseComparison], log_ratios: list[np.ndarray], config: GateConfig) -> Summary:
    # Cases are independent, so one replicate of the summary is the mean over cases of their replicates.
    replicates = np.mean(np.stack(log_ratios), axis=0)  # (resamples,)
    ci_low, ci_high = percentile_interval(replicates, config.confidence)
    point = float(geometric_mean(np.log([r.ratio for r in results])))
    return Summary(
        n_cases=len(results),
        geomean_ratio=point,
        ci_low=float(ci_low),
        ci_high=float(ci_high),
        # The interval alone would call 3 vs 3 iterations "significant" where the test cannot: defer to the cases.
        significant=bool(ci_low > 1.0 or ci_high < 1.0) and not any(r.verdict == Verdict.TOO_FEW for r in results),
        regressions=sum(r.verdict == Verdict.REGRESSION for r in results),
        improvements=sum(r.verdict == Verdict.IMPROVEMENT for r in results),
    )


def compare(
    baseline: str | Path | SampleSet, current: str | Path | SampleSet, *, config: GateConfig | None = None
) -> Comparison:
    """Compare two sides case by case. Raises UsageError for unreadable input or must-match differences."""
    config = config or GateConfig()
    base = baseline if isinstance(baseline, SampleSet) else load_sample_set(baseline)
    cur = current if isinstance(current, SampleSet) else load_sample_set(current)
    matching = match_cases(base, cur, allow_mismatch=config.allow_mismatch)
    results, log_ratios = [], []
    for base_case, cur_case in matching.pairs:
        result, replicates = _compare_case(base_case, cur_case, config)
        results.append(result)
        log_ratios.append(replicates)
    return Comparison(
        baseline=base,
        current=cur,
        config=config,
        cases=tuple(results),
        only_baseline=matching.only_baseline,
        only_current=matching.only_current,
        mismatches=matching.mismatches,
        summary=_summary(results, log_ratios, config),
        differences=matching.differences,
    )
