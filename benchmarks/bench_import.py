"""Benchmark: `ringbench import` against HolisticTraceAnalysis's parse of the same traces, as whole processes.

    .venv/bin/python benchmarks/bench_import.py                          # 4 x 12 MB and 8 x 50 MB, 3 rounds
    .venv/bin/python benchmarks/bench_import.py --sets 4x12 --rounds 5 --traces /tmp/bench-traces
    .venv/bin/python benchmarks/bench_import.py --sets 4x12 --stages     # where ringbench's time goes

A set ``RxM`` is R trace files (one per rank) of about M MB of JSON each: what a user's job leaves, one file per
rank. The sets are made by the project's own profiled runs: `ringbench run --impl torch-ring:alltoall --world R`
profiles every timed iteration of torch's ring on R local gloo ranks; the iteration count sets the size. The traces
are decompressed to plain JSON, so the sizes are JSON bytes (what a parser reads). ``--traces DIR`` keeps them
there and reuses them on the next call.

What a user waits for is the whole process, so each measurement is one: ``ringbench import SET --out TMP -q``
(interpreter start, imports, reading, reconstruction, writing the record), and, when HolisticTraceAnalysis is
installed (``pip install -e '.[bench]'``), ``python -c "TraceAnalysis(trace_dir=SET)"`` (interpreter start, its
imports, its parse of the traces into its DataFrames; it parses the ranks in a pool of processes, one per core).
The two alternate, in turn order, set by set, round by round, so a busy machine slows both alike. Printed per set:
the median (min-max) seconds of each, the ratio ringbench / HTA (median and range over rounds), ringbench's
throughput, and the CPU seconds of each (its worker processes included) with their ratio: on a machine that other
work keeps busy the wall-clock ratio moves with the load, the CPU ratio much less.

Peak memory comes from one more run of each tool per set (a sampler would disturb the timed runs), against the
largest single trace file: the largest process's peak RSS (its own or a worker's, from the kernel's accounting)
above the RSS of a process that only imports the same modules; the peak of all its processes together
(proportional set size, sampled every 20 ms) above that process's; and the largest private memory of one worker
process (what it allocated or copied on write). A tiny set (the tests' 4 traces of 30 KB) shows the part that does
not grow with the traces. ``--stages`` times ringbench's phases in one process.
Goals (issue 30): ratio <= 0.5 at 4 x 12 MB and at 8 x 50 MB; peak memory <= 2 x the largest trace file.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# torch-ring:alltoall, S=1024, H=2, D=32, forward + backward: MB of JSON per rank per iteration, per rank of the
# ring (a rank's trace grows with the ring's steps)
MB_PER_RANK_ITERATION_PER_RANK = 0.09
RUN = ["--seq", "1024", "--heads", "2", "--head-dim", "32", "--impl", "torch-ring:alltoall", "--layout", "zigzag",
       "--buffer", "double", "--kernel", "torch", "--warmup", "1", "--no-check"]  # fmt: skip
BIN = Path(sys.executable).parent
HTA_PARSE = "import logging, sys\nlogging.disable(logging.CRITICAL)\n{imports}\nTraceAnalysis(trace_dir=sys.argv[1])\n"
HTA_IMPORTS = "from hta.trace_analysis import TraceAnalysis"
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "kineto" / "gloo_ring_w4"
RINGBENCH_IMPORTS = ("import ringbench.cli.app as app\napp._register(['import_cmd'])\n"
                     "import ringbench.traces.importer")  # fmt: skip


def parse_set(text: str) -> tuple[int, float]:
    ranks, _, size = text.lower().partition("x")
    try:
        return int(ranks), float(size)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected RANKSxMB, e.g. 4x12") from None


def make_traces(root: Path, ranks: int, size_mb: float) -> Path:
    """A set of ``ranks`` traces of about ``size_mb`` MB of JSON each (reused when already there)."""
    folder = root / f"{ranks}x{size_mb:g}"
    if folder.is_dir() and len(list(folder.glob("*.json"))) == ranks:
        return folder
    iterations = max(3, round(size_mb / (MB_PER_RANK_ITERATION_PER_RANK * ranks)))
    runs = root / f"run-{ranks}x{size_mb:g}"
    command = [str(BIN / "ringbench"), "run", "--world", str(ranks), *RUN, "--iters", str(iterations), "--out",
               str(runs), "-q"]  # fmt: skip
    print(f"generating {ranks} x ~{size_mb:g} MB: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    folder.mkdir(parents=True, exist_ok=True)
    for packed in sorted(runs.glob("*/profile/*/*.json.gz")):
        with gzip.open(packed, "rb") as source, open(folder / packed.name[: -len(".gz")], "wb") as target:
            shutil.copyfileobj(source, target, 1 << 20)
    shutil.rmtree(runs)
    return folder


def command(tool: str, folder: Path, out: Path) -> list[str]:
    if tool == "ringbench":
        return [str(BIN / "ringbench"), "import", str(folder), "--out", str(out), "-q"]
    return [sys.executable, "-c", HTA_PARSE.format(imports=HTA_IMPORTS), str(folder)]


def imports_only(tool: str) -> list[str]:
    """A process that imports what ``tool`` imports and stops: the memory baseline."""
    return [sys.executable, "-c", RINGBENCH_IMPORTS if tool == "ringbench" else HTA_IMPORTS]


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        todo.extend(int(child) for child in children)
    return out


def _rollup_kb(pid: int) -> tuple[int, int]:
    """(proportional set size, private memory) of a process, KB: a page shared by n processes counts 1/n in
    each one's PSS; private pages (its own allocations and the pages it copied on write) are its alone."""
    pss = private = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
            elif line.startswith(("Private_Clean:", "Private_Dirty:")):
                private += int(line.split()[1])
    except OSError:
        pass
    return pss, private


