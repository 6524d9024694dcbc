"""Benchmark: analyze + write_report on a simulated run of about 1,000,000 events (target: <= 10 s).

    .venv/bin/python benchmarks/bench_analysis.py                 # 1M events, timings per stage
    .venv/bin/python benchmarks/bench_analysis.py --events 200000 --detection 20

8 ranks, double buffering, forward and backward (the engine's backward: a dK/dV exchange per step too): 84 events
per rank per iteration, so ~1,490 iterations. The
report's trace is capped (whole iterations up to 100k spans); the timeline figure draws one iteration.
``--detection N`` also measures the straggler detection rate over N randomised trials (benchmarks/detection_rate.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ringbench.record.store import load_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # SimConfig lives with the tests' scaffolding

from support.given import SimConfig, write_simulated_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--detection", type=int, default=0, help="also run N detection trials")
    args = parser.parse_args()
    n = args.world  # per rank: an iteration row per phase, N compute spans each, send/recv/wait of N - 1 K/V
    per_iteration = n * (2 + 2 * n + 6 * (n - 1) + 3 * n)  # exchanges per phase and of N dK/dV ones (backward)
    iterations = max(1, round(args.events / per_iteration))
    cfg = SimConfig.of(world=args.world, iterations=iterations, jitter=0.03, slow_rank=3, slow_factor=1.5, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_dir = write_simulated_run(Path(tmp) / "bench-1m", cfg)
        t1 = time.perf_counter()
        run = load_run(run_dir)
        t2 = time.perf_counter()
        from ringbench.analysis.findings import analyze, verdict_lines  # imported here: timed with the work
        from ringbench.report import write_report

        analysis = analyze(run)
        t3 = time.perf_counter()
        folder = write_report(run, Path(tmp) / "reports", analysis=analysis)
        t4 = time.perf_counter()
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6
        print(f"events: {len(run.events):,} ({iterations} iterations x {args.world} ranks)")
        print(f"simulate + store: {t1 - t0:.2f} s   load_run: {t2 - t1:.2f} s")
        print(f"analyze: {t3 - t2:.2f} s   write_report: {t4 - t3:.2f} s   ({size:.1f} MB written)")
        print(f"analyze + report: {t4 - t2:.2f} s   (load + analyze + report: {t4 - t1:.2f} s; target <= 10 s)")
        print("verdict:", " | ".join(verdict_lines(analysis)))
    if args.detection:
        from detection_rate import detection_rate  # benchmarks/detection_rate.py, beside this script

        t5 = time.perf_counter()
        print("detection:", detection_rate(args.detection), f"({time.perf_counter() - t5:.1f} s)")


if __name__ == "__main__":
    main()
