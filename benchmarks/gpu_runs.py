"""The GPU check's checks that are `ringbench run` commands (placement, adapters, memory, calibration) or pytest
(the curated gpu-marked tests), each a child under its share of the deadline (benchmarks/gpu_check.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from gpu_child import Check, json_document, killed_fact, ringbench_command, run_child

ROOT = Path(__file__).resolve().parent.parent
# The gpu-marked tests worth the last share: each checks something the checks before it do not, in seconds, on the
# Triton variants already in the cache (D=128) or on none (Triton's no-host-sync is the timing check's); the full
# gpu-marked suite (196 tests, many Triton variants to compile) does not fit a lent GPU's minutes. The dry run
# collects these ids, so a rename fails on the CPU first.
GPU_TESTS = [
    "tests/test_timeline.py::test_cuda_marks_time_the_device_not_the_launch",
    "tests/test_timeline.py::test_one_rank_nccl_loopback_ring_on_the_device_timeline[double]",
    "tests/test_kernels.py::test_torch_kernel_matches_math_on_cuda[dtype1]",  # fp32: the memory-efficient op
    "tests/test_kernels.py::test_torch_kernel_matches_math_on_cuda[dtype2]",  # bf16: flash
    "tests/test_torch_kernel_gpu.py::test_flash_attention_is_available",
    "tests/test_torch_kernel_gpu.py::test_torch_kernel_16bit_multihead[bfloat16-2x4x130x130x64-partial-strict-default]",
    "tests/test_torch_kernel_gpu.py::test_torch_kernel_16bit_multihead[float16-2x4x96x130x64-full-default]",
    "tests/test_torch_kernel_gpu.py::test_torch_kernel_16bit_multihead[bfloat16-2x4x128x128x128-causal-efficient]",
    "tests/test_torch_kernel_gpu.py::test_one_rank_ring_16bit[causal-zigzag-130-bfloat16-torch]",
    "tests/test_torch_kernel_gpu.py::test_kernel_calls_do_not_synchronise[torch]",
    "tests/test_triton_kernel.py::TestGpu::test_matches_math_kernel[causal-300-300-128-torch.bfloat16]",
    "tests/test_triton_kernel.py::TestGpu::test_matches_math_kernel[causal-300-300-128-torch.float32]",
    "tests/test_triton_kernel.py::TestGpu::test_float64_rejected",
]


def check_placement(dry: bool, limit: float) -> Check:
    check = Check("placement")
    child = run_child(ringbench_command("run", "--world", "2", "--device", "cuda", "--seq", "256", "--iters", "1",
                                 "--no-check"), limit)  # fmt: skip
    check.seconds = child.seconds
    if child.code is None:
        check.facts = [killed_fact(child, limit)]
        return check
    errors = [line for line in child.stderr.splitlines() if line.startswith("error:")]
    check.ok = child.code == 2 and len(errors) == 1 and "device='cuda' is not allowed" in errors[0] and (
        "Traceback" not in child.stderr)  # fmt: skip
    where = "with no GPU (dry run)" if dry else "on one GPU"
    check.facts = [f"run --world 2 --device cuda {where}: exit {child.code}, "
                   f"{len(errors)} error line: {errors[-1][:160] if errors else child.tail()}"]  # fmt: skip
    return check


def check_adapters(dry: bool, limit: float, out: Path) -> Check:
    check = Check("adapters")
    shape = ["--seq", "128", "--heads", "1", "--head-dim", "16"] if dry else ["--seq", "4096", "--heads", "16",
                                                                             "--head-dim", "128"]  # fmt: skip
    device = ["--device", "cpu"] if dry else ["--device", "cuda"]
    command = ringbench_command("run", "--world", "1", *device, *shape, "--impl", "torch-ring", "--impl", "ring-flash-attn",
                         "--impl", "transformer-engine", "--dtype", "float32", "--dtype", "bfloat16", "--mask",
                         "causal", "--layout", "contiguous", "--layout", "zigzag", "--buffer", "double", "--iters", "2",
                         "--warmup", "1", "--no-trace", "--out", str(out), "--json")  # fmt: skip
    child = run_child(command, limit)
    check.seconds = child.seconds
    if child.code is None:
        check.facts = [killed_fact(child, limit)]
        return check
    document = json_document(child.stdout)
    run_dir = document.get("run_dir")
    meta = json.loads((Path(run_dir) / "meta.json").read_text()) if run_dir else {}
    check.ok, check.facts = judge_adapters(child.code, document.get("cases", []), meta, dry, child.tail())
    return check


TORCH_RING_MISSING = "impl='torch-ring' cannot run here: "


def judge_adapters(code: int, cases: list[dict], meta: dict, dry: bool, tail: str = "") -> tuple[bool | None, list]:
    """(ok, facts) of the adapters run. torch-ring must pass in fp32 and bf16; a torch without the private API it
    pins (the run skips it with the reason) is a version mismatch, not a GPU defect: not checked, never FAIL."""
    reasons = sorted(set((meta.get("skipped") or {}).values()))
    unusable = next((r.removeprefix(TORCH_RING_MISSING) for r in reasons if r.startswith(TORCH_RING_MISSING)), None)
    if code != 0 or (not cases and unusable is None):
        return False, [f"run exited {code}: {tail}" if code != 0 else f"run exited 0 with no case: {tail}"]
    where = "CPU (dry run)" if dry else "GPU"
    facts, ran = [], {}
    for case in cases:
        ran.setdefault((case["impl"], case["dtype"]), []).append(case)
    for (impl, dtype), mine in sorted(ran.items()):
        errors = [max(c.get("fwd_max_abs_err") or 0, c.get("bwd_max_abs_err") or 0) for c in mine]
        layouts = ", ".join(sorted({c["layout"] for c in mine}))
        steps = [c["step_ms"] for c in mine if isinstance(c.get("step_ms"), (int, float))]
        step = f"step {min(steps):.2f} ms" if steps else "no step time"
        facts.append(f"{impl} {dtype} on the {where}, world 1 ({layouts}): max |err| {max(errors):.1e}, {step}, "
                     f"{'pass' if all(c.get('passed') for c in mine) else 'FAIL'}")  # fmt: skip
    if unusable is not None:
        facts.append(f"torch-ring not checked ({unusable})")
    facts += [f"not run: {reason}" for reason in reasons if not reason.startswith(TORCH_RING_MISSING)]
    if not all(c.get("passed") for c in cases):
        return False, facts
    torch_ring = {dtype for impl, dtype in ran if impl == "torch-ring"}
    ok = True if {"float32", "bfloat16"} <= torch_ring else (None if unusable is not None else False)
    return (None if ok else ok) if dry else ok, facts


def check_memory(dry: bool, limit: float, out: Path) -> Check:
    check = Check("memory")
    base = 256 if dry else 16384
    shape = ["--heads", "2", "--head-dim", "16"] if dry else ["--heads", "32", "--head-dim", "128", "--dtype",
                                                              "bfloat16"]  # fmt: skip
    device = ["--device", "cpu"] if dry else ["--device", "cuda"]
    command = ringbench_command("run", "--world", "1", *device, "--seq", str(base), "--seq", str(2 * base), *shape,
                         "--kernel", "torch", "--mask", "causal", "--layout", "contiguous", "--buffer", "double",
                         "--iters", "1", "--warmup", "1", "--no-check", "--out", str(out), "--json")  # fmt: skip
    child = run_child(command, limit)
    check.seconds = child.seconds
    if child.code is None:
        check.facts = [killed_fact(child, limit)]
        return check
    cases = {case["seq"]: case for case in json_document(child.stdout).get("cases", [])}
    if child.code != 0 or len(cases) != 2:
        check.ok = False
        check.facts = [f"run exited {child.code}: {child.tail()}"]
        return check
    run_dir = Path(json_document(child.stdout)["run_dir"])
    import pandas as pd

    peaks = pd.read_parquet(run_dir / "cases.parquet").set_index("seq")["peak_mem_mb"]
    small, large = float(peaks.loc[base]), float(peaks.loc[2 * base])
    ratio = large / small if small > 0 else float("nan")
    method = "peak resident set of the rank, dry run on the CPU" if dry else "torch.cuda.max_memory_allocated"
    dtype = cases[base]["dtype"]
    check.facts = [f"peak memory ({method}), 1 rank, {dtype} fwd+bwd: S={base}: {small:.0f} MiB, S={2 * base}: "
                   f"{large:.0f} MiB, ratio {ratio:.2f} (O(S) memory gives about 2, O(S^2) about 4)"]  # fmt: skip
    check.ok = None if dry else bool(ratio <= 2.5)
    return check


def check_calibration(dry: bool, limit: float, out: Path) -> Check:
    check = Check("calibration")
    rate = "2" if dry else "50000"  # GFLOP/s: slow enough that the real arithmetic stays well under the model
    shape = ["--seq", "512", "--heads", "2", "--head-dim", "32"] if dry else [
        "--seq", "8192", "--heads", "16", "--head-dim", "128", "--dtype", "bfloat16"]  # fmt: skip
    device = ["--device", "cpu"] if dry else ["--device", "cuda"]
    command = ringbench_command("run", "--world", "1", "--loopback", *device, *shape, "--kernel", f"emulated:{rate}",
                         "--buffer", "double", "--mask", "none", "--layout", "contiguous", "--no-check", "--iters",
                         "4", "--out", str(out), "--json")  # fmt: skip
    child = run_child(command, limit)
    check.seconds = child.seconds
    if child.code is None:
        check.facts = [killed_fact(child, limit)]
        return check
    document = json_document(child.stdout)
    if child.code != 0 or not document.get("run_dir"):
        check.ok = False
        check.facts = [f"run exited {child.code}: {child.tail()}"]
        return check
    import pandas as pd

    run_dir = Path(document["run_dir"])
    meta = json.loads((run_dir / "meta.json").read_text())
    events = pd.read_parquet(run_dir / "events.parquet")
    compute = events[events["kind"] == "compute"]
    ratio = ((compute["end_ns"] - compute["start_ns"]) / 1e6 / (compute["flops"] / (float(rate) * 1e9) * 1e3)).median()
    saturated = next(iter(meta.get("ranks", {}).values()), {}).get("emulation_saturated_blocks")
    where = "CPU sleeps (dry run)" if dry else spin_fact(next(iter(meta.get("gpus", [])), {}))
    check.facts = [f"emulated:{rate} ({where}): measured / modelled compute per block, median {ratio:.3f} over "
                   f"{len(compute)} blocks; saturated blocks {saturated}"]  # fmt: skip
    check.ok = bool(0.95 <= ratio <= 1.25 and saturated == 0)
    if dry:
        check.ok = None
    return check


def spin_fact(gpu: dict) -> str:
    """How the run's GPU pads were paced (ringbench.kernels.spin, recorded per rank in meta.json's gpus)."""
    clock = gpu.get("spin_clock", "sm-cycles")
    if clock == "globaltimer":
        return "GPU pads by the nanosecond timer"
    corrected = gpu.get("spin_cycles_per_ms_corrected")
    why = gpu.get("spin_timer_unused")
    return (f"GPU pads by SM cycles at {gpu.get('spin_cycles_per_ms')} cycles/ms at start-up"
            + (f", {corrected} after correction under load" if corrected else "") + (f"; not the timer: {why}" if why
                                                                                    else ""))  # fmt: skip


_TEST_LINE = re.compile(r"^(tests/\S+::\S+)\s+(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)")


def check_gpu_tests(dry: bool, limit: float, env: dict) -> Check:
    check = Check("gpu-tests")
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-p", "no:cacheprovider", "-o", "addopts=",
               "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), *(str(ROOT / t) for t in GPU_TESTS)]  # fmt: skip
    # (the check's TRITON_CACHE_DIR: the variants compiled by the checks before are found there)
    child = run_child(command, limit, env=env)
    check.seconds = child.seconds
    outcomes: dict[str, list[str]] = {}
    for line in child.stdout.splitlines():
        if match := _TEST_LINE.match(line):
            outcomes.setdefault(match.group(2), []).append(match.group(1))
    collected = re.search(r"collected (\d+) items(?: / (\d+) deselected)?", child.stdout)
    total = int(collected.group(1)) - int(collected.group(2) or 0) if collected else None
    counts = ", ".join(f"{len(v)} {k.lower()}" for k, v in sorted(outcomes.items())) or "none finished"
    failed = outcomes.get("FAILED", []) + outcomes.get("ERROR", [])
    if dry:
        check.facts = [f"not checked: no GPU (dry run): {total} of the {len(GPU_TESTS)} curated gpu-marked tests "
                       f"collected, {counts}"]  # fmt: skip
        check.ok = None if child.code in (0, 5) else False
        return check
    done = sum(len(v) for v in outcomes.values())
    if child.code is None:
        check.facts = [f"stopped by the deadline after {child.seconds:.0f} s: {counts} of {total} "
                       f"({total - done if total else '?'} not run)"]  # fmt: skip
    else:
        check.facts = [f"{counts} of {total} curated gpu-marked tests in {child.seconds:.0f} s (the check's warm "
                       "Triton cache)"]  # fmt: skip
    check.facts += [f"failed: {name}" for name in failed[:8]]
    check.ok = (not failed) and child.code == 0 if child.code is not None else (False if failed else None)
    return check
