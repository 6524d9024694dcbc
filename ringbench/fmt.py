"""The one place that turns values into text and JSON: numbers with a missing mark, NaN as JSON null, rings.

Every table, verdict line and JSON document of ringbench formats through these, so a NaN never prints as "nan" in
one place and "n/a" in another, and a ring is always written ``0-1-2-3``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np


def is_missing(value: object) -> bool:
    """None, NaN (float or numpy) or pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and NA are the only values unequal to themselves
    except (TypeError, ValueError):
        return False


def number(value: object, spec: str = ".2f", missing: str = "–") -> str:
    """``value`` formatted with ``spec``; ``missing`` for None / NaN / NA; anything not numeric as str."""
    if is_missing(value):
        return missing
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return format(float(value) if isinstance(value, np.floating) else value, spec)
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def native(value: object) -> object:
    """A plain, hash-stable Python value: numpy scalars unwrapped, NaN -> None, 4096.0 -> 4096."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def json_value(value: object) -> object:
    """``value`` made JSON-safe, recursively: numpy scalars and arrays unwrapped, NaN and infinities as null."""
    if isinstance(value, Mapping):
        return {str(key): json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return [json_value(item) for item in (value.tolist() if isinstance(value, np.ndarray) else value)]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if is_missing(value):
        return None
    return value


def exposed_text(fraction: float, world: int) -> str:
    """Exposed communication as a share of the step, in one word where there is no share: ``none`` on one rank
    (a 1-rank ring has no communication), ``untraced`` when no spans were recorded (``run --no-trace``)."""
    if int(world) == 1:
        return "none"
    return "untraced" if is_missing(fraction) else f"{100 * float(fraction):.1f}%"


def p_text(p: float, alpha: float) -> str:
    """A p-value with the fewest significant digits (at least 1) that leave it on its own side of ``alpha``:
    p = 0.013 at alpha 0.01 reads ``0.013``, never ``0.01`` (which would read as "not below alpha" and as alpha)."""
    if not isinstance(p, (int, float)) or not math.isfinite(p):
        return "–"
    for digits in range(1, 6):
        text = f"{p:.{digits}g}"
        shown = float(text)
        if (shown < alpha) == (p < alpha) and shown != alpha:
            return text
    return f"{p:.6g}"


def ring_text(ring: Iterable[int]) -> str:
    """Ranks in ring order as ``0-1-2-3`` (the form ``--order`` accepts)."""
    return "-".join(str(int(rank)) for rank in ring)


def duration(ms: object, missing: str = "–") -> str:
    """A time given in ms, in the unit that reads best: ``35.2 us``, ``12.4 ms``, ``3.54 s``, ``8.60 min``,
    ``11.1 h``, ``3.2 d``, with three significant digits (never "39923221.896 ms")."""
    if is_missing(ms):
        return missing
    value = float(ms)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0 ms"
    units = ((1.0, 1e-3, "us"), (1e3, 1.0, "ms"), (60e3, 1e3, "s"), (3600e3, 60e3, "min"), (86400e3, 3600e3, "h"))
    for limit, divisor, unit in units:
        scaled = value / divisor
        digits = 2 if abs(scaled) < 10 else 1 if abs(scaled) < 100 else 0
        if abs(round(scaled, digits)) < limit / divisor:
            return f"{scaled:,.{digits}f} {unit}"
    return f"{value / 86400e3:,.1f} d"
