"""`ringbench compare` and `ringbench baseline save` end to end on synthetic run directories."""

from __future__ import annotations

import json

import pytest
from support.synthetic import lognormal_steps, write_synthetic_run
from typer.testing import CliRunner

from ringbench.cli.app import app

runner = CliRunner()


def _run(path, *, median_ms=100.0, seed=0, cv=0.02, repeats=1, meta=None, axes=None):
    steps = lognormal_steps(cv=cv, iterations=20, repeats=repeats, median_ms=median_ms, seed=seed)
    return write_synthetic_run(path, axes or {}, steps, meta=meta)


def _error_lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


@pytest.fixture
def base(tmp_path):
    return _run(tmp_path / "base", seed=1)


def test_same_distribution_passes(tmp_path, base):
    current = _run(tmp_path / "current", seed=2)
    result = runner.invoke(app, ["compare", str(base), str(current)])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "n.s." in result.output  # the change is shown with its significance


def test_slower_current_fails_with_json_and_markdown(tmp_path, base):
    current = _run(tmp_path / "current", seed=2, median_ms=112.0)
    markdown = tmp_path / "comment" / "gate.md"
    result = runner.invoke(app, ["compare", str(base), str(current), "--json", "--markdown", str(markdown)])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    (case,) = document["cases"]
    assert case["verdict"] == "regression" and case["significant"] is True
    assert case["ratio"] == pytest.approx(1.12, abs=0.02)
    assert case["ci_low"] < case["ratio"] < case["ci_high"] and case["p_value"] < 0.01
    assert case["n_baseline"] == case["n_current"] == 20 and case["unit"] == "iteration"
    assert document["summary"]["regressions"] == 1 and document["passed"] is False
    text = markdown.read_text()
    assert "FAIL" in text and "**regression**" in text and "(significant)" in text


