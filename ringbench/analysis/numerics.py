"""Numerics: the ring's error against the float64 single-device reference, by world size and dtype.

Reads the cases table only (``fwd_max_abs_err``, ``bwd_max_abs_err``: max |ring - reference| over the outputs
and gradients; NaN when the run had --no-check). The online-softmax merge is exact up to floating-point
association, so the error should track the dtype's epsilon and grow slowly, if at all, with the number of merged
blocks (the world size).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NUMERICS_COLUMNS = ["world", "dtype", "cases", "checked", "fwd_max_abs_err", "bwd_max_abs_err", "passed"]
WORST_COLUMNS = ["case_id", "phase", "dtype", "world", "max_abs_err", "passed"]


def _errors(cases: pd.DataFrame) -> pd.DataFrame:
    table = cases.copy()
    for column in ("fwd_max_abs_err", "bwd_max_abs_err"):
        table[column] = pd.to_numeric(table.get(column, np.nan), errors="coerce")
    table["passed"] = table.get("passed", True)
    return table


def numerics_table(cases: pd.DataFrame) -> pd.DataFrame:
    """Per (world, dtype): how many cases, how many checked, the worst forward and backward error, all passed."""
    if cases is None or cases.empty or "world" not in cases or "dtype" not in cases:
        return pd.DataFrame(columns=NUMERICS_COLUMNS)
    table = _errors(cases)
    checked = table[["fwd_max_abs_err", "bwd_max_abs_err"]].notna().any(axis=1)
    grouped = table.assign(checked=checked).groupby(["world", "dtype"], sort=True)
    out = grouped.agg(
        cases=("case_id", "size"),
        checked=("checked", "sum"),
        fwd_max_abs_err=("fwd_max_abs_err", "max"),
        bwd_max_abs_err=("bwd_max_abs_err", "max"),
        passed=("passed", lambda s: bool(pd.Series(s).fillna(True).astype(bool).all())),
    )
    out = out.reset_index().astype({"world": "int64", "checked": "int64"})
    out["passed"] = out["passed"].astype(object).where(out["checked"] > 0, None)  # nothing checked: no verdict
    return out[NUMERICS_COLUMNS]


def worst_error(cases: pd.DataFrame) -> pd.DataFrame:
    """The single worst checked error of the run (one row), or an empty table when nothing was checked."""
    if cases is None or cases.empty:
        return pd.DataFrame(columns=WORST_COLUMNS)
    table = _errors(cases)
    long = table.melt(
        id_vars=[c for c in ("case_id", "dtype", "world", "passed") if c in table],
        value_vars=["fwd_max_abs_err", "bwd_max_abs_err"],
        var_name="phase",
        value_name="max_abs_err",
    ).dropna(subset=["max_abs_err"])
    if long.empty:
        return pd.DataFrame(columns=WORST_COLUMNS)
    long["phase"] = long["phase"].str.slice(0, 3)
    return long.loc[[long["max_abs_err"].idxmax()]].reindex(columns=WORST_COLUMNS).reset_index(drop=True)
