"""The report's "implementations side by side" table, from the record (one row per implementation and case).

Figures are those of the cases table (ringbench/figures/metrics.py defines them): step time with its p10 / p90,
tokens/s, exposed communication, peak memory and the largest errors against float64. The cases table names the
implementation in an ``impl`` column (absent in records made before adapters: ``ringbench``).
"""

from __future__ import annotations

import pandas as pd

IMPLEMENTATION_COLUMNS = ["impl", "case_id", "world", "seq", "mask", "layout", "dtype", "step_ms", "step_ms_p10",
                          "step_ms_p90", "tokens_per_s", "exposed_comm_ms", "exposed_comm_frac", "peak_mem_mb",
                          "fwd_max_abs_err", "bwd_max_abs_err", "passed"]  # fmt: skip


def implementations_table(cases: pd.DataFrame) -> pd.DataFrame:
    """Cases -> IMPLEMENTATION_COLUMNS, medians over repeats (errors and memory: the worst), fastest first."""
    if cases.empty:
        return pd.DataFrame(columns=IMPLEMENTATION_COLUMNS)
    table = cases.assign(impl=cases["impl"].fillna("ringbench") if "impl" in cases else "ringbench")
    keys = ["impl", "case_id", "world", "seq", "mask", "layout", "dtype"]
    grouped = table.groupby(keys, sort=False, dropna=False)
    medians = grouped[["step_ms", "step_ms_p10", "step_ms_p90", "tokens_per_s", "exposed_comm_ms",
                       "exposed_comm_frac"]].median()  # fmt: skip
    worst = grouped[["peak_mem_mb", "fwd_max_abs_err", "bwd_max_abs_err"]].max()
    passed = grouped["passed"].apply(lambda s: bool(pd.Series(s).fillna(True).astype(bool).all()))
    out = medians.join(worst).join(passed).reset_index()
    return out.sort_values("step_ms", kind="stable").reset_index(drop=True)[IMPLEMENTATION_COLUMNS]


__all__ = ["IMPLEMENTATION_COLUMNS", "implementations_table"]
