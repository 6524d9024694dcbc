"""Per-rank peak memory at (N, S), (2N, 2S), (4N, 4S): it should stay flat, since each rank holds S/N tokens.

    .venv/bin/python benchmarks/bench_memory.py [--world 2] [--seq 32768] [--kernel emulated:1000]
    .venv/bin/python benchmarks/bench_memory.py --direct [--old] [--budget-s 20] [--seq 32768]

Default mode runs `ringbench run ... --json` per point, with and without --check, and reads the per-case column
`peak_mem_mb` (max over ranks; CPU: peak RSS of each rank process, CUDA: torch.cuda.max_memory_allocated).

``--direct`` needs no runner: one fresh process per point plays one rank (one thread, rank 0). It builds that rank's inputs with
ringbench.engine.inputs.rank_shards (and, with the check, holds zero out/dq/dk/dv of the same shape and runs
ringbench.engine.reference.check_errors under ``--budget-s``), then reports its peak RSS (getrusage ru_maxrss). ``--old``
adds the previous approach for comparison: every rank draws the full (B, H, S, D) q, k, v, dout and slices its
shard. "floor" is the RSS after imports and a warm-up, before any input exists; "above floor" is peak - floor.
The target: (2N, 2S) / (N, S) <= 1.10 without the check and <= 1.25 with it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

SCALES = (1, 2, 4)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(config: dict) -> dict:
    """One rank's inputs (and check) in this process; returns its peak RSS in MB."""
    import torch

    from ringbench.engine.inputs import ShardSpec, rank_shards
    from ringbench.engine.layout import shard
    from ringbench.engine.reference import check_errors

    torch.set_num_threads(1)  # as a local rank runs (ringbench.run.launch)
    torch.zeros(64, 64) @ torch.zeros(64, 64)  # warm-up: thread pools and allocator exist before the floor
    floor = _rss_mb()
    inputs = ShardSpec(
        seed=1,
        batch=config["batch"],
        heads=config["heads"],
        head_dim=config["head_dim"],
        seq=config["seq"],
        dtype=config["dtype"],
        layout=config["layout"],
        world=config["world"],
        rank=0,
    )
    dtype = getattr(torch, config["dtype"])
    started = time.perf_counter()
    if config["approach"] == "old":  # what runner.py did: the full tensors on every rank, then the shard
        generator = torch.Generator().manual_seed(1)
        full_shape = (config["batch"], config["heads"], config["seq"], config["head_dim"])
        full = [torch.randn(full_shape, generator=generator).to(dtype) for _ in range(4)]  # (B, H, S, D)
        shards = [shard(t, config["layout"], config["world"], 0) for t in full]  # q, k, v, dout
    else:
        shards = rank_shards(inputs)  # q, k, v, dout: (B, H, S/N, D) each
    mode = "-"
    if config["check"]:
        out, dq, dk, dv = (torch.zeros_like(shards[0]) for _ in range(4))  # what the ring hands the check
        result = check_errors(out, (dq, dk, dv), inputs, config["mask"], budget_s=config["budget_s"])
        mode = (
            "full"
            if not result.sampled
            else f"rows {result.rows_checked}/{result.rows_total}, grads {','.join(result.grads) or '-'}"
        )
    return {"peak_mb": _rss_mb(), "floor_mb": floor, "seconds": time.perf_counter() - started, "mode": mode}


def direct(args) -> list[dict]:
    rows = []
    approaches = ("new", "old") if args.old else ("new",)
    for approach in approaches:
        for check in (False, True) if approach == "new" else (False,):
            for scale in SCALES:
                config = dict(
                    approach=approach, check=check, world=args.world * scale, seq=args.seq * scale,
                    batch=args.batch, heads=args.heads, head_dim=args.head_dim, dtype=args.dtype,
                    layout=args.layout, mask=args.mask, budget_s=args.budget_s,
                )  # fmt: skip
                done = subprocess.run(
                    [sys.executable, __file__, "--child", json.dumps(config)], capture_output=True, text=True,
                    env=os.environ | {"OMP_NUM_THREADS": "1"},
                )  # fmt: skip
                if done.returncode:
                    raise SystemExit(f"child failed for {config}:\n{done.stderr[-2000:]}")
                rows.append(config | json.loads(done.stdout.strip().splitlines()[-1]))
                print(_line(rows[-1], rows), flush=True)
    return rows


