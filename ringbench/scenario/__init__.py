"""The user's scenario vocabulary, below both producers (the measured run and the simulator) and the commands.

Owns the axis registry (axes.py): every sweep axis once -- its name, type, help text and the commands that take
it -- from which the scenario schema, every command's options, the summary's shown axes and the docs table
come. Imports only the vocabulary (errors, vocab).
"""

from __future__ import annotations

from ringbench.scenario.axes import AXES, AXIS_NAMES, INT_AXES, SHOWN_AXES, Axis, axes_for, axis

__all__ = ["AXES", "AXIS_NAMES", "INT_AXES", "SHOWN_AXES", "Axis", "axes_for", "axis"]
