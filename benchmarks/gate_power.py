"""Monte-Carlo check of the gate: false-alarm rate on A/A comparisons and power against a known slowdown.

Step times are simulated as lognormal noise around a median, optionally with a run-level factor per repeat (each
repeat is a fresh process group with its own luck)::

    step_ms[r, i] = median * (1 + slowdown) * exp(sigma_run * Z_r + sigma_iter * Z_ri),  sigma = sqrt(log(1 + CV^2))

(a lognormal with that sigma has exactly the given coefficient of variation). Whole batches go through the same
functions as a real case (stats.case_statistics, verdict.decide), so the figures describe
the shipped rule, not a re-implementation of it. Run ``python benchmarks/gate_power.py`` for the table quoted in
docs/ci-gate.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ringbench.gate.stats import case_statistics
from ringbench.gate.verdict import GateConfig, Verdict, decide

RULES = ("point", "ci-low")


@dataclass(frozen=True, kw_only=True, slots=True)
class NoiseScenario:
    """One simulated setting."""

    cv: float
    """Coefficient of variation of one iteration's step time inside one repeat."""
    iterations: int = 20
    repeats: int = 1
    slowdown: float = 0.0
    """True relative slowdown of the current side (0 for an A/A comparison)."""
    run_cv: float = 0.0
    """Coefficient of variation of the per-repeat (process group) factor; 0 means iterations are independent."""


@dataclass(frozen=True, kw_only=True, slots=True)
class SimulationResult:
    """Fraction of simulated comparisons that the gate called a regression."""

    scenario: NoiseScenario
    rule: str
    alpha: float
    sims: int
    regression_rate: float


def _sigma(cv: float) -> float:
    return math.sqrt(math.log1p(cv * cv))


def simulate_side(rng: np.random.Generator, scenario: NoiseScenario, sims: int, factor: float = 1.0) -> np.ndarray:
    """Simulated step times (ms), shape (sims, repeats, iterations), median ``100 * factor``."""
    shape = (sims, scenario.repeats, scenario.iterations)
    run = _sigma(scenario.run_cv) * rng.standard_normal((sims, scenario.repeats, 1))
    iteration = _sigma(scenario.cv) * rng.standard_normal(shape)
    return 100.0 * factor * np.exp(run + iteration)


def simulate_gate(
    scenario: NoiseScenario,
    *,
    config: GateConfig | None = None,
    sims: int = 1000,
    rule: str = "point",
    seed: int = 0,
) -> SimulationResult:
    """Run ``sims`` independent comparisons of baseline vs current under ``scenario``; return the regression rate.

    ``rule="point"`` is the shipped rule (verdict.decide). ``rule="ci-low"`` additionally requires the bootstrap
    interval's lower bound above 1 + max_regression (the alternative the docs compare against; slower, as it
    bootstraps every simulated comparison).
    """
    if rule not in RULES:
        raise ValueError(f"rule={rule!r} is not allowed; expected one of: {', '.join(RULES)}")
    config = config or GateConfig()
    rng = np.random.default_rng(seed)
    baseline = simulate_side(rng, scenario, sims)
    current = simulate_side(rng, scenario, sims, 1.0 + scenario.slowdown)
    stats = case_statistics(
        baseline, current, alpha=config.alpha, resamples=config.resamples, rng=rng, interval=rule == "ci-low"
    )
    verdict = decide(stats.ratio, stats.p_value, alpha=config.alpha, max_regression=config.max_regression)
    flagged = verdict == Verdict.REGRESSION.value
    if rule == "ci-low":
        flagged &= stats.ci_low > 1.0 + config.max_regression
    return SimulationResult(
        scenario=scenario, rule=rule, alpha=config.alpha, sims=sims, regression_rate=float(np.mean(flagged))
    )


def _rates(scenario: NoiseScenario, config: GateConfig, sims: int, rule: str = "point") -> tuple[float, float]:
    """(A/A false-alarm rate, power against a true 10% slowdown) for one scenario."""
    null = simulate_gate(scenario, config=config, sims=sims, rule=rule, seed=1)
    slower = NoiseScenario(
        cv=scenario.cv,
        iterations=scenario.iterations,
        repeats=scenario.repeats,
        run_cv=scenario.run_cv,
        slowdown=0.10,
    )
    return null.regression_rate, simulate_gate(slower, config=config, sims=sims, rule=rule, seed=2).regression_rate


def main(sims: int = 2000) -> None:
    """Print false-alarm rates (A/A) and power (true 10% slowdown) for the settings docs/ci-gate.md discusses."""
    print(f"shipped rule, {sims} simulated comparisons each; 20 timed iterations per repeat")
    print(
        f"{'iter_cv':>7} {'run_cv':>6} {'repeats':>7}  {'alpha=0.01 false/power':>22}  {'alpha=0.05 false/power':>22}"
    )
    for cv, run_cv in ((0.02, 0.0), (0.09, 0.0), (0.01, 0.02), (0.05, 0.05), (0.02, 0.09)):
        for repeats in (1, 3, 6):
            scenario = NoiseScenario(cv=cv, repeats=repeats, run_cv=run_cv)
            cells = []
            for alpha in (0.01, 0.05):
                false_alarm, power = _rates(scenario, GateConfig(alpha=alpha, resamples=1000), sims)
                cells.append(f"{false_alarm:10.4f} / {power:9.3f}")
            print(f"{cv:7.2f} {run_cv:6.2f} {repeats:7d}  {cells[0]:>22}  {cells[1]:>22}")
    few = max(200, sims // 4)
    print(f"\nsize criterion, alpha=0.01, 1 repeat, {few} comparisons: point estimate vs interval's lower bound")
    for cv in (0.02, 0.05, 0.09):
        config = GateConfig(alpha=0.01, resamples=1000)
        point = _rates(NoiseScenario(cv=cv), config, few, "point")
        low = _rates(NoiseScenario(cv=cv), config, few, "ci-low")
        print(f"cv={cv:.2f}  point: {point[0]:.4f} / {point[1]:.3f}   ci-low: {low[0]:.4f} / {low[1]:.3f}")


if __name__ == "__main__":
    main()
