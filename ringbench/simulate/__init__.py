"""The simulator: the model of ring attention and its strategies. SIMULATED, never measured.

    from ringbench.scenario import Workload
    from ringbench.simulate import SimCase, Cluster, simulate_case
    result = simulate_case(SimCase(workload=Workload(world=1024, seq=1 << 20), faults=("slow-host:3:1.5",)), costs)

A producer beside the measured run (they never import each other): both read the scenario (ringbench/scenario/)
and write one record. Modules: pair_classes and pair_table (the mask plan's pairs at any N), costs (the price
list, and where each cost came from), priors (a catalogue GPU's costs), case (a case and its cluster), engine (the
vectorised ring), grouped (Ulysses, the hybrid, the double ring), flows (their exchanges priced as vectors), walk
(the critical path), ring_timeline, events, simulated_record (the record). Its costs come from a measured run
through ringbench/calibration/; the advisers above both (ringbench/advise/: plan, recommend's step times, the
simulate command's front) use it. docs/simulate.md is the model in one page. (A ring at given compute and link
times for the tests, ``SimConfig``, is in tests/support/given.py.)
"""

from typing import TYPE_CHECKING

# The public names load on first use (PEP 562): the planner imports the model without pandas, which the record
# writer (simulated_record) needs.
_HOMES = {
    "Cluster": "case", "SimCase": "case", "CaseResult": "case_result", "DEFAULTS": "costs", "Costs": "costs",
    "LinkCost": "costs", "run_data": "simulated_record", "simulate_case": "simulated_record",
    "simulate_cases": "simulated_record", "write_run": "simulated_record",
}  # fmt: skip

if TYPE_CHECKING:
    from ringbench.simulate.case import Cluster, SimCase
    from ringbench.simulate.case_result import CaseResult
    from ringbench.simulate.costs import DEFAULTS, Costs, LinkCost
    from ringbench.simulate.simulated_record import run_data, simulate_case, simulate_cases, write_run


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ringbench.simulate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ringbench.simulate.{home}"), name)


__all__ = [
    "DEFAULTS",
    "CaseResult",
    "Cluster",
    "Costs",
    "LinkCost",
    "SimCase",
    "run_data",
    "simulate_case",
    "simulate_cases",
    "write_run",
]