def test_faster_current_is_an_improvement_and_passes(tmp_path, base):
    current = _run(tmp_path / "current", seed=2, median_ms=85.0)
    result = runner.invoke(app, ["compare", str(base), str(current), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["cases"][0]["verdict"] == "improvement"


def test_threshold_and_alpha_options(tmp_path, base):
    current = _run(tmp_path / "current", seed=2, median_ms=112.0)
    result = runner.invoke(app, ["compare", str(base), str(current), "--max-regression", "20%", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["config"]["max_regression"] == pytest.approx(0.20)
    result = runner.invoke(app, ["compare", str(base), str(current), "--max-regression", "lots"])
    assert result.exit_code == 2 and len(_error_lines(result)) == 1
    result = runner.invoke(app, ["compare", str(base), str(current), "--alpha", "2"])
    assert result.exit_code == 2 and "alpha=2.0 is not allowed" in result.output


def test_missing_baseline_is_one_clear_line(tmp_path, base):
    result = runner.invoke(app, ["compare", str(tmp_path / "no-such-run"), str(base)])
    assert result.exit_code == 2
    (line,) = _error_lines(result)
    assert line.startswith("error:") and "no-such-run" in line and "does not exist" in line
    assert "Traceback" not in result.output


def test_directory_that_is_not_a_run_is_one_clear_line(tmp_path, base):
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["compare", str(base), str(tmp_path / "empty")])
    assert result.exit_code == 2
    (line,) = _error_lines(result)
    assert "meta.json is missing" in line


@pytest.mark.parametrize(
    ("meta", "axes", "field"),
    [
        ({"backend": "nccl"}, None, "backend"),
        ({"device_kind": "NVIDIA H200"}, None, "device_kind"),
        ({"torch_version": "2.4.0"}, None, "torch_version"),
        ({"emulated": True}, None, "emulated"),
        (None, {"world": 8}, "world"),
        (None, {"dtype": "bfloat16"}, "dtype"),
    ],
)
def test_metadata_mismatch_refused_unless_allowed(tmp_path, base, meta, axes, field):
    current = _run(tmp_path / "current", seed=2, meta=meta, axes=axes)
    result = runner.invoke(app, ["compare", str(base), str(current)])
    assert result.exit_code == 2
    (line,) = _error_lines(result)
    assert f"{field}:" in line and "--allow-mismatch" in line
    allowed = runner.invoke(app, ["compare", str(base), str(current), "--allow-mismatch", "--json"])
    assert allowed.exit_code == 0, allowed.output
    document = json.loads(allowed.stdout)
    assert len(document["cases"]) == 1 and any(field in m for m in document["mismatches"])


def test_one_sided_cases_are_listed(tmp_path, base):
    steps = lognormal_steps(cv=0.02, iterations=20, seed=3)
    current = write_synthetic_run(tmp_path / "current", {"a": ({}, steps), "new": ({"seq": 8192}, steps)})
    result = runner.invoke(app, ["compare", str(base), str(current), "--json"])
    assert result.exit_code == 0
    document = json.loads(result.stdout)
    assert [c["case_id"] for c in document["only_current"]] == ["new"]
    assert "only in current" in result.output


def test_baseline_save_then_compare_either_way(tmp_path, base):
    baseline_file = tmp_path / "baselines" / "ring.json"
    saved = runner.invoke(app, ["baseline", "save", str(base), str(baseline_file)])
    assert saved.exit_code == 0, saved.output
    assert json.loads(baseline_file.read_text())["format"] == "ringbench-baseline"
    same = _run(tmp_path / "same", seed=2)
    slower = _run(tmp_path / "slower", seed=2, median_ms=115.0)
    assert runner.invoke(app, ["compare", str(baseline_file), str(same)]).exit_code == 0
    assert runner.invoke(app, ["compare", str(baseline_file), str(slower)]).exit_code == 1
    assert runner.invoke(app, ["compare", str(slower), str(baseline_file)]).exit_code == 0  # an improvement
    identical = runner.invoke(app, ["compare", str(baseline_file), str(base), "--json"])
    assert json.loads(identical.stdout)["cases"][0]["ratio"] == pytest.approx(1.0)


def test_baseline_save_of_a_missing_run_is_one_clear_line(tmp_path):
    result = runner.invoke(app, ["baseline", "save", str(tmp_path / "nope"), str(tmp_path / "b.json")])
    assert result.exit_code == 2
    (line,) = _error_lines(result)
    assert "is not a directory" in line


def test_repeats_are_reported_and_verdict_is_reproducible(tmp_path):
    base = _run(tmp_path / "base", seed=1, repeats=3)
    current = _run(tmp_path / "current", seed=2, repeats=3, median_ms=110.0)
    first = runner.invoke(app, ["compare", str(base), str(current), "--json"])
    second = runner.invoke(app, ["compare", str(base), str(current), "--json"])
    assert first.exit_code == second.exit_code == 1
    case = json.loads(first.stdout)["cases"][0]
    assert case["unit"] == "clustered" and case["repeats_baseline"] == 3 and case["n_current"] == 60
    assert first.stdout == second.stdout


def test_fault_injected_current_pairs_with_a_clean_baseline_and_says_so(tmp_path, base):
    # Faults are one run-level setting per side: a faulted run is a legitimate slower current, reported as such.
    current = _run(tmp_path / "current", seed=2, median_ms=150.0, axes={"faults": "slow-rank:0:2;slow-rank:1:2"})
    result = runner.invoke(app, ["compare", str(base), str(current), "--json"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["cases"][0]["verdict"] == "regression" and document["mismatches"] == []
    (difference,) = document["differences"]
    assert difference.startswith("injected faults differ: none (baseline) vs 'slow-rank:0:2;slow-rank:1:2'")
    assert "injected faults differ" in result.stderr


def test_a_side_mixing_fault_sets_pairs_cases_by_their_faults(tmp_path):
    steps = lognormal_steps(cv=0.02, iterations=20, seed=3)
    cases = {"clean": ({}, steps), "slow": ({"faults": "slow-rank:1:2"}, steps * 2)}
    base = write_synthetic_run(tmp_path / "base", cases)
    current = write_synthetic_run(tmp_path / "current", cases)
    result = runner.invoke(app, ["compare", str(base), str(current), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {c["axes"]["faults"] for c in document["cases"]} == {"", "slow-rank:1:2"}
    assert all(c["ratio"] == pytest.approx(1.0) for c in document["cases"])
    assert "same on both sides" in document["differences"][0]


def test_untrustworthy_timings_are_noted_in_the_markdown_and_json(tmp_path, base):
    # 500 emulated kernel calls outlasted their modelled time against 80 compute spans: the emulation saturated.
    saturated = {"ranks": {"4": {"emulation_saturated_blocks": 500}}}
    current = _run(tmp_path / "current", seed=2, meta=saturated)
    markdown = tmp_path / "gate.md"
    result = runner.invoke(app, ["compare", str(base), str(current), "--json", "--markdown", str(markdown)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["baseline"]["caveats"] == []
    (caveat,) = document["current"]["caveats"]
    assert caveat.startswith("c0: emulation saturated")
    assert "INCONCLUSIVE timings in the current run, case c0: emulation saturated" in markdown.read_text()


def test_baseline_noise_prints_the_cvs_per_case_and_its_json(tmp_path):
    steady = write_synthetic_run(
        tmp_path / "steady", {}, lognormal_steps(cv=0.02, iterations=20, repeats=3, median_ms=100.0, seed=3)
    )
    saved = tmp_path / "steady.json"
    assert runner.invoke(app, ["baseline", "save", str(steady), str(saved)]).exit_code == 0
    words = runner.invoke(app, ["baseline", "noise", str(steady), str(saved)])
    assert words.exit_code == 0, words.output
    lines = words.stdout.splitlines()
    assert lines[0] == str(steady) and lines[1].split()[:2] == ["case", "rep"] and lines[3] == str(saved)
    assert lines[2].split()[-6:-4] == ["3", "60"]  # three repeats of 20 iterations
    document = json.loads(runner.invoke(app, ["baseline", "noise", str(steady), "--json"]).stdout)
    assert (document["format"], document["format_version"]) == ("ringbench-baseline-noise", 1)
    ((run, case),) = [(side["run"], case) for side in document["runs"] for case in side["cases"]]
    assert run == str(steady) and case["repeats"] == 3 and case["iterations"] == 60
    assert 0.01 < case["iter_cv"] < 0.03 and case["repeat_cv"] < case["iter_cv"]  # medians of 20 vary less


def test_baseline_noise_of_a_missing_run_is_one_clear_line(tmp_path):
    result = runner.invoke(app, ["baseline", "noise", str(tmp_path / "nope")])
    assert result.exit_code == 2
    (line,) = _error_lines(result)
    assert line.startswith("error:") and "nope" in line and "does not exist" in line