def run(argv: list[str], sample: bool = False) -> dict:
    """Run ``argv`` to its end: seconds, CPU seconds and the largest process's peak RSS (MB), the kernel's figures
    for the process and the children it waited for (worker processes), and, with ``sample`` (every 20 ms), the
    peak proportional set size of its tree and the largest private memory of one of its worker processes (MB)."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks, done = {"pss": 0, "worker": 0}, threading.Event()

    def sampler() -> None:
        while not done.wait(0.02):
            tree = {pid: _rollup_kb(pid) for pid in _tree(process.pid)}
            peaks["pss"] = max(peaks["pss"], sum(pss for pss, _ in tree.values()))
            workers = [private for pid, (_, private) in tree.items() if pid != process.pid]
            peaks["worker"] = max([peaks["worker"], *workers])

    watcher = threading.Thread(target=sampler, daemon=True) if sample else None
    if watcher is not None:
        watcher.start()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    done.set()
    if watcher is not None:
        watcher.join()
    errors = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        sys.exit(f"{' '.join(argv[:3])} failed ({process.returncode}): {errors.strip()[-600:]}")
    return {"seconds": seconds, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024,
            "pss_mb": peaks["pss"] / 1024, "worker_mb": peaks["worker"] / 1024}  # fmt: skip


def stages(folder: Path) -> str:
    """ringbench's phases in one process (``--stages``): interpreter and imports, reading, rebuilding, writing."""
    code = r"""
import sys, time
start = time.perf_counter()
import ringbench.cli.app as app
app._register(["import_cmd"])
from ringbench.traces import importer
from ringbench.record import store
imported = time.perf_counter()
spent = {}
def timed(module, name, label):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        begin = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - begin
    setattr(module, name, wrapper)
timed(importer, "read_ranks", "read and reduce the traces")
timed(importer, "assemble", "rebuild the ring")
timed(importer, "events_frame", "events table")
timed(importer, "_case_table", "case figures")
timed(store, "write_events", "write")
timed(store, "write_cases", "write")
import tempfile
with tempfile.TemporaryDirectory() as out:
    importer.import_traces([sys.argv[1]], out=out)
end = time.perf_counter()
print(f"imports {imported - start:.2f} s (after the interpreter's start); import_traces {end - imported:.2f} s: "
      + ", ".join(f"{label} {seconds:.2f} s" for label, seconds in spent.items()))
"""
    interpreter = run([sys.executable, "-c", "pass"])["seconds"]
    done = subprocess.run([sys.executable, "-c", code, str(folder)], check=True, capture_output=True, text=True)
    return f"interpreter start {interpreter:.2f} s; {done.stdout.strip()}"


