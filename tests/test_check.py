"""`ringbench check`: per-tensor verdicts, diagnoses of planted bugs (tests/cp_rings.py), bad implementations,
the CLI's exit codes and documents, the matrix, the report section.

The default tier runs each planted bug on one small case (one pool of 3 ranks per implementation); the slow tier
runs the default matrix on correct implementations (no false alarm at any world, dtype or mask) and on every
planted bug.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from ringbench.conformance import check_implementation, plan_cases
from ringbench.conformance.check_case import ConformanceCase
from ringbench.conformance.dense import build_problem, solve, visibility
from ringbench.conformance.evaluate import evaluate, ranges_text
from ringbench.conformance.tolerance import CHECK_TOLERANCE, error_kind, tolerance
from ringbench.errors import UsageError

CP = "cp_rings"


def _shards(problem, got: dict) -> list[dict]:
    return [{name: (None if tensor is None else tensor[:, :, rows].float()) for name, tensor in got.items()}
            for rows in problem.positions]  # fmt: skip


def _diagnoses(rows: list[dict]) -> dict[str, str]:
    return {r["tensor"]: r["diagnosis"] for r in rows if r["kind"] != "ok"}


# -- the comparison and the diagnoses, on tensors made to order (no processes) ---------------------------------------


def test_the_truth_passes_and_every_tensor_and_rank_has_a_row():
    case = ConformanceCase.of(world=3, seq=36, heads=4, kv_heads=2, mask="causal-document", docs="lengths:1,2,30,3",
                           layout="striped", dtype="float32")  # fmt: skip
    problem = build_problem(case)
    rows, _ = evaluate(case, _shards(problem, solve(problem, problem.visible)))
    assert {(r["tensor"], r["rank"]) for r in rows} == {
        (t, k) for t in ("out", "lse", "dq", "dk", "dv") for k in range(3)
    }
    assert all(r["kind"] == "ok" for r in rows), [r for r in rows if r["kind"] != "ok"]


def test_float64_shards_of_the_reference_match_it_to_the_last_bits():
    case = ConformanceCase.of(world=2, seq=16, dtype="float64", mask="window:3", layout="zigzag")
    problem = build_problem(case)
    truth = solve(problem, problem.visible)
    shards = [{n: t[:, :, rows] for n, t in truth.items()} for rows in problem.positions]
    rows, _ = evaluate(case, shards)
    assert max(r["max_abs_err"] for r in rows) <= 1e-12


@pytest.mark.parametrize(
    ("name", "make", "tensor", "expected"),
    [
        ("local positions", lambda p: visibility(p.case.rule(), p.local_of, p.local_of), "out", "local to the shard"),
        ("own block only", lambda p: p.visible & (p.rank_of[:, None] == p.rank_of[None, :]), "out",
         "never arrive"),
        ("a step short", lambda p: p.visible & ((p.rank_of[:, None] - p.rank_of[None, :]) % 4 != 3), "out",
         "one step short"),
    ],
)  # fmt: skip
def test_a_wrong_visibility_is_named(name, make, tensor, expected):
    case = ConformanceCase.of(world=4, seq=32, heads=2, mask="causal", layout="contiguous", dtype="float32")
    problem = build_problem(case)
    rows, _ = evaluate(case, _shards(problem, solve(problem, make(problem))))
    assert expected in _diagnoses(rows)[tensor], (name, _diagnoses(rows))


def test_a_contiguous_layout_assumed_is_named_on_zigzag_and_striped():
    for layout in ("zigzag", "striped"):
        case = ConformanceCase.of(world=3, seq=48, heads=2, mask="causal", layout=layout)
        problem = build_problem(case)
        offsets = torch.tensor([0] + [p.numel() for p in problem.positions]).cumsum(0)
        contiguous = offsets[problem.rank_of] + problem.local_of
        got = solve(problem, visibility(case.rule(), contiguous, contiguous))
        rows, _ = evaluate(case, _shards(problem, got))
        assert "assumes a contiguous layout" in _diagnoses(rows)["out"]


def test_backward_bugs_are_named_with_the_forward_right():
    case = ConformanceCase.of(world=3, seq=24, heads=4, kv_heads=2, mask="causal", layout="zigzag")
    problem = build_problem(case)
    truth = solve(problem, problem.visible)
    summed = dict(truth, dk=truth["dk"] + truth["dv"])
    assert "dK carries dV" in _diagnoses(evaluate(case, _shards(problem, summed))[0])["dk"]
    halved = dict(truth, dq=truth["dq"] * 0.5)
    assert "0.5 x the right value" in _diagnoses(evaluate(case, _shards(problem, halved))[0])["dq"]
    moved = dict(truth)
    moved["dv"] = torch.cat([truth["dv"][:, :, problem.positions[(r + 1) % 3]] for r in range(3)], dim=2)
    order = torch.cat(list(problem.positions))
    moved["dv"] = torch.empty_like(truth["dv"]).index_copy_(2, order, moved["dv"])
    text = _diagnoses(evaluate(case, _shards(problem, moved))[0])["dv"]
    assert text.startswith("forward right;") and "rank r+1" in text


def test_a_nan_only_where_a_fully_masked_block_meets_a_live_row_is_named():
    case = ConformanceCase.of(world=2, seq=16, mask="window:3", layout="contiguous")
    problem = build_problem(case)
    truth = solve(problem, problem.visible)
    got = {n: t.clone() for n, t in truth.items()}
    rows = problem.positions[1][3:]  # rank 1's rows past the window see none of rank 0's keys
    got["out"][:, :, rows] = math.nan
    found = _diagnoses(evaluate(case, _shards(problem, got))[0])
    assert "fully masked block gives NaN" in found["out"]
    got["out"][:, :, problem.positions[1][:1]] = math.nan  # a row that sees rank 0's keys: another cause
    assert "fully masked" not in _diagnoses(evaluate(case, _shards(problem, got))[0])["out"]


def test_tolerance_and_kinds():
    assert tolerance("float32", 2.0) == pytest.approx(1e-6 + 2e-5)
    assert CHECK_TOLERANCE["bfloat16"][0] == pytest.approx(4 * 2**-8)
    assert error_kind(1e-7, 1e-5, 1.0, 0) == "ok"
    assert error_kind(2e-5, 1e-5, 1.0, 0) == "imprecise"
    assert error_kind(1.0, 1e-5, 1.0, 0) == "wrong"
    assert error_kind(0.0, 1e-5, 1.0, 3) == "nonfinite"
    assert ranges_text([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"


def test_cases_refuse_bad_axes_in_one_line():
    with pytest.raises(UsageError, match="kv_heads=3"):
        ConformanceCase.of(world=2, seq=16, heads=4, kv_heads=3)
    with pytest.raises(UsageError, match="doc-balanced"):
        ConformanceCase.of(world=2, seq=16, mask="causal", layout="doc-balanced")
    with pytest.raises(UsageError, match="seq=9000"):
        ConformanceCase.of(world=2, seq=9000)


def test_uneven_shards_split_like_tensor_split():
    case = ConformanceCase.of(world=3, seq=11, layout="contiguous")
    assert [p.tolist() for p in case.all_positions()] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    zigzag = ConformanceCase.of(world=2, seq=10, layout="zigzag")
    assert sorted(torch.cat(zigzag.all_positions()).tolist()) == list(range(10)) and not zigzag.even


def test_the_default_matrix_covers_what_is_declared_and_is_seeded():
    from ringbench.conformance.matrix import default_matrix
    from ringbench.rank.impls import get_adapter

    adapter = get_adapter(f"{CP}:correct")
    adapter.missing()
    first, total = default_matrix(adapter.support, seed=3)
    again, _ = default_matrix(adapter.support, seed=3)
    assert first == again and len(first) < total
    assert {c.world for c in first} == set(range(1, 9))
    assert {"float32", "bfloat16", "float16"} <= {c.dtype for c in first}
    assert any(c.gqa for c in first) and any(not c.even for c in first)
    masks = {c.mask.split(":")[0] for c in first}
    assert {"none", "causal", "causal-document", "full-document", "window", "causal-document+window"} <= masks
    assert any(c.docs.count(",") > 10 for c in first) and any(c.docs.count(",") == 2 for c in first)
    windows = [(int(c.mask.split(":")[1]), c) for c in first if c.mask.startswith("window:")]
    assert any(w < c.seq // c.world for w, c in windows) and any(w > c.seq for w, c in windows)
    ladder = [c for c in first if c.purpose == "ladder"]
    assert {c.world for c in ladder} == {1, 2, 3, 4, 8} and len({c.seq for c in ladder}) == 1


# -- real implementations on real ranks -------------------------------------------------------------------------------

QUICK = dict(world=3, seq=48, heads=4, mask="causal", layout="zigzag", dtype="float32")


def _check(impl: str, cases: list[ConformanceCase], timeout_s: float = 20.0):
    return check_implementation(impl, cases, timeout_s=timeout_s)


PLANTED = {  # bug -> (case, tensor, words the diagnosis must hold)
    "dkv_summed": (QUICK, "dk", "dK carries dV"),
    "dkv_local": (QUICK, "dv", "forward right; dV misses the contributions of other ranks' queries"),
    "stale_kv": (QUICK, "dq", "forward right; the backward reuses the rank's own K/V"),
    "local_positions": (QUICK, "out", "positions look local to the shard"),
    "contiguous_only": (QUICK | {"layout": "striped"}, "out", "assumes a contiguous layout"),
    "nan_block": (QUICK | {"mask": "window:3", "layout": "contiguous"}, "out", "fully masked block gives NaN"),
    "short_ring": (QUICK, "out", "stops one step short"),
    "gqa_interleaved": (QUICK | {"kv_heads": 2}, "out", "h % KV"),
    "window_off_by_one": (QUICK | {"mask": "window:5"}, "out", "window is off by one"),
}


@pytest.mark.parametrize("bug", ["dkv_summed", "dkv_local", "stale_kv", "local_positions", "nan_block"])
def test_planted_bugs_are_diagnosed(bug):
    _diagnosed(bug)


def _diagnosed(bug: str) -> None:
    shape, tensor, words = PLANTED[bug]
    outcome = _check(f"{CP}:{bug}", [ConformanceCase.of(**shape)])
    assert outcome.verdict == "fail"
    finding = outcome.findings[outcome.findings["tensor"] == tensor].iloc[0]
    assert words in finding["diagnosis"], finding.to_dict()
    assert finding["ranks"] and finding["where"]


def test_a_correct_ring_passes_with_every_mask_gqa_and_uneven_shards():
    cases = [ConformanceCase.of(world=3, seq=40, heads=4, kv_heads=1, mask="causal-document+window:3",
                             docs="lengths:1,2,30,7", layout="striped", dtype="bfloat16"),
             ConformanceCase.of(world=3, seq=37, heads=2, mask="causal", layout="zigzag", dtype="float16"),
             ConformanceCase.of(world=3, seq=36, heads=2, mask="full-document", docs="lengths:3,31,2",
                             layout="doc-balanced")]  # fmt: skip
    outcome = _check(f"{CP}:correct", cases)
    assert outcome.verdict == "pass", outcome.findings.to_dict("records")
    assert set(outcome.cases["status"]) == {"pass"}


def test_bad_implementations_give_findings_not_tracebacks_and_leave_no_process():
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    outcome = _check(f"{CP}:hangs", [ConformanceCase.of(world=2, seq=16)], timeout_s=1.0)
    assert outcome.cases.iloc[0]["seconds"] < 1.0 + 1.5 + 1.0  # the group's timeout, then the grace period
    hang = outcome.findings.iloc[0]
    assert hang["kind"] == "hang" and hang["ranks"] == [1] and "stalled in the fwd" in hang["diagnosis"]
    for bug, kind, words in (("raises", "error", "boom: rank 0 gave up"), ("wrong_shape", "shape", "has shape")):
        finding = _check(f"{CP}:{bug}", [ConformanceCase.of(world=2, seq=16)]).findings.iloc[0]
        assert finding["kind"] == kind and words in finding["where"], finding.to_dict()
    rejects = _check(f"{CP}:rejects_window", [ConformanceCase.of(world=2, seq=16, mask="window:3"),
                                              ConformanceCase.of(world=2, seq=16, mask="causal")]).findings  # fmt: skip
    assert "declares mask window but raises" in rejects.iloc[0]["diagnosis"]
    assert {p.pid for p in multiprocessing.active_children()} <= before


def test_an_implementation_that_cannot_be_imported_is_one_line():
    with pytest.raises(UsageError, match="cannot import 'no_such_module_here'") as info:
        plan_cases("no_such_module_here:attention")
    assert "\n" not in str(info.value)
    with pytest.raises(UsageError, match="has no function 'nothing'"):
        plan_cases(f"{CP}:nothing")


def test_the_documented_example_passes():
    cases = [ConformanceCase.of(world=3, seq=42, heads=4, kv_heads=2, mask="causal-document+window:4",
                             docs="lengths:2,37,3", layout="zigzag", dtype="bfloat16")]  # fmt: skip
    assert _check("cp_allgather:attention", cases).verdict == "pass"
    with_lse = _check("cp_allgather:with_lse", cases)
    assert with_lse.verdict == "pass" and "lse" in set(with_lse.tensors["tensor"])


def test_a_function_written_for_the_first_interface_still_runs():
    outcome = _check(f"{CP}:legacy", [ConformanceCase.of(world=2, seq=32, layout="zigzag")])
    assert outcome.verdict == "pass"


# -- the command ------------------------------------------------------------------------------------------------------


def test_cli_json_exit_codes_and_human_summary(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from ringbench.cli.app import app

    runner = CliRunner()
    result = runner.invoke(app, ["check", "--impl", f"{CP}:dkv_summed", "--world", "2", "--seq", "16", "--json"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["format"] == "ringbench-check" and document["verdict"] == "fail"
    finding = document["findings"][0]
    assert {"tensor", "kind", "ranks", "max_abs_err", "tolerance", "diagnosis", "where"} <= set(finding)
    assert finding["tensor"] == "dk" and "dK carries dV" in finding["diagnosis"]
    human = runner.invoke(app, ["check", "--impl", f"{CP}:correct", "--world", "2", "--seq", "16", "--report",
                                str(tmp_path / "r")])  # fmt: skip
    assert human.exit_code == 0, human.output
    assert "PASS" in human.stdout and "[1/1]" in human.stderr
    page = (tmp_path / "r" / "report.html").read_text()
    assert "Conformance" in page and "The matrix" in page
    bad = runner.invoke(app, ["check", "--impl", "nope"])
    assert bad.exit_code == 2 and "impl='nope' is not known" in bad.stderr
    unsupported = runner.invoke(app, ["check", "--impl", "torch-ring", "--mask", "window:3"])
    assert unsupported.exit_code == 2 and "nothing to check" in unsupported.stderr


# -- wide: the default matrix, every planted bug (slow tier) ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("impl", [f"{CP}:correct", "ringbench"])
def test_correct_implementations_pass_the_default_matrix(impl):
    cases, note, _, _ = plan_cases(impl)
    outcome = check_implementation(impl, cases, note=note)
    assert outcome.verdict == "pass", outcome.findings.to_dict("records")
    assert outcome.invariance["agree"].all() and len(outcome.invariance)


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["contiguous_only", "short_ring", "gqa_interleaved", "window_off_by_one"])
def test_more_planted_bugs_are_diagnosed(bug):
    _diagnosed(bug)


@pytest.mark.slow
def test_low_precision_partials_are_diagnosed_as_error_growing_with_the_cp_degree():
    from ringbench.conformance.matrix import ladder
    from ringbench.rank.impls import get_adapter

    adapter = get_adapter(f"{CP}:low_precision")
    adapter.missing()
    outcome = check_implementation(f"{CP}:low_precision", ladder(adapter.support))
    texts = " ".join(outcome.findings["diagnosis"])
    assert outcome.verdict == "fail" and "grows with the CP degree" in texts, texts
    correct = check_implementation(f"{CP}:correct", ladder(adapter.support))
    assert correct.verdict == "pass", correct.findings.to_dict("records")


def test_run_rows_name_the_non_finite_tensors_instead_of_reading_unchecked():
    from ringbench.cli.run_cmd import json_cases
    from ringbench.cli.views import case_line
    from ringbench.rank.layer_checks import nonfinite_tensors

    out = torch.zeros(1, 1, 4, 2)
    grads = (torch.zeros(1, 1, 4, 2), torch.full((1, 1, 4, 2), math.nan), torch.zeros(1, 1, 4, 2))
    assert nonfinite_tensors(out, grads) == "dk"
    assert nonfinite_tensors([out], [grads]) == "dk" and nonfinite_tensors(out, None) == ""
    row = {"case_id": "c", "ring": "0-1", "fwd_max_abs_err": math.nan, "bwd_max_abs_err": math.nan, "passed": False,
           "nonfinite": "dk", "emulated": False, "kernel": "torch", "impl": "x:y", "mask": "causal",
           "layout": "zigzag", "buffer": "double", "order": "identity", "world": 2, "seq": 8, "step_ms": 1.0,
           "step_ms_p10": 1.0, "step_ms_p90": 1.0, "exposed_comm_frac": 0.1}  # fmt: skip
    import pandas as pd

    assert json_cases(pd.DataFrame([row]))[0]["passed"] is False
    assert "non-finite dk" in case_line(row, 1, 1)


def test_declared_block_multiples_and_forward_only_shape_the_matrix():
    from ringbench.conformance.matrix import default_matrix
    from ringbench.rank.impls import get_adapter

    blocks = get_adapter(f"{CP}:blocks_of_8")
    blocks.missing()
    cases, _ = default_matrix(blocks.support)
    assert cases and all(c.seq // c.world // (2 if c.layout == "zigzag" else 1) % 8 == 0 for c in cases)
    alone = get_adapter(f"{CP}:never_alone")
    alone.missing()
    cases, _ = default_matrix(alone.support)
    assert cases and min(c.world for c in cases) == 2
    forward = get_adapter(f"{CP}:forward_only")
    forward.missing()
    cases, _ = default_matrix(forward.support)
    assert cases and not any(c.backward for c in cases)
    outcome = _check(f"{CP}:forward_only", [ConformanceCase.of(world=2, seq=16, backward=False)])
    assert outcome.verdict == "pass" and set(outcome.tensors["tensor"]) == {"out"}
