"""The user's scenario vocabulary, below both producers (the measured run and the simulator) and the commands.

Owns the workload (workload.py: ``Workload``, the axes of one computation, which every case, simulated case, plan
request, adapter call and self-check wraps), the user's scenario (scenario.py: ``Scenario``, ``Case``, loading and
validating a file, the cartesian product of cases), the axis registry (axes.py: every sweep axis once, from which the scenario schema, every
command's options, the summary's shown axes and the docs table come), the fault specs (faults.py), the layers
axis (layers.py) and the names of the implementations (impls.py). Both producers -- the measured run (rank/,
run/) and the simulator -- read it; it imports only the vocabulary, the kernels' names, the layout's arithmetic
and the orders.
"""

from __future__ import annotations

from ringbench.scenario.axes import AXES, AXIS_NAMES, INT_AXES, SHOWN_AXES, Axis, axes_for, axis
from ringbench.scenario.workload import WORKLOAD_FIELDS, Workload

__all__ = ["AXES", "AXIS_NAMES", "INT_AXES", "SHOWN_AXES", "WORKLOAD_FIELDS", "Axis", "Workload", "axes_for", "axis"]
