"""The simulator: the model of ring attention and its strategies. SIMULATED, never measured. Two doors:

    from ringbench.scenario import Workload
    from ringbench.simulate import Cluster, SimCase, predict, simulate_case
    case = SimCase(workload=Workload(world=1024, seq=1 << 20), faults=("slow-host:3:1.5",))
    predict(case, costs, Cluster()).step_ms     # the times alone: no record, no critical-path walk (the planner)
    simulate_case(case, costs).row["step_ms"]   # the case's events and record row (``ringbench simulate``)

``run_data`` and ``write_run`` turn simulated cases into the record a run writes, labelled SIMULATED. The price
list (``Costs``, ``DEFAULTS``) comes from the documented defaults, a GPU of the hardware catalogue
(``gpu_prior``, ``find_hardware``) or a measured run (ringbench/calibration/, ``fit``).

Modules: case (``SimCase``, ``Cluster``, and the phase models a case gives the ring), pair_classes and
pair_table (the mask plan's pairs at any N), costs (the price list, and where each cost came from), priors (a
catalogue GPU's costs), phase_ring (one phase of a ring, vectorised over positions; fastring its compiled pass),
ring_timeline (a ring's phases end to end), walk (the critical path), events (a timeline as the record's rows),
grouped, flows and strategy_results (Ulysses, the hybrid, the double ring), traffic (bytes per link class),
host_floor (the framework's host time), prediction and simulated_record (the two doors), case_result.
docs/simulate.md is the model in one page.

The predict wing's base: the calibration (ringbench/calibration/) and the advisers (ringbench/advise/) build on it
through these names; it imports only the base (scenario, figures, record, engine, topology, hardware).
(A ring at given compute and link times for the tests, ``SimConfig``, is in tests/support/given.py.)
"""

from typing import TYPE_CHECKING

# The public names load on first use (PEP 562): the planner imports the model without pandas, which the record
# writer (simulated_record) needs.
_HOMES = {
    "Cluster": "case", "SimCase": "case", "CaseResult": "case_result", "DEFAULTS": "costs", "Costs": "costs",
    "LinkCost": "costs", "Prediction": "prediction", "predict": "prediction", "describe_framework": "priors",
    "find_hardware": "priors", "framework_costs": "priors", "gpu_prior": "priors", "MAX_EVENTS": "simulated_record",
    "run_data": "simulated_record", "simulate_case": "simulated_record", "simulate_cases": "simulated_record",
    "write_run": "simulated_record",
}  # fmt: skip

if TYPE_CHECKING:
    from ringbench.simulate.case import Cluster, SimCase
    from ringbench.simulate.case_result import CaseResult
    from ringbench.simulate.costs import DEFAULTS, Costs, LinkCost
    from ringbench.simulate.prediction import Prediction, predict
    from ringbench.simulate.priors import describe_framework, find_hardware, framework_costs, gpu_prior
    from ringbench.simulate.simulated_record import MAX_EVENTS, run_data, simulate_case, simulate_cases, write_run


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ringbench.simulate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"ringbench.simulate.{home}"), name)


__all__ = [
    "DEFAULTS",
    "MAX_EVENTS",
    "CaseResult",
    "Cluster",
    "Costs",
    "LinkCost",
    "Prediction",
    "SimCase",
    "describe_framework",
    "find_hardware",
    "framework_costs",
    "gpu_prior",
    "predict",
    "run_data",
    "simulate_case",
    "simulate_cases",
    "write_run",
]
