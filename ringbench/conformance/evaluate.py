"""One case's verdict: every rank's tensors against float64, per tensor and per rank, with a diagnosis.

``evaluate(case, shards)`` takes what each rank returned (out, and where exposed lse; dq, dk, dv) and gives one
row per (tensor, rank): the largest absolute error of the rank's rows, the tensor's scale and tolerance
(ringbench/conformance/tolerance.py), how many values are not finite, the kind (ok, wrong, imprecise, nonfinite),
the token positions where it fails and, when a differential check explains it, the diagnosis
(ringbench/conformance/hypotheses.py). It also returns the assembled global tensors, for the CP-degree
invariance check.
"""

from __future__ import annotations

import torch

from ringbench.conformance.check_case import ConformanceCase
from ringbench.conformance.dense import KEY_TENSORS, TENSORS, Problem, assemble, build_problem, solve
from ringbench.conformance.hypotheses import backward_matches, bad_rows, forward_matches, nonfinite_diagnosis
from ringbench.conformance.tolerance import error_kind, tolerance

MAX_RANGES = 6  # a "where" lists at most this many position ranges, then a count


def ranges_text(positions: list[int], limit: int = MAX_RANGES) -> str:
    """ "3-7, 12, 20-31" for sorted positions (at most ``limit`` ranges, then "... (+n more)")."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    shown = [f"{a}-{b}" if b > a else f"{a}" for a, b in runs[:limit]]
    more = f" (+{len(runs) - limit} more ranges)" if len(runs) > limit else ""
    return ", ".join(shown) + more


def row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """(S,) largest |got - want| of each row of a (B, H, S[, D]) tensor: NaN where got is not finite, 0 where the
    reference is undefined (a row that sees nothing under a hypothesis)."""
    defined = torch.isfinite(want)
    diff = torch.where(defined, (got - want).abs(), torch.zeros_like(want))
    diff = torch.where(defined & ~torch.isfinite(got), torch.full_like(diff, float("nan")), diff)
    rows = diff.movedim(2, 0).reshape(diff.shape[2], -1)  # (S, B * H [* D])
    worst = torch.nan_to_num(rows, nan=0.0).amax(1)
    return torch.where(torch.isnan(rows).any(1), torch.full_like(worst, float("nan")), worst)


def evaluate(case: ConformanceCase, shards: list[dict]) -> tuple[list[dict], dict]:
    """(rows, global tensors) of one case whose ranks all returned their tensors (see the module doc)."""
    problem = build_problem(case)
    truth = solve(problem, problem.visible)
    got = {name: assemble(problem, shards, name) for name in TENSORS}
    tols, scales, kinds, errors, rms = {}, {}, {}, {}, {}
    for name in TENSORS:
        if got[name] is None:
            continue
        reference = truth[name]
        scales[name] = float(torch.nan_to_num(reference, nan=0.0).abs().max())
        tols[name] = tolerance(case.dtype, scales[name])
        errors[name] = row_errors(got[name], reference)  # (S,)
        finite = torch.isfinite(got[name])
        worst = float(torch.nan_to_num(errors[name], nan=0.0).max())
        kinds[name] = error_kind(worst, tols[name], scales[name], int((~finite).sum()))
        defined = finite & torch.isfinite(reference)
        diff = (got[name] - reference)[defined]
        rms[name] = float(diff.pow(2).mean().sqrt()) / scales[name] if diff.numel() and scales[name] > 0 else 0.0
    failing = [n for n, k in kinds.items() if k != "ok"]
    diagnoses = _diagnose(problem, truth, got, tols, kinds, failing)
    rows = []
    for name in [n for n in TENSORS if n in kinds]:
        per_row = errors[name]
        bad = torch.isnan(per_row) | (per_row > tols[name])
        nonfinite_rows = bad_rows(got[name], name)
        for rank, where in enumerate(problem.positions):
            rank_err = per_row[where]
            rank_bad = bad[where]
            nonfinite = int((~torch.isfinite(got[name][:, :, where])).sum())
            worst = float(torch.nan_to_num(rank_err, nan=0.0).max()) if rank_err.numel() else 0.0
            kind = error_kind(worst, tols[name], scales[name], nonfinite)
            failed = sorted(where[rank_bad].tolist())
            rows.append({
                "case_id": case.case_id, "tensor": name, "rank": rank, "max_abs_err": worst,
                "max_rel_err": worst / scales[name] if scales[name] > 0 else 0.0, "rms_rel_err": rms[name],
                "tolerance": tols[name],
                "scale": scales[name], "nonfinite": nonfinite, "kind": kind, "bad_rows": len(failed),
                "rows": int(where.numel()), "where": ranges_text(failed),
                "nonfinite_where": ranges_text(sorted(where[nonfinite_rows[where]].tolist())),
                "diagnosis": diagnoses.get(name, "") if kind != "ok" else "",
            })  # fmt: skip
    return rows, got


def _diagnose(problem: Problem, truth: dict, got: dict, tols: dict, kinds: dict, failing: list[str]) -> dict:
    """{tensor: diagnosis} of the failing tensors."""
    found: dict[str, str] = {}
    nonfinite = [n for n in failing if kinds[n] == "nonfinite"]
    if nonfinite:
        found.update(nonfinite_diagnosis(problem, got, nonfinite))
    finite = [n for n in failing if kinds[n] != "nonfinite"]
    if not finite:
        return found
    forward_ok = all(kinds.get(n, "ok") == "ok" for n in ("out", "lse"))
    if not forward_ok:
        found.update(forward_matches(problem, truth, got, tols, finite))
        for name in finite:
            if name not in found and name in ("dq", *KEY_TENSORS):
                found[name] = "follows from the forward (wrong too)"
        return found
    matched = backward_matches(problem, truth, got, tols, finite)
    rest = [n for n in finite if n not in matched]
    if rest:  # a backward that runs another mask or misses steps of its own
        matched.update({n: d for n, d in forward_matches(problem, truth, got, tols, rest).items()})
    found.update({name: f"forward right; {text}" for name, text in matched.items()})
    return found


def compare_worlds(case: ConformanceCase, ours: dict, other: dict, other_world: int) -> list[dict]:
    """CP-degree invariance: the same global problem at ``other_world`` ranks against this case, per tensor."""
    problem_scale = {}
    rows = []
    for name in TENSORS:
        a, b = ours.get(name), other.get(name)
        if a is None or b is None:
            continue
        both = torch.isfinite(a) & torch.isfinite(b)
        diff = float((a[both] - b[both]).abs().max()) if bool(both.any()) else 0.0
        problem_scale[name] = float(torch.nan_to_num(b, nan=0.0).abs().max())
        tol = 2 * tolerance(case.dtype, problem_scale[name])  # two results, each within its own tolerance
        agree = bool(torch.equal(torch.isfinite(a), torch.isfinite(b))) and diff <= tol
        rows.append({"case_id": case.case_id, "tensor": name, "world": case.world, "other_world": other_world,
                     "max_abs_diff": diff, "tolerance": tol, "agree": agree})  # fmt: skip
    return rows


__all__ = ["compare_worlds", "evaluate", "ranges_text", "row_errors"]
