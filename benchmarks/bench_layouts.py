"""Forward time of causal ring attention per layout against causal-naive and single-process attention.

The issue's figure: N=4, S=16384, H=8, D=64, fp32, one thread per rank, median of at least 5 timed iterations.

    .venv/bin/python benchmarks/bench_layouts.py [--seq 16384] [--iters 5]

Prints the median and p10/p90 of each ring case (from a real `ringbench run`, no emulation) and of single-process
attention over the whole sequence with one thread (the same CPU flash-attention op, is_causal=True).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from ringbench.run.sweep import execute
from ringbench.scenario.scenario import Scenario


def single_process(seq: int, heads: int, head_dim: int, iters: int) -> list[float]:
    torch.set_num_threads(1)
    q, k, v = (torch.randn(1, heads, seq, head_dim) for _ in range(3))
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    op(q, k, v, 0.0, True)  # warm-up
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        op(q, k, v, 0.0, True)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    rows = []
    for mask, layout in (("causal-naive", "contiguous"), ("causal", "contiguous"), ("causal", "zigzag"),
                         ("causal", "striped")):  # fmt: skip
        scenario = Scenario(
            name=f"bench-{mask}-{layout}", world=(args.world,), seq=(args.seq,), heads=(args.heads,),
            head_dim=(args.head_dim,), mask=(mask,), layout=(layout,), buffer=("double",), kernel=("torch",),
            backward=False, iters=args.iters, warmup=1, check=False,
        )  # fmt: skip
        state = execute(scenario, out=args.out, trace=False)
        row = state.cases.iloc[0]
        rows.append((f"{mask}/{layout}", row["fwd_ms"], row["step_ms_p10"], row["step_ms_p90"]))
        print(f"{mask}/{layout}: forward {row['fwd_ms']:.0f} ms (p10 {row['step_ms_p10']:.0f}, "
              f"p90 {row['step_ms_p90']:.0f}) [{state.run_dir}]", flush=True)  # fmt: skip
    single = single_process(args.seq, args.heads, args.head_dim, args.iters)
    print(f"single process, 1 thread: {statistics.median(single):.0f} ms "
          f"(p10 {np.percentile(single, 10):.0f}, p90 {np.percentile(single, 90):.0f})")  # fmt: skip
    naive = rows[0][1]
    for name, fwd, _, _ in rows[1:]:
        print(f"{name} / causal-naive/contiguous = {fwd / naive:.2f}")


if __name__ == "__main__":
    main()
