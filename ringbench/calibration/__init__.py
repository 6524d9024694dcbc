"""The model's calibration: the simulator's costs fitted on a measured (or imported) record. One door: ``fit``.

    from ringbench.calibration import fit, extrapolation
    calibration = fit(load_run("results/r1"))   # costs, each determined or a stated prior (calibration.sources)
    extrapolation(calibration, cases)           # what a prediction of ``cases`` takes beyond what the run measured

Owns run_views (the run as the fit reads it, derived once: its ring cases, transfers, topology, cores; and its
cases as the simulator's, ``cases_like``), calibrate (``fit``: the compute, host and link costs of a run, each
determined or a stated prior), identify (what a run can determine: the design matrix's row space), calibrate_host
and calibrate_links (their parts), strategy_fit (the strategies' own host time per event; several runs merged
into one record) and coverage (what a prediction extrapolates from the calibration). The predict wing's middle:
may import the simulator (the costs it fits, through its door), the base below (record, figures, scenario,
topology); never the measured run or the answers.
"""

from typing import TYPE_CHECKING

# The public names load on first use (PEP 562): the planner imports the door without pandas, which the fit needs.
_HOMES = {
    "Calibration": "calibrate", "fit": "calibrate", "cases_like": "run_views", "run_cores": "run_views",
    "merge_runs": "strategy_fit", "Extrapolation": "coverage", "extrapolation": "coverage",
}  # fmt: skip

if TYPE_CHECKING:
    from ringbench.calibration.calibrate import Calibration, fit
    from ringbench.calibration.coverage import Extrapolation, extrapolation
    from ringbench.calibration.run_views import cases_like, run_cores
    from ringbench.calibration.strategy_fit import merge_runs


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ringbench.calibration' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ringbench.calibration.{home}"), name)


__all__ = ["Calibration", "Extrapolation", "cases_like", "extrapolation", "fit", "merge_runs", "run_cores"]
