"""The one place a cases-table row's axes are written: every producer (the measured run, the simulator, an import,
a made-up record) opens its rows with ``case_row``.

    row = case_row(case, repeat, emulated=False, iters=10, step_ms=4.2)

``case`` is a scenario ``Case`` (ringbench/scenario/scenario.py): its ``case_id`` and ``axes()``, which read its
``Workload``. The record does not import the scenario (it stands below it); it reads those two names.
"""

from __future__ import annotations

from ringbench.record.schema import CASE_AXES


def case_row(case, repeat: int, **columns) -> dict:
    """A cases-table row: ``case_id``, ``repeat``, the axis columns (schema.CASE_AXES) and ``ring`` of ``case``,
    then ``columns`` (figures, settings); a column given in ``columns`` replaces the case's own value in place."""
    axes = case.axes()
    row = {"case_id": case.case_id, "repeat": repeat, **{name: axes[name] for name in CASE_AXES}, "ring": axes["ring"]}
    return row | columns


__all__ = ["case_row"]
