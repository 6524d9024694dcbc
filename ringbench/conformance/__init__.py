"""`ringbench check`: conformance of a context-parallel attention implementation, per tensor, with a diagnosis.

    from ringbench.conformance import check_implementation, plan_cases
    cases, note, skipped, adapter = plan_cases("torch-ring")       # the default matrix, sampled with seed 0
    outcome = check_implementation("torch-ring", cases, note=note)
    outcome.verdict, outcome.findings                                # "pass" | "fail", a DataFrame

check_case.py (a case and its positions), matrix.py (which cases), pool.py and worker.py (rank processes that serve
cases), dense.py (float64 attention under any mask), hypotheses.py (the wrong answers rings give),
evaluate.py (one case's per-tensor verdict), check.py (the run); the findings are ringbench/analysis/conformance.py.
"""

from __future__ import annotations

import importlib

# Rank processes import ringbench.conformance.worker, hence this package: its names load on first use, so that a
# rank does not import pandas and the analyses it never runs.
_WHERE = {"ConformanceCase": "check_case", "DEFAULT_TIMEOUT_S": "check", "CheckOutcome": "check",
          "check_implementation": "check", "plan_cases": "check"}  # fmt: skip


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"ringbench.conformance.{_WHERE[name]}"), name)
    raise AttributeError(name)


__all__ = ["DEFAULT_TIMEOUT_S", "CheckOutcome", "ConformanceCase", "check_implementation", "plan_cases"]