def _spread(values: list[float], fmt: str = ".2f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=parse_set, nargs="+", default=[(4, 12.0), (8, 50.0)],
                        help="RANKSxMB: trace files and MB of JSON per file")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--traces", type=Path, default=None, help="where the trace sets go (reused when there)")
    parser.add_argument("--stages", action="store_true", help="also time ringbench's phases in one process")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory runs")
    args = parser.parse_args()
    root = args.traces or Path(tempfile.mkdtemp(prefix="bench-import-"))
    folders = {f"{r}x{m:g}": make_traces(root, r, m) for r, m in args.sets}
    have_hta = importlib.util.find_spec("hta") is not None
    if not have_hta:
        print("HolisticTraceAnalysis is not installed (pip install -e '.[bench]'): timing ringbench alone")
    tools = ["ringbench", "hta"] if have_hta else ["ringbench"]
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as out:
        for round_ in range(args.rounds):
            for name, folder in folders.items():
                for tool in tools if round_ % 2 == 0 else tools[::-1]:
                    target = Path(out) / f"{name}-{tool}-{round_}"
                    results.setdefault((name, tool), []).append(run(command(tool, folder, target)))
                    shutil.rmtree(target, ignore_errors=True)
        memory = {}
        if not args.no_memory:
            base = {tool: run(imports_only(tool), sample=True) for tool in tools}
            named = {**folders, **({"tiny": FIXTURE} if FIXTURE.is_dir() else {})}
            for name, folder in named.items():
                for tool in tools:
                    target = Path(out) / f"{name}-{tool}-memory"
                    used = run(command(tool, folder, target), sample=True)
                    memory[(name, tool)] = (used["peak_mb"] - base[tool]["peak_mb"],
                                            used["pss_mb"] - base[tool]["pss_mb"], used["worker_mb"])  # fmt: skip
                    shutil.rmtree(target, ignore_errors=True)
    print(f"\nwhole processes, {args.rounds} interleaved rounds (median (min-max)); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    print(f"{'set':>6} {'JSON MB':>8} {'largest':>8} {'ringbench s':>18} {'HTA s':>20} {'ratio':>18} {'MB/s':>6} "
          f"{'CPU s ringbench / HTA':>22} {'CPU ratio':>18}")  # fmt: skip
    for name, folder in folders.items():
        sizes = [f.stat().st_size / 1e6 for f in folder.glob("*.json")]
        ours, theirs = results[(name, "ringbench")], results.get((name, "hta"), [])
        wall, cpu = [r["seconds"] for r in ours], [r["cpu_s"] for r in ours]
        ratio = cpu_ratio = hta_wall = cpus = "-"
        if theirs:
            ratio = _spread([a["seconds"] / b["seconds"] for a, b in zip(ours, theirs, strict=True)])
            cpu_ratio = _spread([a["cpu_s"] / b["cpu_s"] for a, b in zip(ours, theirs, strict=True)])
            hta_wall = _spread([r["seconds"] for r in theirs])
            cpus = f"{statistics.median(cpu):.2f} / {statistics.median(r['cpu_s'] for r in theirs):.2f}"
        print(f"{name:>6} {sum(sizes):8.1f} {max(sizes):8.1f} {_spread(wall):>18} {hta_wall:>20} {ratio:>18} "
              f"{sum(sizes) / statistics.median(wall):6.1f} {cpus:>22} {cpu_ratio:>18}")  # fmt: skip
    if memory:
        print("\npeak memory, MB: the largest process above a process that only imports the same modules / all its "
              "processes together (PSS) above it / the largest worker's own (private) memory")  # fmt: skip
        print(f"{'set':>6} {'largest file':>12} {'2 x file':>9} {'ringbench':>18} {'HTA':>18}")
        for name in [*folders, *(["tiny"] if ("tiny", tools[0]) in memory else [])]:
            files = list((folders.get(name) or FIXTURE).glob("*.json*"))
            largest = max(f.stat().st_size for f in files if f.name.endswith((".json", ".json.gz"))) / 1e6
            cells = ["{:.0f} / {:.0f} / {:.0f}".format(*memory[(name, tool)]) for tool in tools]
            print(f"{name:>6} {largest:12.1f} {2 * largest:9.1f} " + " ".join(f"{cell:>18}" for cell in cells))
        if ("tiny", tools[0]) in memory:
            print(f"  tiny: {FIXTURE} (4 gzipped traces of 30 KB): what any import costs above the imports, the "
                  "libraries' first use (their code and pools), whatever the size")  # fmt: skip
    if args.stages:
        print("\nringbench's phases (one process each):")
        for name, folder in folders.items():
            print(f"{name:>6}: {stages(folder)}")
    print(f"traces: {root}")


if __name__ == "__main__":
    main()
