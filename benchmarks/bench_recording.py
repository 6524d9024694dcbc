"""Recording overhead: the same cases with per-step tracing on and off (`--no-trace`), interleaved.

    .venv/bin/python benchmarks/bench_recording.py [--rounds 3]

Each round runs the traced and the untraced run back to back (alternating which goes first) and reports the
ratio of median step times; the figure is the median ratio over rounds with its range.
"""

from __future__ import annotations

import argparse
import statistics

from ringbench.run.sweep import execute
from ringbench.scenario.scenario import Scenario


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel", default="emulated:20")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    scenario = Scenario(
        name="bench-recording", world=(4,), seq=(args.seq,), heads=(8,), head_dim=(64,), mask=("causal",),
        layout=("zigzag",), buffer=("double",), kernel=(args.kernel,), backward=True, iters=10, warmup=2,
        check=False,
    )  # fmt: skip
    ratios = []
    for round_index in range(args.rounds):
        steps = {}
        for trace in (True, False) if round_index % 2 == 0 else (False, True):
            state = execute(scenario, out=args.out, trace=trace)
            steps[trace] = float(state.cases.iloc[0]["step_ms"])
        ratios.append(steps[True] / steps[False])
        print(f"round {round_index}: traced {steps[True]:.1f} ms, untraced {steps[False]:.1f} ms, "
              f"ratio {ratios[-1]:.3f}", flush=True)  # fmt: skip
    print(
        f"recording overhead ratio: median {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(ratios)} rounds, kernel {args.kernel}"
    )


if __name__ == "__main__":
    main()
