"""The user's scenario vocabulary, below both producers (the measured run and the simulator) and the commands.

Owns the user's scenario (scenario.py: ``Scenario``, ``Case``, loading and validating a file, the cartesian
product of cases), the axis registry (axes.py: every sweep axis once, from which the scenario schema, every
command's options, the summary's shown axes and the docs table come), the fault specs (faults.py), the layers
axis (layers.py) and the names of the implementations (impls.py). Both producers -- the measured run (rank/,
run/) and the simulator -- read it; it imports only the vocabulary, the kernels' names, the layout's arithmetic
and the orders.
"""

from __future__ import annotations

from ringbench.scenario.axes import AXES, AXIS_NAMES, INT_AXES, SHOWN_AXES, Axis, axes_for, axis

__all__ = ["AXES", "AXIS_NAMES", "INT_AXES", "SHOWN_AXES", "Axis", "axes_for", "axis"]
