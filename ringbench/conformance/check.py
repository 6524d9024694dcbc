"""`ringbench check` as a library call: run an implementation through a matrix of cases and judge every tensor.

    from ringbench.conformance import check_implementation
    outcome = check_implementation("my_pkg.ring:attention")      # the default matrix, sampled with seed 0
    outcome.verdict, outcome.findings                               # "pass" | "fail", a DataFrame

Cases run world by world, each world on one pool of ranks (ringbench/conformance/pool.py); the parent compares
every case's tensors with float64 (ringbench/conformance/evaluate.py) while the pool waits, keeps the global
tensors of the ladder's cases for the CP-degree invariance check, and finally turns the per-tensor rows into
findings (ringbench/analysis/conformance.py).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from ringbench.analysis.conformance import CASE_COLUMNS, TENSOR_COLUMNS, findings_table, verdict_of
from ringbench.conformance.check_case import ConformanceCase
from ringbench.conformance.evaluate import compare_worlds, evaluate
from ringbench.conformance.matrix import cases_from_axes, default_matrix, sample_note
from ringbench.conformance.pool import CaseRun, PoolFailure, RankPool
from ringbench.errors import UsageError

DEFAULT_TIMEOUT_S = 20.0


@dataclass(slots=True)
class CheckOutcome:
    impl: str
    cases: pd.DataFrame
    tensors: pd.DataFrame
    invariance: pd.DataFrame
    findings: pd.DataFrame
    verdict: str  # pass | fail | skip
    note: str = ""
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    adapter: dict = field(default_factory=dict)


def plan_cases(impl: str, axes: dict | None = None, *, seed: int = 0, full: bool = False, budget: int | None = None,
               device_type: str = "cpu") -> tuple[list[ConformanceCase], str, list[str], dict]:  # fmt: skip
    """(cases, what was chosen and how, skipped combinations, the adapter's description) for ``impl``; UsageError
    when it cannot run here (one line)."""
    from ringbench.rank.impls import get_adapter

    adapter = get_adapter(impl)
    with contextlib.redirect_stdout(sys.stderr):  # importing a user's module may print
        reason = adapter.missing(device_type)
    if reason:
        raise UsageError(f"impl={impl!r} cannot run here: {reason}")
    if device_type not in adapter.support.devices:
        raise UsageError(f"impl={impl!r} cannot run here: it runs on {', '.join(adapter.support.devices)} only")
    given = {key: value for key, value in (axes or {}).items() if value}
    if given:
        cases, skipped = cases_from_axes(given, adapter.support, device_type)
        note = f"the axes given: {len(cases)} case(s)" + (
            f", {len(skipped)} skipped (not supported)" if skipped else ""
        )
    else:
        options = {"budget": budget} if budget else {}
        cases, total = default_matrix(adapter.support, device_type, seed=seed, full=full, **options)
        note, skipped = sample_note(cases, total, seed, full), []
    if not cases:
        raise UsageError(f"impl={impl!r}: nothing to check ({'; '.join(skipped[:3]) or 'no supported case'})")
    return cases, note, skipped, adapter.describe()


def check_implementation(impl: str, cases: list[ConformanceCase], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                         device: str | None = "cpu", on_case: Callable[[dict, int, int], None] | None = None,
                         note: str = "", skipped: list[str] | None = None, adapter: dict | None = None,
                         ) -> CheckOutcome:  # fmt: skip
    """Run ``cases`` (see the module doc); ``on_case(case_row, done, total)`` after each."""
    import torch

    started = time.monotonic()
    threads = torch.get_num_threads()
    # The float64 comparisons are small; the ranks hold the cores. One thread: an idle intra-op pool spinning
    # against busy ranks made each comparison some 30x slower.
    torch.set_num_threads(1)
    case_rows, tensor_rows, invariance_rows = [], [], []
    ladder: dict[tuple, tuple[int, dict]] = {}  # problem -> (world, global tensors) of the smallest world seen
    pool: RankPool | None = None
    try:
        for done, case in enumerate(cases, start=1):
            if pool is None or pool.world != case.world:
                if pool is not None:
                    pool.close()
                pool = RankPool(impl=impl, world=case.world, timeout_s=timeout_s, device=device)
            try:
                run = pool.run(case)
            except PoolFailure as exc:  # the ranks did not even start: the case fails with why
                run = CaseRun(failure=exc.failure)
            row, tensors, got = _judge(case, run)
            case_rows.append(row)
            tensor_rows += tensors
            if got is not None and case.purpose == "ladder":
                key = _problem_key(case)
                if key in ladder:
                    other_world, other = ladder[key]
                    invariance_rows += compare_worlds(case, got, other, other_world)
                else:
                    ladder[key] = (case.world, got)
            if on_case is not None:
                on_case(row, done, len(cases))
    finally:
        if pool is not None:
            pool.close()
        torch.set_num_threads(threads)
    cases_table = pd.DataFrame(case_rows, columns=CASE_COLUMNS)
    tensors_table = pd.DataFrame(tensor_rows, columns=TENSOR_COLUMNS)
    invariance = pd.DataFrame(invariance_rows, columns=["case_id", "tensor", "world", "other_world",
                                                        "max_abs_diff", "tolerance", "agree"])  # fmt: skip
    findings = findings_table(cases_table, tensors_table, invariance)
    return CheckOutcome(impl=impl, cases=cases_table, tensors=tensors_table, invariance=invariance,
                        findings=findings, verdict=verdict_of(findings, cases_table), note=note, skipped=list(skipped or ()),
                        seconds=time.monotonic() - started, adapter=adapter or {})  # fmt: skip


def _problem_key(case: ConformanceCase) -> tuple:
    return (
        case.seq,
        case.heads,
        case.key_value_heads,
        case.head_dim,
        case.batch,
        case.dtype,
        case.mask,
        case.docs,
        case.layout,
    )


def _judge(case: ConformanceCase, run: CaseRun) -> tuple[dict, list[dict], dict | None]:
    row = {"case_id": case.case_id, "world": case.world, "seq": case.seq, "heads": case.heads, "kv_heads": case.key_value_heads,
           "head_dim": case.head_dim, "batch": case.batch, "dtype": case.dtype, "mask": case.mask,
           "docs": case.docs, "layout": case.layout, "purpose": case.purpose, "even": case.even,
           "seconds": run.seconds, "status": "pass", "failure": "", "failure_line": "", "failure_ranks": "",
           "lse": False}  # fmt: skip
    if run.failure is not None:
        row |= {"status": "fail", "failure": run.failure.kind, "failure_line": run.failure.line,
                "failure_ranks": ",".join(map(str, run.failure.ranks))}  # fmt: skip
        if run.failure.kind == "refused":
            row["status"] = "skip"
        return row, [], None
    tensors, got = evaluate(case, run.shards)
    row["lse"] = any(t["tensor"] == "lse" for t in tensors)
    failed = [t for t in tensors if t["kind"] != "ok"]
    if failed:
        row["status"] = "fail"
    for name in ("out", "lse", "dq", "dk", "dv"):
        mine = [t for t in tensors if t["tensor"] == name]
        row[f"{name}_err"] = max((t["max_abs_err"] for t in mine), default=float("nan"))
        row[f"{name}_rel"] = max((t["max_rel_err"] for t in mine), default=float("nan"))
        row[f"{name}_rms"] = mine[0]["rms_rel_err"] if mine else float("nan")  # one figure for the whole tensor
        row[f"{name}_kind"] = _worst_kind([t["kind"] for t in mine])
    return row, tensors, got


def _worst_kind(kinds: list[str]) -> str:
    for kind in ("nonfinite", "wrong", "imprecise", "ok"):
        if kind in kinds:
            return kind
    return ""


__all__ = ["DEFAULT_TIMEOUT_S", "CheckOutcome", "check_implementation", "plan_cases"]
