"""`ringbench run` end to end on local gloo ranks: outputs, JSON, resume, bad input, faults."""

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from ringbench.cli.app import app
from ringbench.record.schema import EVENT_COLUMNS, SCHEMA_VERSION
from ringbench.scenario.scenario import DEFAULT_SCENARIO, load_scenario

runner = CliRunner()
SMALL = ["--seq", "48", "--heads", "2", "--head-dim", "8", "--iters", "2", "--warmup", "1", "--kernel", "emulated:50"]
JSON_KEYS = {
    "case_id", "world", "seq", "heads", "head_dim", "batch", "dtype", "mask", "layout", "buffer", "order", "ring",
    "kernel", "emulated", "backward", "iters", "step_ms", "step_ms_p10", "step_ms_p90", "tokens_per_s", "tflops",
    "exposed_comm_ms", "exposed_comm_frac", "fwd_max_abs_err", "bwd_max_abs_err", "passed",
}  # fmt: skip


def _run(*args):
    return runner.invoke(app, ["run", *args])


def test_run_writes_the_record_and_json(tmp_path):
    result = _run("--world", "3", *SMALL, "--layout", "zigzag", "--buffer", "sync", "--buffer", "double",
                  "--order", "0-2-1", "--out", str(tmp_path), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["cases"]) == 2
    for case in document["cases"]:
        assert set(case) >= JSON_KEYS
        assert case["emulated"] is True and case["passed"] is True and case["ring"] == [0, 2, 1]
        assert case["fwd_max_abs_err"] < 1e-5 and case["bwd_max_abs_err"] < 5e-5
    run_dir = tmp_path / document["run_dir"].split("/")[-1]
    events = pd.read_parquet(run_dir / "events.parquet")
    assert tuple(events.columns) == EVENT_COLUMNS
    assert {"iteration", "compute", "send", "recv", "wait"} <= set(events["kind"])
    assert set(events["rank"]) == {0, 1, 2}
    sends = events[events["kind"] == "send"]
    assert ((sends["dst"] - sends["src"]) % 3 == 2).all()  # ring 0 -> 2 -> 1 -> 0: each sends to its successor
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["emulated"] is True and meta["schema_version"] == SCHEMA_VERSION and meta["backend"] == "gloo"
    assert (run_dir / "cases.csv").read_text().count("\n") == 3


def test_a_run_whose_every_case_is_skipped_says_so_without_a_traceback(tmp_path):
    """Another implementation that cannot run here (CUDA only) is skipped with its reason; when nothing is left,
    the run says so and its JSON has no case (the GPU check reads 'not checked' from that, never a crash)."""
    result = _run("--world", "1", "--device", "cpu", "--impl", "ring-flash-attn", *SMALL, "--out", str(tmp_path),
                  "--json")  # fmt: skip
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert "no case ran: every case was skipped" in result.output
    document = json.loads(result.stdout[result.stdout.index("{") :])
    assert document["cases"] == []
    meta = json.loads((Path(document["run_dir"]) / "meta.json").read_text())
    assert all("ring-flash-attn" in reason for reason in meta["skipped"].values())


