"""The one-GPU check: its dry run passes anywhere within a minute (CI runs it this way), it refuses in one line
without a GPU, its deadline kills a child's whole process tree, and its CUPTI analysis (benchmarks/gpu_timing.py)
gives the right overlap and edges on synthetic traces, so the first real GPU run meets code that has run."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_coverage import CHECK_NAMES, coverage_lines  # noqa: E402
from gpu_timing import edge_residuals, overlap, profiled_edges, recorded_edges, step_kernels  # noqa: E402

ENV = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine run the real check")


@NO_GPU
@pytest.mark.slow
def test_gpu_check_dry_run_passes_without_a_gpu(tmp_path):
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["dry_run"] and summary["passed"]
    names = [c["check"] for c in summary["checks"]]
    assert names == ["env", "placement", "triton-compile", "correctness-float16", "correctness-bfloat16",
                     "correctness-float32", "no-host-sync", "overlap", "spin-drift", *CHECK_NAMES, "adapters", "memory",
                     "calibration", "gpu-tests", "multi-rank"]  # fmt: skip
    covered = {row["item"]: row for row in summary["coverage"]}  # every strategy and mask family has its line
    assert {"strategy ring", "strategy ulysses", "strategy hybrid:U", "strategy double-ring:W", "strategy allgather",
            "buffer short ring", "mask none", "mask causal", "mask causal-naive", "mask causal-document",
            "mask full-document", "mask window", "mask causal-document+window"} == set(covered)  # fmt: skip
    assert all(row["ok"] is None and row["line"].startswith("not checked") for row in covered.values())
    for check in summary["checks"]:
        assert check["facts"] and all(fact.strip() for fact in check["facts"]), check
        if check["ok"] is None and check["check"] != "multi-rank":  # nothing measured on a GPU: it says so
            text = " ".join(check["facts"])
            assert "not checked" in text or "not measured" in text or "dry run" in text, check
    assert "one GPU cannot show multi-rank behaviour" in done.stdout
    assert "gpu_check: 1 passed, 0 failed, 20 not checked (dry run" in done.stdout
    from gpu_check import GPU_TESTS

    assert "which adds up to the budget of 420 s" in done.stdout and all(test in done.stdout for test in GPU_TESTS)
    tests = next(c for c in summary["checks"] if c["check"] == "gpu-tests")  # every curated id exists and is gpu-marked
    assert f"{len(GPU_TESTS)} of the {len(GPU_TESTS)} curated gpu-marked tests collected" in tests["facts"][0]
    print(f"dry run: {time.monotonic() - started:.1f} s")


@NO_GPU
def test_without_a_gpu_and_without_dry_run_it_refuses_in_one_line(tmp_path, capsys):
    from gpu_check import main

    assert main([str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert "no CUDA device is visible" in captured.err and not (tmp_path / "summary.json").exists()


def test_a_deadline_that_leaves_no_time_checks_nothing_and_says_so(tmp_path, capsys, monkeypatch):
    """... and the check itself never initialises CUDA: the device facts come from a child (a context in this
    process would lock every child out of the GPU under the EXCLUSIVE_PROCESS compute mode)."""
    from gpu_check import main

    def touched(*args, **kwargs):
        raise AssertionError("gpu_check touched CUDA in its own process")

    for name in ("is_available", "device_count", "get_device_properties", "get_device_name", "init", "_lazy_init",
                 "current_device", "set_device"):  # fmt: skip
        monkeypatch.setattr(torch.cuda, name, touched)
    assert main(["--dry-run", "--budget", "1", str(tmp_path)]) == 0
    assert f"torch {torch.__version__}, Triton" in capsys.readouterr().out  # read in the child
    summary = json.loads((tmp_path / "summary.json").read_text())
    skipped = [c for c in summary["checks"] if c["facts"][0].startswith("not checked: the deadline left")]
    assert len(skipped) == 7 and all(c["seconds"] == 0 for c in skipped)  # nothing was started past the deadline


def test_a_child_past_its_time_is_killed_with_its_whole_tree():
    from gpu_check import run_child

    # The child starts a grandchild in a process group of its own that ignores SIGTERM, as a rank would.
    grandchild = ("import os, signal, time; os.setpgid(0, 0); signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "time.sleep(60)")  # fmt: skip
    code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
            "print(p.pid, flush=True); time.sleep(60)")  # fmt: skip
    started = time.monotonic()
    child = run_child([sys.executable, "-c", code], timeout_s=2.0)
    assert child.code is None and time.monotonic() - started < 15
    pid = int(child.stdout.split()[0])
    time.sleep(0.5)
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


# -- the CUPTI analysis on synthetic traces -------------------------------------------------------------------------
MARKER = "ringbench:fwd step 0"


def _trace(kernels: list[tuple[str, int, int, int]], step=(0, 100)) -> pd.DataFrame:
    """A trace: the step's range, and per kernel (name, stream, start us, end us) its launch inside the step."""
    rows = [{"name": MARKER, "cat": "user_annotation", "start_ns": step[0] * 1000, "end_ns": step[1] * 1000,
             "stream": -1, "correlation": -1}]  # fmt: skip
    for index, (name, stream, start, end) in enumerate(kernels):
        rows.append({"name": "cudaLaunchKernel", "cat": "cuda_runtime", "start_ns": (step[0] + 1 + index) * 1000,
                     "end_ns": (step[0] + 2 + index) * 1000, "stream": -1, "correlation": 100 + index})  # fmt: skip
        rows.append({"name": name, "cat": "kernel", "start_ns": start * 1000, "end_ns": end * 1000, "stream": stream,
                     "correlation": 100 + index})  # fmt: skip
    return pd.DataFrame(rows)


