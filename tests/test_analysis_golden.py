"""The figures did not move: every analysis table of a fixed simulated record, as `analyze` computed it before the
import's attribution and speed rework (tests/data/analysis/sim_w4_golden/tables, commit d7688cd), against today's.

Columns added since are allowed; every column the tables had must hold the same values. One change is deliberate
and checked apart: a flagged straggler's cost is now what its iterations save when they are replayed with it at
its peers' speed (analysis/what_if.py) rather than its critical-path time x (1 - 1/ratio). On this record (every
step of the slow rank 1.5x) the two agree within 5% (p10 and p90 within 10%): 13.79 against 14.19 ms per
iteration; the same simulation
without the slow rank is 13.56 ms per iteration faster (tests/test_what_if.py checks the replay against such
pairs).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ringbench.analysis.findings import analyze
from ringbench.record.store import load_run

GOLDEN = Path(__file__).parent / "data" / "analysis" / "sim_w4_golden"
TABLES = ("transfers", "hops", "critical_path", "stragglers", "culprits", "overlap_steps", "overlap_cases",
          "overlap_buffers", "balance_ranks", "balance_cases", "confidence", "summary")  # fmt: skip
COST = {"cost_ms", "cost_ms_p10", "cost_ms_p90", "extra_ms"}  # the deliberate change (module doc)


@pytest.fixture(scope="module")
def analysis():
    return analyze(load_run(GOLDEN / "record"))


@pytest.mark.parametrize("name", TABLES)
def test_the_analysis_tables_are_unchanged(analysis, name):
    before = pd.read_parquet(GOLDEN / "tables" / f"{name}.parquet")
    after = getattr(analysis, name).reset_index(drop=True)
    columns = [c for c in before.columns if c not in COST]
    assert set(columns) <= set(after.columns), set(columns) - set(after.columns)
    left, right = before[columns], after[columns]
    for column in columns:  # list cells (reasons) compare as lists; text (str or categorical) as text
        if left[column].map(lambda v: hasattr(v, "__len__") and not isinstance(v, str)).any():
            left = left.assign(**{column: left[column].map(list)})
            right = right.assign(**{column: right[column].map(lambda v: list(v) if v is not None else v)})
        elif not pd.api.types.is_numeric_dtype(left[column]) or isinstance(right[column].dtype, pd.CategoricalDtype):
            left = left.assign(**{column: left[column].astype(object)})
            right = right.assign(**{column: right[column].astype(object)})
    pd.testing.assert_frame_equal(left, right, check_dtype=False, check_exact=False, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ["stragglers", "culprits", "summary"])
def test_the_straggler_cost_agrees_with_the_old_one_where_every_step_is_slow(analysis, name):
    before = pd.read_parquet(GOLDEN / "tables" / f"{name}.parquet")
    after = getattr(analysis, name).reset_index(drop=True)
    for column in sorted(COST & set(before.columns)):
        rtol = 0.05 if column == "cost_ms" else 0.10  # the spread over iterations: each one replayed on its own
        pd.testing.assert_series_equal(before[column], after[column], check_dtype=False, rtol=rtol, atol=0.05)