def test_no_trace_keeps_iteration_times_only(tmp_path):
    result = _run("--world", "2", *SMALL, "--layout", "zigzag", "--no-trace", "--no-check", "--no-backward",
                  "--out", str(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    events = pd.read_parquet(run_dir / "events.parquet")
    assert set(events["kind"]) == {"iteration"}
    cases = pd.read_parquet(run_dir / "cases.parquet")
    assert cases["step_ms"].notna().all() and cases["fwd_max_abs_err"].isna().all()


def test_resume_runs_only_missing_cases(tmp_path):
    result = _run("--world", "2", *SMALL, "--layout", "zigzag", "--buffer", "sync", "--buffer", "double",
                  "--no-check", "--out", str(tmp_path))  # fmt: skip
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    cases = pd.read_parquet(run_dir / "cases.parquet")
    kept = cases.iloc[:1]
    kept.to_parquet(run_dir / "cases.parquet", index=False)  # as if the run had been killed after one case
    resumed = _run("--resume", str(run_dir), "--json")
    assert resumed.exit_code == 0, resumed.output
    assert "[1/2]" not in resumed.output and "[2/2]" in resumed.output
    assert len(json.loads(resumed.stdout)["cases"]) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mask", "sliding"], "mask='sliding' is not allowed; expected one of: none, causal, causal-naive"),
        (["--order", "0-0-1-2"], "is not a permutation of ranks 0..3"),
        (["--world", "0"], "world=0 is not allowed"),
        (["--seq", "100", "--layout", "zigzag"], "seq=100 is not allowed for layout='zigzag' on 4 ranks"),
        (["--fault", "crash:1"], "fault='crash:1' is not allowed"),
        (["--fault", "slow-rank:9:2"], "fault='slow-rank:9:2' is not allowed on 4 ranks"),
        (["no-such-scenario.yaml"], "scenario='no-such-scenario.yaml' is not allowed: no such file"),
        (["--kernel", "emulated:fast"], "kernel='emulated:fast' is not allowed"),
        (["--dtype", "int8"], "dtype='int8' is not allowed"),
        (["--resume", "/nonexistent/run"], "is not a directory"),
        (["--fault", "slow-rank:-1:2"], "fault='slow-rank:-1:2' is not allowed"),
        (["--fault", "slow-rank:0:inf"], "fault='slow-rank:0:inf' is not allowed"),
        (["--fault", "slow-link:1:1:5"], "a link joins two different ranks"),
        (["--timeout", "nan"], "timeout=nan is not allowed"),
        (["--buffer", "allgather", "--fault", "crash:1:2"], "step 0 with buffer allgather"),
        # a fault that cannot act is refused, per case, naming the hops the ring uses
        (
            ["--world", "8", "--fault", "slow-link:1:4:20"],
            "the ring never sends 1 -> 4 (rank 1 sends to 2); its hops are 0->1, 1->2",
        ),
        (["--order", "identity", "--order", "reverse", "--fault", "slow-link:0:1:5"], "with order reverse on 4 ranks"),
        (["--buffer", "allgather", "--fault", "slow-link:0:1:5"], "not allowed with buffer allgather"),
        (["--fault", "slow-rank:1:2", "--fault", "slow-rank:1:1.5"], "give one fault (slow-rank:1:3 for both factors)"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    result = _run(*args, "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.stderr.splitlines() if line.strip()]) <= 2


def test_scenario_file_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("world: 4\nlayuot: zigzag\n")
    result = _run(str(bad))
    assert result.exit_code == 2 and f"{bad}: field 'layuot' is not allowed" in result.output
    bad.write_text("world: [4]\nbuffer: [sync, quad]\n")
    result = _run(str(bad))
    assert result.exit_code == 2 and f"{bad}: buffer='quad' is not allowed" in result.output
    bad.write_text("world: [4\n")
    result = _run(str(bad))
    assert result.exit_code == 2 and "not valid YAML" in result.output
    bad.write_text("!!python/object/apply:os.system ['echo unsafe']\n")
    result = _run(str(bad))
    assert result.exit_code == 2 and "not valid YAML" in result.output  # safe_load refuses python tags


@pytest.mark.parametrize(
    "name", ["default", "masks", "buffers", "orderings", "stragglers", "scaling", "documents", "windows"]
)
def test_shipped_scenarios_load(name):
    scenario = load_scenario(name)
    assert scenario.cases()


def test_embedded_default_matches_the_shipped_file():
    shipped = load_scenario("default")
    for field in ("world", "seq", "heads", "head_dim", "dtype", "mask", "layout", "buffer", "kernel", "iters"):
        assert getattr(shipped, field) == getattr(DEFAULT_SCENARIO, field), field


def test_crash_ends_the_run_naming_rank_and_step(tmp_path):
    started = time.monotonic()
    result = _run(
        "--world", "3", *SMALL, "--fault", "crash:1:1", "--timeout", "20", "--no-check", "--out", str(tmp_path),
        "--json",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "rank 1 died" in result.stderr and "fwd ring step 1" in result.stderr
    assert elapsed < 20  # well within the timeout: the dead process is noticed at once
    assert "within 20 s" not in result.stderr, result.stderr  # the peers' waits failed early: said as when
    (run_dir,) = tmp_path.iterdir()
    assert "rank 1 died" in json.loads((run_dir / "meta.json").read_text())["failure"]
    document = json.loads(result.stdout)  # --json still prints its one document, saying where and why
    assert document["run_dir"] == str(run_dir) and "rank 1 died" in document["error"]


def test_hang_ends_the_run_within_the_timeout(tmp_path):
    started = time.monotonic()
    result = _run("--world", "3", *SMALL, "--fault", "hang:2:1", "--timeout", "4", "--no-check", "--out", str(tmp_path))
    elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output
    assert "rank 2 stopped responding at fwd ring step 1" in result.output
    assert elapsed < 4 + 15


def test_resume_of_a_file_and_bad_settings_are_usage_errors(tmp_path):
    not_a_run = tmp_path / "file.txt"
    not_a_run.write_text("x")
    result = _run("--resume", str(not_a_run))
    assert result.exit_code == 2 and "is not a directory" in result.output and "Traceback" not in result.output
    bad = tmp_path / "bad.yaml"
    for text, message in (
        ("check: 'false'\n", "check='false' is not allowed; expected true or false"),
        ("name: 5\n", "name=5 is not allowed; expected a string"),
        ("seed: abc\n", "seed='abc' is not allowed; expected an integer"),
    ):
        bad.write_text(text)
        result = _run(str(bad))
        assert result.exit_code == 2 and message in result.output, result.output


def test_a_hang_with_no_live_peer_still_ends(tmp_path):
    started = time.monotonic()
    result = _run("--world", "1", *SMALL, "--fault", "hang:0:0", "--timeout", "3", "--no-check", "--out", str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "rank 0 stopped responding at fwd ring step 0" in result.output
    assert time.monotonic() - started < 3 + 20


def test_nan_errors_fail_the_check():
    import math

    from ringbench.rank.rank_report import RankReport
    from ringbench.run.results import summarize_case
    from ringbench.scenario.scenario import Scenario

    scenario = Scenario(world=(1,), seq=(64,))
    (case,) = scenario.cases()
    result = RankReport(case_id=case.case_id, rank=0, fwd_err=math.nan, bwd_err=0.0)
    _, row = summarize_case(case, [result], scenario, repeat=0)
    assert row["passed"] is False  # a NaN error is a failure, never a pass by comparison with NaN


def test_resume_after_a_crash_finishes_without_the_crash(tmp_path):
    crashed = _run("--world", "2", *SMALL, "--layout", "zigzag", "--buffer", "double", "--fault", "crash:1:1",
                   "--no-check", "--out", str(tmp_path))  # fmt: skip
    assert crashed.exit_code == 1
    (run_dir,) = tmp_path.iterdir()
    resumed = _run("--resume", str(run_dir), "--json")
    assert resumed.exit_code == 0, resumed.output
    assert "crash/hang faults of the original run are not applied again" in resumed.output
    assert len(json.loads(resumed.stdout)["cases"]) == 1
    assert "failure" not in json.loads((run_dir / "meta.json").read_text())


def test_impl_runs_another_ring_under_the_same_sweep_and_check(tmp_path):
    result = _run("--world", "2", "--seq", "64", "--heads", "2", "--head-dim", "8", "--layout", "zigzag",
                  "--impl", "ringbench", "--impl", "torch-ring:alltoall", "--impl", "transformer-engine",
                  "--kernel", "torch", "--iters", "2", "--warmup", "1", "--out", str(tmp_path), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    by_impl = {case["impl"]: case for case in document["cases"]}
    assert set(by_impl) == {"ringbench", "torch-ring:alltoall"} and all(c["passed"] for c in by_impl.values())
    if not torch.cuda.is_available():  # a peer that cannot run here is skipped with its reason, not failed
        reasons = json.loads((Path(document["run_dir"]) / "meta.json").read_text())["skipped"].values()
        assert len(reasons) == 2 and all("transformer-engine" in r and "CUDA" in r for r in reasons)  # sync, double
        assert "skipped 2 case(s): impl='transformer-engine'" in result.stderr
    assert by_impl["torch-ring:alltoall"]["bwd_max_abs_err"] < 5e-5
    theirs_errors = {name: by_impl["torch-ring:alltoall"][f"{name}_err"] for name in ("out", "lse", "dq", "dk", "dv")}
    assert all(err is not None and err < 5e-5 for err in theirs_errors.values()), theirs_errors  # lse: exposed
    assert by_impl["torch-ring:alltoall"]["bwd_max_abs_err"] == max(theirs_errors[g] for g in ("dq", "dk", "dv"))
    assert by_impl["ringbench"]["lse_err"] is None and by_impl["ringbench"]["dk_err"] < 5e-5  # the engine's: no lse
    events = pd.read_parquet(Path(document["run_dir"]) / "events.parquet")
    theirs = events[events["case_id"] == by_impl["torch-ring:alltoall"]["case_id"]]
    assert {"iteration", "compute"} <= set(theirs["kind"])  # per-step spans from the profiler capture
    assert "-torch-ring_alltoall-" in by_impl["torch-ring:alltoall"]["case_id"]
    assert "-torch-ring" not in by_impl["ringbench"]["case_id"]  # ringbench's own ids are unchanged