def _rows(compute, recv) -> list[dict]:
    return [
        {"kind": "compute", "phase": "fwd", "step": 0, "start_ns": compute[0] * 1000, "end_ns": compute[1] * 1000},
        {"kind": "recv", "phase": "fwd", "step": 0, "start_ns": recv[0] * 1000, "end_ns": recv[1] * 1000},
    ]


def test_double_buffering_shows_as_overlap_and_its_edges_agree():
    trace = _trace([("ncclDevKernel_SendRecv(...)", 20, 1000, 6000),  # a 5 ms transfer on NCCL's stream
                    ("pytorch_flash::flash_fwd_kernel<...>", 7, 1010, 7000),  # attention beside it
                    ("vectorized_elementwise_kernel<sigmoid>", 7, 7000, 7100),  # the merge: compute stream
                    ("spin_kernel(long)", 13, 6000, 8000)])  # a 2 ms link delay on the comm stream  # fmt: skip
    kernels = step_kernels(trace, MARKER)
    assert kernels.compute_stream == 7 and len(kernels.compute) == 2 and len(kernels.nccl) == 1
    assert overlap(kernels) == pytest.approx(4990 / 5000)  # attention started 10 us after the transfer
    assert profiled_edges(kernels) == {"compute start": 1_010_000, "compute end": 7_100_000,
                                       "transfer start": 1_000_000, "transfer end": 8_000_000}  # fmt: skip
    shifted = _rows((1010 - 30, 7100 - 30), (1000 - 30, 8000 - 30 + 12))  # recorder 30 us early, one edge 12 us off
    residuals, shift = edge_residuals(recorded_edges(shifted), profiled_edges(kernels))
    assert shift == pytest.approx(30.0) and max(residuals.values()) == pytest.approx(12.0)


