"""The simulator: a what-if model of ring attention, calibrated on measured runs. SIMULATED, never measured.

    from ringbench.simulate import SimCase, Cluster, simulate_case, calibrate
    result = simulate_case(SimCase(world=1024, seq=1 << 20, faults=("slow-host:3:1.5",)), costs)

``ringbench simulate`` (ringbench/cli/simulate_cmd.py) is the command; docs/simulate.md the model in one page.
Modules: plans (pair classes of the mask plan at any N), costs (the price list), case (a case and its cluster),
engine (the vectorised ring), walk (the critical path), timeline, events, results (the record), calibrate,
scale (the scale view), given (SimConfig: a ring at given compute and link times, on the same model),
calibrate / identify / coverage (costs from a run, what it determined, what a prediction extrapolates), orders
(step times of other ring orders from a run).
"""

from ringbench.simulate.case import Cluster, SimCase
from ringbench.simulate.case_result import CaseResult
from ringbench.simulate.costs import DEFAULTS, Costs, LinkCost
from ringbench.simulate.given import SimConfig, pair_work, simulate, simulate_run, write_simulated_run
from ringbench.simulate.results import run_data, simulate_case, simulate_cases, write_run

__all__ = [
    "DEFAULTS",
    "CaseResult",
    "Cluster",
    "Costs",
    "LinkCost",
    "SimCase",
    "SimConfig",
    "pair_work",
    "run_data",
    "simulate",
    "simulate_case",
    "simulate_cases",
    "simulate_run",
    "write_run",
    "write_simulated_run",
]
