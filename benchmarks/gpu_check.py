"""The one-GPU check: what only a GPU can confirm, in one command, with one summary at the end.

    benchmarks/gpu_check.sh [OUT_DIR]            # on a machine with one CUDA GPU (about 3-5 minutes)
    benchmarks/gpu_check.sh --dry-run [OUT_DIR]  # anywhere: the same checks on CPU stand-ins (CI runs this)

Checks, in order (each bounded; a failing check does not stop the others):
  gpu-tests      the `gpu`-marked tests: kernels (half-precision gradients with H > 1, compiled Triton forward and
                 backward), the CUDA stream timeline, a 1-rank NCCL loopback ring per buffer strategy;
  loopback       `ringbench run --world 1 --device cuda --loopback` for sync, double and allgather: the rank
                 exchanges with itself, a real ncclDevKernel_SendRecv on NCCL's stream (NCCL timing on);
  timeline       a double-buffered step whose transfer and compute each take over 1 ms, profiled: the overlap the
                 recorder's events see must agree with the overlap CUPTI sees (`ringbench check-timeline`);
  calibration    the emulated kernel on the GPU: the spin rate, and modelled against measured compute per block;
  placement      `--device cuda --world 2` on one GPU: a one-line error and exit code 2, not an NCCL crash.
Dry run: the same commands with CPU stand-ins (gloo, a loopback copy, host timeline), GPU tests collected and
skipped; exits 0 when they behave. The summary is printed and written to OUT_DIR/summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_TESTS = ["tests/test_kernels.py", "tests/test_triton_kernel.py", "tests/test_torch_kernel_gpu.py",
             "tests/test_timeline.py"]  # fmt: skip


class Output(str):
    """A command's stderr then stdout (for messages), with its stdout alone kept for JSON."""

    stdout: str = ""


def _run(command: list[str], timeout_s: float, env: dict | None = None) -> tuple[int, Output, float]:
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})  # fmt: skip
        output, code = Output(done.stderr + done.stdout), done.returncode
        output.stdout = done.stdout
    except subprocess.TimeoutExpired as exc:
        output, code = Output(f"timed out after {timeout_s:g} s\n{exc.stderr or ''}{exc.stdout or ''}"), 124
    return code, output, time.monotonic() - started


def _ringbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "ringbench", *args]


def _json_tail(output: Output) -> dict:
    """The JSON document a `--json` command printed on stdout (from its first line that opens an object)."""
    lines = output.stdout.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("{"):
            try:
                return json.loads("\n".join(lines[index:]))
            except json.JSONDecodeError:
                continue
    return {}


class Check:
    def __init__(self, name: str) -> None:
        self.name = name
        self.ok = False
        self.detail = ""
        self.seconds = 0.0

    def as_dict(self) -> dict:
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "seconds": round(self.seconds, 1)}


def check_gpu_tests(dry: bool) -> Check:
    check = Check("gpu-tests")
    code, output, check.seconds = _run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                        *GPU_TESTS], timeout_s=300)  # fmt: skip
    last = output.strip().splitlines()[-1] if output.strip() else ""
    check.ok = code == 0 or (dry and code == 5)  # 5: nothing ran (all skipped) is fine without a GPU
    check.detail = last
    return check


def _device_args(dry: bool) -> list[str]:
    return ["--device", "cpu"] if dry else ["--device", "cuda"]


def check_loopback(dry: bool, out: Path) -> Check:
    check = Check("loopback")
    shape = ["--seq", "256", "--heads", "2", "--head-dim", "32", "--iters", "2", "--warmup", "1"] if dry else [
        "--seq", "16384", "--heads", "16", "--head-dim", "128", "--dtype", "bfloat16", "--iters", "4", "--warmup", "2"]  # fmt: skip
    command = _ringbench("run", "--world", "1", "--loopback", *_device_args(dry), *shape, "--buffer", "sync",
                         "--buffer", "double", "--buffer", "allgather", "--mask", "causal", "--kernel", "torch",
                         "--layout", "contiguous", "--out", str(out), "--json")  # fmt: skip
    code, output, check.seconds = _run(command, timeout_s=240, env={"TORCH_NCCL_ENABLE_TIMING": "1"})
    document = _json_tail(output)
    cases = document.get("cases", [])
    if code != 0 or len(cases) != 3:
        check.detail = f"exit {code}: " + " ".join(output.strip().splitlines()[-2:])[:300]
        return check
    import pandas as pd

    events = pd.read_parquet(Path(document["run_dir"]) / "events.parquet")
    transfers = events[events["kind"].isin(["recv", "collective"])]
    per_buffer = []
    for case in cases:
        mine = transfers[transfers["case_id"] == case["case_id"]]
        ms = ((mine["end_ns"] - mine["start_ns"]) / 1e6).median() if len(mine) else float("nan")
        nccl = mine["nccl_ms"].dropna()
        per_buffer.append(f"{case['buffer']}: step {case['step_ms']:.2f} ms, transfer {ms:.3f} ms"
                          + (f", NCCL {nccl.median():.3f} ms" if len(nccl) else ""))  # fmt: skip
    check.ok = all(c["passed"] for c in cases) and len(transfers) > 0
    check.detail = "; ".join(per_buffer) + ("" if check.ok else " (check failed or no transfer recorded)")
    return check