def test_a_sync_step_serialises_and_a_late_recorder_edge_is_caught():
    trace = _trace([("ncclDevKernel_SendRecv(...)", 20, 1000, 6000),
                    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", 7, 6005, 11000)])  # fmt: skip
    kernels = step_kernels(trace, MARKER)
    assert overlap(kernels) == pytest.approx(0.0)
    residuals, _ = edge_residuals(recorded_edges(_rows((6005, 11000 + 200), (1000, 6000))), profiled_edges(kernels))
    assert max(residuals.values()) >= 100  # the compute end 200 us late shows against the other edges


def test_nccl_kernels_the_trace_does_not_link_are_found_by_time():
    trace = _trace([("pytorch_flash::flash_fwd_kernel", 7, 1010, 7000)])
    trace = pd.concat([trace, pd.DataFrame([{"name": "ncclDevKernel_SendRecv", "cat": "kernel", "start_ns": 1_000_000,
                                             "end_ns": 6_000_000, "stream": 20, "correlation": 999}])])  # fmt: skip
    kernels = step_kernels(trace, MARKER)
    assert len(kernels.nccl) == 1 and overlap(kernels) == pytest.approx(4990 / 5000)
    with pytest.raises(ValueError, match="no 'ringbench:bwd step 0' range"):
        step_kernels(trace, "ringbench:bwd step 0")


@pytest.mark.slow
@NO_GPU
def test_the_node_check_runs_its_stand_ins_through_torchrun(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--gpus", "2",
                           str(tmp_path)], capture_output=True, text=True, timeout=900, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    by_name = {c["check"]: c for c in summary["checks"]}
    assert {"node-ring", "node-timeline", "node-probe"} <= set(by_name)
    assert "2 ranks (gloo" in by_name["node-ring"]["facts"][0]
    assert "probe over 2 ranks" in by_name["node-probe"]["facts"][0]


def test_coverage_lines_say_checked_partly_checked_failed_or_why_not():
    results = {"cover:ulysses": (True, "ulysses ... pass"), "correctness-float16": (False, "FAIL"),
               "overlap": (None, "not checked: a CPU trace has no CUDA kernels"),
               "cover:document-torch": (True, "pass"),
               "cover:document-triton": (None, "not checked: stopped by the deadline")}  # fmt: skip
    lines = {item: (ok, line) for item, ok, line in coverage_lines(results)}
    assert lines["strategy ulysses"] == (True, "checked by cover:ulysses")
    assert lines["strategy ring"] == (False, "FAILED in correctness-float16")
    assert lines["mask none"] == (None, "not checked on a GPU: a CPU trace has no CUDA kernels")
    assert lines["strategy hybrid:U"][1].startswith("not checked on one GPU")
    # one source of two passed, the other never ran: not "checked"
    assert lines["mask causal-document"] == (True, "partly checked (1 of 2 sources ran): checked by "
                                                   "cover:document-torch; not run: cover:document-triton")  # fmt: skip
    ring = ["correctness-float16", "correctness-bfloat16", "correctness-float32", "no-host-sync", "overlap"]
    (_, ok, line), *_ = coverage_lines({name: (True, "pass") for name in ring})
    assert ok and line.startswith("checked by correctness-float16") and "(world-1 loopback only:" in line


def test_the_node_check_judges_each_strategy_from_cuptis_overlap():
    from gpu_check import judge_strategies, node_strategies

    assert node_strategies(8) == ["ring", "ulysses", "hybrid:2", "double-ring:2", "allgather"]
    assert node_strategies(3) == ["ring", "ulysses", "allgather"]  # no group and ring across groups at 3
    cases = [{"case_id": f"{s}-{b}", "strategy": s, "buffer": b, "passed": True}
             for s in ("ring", "hybrid:2") for b in ("sync", "double")]  # fmt: skip
    timeline = [{"case_id": "ring-sync", "kind": "recv", "profiled_overlap": 0.05},
                {"case_id": "ring-double", "kind": "recv", "profiled_overlap": 0.9},
                {"case_id": "hybrid:2-sync", "kind": "recv", "profiled_overlap": 0.1},
                {"case_id": "hybrid:2-double", "kind": "recv", "profiled_overlap": 0.15}]  # fmt: skip
    judged = judge_strategies(cases, timeline, dry=False)
    assert judged["ring"]["overlap_ok"] is True and judged["hybrid:2"]["overlap_ok"] is False


# -- the plan, the curated tests, the children and the judges, on CPU ----------------------------------------------
def test_the_plan_shares_add_up_to_the_budget_and_the_dry_run_says_so():
    from gpu_check import BUDGET_S, GPU_TESTS, PLAN, STARTUP_S, plan_lines

    assert sum(share for _, share, _ in PLAN) + STARTUP_S == BUDGET_S
    assert all(0 < minimum <= share for _, share, minimum in PLAN)
    lines = plan_lines(BUDGET_S)
    assert "which adds up to the budget of 420 s" in lines[1]
    assert 10 <= len(GPU_TESTS) <= 16 and all(f"    {test}" in lines for test in GPU_TESTS)
    assert "is MORE than the budget of 300 s" in plan_lines(300)[1]


def test_a_check_that_ends_early_leaves_its_time_to_the_next_and_later_checks_keep_theirs():
    from gpu_check import share_limit

    plan = [("a", 10, 5), ("b", 20, 5), ("c", 30, 10)]
    assert share_limit(plan, 0, 65.0) == 10  # on time: its share
    assert share_limit(plan, 1, 60.0) == 25  # "a" ended 5 s early: "b" may take them, "c" keeps its 30 s
    assert share_limit(plan, 2, 50.0) == 45  # the last check takes whatever is left
    assert share_limit(plan, 1, 30.0) == 15  # late: "b" is cut so that "c" keeps its minimum
    assert share_limit(plan, 1, 18.0) < 5  # too late for "b": not run (below its minimum)


def test_children_that_print_more_than_a_pipe_holds_do_not_stall_the_pre_compile(tmp_path):
    from gpu_compile import run_side_by_side

    loud = ("import sys; sys.stderr.write('warning: ' * 40000); sys.stdout.write('x' * 300000 + chr(10)); "
            "print('{\"seconds\": 1.5}')")  # fmt: skip
    failing = "import sys; sys.stderr.write('noise' + chr(10) * 3 + 'the last line'); sys.exit(3)"
    started = time.monotonic()
    ended = {name: (code, result, last) for name, code, result, last in run_side_by_side(
        {"loud": [sys.executable, "-c", loud], "failing": [sys.executable, "-c", failing]}, tmp_path, poll_s=0.05)}  # fmt: skip
    assert time.monotonic() - started < 60
    assert ended["loud"][:2] == (0, {"seconds": 1.5}) and ended["failing"] == (3, None, "the last line")
    assert (tmp_path / "loud.err").stat().st_size == 9 * 40000  # kept, in the check's folder


def test_the_cache_watch_says_whether_a_check_compiled_anything(tmp_path):
    from gpu_compile import CacheWatch, cache_fact

    watch = CacheWatch(tmp_path / "triton")
    assert watch.new() == 0 and cache_fact(0).startswith("Triton cache: hit")
    for name in ("a1", "b2"):
        (tmp_path / "triton" / name).mkdir(parents=True)
    assert watch.new() == 2 and watch.new() == 0
    assert "2 new entries compiled during this check (missed by the pre-compile" in cache_fact(2)
    assert cache_fact(None) == "Triton cache: not used (the interpreter compiles nothing)"


def _phases(sync: float, double: float, spins: float, bwd_double: float | None = None) -> dict:
    def phase(share: float, transfer_ms: float = 8.5, worst_us: float = 12.0) -> dict:
        offsets = {"compute start": 3.0, "compute end": -2.0, "transfer start": 4.0, "transfer end": worst_us}
        return {"overlap": share, "offsets_us": offsets, "shift_us": 40.0,
                "nccl_ms": [8.4], "sendrecv_ms": 8.41, "kernels": {"compute": 3, "nccl": 1, "comm_spins": 0},
                "transfer_ms": transfer_ms, "compute_ms": 11.0, "recorded_recv_ms": 8.45}  # fmt: skip

    bwd = double if bwd_double is None else bwd_double
    return {"sync": {"fwd": phase(sync), "bwd": phase(sync, worst_us=400.0)},
            "double": {"fwd": phase(double), "bwd": phase(bwd)},
            "double+spins": {"fwd": phase(spins), "bwd": phase(spins)}}  # fmt: skip


def test_overlap_is_judged_against_sync_not_against_an_absolute_floor():
    from gpu_overlap import judge

    ok, facts = judge(_phases(sync=0.02, double=0.71, spins=0.75))  # 0.71: below the old 0.8 floor, +0.69 over sync
    assert ok, facts
    assert any("double 0.71, +0.69 over sync (at least +0.6: pass)" in fact for fact in facts)
    assert any(f.startswith("bwd sync: recorder vs profiler edges") and "reported, not judged" in f for f in facts)
    ok, facts = judge(_phases(sync=0.02, double=0.9, spins=0.9, bwd_double=0.5))  # the backward's K/V not hidden
    assert not ok and any(f.startswith("bwd: ") and "FAIL" in f for f in facts)
    ok, facts = judge(_phases(sync=0.35, double=0.99, spins=0.99))  # sync that overlaps is a finding too
    assert not ok and any("sync 0.35 (at most 0.2: FAIL)" in fact for fact in facts)
    short = _phases(sync=0.0, double=0.9, spins=0.9)
    for phases in short.values():
        phases["fwd"]["transfer_ms"] = 3.2  # a loopback too fast for the memory to hold a longer block
    assert not judge(short)[0] and judge(short, memory_bound=True)[0]
    assert any("under 5 ms: the memory allows no larger block, not judged" in f for f in judge(short, True)[1])


def test_edges_are_judged_within_the_timer_floor_or_a_share_of_the_transfer_and_a_wait_for_sms_is_allowed():
    """The forward's edges within max(50 us, 0.5% of the transfer); beside the attention the NCCL kernel may start
    after its mark (it waits for SMs), never before; nccl_ms spans the kernel plus that wait."""
    from gpu_overlap import edge_tolerance_us, judge

    assert edge_tolerance_us(8.5) == 50.0 and edge_tolerance_us(30.0) == pytest.approx(150.0)
    phases = _phases(sync=0.0, double=0.95, spins=0.95)
    double = phases["double"]["fwd"]
    double["offsets_us"]["transfer start"] = 180.0  # the SendRecv kernel waited 180 us for an SM
    double["nccl_ms"] = [8.41 + 0.18]  # NCCL's start event fired at the mark, before the wait
    ok, facts = judge(phases)
    assert ok, facts
    assert any("fwd double: recorder vs profiler edges" in f and "transfer start +180.0 us" in f and "(pass)" in f
               for f in facts)  # fmt: skip
    assert any("fwd double: nccl_ms 8.590 ms" in f and "agree: allowed 8.360-8.640 ms" in f for f in facts)
    double["offsets_us"]["transfer start"] = -90.0  # started before its mark: the comm lane did not wait
    ok, facts = judge(phases)
    assert not ok and any("fwd double:" in f and "FAIL: transfer start" in f for f in facts)
    phases = _phases(sync=0.0, double=0.95, spins=0.95)
    phases["sync"]["fwd"]["offsets_us"]["transfer start"] = 180.0  # nothing computed beside it: no wait for SMs
    assert not judge(phases)[0]
    phases = _phases(sync=0.0, double=0.95, spins=0.95)
    phases["double"]["fwd"]["nccl_ms"] = [8.41 + 0.3]  # more than the kernel and its (4 us) wait
    ok, facts = judge(phases)
    assert not ok and any("DISAGREE" in f for f in facts)
    phases = _phases(sync=0.0, double=0.95, spins=0.95)
    for case in phases.values():
        case["fwd"]["transfer_ms"] = 30.0
        case["fwd"]["offsets_us"]["compute end"] = 120.0  # 0.4% of a 30 ms transfer
    assert judge(phases)[0]


def test_the_shift_comes_from_the_edges_tied_to_a_kernel_beside_their_mark():
    from gpu_timing import TWO_SIDED, edge_offsets

    recorded = {"compute start": 1000, "compute end": 9000, "transfer start": 1000, "transfer end": 7000}
    profiled = {name: ns + 30_000 for name, ns in recorded.items()}
    profiled["transfer start"] += 150_000  # a 150 us wait for SMs: not part of the clocks' offset
    offsets, shift = edge_offsets(recorded, profiled, anchors=TWO_SIDED)
    assert shift == pytest.approx(30.0) and offsets["transfer start"] == pytest.approx(150.0)
    assert all(abs(offsets[name]) < 1e-9 for name in TWO_SIDED)


def test_a_backward_step_is_judged_on_its_kv_transfer_only():
    # The K/V's communicator (stream 20) posts first and runs under the compute; the dK/dV's (stream 30) after it.
    events = _trace([("flash_bwd_kernel", 7, 100, 900), ("ncclDevKernel_SendRecv", 20, 120, 600),
                     ("ncclDevKernel_SendRecv", 30, 950, 1400)], step=(0, 2000))  # fmt: skip
    kernels = step_kernels(events, MARKER)
    assert set(kernels.nccl_by_stream) == {20, 30} and overlap(kernels) < 0.6
    assert overlap(kernels.first_comm()) == 1.0 and kernels.first_comm().nccl == [
        (120_000, 600_000, "ncclDevKernel_SendRecv")
    ]


def test_a_torch_without_the_private_ring_api_reads_not_checked_never_fail():
    from gpu_runs import judge_adapters

    reason = ("impl='torch-ring' cannot run here: torch 2.11.0's private ring API lacks _templated_ring_attention "
              "(pinned to torch 2.13)")  # fmt: skip
    meta = {"skipped": {"c1": reason, "c2": reason, "c3": "impl='ring-flash-attn' cannot run here: not installed"}}
    ok, facts = judge_adapters(0, [], meta, dry=False)
    assert ok is None and "torch-ring not checked (torch 2.11.0's private ring API lacks" in " ".join(facts)
    case = {"impl": "torch-ring", "layout": "zigzag", "step_ms": 1.0, "fwd_max_abs_err": 1e-3, "bwd_max_abs_err": 2e-3}
    cases = [{**case, "dtype": dtype, "passed": True} for dtype in ("float32", "bfloat16")]
    assert judge_adapters(0, cases, {}, dry=False)[0] is True
    assert judge_adapters(0, cases[:1], {}, dry=False)[0] is False  # bf16 missing for no stated reason
    assert judge_adapters(0, [{**cases[0], "passed": False}], meta, dry=False)[0] is False
    assert judge_adapters(1, [], meta, dry=False, tail="Traceback")[0] is False


def test_the_bundle_leaves_a_newer_pyarrow_on_the_machine_alone(monkeypatch):
    import gpu_env

    rows = [{"name": "pyarrow", "requirement": "pyarrow>=14,<20", "file": "pyarrow-19.0.1.whl"},
            {"name": "msgspec", "requirement": "msgspec>=0.18", "file": "msgspec.whl"},
            {"name": "ringbench", "requirement": "", "file": "ringbench.whl"}]  # fmt: skip
    machine = {"pyarrow": "26.0.1", "msgspec": "0.17.0", "ringbench": "0.1.0"}
    monkeypatch.setattr(gpu_env.importlib.metadata, "version", lambda name: machine[name])
    chosen, kept = gpu_env.to_install({"wheels": rows})
    assert kept == ["pyarrow 26.0.1"] and [row["name"] for row in chosen] == ["msgspec", "ringbench"]
    machine["pyarrow"] = "12.0.0"  # older than the lower bound: the bundle's
    assert "pyarrow" in [row["name"] for row in gpu_env.to_install({"wheels": rows})[0]]


def test_kernel_errors_are_judged_absolute_up_to_one_and_relative_above():
    """A bf16 output of 4 is rounded to within 4 x 2**-8 = 0.016 of its exact value: relative above |value| 1, as
    the kernels' final rounding is; absolute below, where a layout or statistics fault shows."""
    from gpu_numerics import max_error, scaled_error

    want = torch.tensor([4.0, -3.0, 0.5, 0.0], dtype=torch.float64)
    rounded = want + torch.tensor([0.016, -0.012, 0.002, 0.001])
    assert max_error(rounded, want) == pytest.approx(0.016) and scaled_error(rounded, want) == pytest.approx(0.004)
    fault = want + torch.tensor([0.0, 0.0, 0.1, 0.0])  # 0.1 on a value of 0.5: a fault, whatever the tolerance
    assert scaled_error(fault, want) == pytest.approx(0.1)
    assert scaled_error(want.to(torch.bfloat16), want) <= 2.0**-8  # one bf16 rounding, scaled


def test_spin_drift_judges_the_pads_of_the_clock_in_use_under_load():
    from gpu_probe import DRIFT_LIMIT, drift_error

    assert drift_error("globaltimer", [1.001, 1.0, 1.002]) == pytest.approx(0.002)
    # SM cycles: the first pad ran at the idle rate (20% long); once corrected from it, the next ones are judged
    assert drift_error("sm-cycles", [1.21, 1.01, 0.99]) == pytest.approx(0.01) and DRIFT_LIMIT >= 0.01
    assert drift_error("sm-cycles", [1.21, 1.08, 1.07]) > DRIFT_LIMIT  # the correction did not hold: FAIL