def via_runner(args) -> list[dict]:
    rows = []
    for check in (False, True):
        for scale in SCALES:
            world, seq = args.world * scale, args.seq * scale
            with tempfile.TemporaryDirectory() as out:
                command = [
                    sys.executable, "-m", "ringbench", "run", "--world", str(world), "--seq", str(seq),
                    "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--batch", str(args.batch),
                    "--dtype", args.dtype, "--layout", args.layout, "--mask", args.mask, "--kernel", args.kernel,
                    "--iters", "1", "--warmup", "0", "--no-trace", "--json", "--out", out,
                    "--check" if check else "--no-check",
                ]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode not in (0, 1):  # 1: the run finished but a check failed; memory is still valid
                raise SystemExit(f"ringbench run failed ({done.returncode}):\n{done.stderr[-2000:]}")
            case = json.loads(done.stdout)["cases"][0]
            if "peak_mem_mb" not in case:
                raise SystemExit("the run record has no peak_mem_mb column; use --direct")
            row = dict(approach="run", check=check, world=world, seq=seq, peak_mb=case["peak_mem_mb"],
                       floor_mb=float("nan"), seconds=float("nan"), mode="run")  # fmt: skip
            rows.append(row)
            print(_line(row, rows), flush=True)
    return rows


def _line(row: dict, rows: list[dict]) -> str:
    """One table row; the ratio is against the same approach and check at scale 1."""
    first = next(r for r in rows if r["approach"] == row["approach"] and r["check"] == row["check"])
    ratio = row["peak_mb"] / first["peak_mb"]
    above = row["peak_mb"] - row["floor_mb"]
    above_first = first["peak_mb"] - first["floor_mb"]
    if row["approach"] == "run":  # the run record has no floor and no per-rank timing of the input build
        above_text, ratio_above, seconds = f"{'-':>11}", f"{'-':>11}", f"{'-':>7}"
    else:
        above_text, ratio_above = f"{above:>11.0f}", f"{above / above_first:>11.2f}"
        seconds = f"{row['seconds']:>7.1f}"
    return (
        f"{row['approach']:<4} {'yes' if row['check'] else 'no':<5} {row['world']:>3} {row['seq']:>7} "
        f"{row['peak_mb']:>9.0f} {above_text} {ratio:>7.2f} {ratio_above} {seconds}  {row['mode']}"
    )


HEADER = "inputs check   N       S   peak MB  above floor   ratio ratio above      s  check done"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="N at scale 1 (then 2N, 4N)")
    parser.add_argument("--seq", type=int, default=32768, help="S at scale 1 (then 2S, 4S)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layout", default="zigzag")
    parser.add_argument("--mask", default="causal")
    parser.add_argument("--kernel", default="emulated:1000", help="runner mode: the ring's kernel")
    parser.add_argument("--direct", action="store_true", help="measure rank_shards (+ check) without the runner")
    parser.add_argument("--old", action="store_true", help="--direct: also the full-tensor approach")
    parser.add_argument("--budget-s", type=float, default=20.0, help="--direct: check_errors budget per point")
    args = parser.parse_args()
    print(HEADER)
    rows = direct(args) if args.direct else via_runner(args)
    for approach in dict.fromkeys(r["approach"] for r in rows):
        for check in (False, True):
            series = [r for r in rows if r["approach"] == approach and r["check"] == check]
            if len(series) == len(SCALES):
                ratios = ", ".join(f"{r['peak_mb'] / series[0]['peak_mb']:.2f}" for r in series[1:])
                print(f"{approach} {'with' if check else 'without'} check: peak ratios (2N,2S), (4N,4S) = {ratios}")


if __name__ == "__main__":
    main()