def check_timeline(dry: bool, out: Path) -> Check:
    """A double-buffered step whose transfer and compute each take over 1 ms, profiled and compared."""
    check = Check("timeline")
    # GPU: a 1 GiB K/V block (B=1, H=64, S=32768, D=128, bf16) travels through NCCL's SendRecv while the flash
    # kernel computes causal attention over it (tens of ms): the transfer must show as hidden both ways.
    shape = ["--world", "2", "--seq", "1024", "--heads", "2", "--head-dim", "32", "--kernel", "emulated:2"] if dry else [
        "--world", "1", "--loopback", "--seq", "32768", "--heads", "64", "--head-dim", "128", "--dtype", "bfloat16",
        "--kernel", "torch"]  # fmt: skip
    command = _ringbench("run", *_device_args(dry), *shape, "--buffer", "double", "--mask", "causal", "--layout", "contiguous", "--no-check",
                         "--iters", "2", "--warmup", "1", "--profile", "--out", str(out), "--json")  # fmt: skip
    code, output, seconds = _run(command, timeout_s=240)
    run_dir = _json_tail(output).get("run_dir")
    if code != 0 or not run_dir:
        check.seconds = seconds
        check.detail = f"run exit {code}: " + " ".join(output.strip().splitlines()[-2:])[:300]
        return check
    code, output, more = _run(_ringbench("check-timeline", run_dir, "--json"), timeout_s=120)
    check.seconds = seconds + more
    document = _json_tail(output)
    check.ok = code == 0
    kinds = document.get("kinds") or document.get("rows") or []
    parts = []
    for row in kinds if isinstance(kinds, list) else []:
        name = row.get("kind", "?")
        figures = {key: value for key, value in row.items() if key != "kind" and isinstance(value, (int, float))}
        shown = ", ".join(f"{key} {value:.3g}" for key, value in list(figures.items())[:6])
        parts.append(f"{name}: {shown}")
    check.detail = ("; ".join(parts) or " ".join(output.strip().splitlines()[-3:]))[:600]
    return check


def check_calibration(dry: bool, out: Path) -> Check:
    check = Check("calibration")
    rate = "2" if dry else "50000"  # GFLOP/s: slow enough that the real arithmetic stays well under the model
    shape = ["--seq", "512", "--heads", "2", "--head-dim", "32"] if dry else [
        "--seq", "8192", "--heads", "16", "--head-dim", "128", "--dtype", "bfloat16"]  # fmt: skip
    command = _ringbench("run", "--world", "1", "--loopback", *_device_args(dry), *shape, "--kernel",
                         f"emulated:{rate}", "--buffer", "double", "--mask", "none", "--layout", "contiguous", "--no-check", "--iters", "4",
                         "--out", str(out), "--json")  # fmt: skip
    code, output, check.seconds = _run(command, timeout_s=180)
    document = _json_tail(output)
    if code != 0 or not document.get("run_dir"):
        check.detail = f"exit {code}: " + " ".join(output.strip().splitlines()[-2:])[:300]
        return check
    import pandas as pd

    run_dir = Path(document["run_dir"])
    meta = json.loads((run_dir / "meta.json").read_text())
    events = pd.read_parquet(run_dir / "events.parquet")
    compute = events[events["kind"] == "compute"]
    modelled_ms = compute["flops"] / (float(rate) * 1e9) * 1e3
    measured_ms = (compute["end_ns"] - compute["start_ns"]) / 1e6
    ratio = (measured_ms / modelled_ms).median()
    ranks = next(iter(meta.get("ranks", {}).values()), {})
    cycles = next((gpu.get("spin_cycles_per_ms") for gpu in meta.get("gpus", [])), None)
    saturated = ranks.get("emulation_saturated_blocks")
    check.ok = 0.95 <= ratio <= 1.25 and saturated == 0
    check.detail = (f"measured/modelled compute per block: median {ratio:.3f} over {len(compute)} blocks; "
                    f"saturated {saturated}; spin rate {cycles} cycles/ms")  # fmt: skip
    return check


def check_placement(dry: bool) -> Check:
    check = Check("placement")
    command = _ringbench("run", "--world", "2", "--device", "cuda", "--seq", "256", "--iters", "1", "--no-check")
    code, output, check.seconds = _run(command, timeout_s=120)
    errors = [line for line in output.strip().splitlines() if line.startswith("error:")]
    tracebacks = "Traceback" in output
    check.ok = code == 2 and len(errors) == 1 and "device='cuda' is not allowed" in errors[0] and not tracebacks
    check.detail = f"exit {code}: {errors[-1][:200] if errors else output.strip()[-200:]}"
    return check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU stand-ins (no GPU needed); exits 0 when they pass")
    parser.add_argument("out", nargs="?", default=None, help="folder for the runs and summary.json")
    args = parser.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ringbench-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    import torch

    has_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    dry = args.dry_run or not has_gpu
    device = torch.cuda.get_device_name(0) if has_gpu else "no GPU visible"
    print(f"gpu_check: {'DRY RUN (CPU stand-ins)' if dry else 'GPU'} on {device}; out {out}", flush=True)
    started = time.monotonic()
    checks = []
    for run_check in (lambda: check_gpu_tests(dry), lambda: check_loopback(dry, out), lambda: check_timeline(dry, out),
                      lambda: check_calibration(dry, out), lambda: check_placement(dry)):  # fmt: skip
        check = run_check()
        checks.append(check)
        print(f"  [{'ok' if check.ok else 'FAIL'}] {check.name} ({check.seconds:.0f} s): {check.detail}", flush=True)
    summary = {"dry_run": dry, "device": device, "seconds": round(time.monotonic() - started, 1),
               "passed": all(c.ok for c in checks), "checks": [c.as_dict() for c in checks],
               "command": shlex.join(sys.argv)}  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"gpu_check summary: {sum(c.ok for c in checks)}/{len(checks)} checks passed in {summary['seconds']} s"
          f"{' (dry run: no GPU measurement)' if dry else ''}; details in {out / 'summary.json'}")  # fmt: skip
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
