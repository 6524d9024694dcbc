"""`ringbench import` on real traces checked into tests/data: ringbench's own gloo ring (agreement with its
recorder), the GPU job that holds no ring, clocks across hosts, and every bad input (exit 2, one line)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from cli_helpers import invoke
from support.agreement import agreement, pair_spans

from ringbench.errors import UsageError
from ringbench.record.store import load_run
from ringbench.traces.importer import import_traces, reconstruct
from ringbench.traces.kineto import read_kineto_trace

DATA = Path(__file__).parent / "data" / "kineto"
GLOO = DATA / "gloo_ring_w4"
GPU = [DATA / "gpu128_sampled_rank-0.json.gz", DATA / "gpu128_sampled_rank-1.json.gz"]

# Self-import tolerances (docs/import.md): the same spans, peers and bytes; times close. Measured on the fixture:
# |Δstart| median 0.07 ms (transfers) / 0.21 ms (compute), |Δduration| median 0.09-0.10 / 0.60 ms (the recorder's
# compute span also holds the online-softmax merge, which is no attention op).
TOLERANCE_MS = {"compute": (1.5, 3.0), "send": (0.5, 1.0), "recv": (0.5, 1.0), "wait": (0.5, 20.0)}


def test_self_import_agrees_with_ringbench_recorder():
    rebuilt = reconstruct([GLOO])
    assert rebuilt.ring == [0, 1, 2, 3]
    recorded = pd.read_csv(GLOO / "events.csv")
    table = agreement(pair_spans(recorded, rebuilt.events)).set_index("kind")
    assert (table["missing"] == 0).all() and (table["extra"] == 0).all(), table
    assert (table["same_peers"] == 1.0).all() and (table["same_bytes"] == 1.0).all(), table
    for kind, (start_ms, duration_ms) in TOLERANCE_MS.items():
        assert table.at[kind, "start_median_ms"] <= start_ms, table
        assert table.at[kind, "duration_median_ms"] <= duration_ms, table
    steps = rebuilt.events.query("kind == 'send' and phase == 'bwd' and rank == 0")["step"].tolist()
    assert steps == [0, 0, 1, 1, 2, 2, 3]  # K/V and dK/dV per step, the last dK/dV alone (double buffer)


def test_ranks_read_in_worker_processes_give_the_same_record():
    alone, parallel = reconstruct([GLOO], workers=1), reconstruct([GLOO], workers=2)
    pd.testing.assert_frame_equal(alone.events, parallel.events)
    pd.testing.assert_frame_equal(alone.cases, parallel.cases)
    assert alone.notes == parallel.notes and alone.ring == parallel.ring


def test_import_writes_a_record_that_analyze_report_and_compare_read(tmp_path):
    result = invoke("import", str(GLOO), "--out", str(tmp_path), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    run = load_run(document["run_dir"])
    assert run.meta["source"] == "profiler" and run.meta["kind"] == "import"
    traces = run.meta["imported"]["traces"]
    assert [t["rank"] for t in traces] == [0, 1, 2, 3] and all(len(t["sha256"]) == 64 for t in traces)
    assert run.meta["imported"]["distributed_info"]["backend"] == "gloo"
    case = run.cases.iloc[0]
    assert (case["world"], case["seq"], case["heads"], case["head_dim"], case["dtype"]) == (4, 2048, 4, 64, "float32")
    assert case["ring"] == "0-1-2-3" and case["step_ms"] > 0 and 0 < case["exposed_comm_frac"] < 1
    analyzed = invoke("analyze", document["run_dir"], "--json")
    assert analyzed.exit_code == 0, analyzed.output
    assert json.loads(analyzed.stdout)["exposed_comm_frac"] == pytest.approx(case["exposed_comm_frac"], rel=0.05)
    reported = invoke("report", document["run_dir"], "--out", str(tmp_path / "report"))
    assert reported.exit_code == 0, reported.output
    again = json.loads(invoke("import", str(GLOO), "--out", str(tmp_path), "--json").stdout)
    compared = invoke("compare", document["run_dir"], again["run_dir"])
    # The same workload pairs up (no refusal, exit 2); one captured iteration per side is too few to judge (exit 3).
    assert compared.exit_code == 3 and "too few samples" in compared.stdout, compared.output


def test_gpu_job_traces_parse_but_hold_no_ring(tmp_path):
    events = read_kineto_trace(GPU[0]).events
    kernels = events[events["cat"] == "kernel"]
    assert len(kernels) and (kernels["stream"] >= 0).all() and (kernels["correlation"] >= 0).all()
    result = invoke("import", *map(str, GPU), "--out", str(tmp_path))
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "no ring in these traces" in line and "SendRecv" in line, line


def _copy(tmp_path: Path, names=None) -> Path:
    folder = tmp_path / "traces"
    folder.mkdir(parents=True)
    for path in sorted(GLOO.glob("*.json.gz")):
        if names is None or path.name in names:
            shutil.copy(path, folder / path.name)
    return folder


def _rewrite(path: Path, change) -> None:
    document = json.loads(gzip.decompress(path.read_bytes()))
    change(document)
    path.write_bytes(gzip.compress(json.dumps(document).encode()))


def test_clocks_across_hosts_are_aligned_by_sends_and_receives(tmp_path):
    folder = _copy(tmp_path)
    skew_ns = 40_000_000  # ranks 2 and 3 on another host whose wall clock runs 40 ms ahead
    for name in ("r0-rank2.json.gz", "r0-rank3.json.gz"):
        _rewrite(folder / name, lambda d: d.update(host_name="other", baseTimeNanoseconds=d["baseTimeNanoseconds"]
                                                   + skew_ns))  # fmt: skip
    rebuilt = reconstruct([folder])
    ranks = rebuilt.meta["ranks"]["4"]
    offsets, residual = ranks["clock_offsets_ns"], ranks["clock_residual_ns"]
    assert offsets[0] == offsets[1] == 0 and offsets[2] == offsets[3]
    assert abs(offsets[2] + skew_ns) <= residual + 1_000_000, (offsets, residual)
    assert residual < 20_000_000
    same = reconstruct([GLOO]).events
    moved = rebuilt.events
    gap = (moved["start_ns"] - same["start_ns"]).abs() / 1e6
    assert gap.max() <= residual / 1e6 + 1.0


def _only_communication(document: dict) -> None:
    """Keep a trace's communication, iterations and ring-step markers, drop every other op, and add a user range
    outside the ring (``my_loss``)."""
    keep = ("c10d::", "gloo:", "ringbench:iteration", "ringbench:fwd step", "ringbench:bwd step", "ProfilerStep")
    events = [e for e in document["traceEvents"] if e.get("ph") != "X" or str(e.get("name", "")).startswith(keep)]
    first = next(e for e in events if e.get("ph") == "X")
    events.append(first | {"name": "my_loss", "cat": "user_annotation", "dur": 1, "args": {}})
    document["traceEvents"] = events


def test_compute_is_found_from_the_ring_without_attention_ops(tmp_path):
    """Without SDPA ops (a ring written with matmuls), the block computation is what runs between each post and
    its wait: the import says what it took, per rank, and its share of the step."""
    plain = _copy(tmp_path / "plain")
    for path in plain.glob("*.json.gz"):
        _rewrite(path, lambda d: d.update(traceEvents=[e for e in d["traceEvents"]
                                                        if "scaled_dot_product" not in e.get("name", "")]))  # fmt: skip
    document = json.loads(invoke("import", str(plain), "--out", str(tmp_path / "out"), "--json").stdout)
    compute = document["compute"]
    assert compute["how"] == "ops" and compute["where"] == "post-wait", compute
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in compute["families"], compute
    assert set(compute["per_iteration"]) == {"0", "1", "2", "3"} and 0 < compute["share_of_step"] < 1, compute
    assert document["notes"][0].startswith("compute taken: "), document["notes"]
    rebuilt = reconstruct([GLOO])
    assert rebuilt.meta["imported"]["compute"]["how"] == "attention ops"


def _error(tmp_path, *args) -> str:
    result = invoke("import", *map(str, args), "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line, line
    return line


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    text = tmp_path / "notes.json"
    text.write_text("hello")
    assert "not a PyTorch profiler trace" in _error(tmp_path, text)
    cut = tmp_path / "cut.json.gz"
    data = (GLOO / "r0-rank0.json.gz").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    assert "truncated or corrupt gzip" in _error(tmp_path, cut)
    three = _copy(tmp_path / "a", {"r0-rank0.json.gz", "r0-rank1.json.gz", "r0-rank2.json.gz"})
    assert "rank(s) 3 missing" in _error(tmp_path, three)
    doubled = _copy(tmp_path / "b")
    shutil.copy(doubled / "r0-rank1.json.gz", doubled / "copy-of-rank1.json.gz")
    assert "rank 1 appears in 2 traces" in _error(tmp_path, doubled)
    other = _copy(tmp_path / "c")
    _rewrite(
        other / "r0-rank3.json.gz", lambda d: d.update(baseTimeNanoseconds=d["baseTimeNanoseconds"] + 3600 * 10**9)
    )
    assert "traces of different jobs" in _error(tmp_path, other)
    later = _copy(tmp_path / "c2")  # one host shares one clock: a minute apart is another run, not clock skew
    _rewrite(later / "r0-rank3.json.gz", lambda d: d.update(baseTimeNanoseconds=d["baseTimeNanoseconds"] + 60 * 10**9))
    assert "traces of different jobs" in _error(tmp_path, later)
    assert "traces of different jobs" in _error(tmp_path, GLOO / "r0-rank0.json.gz", GPU[0])
    assert "no compute spans matched" not in _error(tmp_path, *GPU)  # no ring comes first
    bare = _copy(tmp_path / "d")  # between the posts and the waits: no op at all (compute unprofiled)
    for path in bare.glob("*.json.gz"):
        _rewrite(path, _only_communication)
    line = _error(tmp_path, bare)
    assert "no compute spans matched" in line and "--compute-pattern" in line and "record_function" in line, line
    assert "my_loss" in line and "aten::" not in line, line  # the user's own ranges, not aten internals
    assert "no such file" in _error(tmp_path, tmp_path / "absent.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no *.json or *.json.gz traces" in _error(tmp_path, empty)


def test_compute_pattern_must_be_a_regular_expression():
    with pytest.raises(UsageError, match="compute_pattern"):
        import_traces([GLOO], out="/nonexistent", compute_patterns=("(",))


def test_simulate_calibrates_on_an_imported_ring(tmp_path):
    """An imported record has no mask plan: its spans' own FLOPs calibrate the compute rate."""
    document = json.loads(invoke("import", str(GLOO), "--out", str(tmp_path), "--json").stdout)
    result = invoke("simulate", "--from", document["run_dir"], "--world", "8", "--seq", "4096", "--layout", "zigzag",
                    "--buffer", "double", "--out", str(tmp_path / "sim"), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    simulated = json.loads(result.stdout)
    assert simulated["simulated"] is True and simulated["cases"][0]["step_ms"] > 0


def test_recommend_compares_with_the_ring_the_record_measured(tmp_path):
    document = json.loads(invoke("import", str(GLOO), "--out", str(tmp_path), "--json").stdout)
    cases_path = Path(document["run_dir"]) / "cases.parquet"
    cases = pd.read_parquet(cases_path).assign(ring="0-2-1-3")  # as if the job had run that ring
    cases.to_parquet(cases_path)
    topology = Path(__file__).parent / "data" / "topology" / "nvlink_pairs_4gpu.yaml"
    result = invoke("recommend", "--topology", str(topology), document["run_dir"], "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["current_order"] == [0, 2, 1, 3]
