"""Benchmark: `ringbench import` against HolisticTraceAnalysis's parse of the same traces, at three sizes.

    .venv/bin/python benchmarks/bench_import.py                        # about 10, 50 and 250 MB, 3 repeats
    .venv/bin/python benchmarks/bench_import.py --sizes 10 50 --repeats 5 --traces /tmp/bench-traces

The trace sets are made by the project's own profiled runs: `ringbench run --impl torch-ring:alltoall` profiles
every timed iteration of torch's ring on 4 local gloo ranks (one trace per rank); the iteration count sets the
size. The traces are decompressed to plain JSON, so the sizes are JSON bytes (what a parser reads). ``--traces DIR``
keeps them there and reuses them on the next call.

Each measurement runs in a fresh process and times the work alone (the modules already imported): ringbench's
``import_traces(...)`` (the whole import: read, rebuild, write the record) and, when HolisticTraceAnalysis is
installed (``pip install -e '.[bench]'``), ``TraceAnalysis(trace_dir=...)`` (its parse of the traces into its
DataFrames). The two alternate, in turn order, size by size, repeat by repeat, so a busy machine slows both alike.
Printed per size: the median (min-max) of each, the ratio ringbench / HTA (median and range over repeats),
ringbench's throughput (MB of JSON per second) and the peak memory of each process above its baseline after its
imports (and of its largest worker process, when it used any), against the largest single trace file.
Goals (issue): ratio <= 0.5 at every size; peak memory <= 2 x the largest trace file.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MB_PER_ITERATION = 1.35  # torch-ring:alltoall, 4 ranks, S=1024, H=2, D=32, forward + backward: JSON per iteration
RUN = ["--world", "4", "--seq", "1024", "--heads", "2", "--head-dim", "32", "--impl", "torch-ring:alltoall",
       "--layout", "zigzag", "--buffer", "double", "--kernel", "torch", "--warmup", "1", "--no-check"]  # fmt: skip

_MEASURE = r"""
import json, resource, sys, tempfile, time
tool, folder = sys.argv[1], sys.argv[2]
if tool == "ringbench":
    from ringbench.traces.importer import import_traces
else:
    import logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if tool == "ringbench":
    with tempfile.TemporaryDirectory() as out:
        result = import_traces([folder], out=out)
        readers = sorted(set(result.meta["imported"].get("readers", [])))
else:
    TraceAnalysis(trace_dir=folder)
    readers = []
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"seconds": seconds, "base_mb": base / 1024, "peak_mb": peak / 1024, "child_mb": child / 1024,
                  "readers": readers}))
"""


def make_traces(root: Path, size_mb: float) -> Path:
    """A trace set of about ``size_mb`` MB of JSON (reused when already there)."""
    folder = root / f"{size_mb:g}MB"
    if folder.is_dir() and any(folder.glob("*.json")):
        return folder
    iterations = max(3, round(size_mb / MB_PER_ITERATION))
    runs = root / f"run-{size_mb:g}MB"
    command = [str(Path(sys.executable).parent / "ringbench"), "run", *RUN, "--iters", str(iterations), "--out",
               str(runs), "-q"]  # fmt: skip
    print(f"generating ~{size_mb:g} MB: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    folder.mkdir(parents=True, exist_ok=True)
    for packed in sorted(runs.glob("*/profile/*/*.json.gz")):
        with gzip.open(packed, "rb") as source, open(folder / packed.name[: -len(".gz")], "wb") as target:
            shutil.copyfileobj(source, target, 1 << 20)
    shutil.rmtree(runs)
    return folder


def measure(tool: str, folder: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _MEASURE, tool, str(folder)], check=True, capture_output=True,
                          text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 50, 250], help="MB of JSON per trace set")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--traces", type=Path, default=None, help="where the trace sets go (reused when there)")
    args = parser.parse_args()
    root = args.traces or Path(tempfile.mkdtemp(prefix="bench-import-"))
    folders = {size: make_traces(root, size) for size in args.sizes}
    have_hta = importlib.util.find_spec("hta") is not None
    if not have_hta:
        print("HolisticTraceAnalysis is not installed (pip install -e '.[bench]'): timing ringbench alone")
    tools = ["ringbench", "hta"] if have_hta else ["ringbench"]
    results: dict[tuple[float, str], list[dict]] = {}
    for repeat in range(args.repeats):
        for size, folder in folders.items():
            for tool in tools if repeat % 2 == 0 else tools[::-1]:
                results.setdefault((size, tool), []).append(measure(tool, folder))
    print(f"\n{'set':>6} {'JSON MB':>8} {'largest':>8} {'ringbench s':>20} {'HTA s':>20} {'ratio':>18} "
          f"{'MB/s':>7} {'ringbench peak MB':>18} {'HTA peak MB':>12}  reader")  # fmt: skip
    for size, folder in folders.items():
        files = sorted(folder.glob("*.json"))
        total = sum(f.stat().st_size for f in files) / 1e6
        largest = max(f.stat().st_size for f in files) / 1e6
        ours = results[(size, "ringbench")]
        times = [r["seconds"] for r in ours]
        peak = max(max(r["peak_mb"] - r["base_mb"], r["child_mb"]) for r in ours)
        hta_text = ratio_text = hta_peak = "-"
        if have_hta:
            theirs = results[(size, "hta")]
            hta_times = [r["seconds"] for r in theirs]
            hta_text = _spread(hta_times)
            ratio_text = _spread([a / b for a, b in zip(times, hta_times, strict=True)])
            hta_peak = f"{max(max(r['peak_mb'] - r['base_mb'], r['child_mb']) for r in theirs):.0f}"
        rate = total / statistics.median(times)
        readers = ", ".join(sorted({reader for r in ours for reader in r["readers"]}))
        print(f"{size:>5g}M {total:8.1f} {largest:8.1f} {_spread(times):>20} {hta_text:>20} {ratio_text:>18} "
              f"{rate:7.1f} {peak:18.0f} {hta_peak:>12}  {readers}")  # fmt: skip
    print("\npeak MB: the process's peak RSS above its baseline after its imports, or its largest worker's")
    print(f"traces: {root}")


if __name__ == "__main__":
    main()
