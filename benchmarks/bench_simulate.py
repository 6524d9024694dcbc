"""Benchmark: the simulator at 4,096 ranks (target <= 10 s) and 65,536 ranks (target <= 60 s, < 4 GB), one
iteration forward and backward, through the command (`ringbench simulate`), each size in a fresh process.

    python benchmarks/bench_simulate.py                    # 4,096 and 65,536 ranks
    python benchmarks/bench_simulate.py --world 1024 --world 4096 --fault slow-rank:7:1.5
    python benchmarks/bench_simulate.py --example          # the worked example of docs/simulate.md

Each size: causal zigzag, 64 tokens per rank (S = 64 N), 8 heads of 128, bfloat16, double buffering, the default
costs; wall time of the whole command (simulate, walk the critical path, write the bounded record) and the
process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

TARGETS = {4096: (10.0, None), 65536: (60.0, 4096.0)}  # seconds, MB
CLUSTER = """# 128 hosts x 8 GPUs on NVSwitch (NV18); 50 GB/s between two hosts, shared by the ring hops that cross
# it (the worked example of docs/simulate.md; round figures, not a measured machine).
name: cluster-1024
intra: NV18
inter: NET
class_costs:
  NET: {latency_us: 10.0, bandwidth_gbps: 50.0}
hosts:
  - name: node
    count: 128
    gpus: 8
"""


def example() -> None:
    """1,024 ranks on 128 hosts, 32 heads of 128, causal zigzag, S = 1M and 32M tokens: one slow host (host 3 at
    1.5x), the blast radius of one slow rank, and the recommended ring order against identity and stride:8."""
    import dataclasses
    from pathlib import Path

    from ringbench.advise.scale_view import order_comparison
    from ringbench.scenario.workload import Workload
    from ringbench.simulate import DEFAULTS, Cluster, SimCase, simulate_case
    from ringbench.topology import load_topology

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster-1024.yaml"
        path.write_text(CLUSTER)
        cluster = Cluster(topology=load_topology(path))
    print(f"SIMULATED, default costs (400 TFLOP/s per GPU); {cluster.topology.describe()}")
    for seq in (1 << 20, 1 << 25):
        for buffer in ("double", "sync"):
            base = SimCase(workload=Workload(world=1024, seq=seq, heads=32, head_dim=128, dtype="bfloat16",
                                             mask="causal", layout="zigzag", buffer=buffer))  # fmt: skip
            healthy = simulate_case(base, DEFAULTS, cluster).row
            slow = simulate_case(dataclasses.replace(base, faults=("slow-host:3:1.5",)), DEFAULTS, cluster).row
            print(f"S={seq:,} ({seq // 1024:,} tokens/rank), {buffer}: step {healthy['step_ms']:.1f} ms, exposed "
                  f"comm {100 * healthy['exposed_comm_frac']:.1f}%; host 3 at 1.5x: {slow['step_ms']:.1f} ms "
                  f"(x{slow['step_ms'] / healthy['step_ms']:.3f})")  # fmt: skip
            blast = []
            for factor in (1.1, 1.5, 2.0):
                one = dataclasses.replace(base, faults=(f"slow-rank:512:{factor:g}",))
                blast.append(
                    f"k={factor:g}: x{simulate_case(one, DEFAULTS, cluster).row['step_ms'] / healthy['step_ms']:.3f}"
                )
            print(f"  blast radius of one slow rank: {', '.join(blast)}")
            rows = order_comparison(base, DEFAULTS, cluster)
            print(
                "  orders: " + ", ".join(f"{r['order']} {r['step_ms']:.1f} ms (x{r['vs_identity']:.3f})" for r in rows)
            )
    print(f"({time.perf_counter() - started:.0f} s)")


def child(world: int, faults: list[str], buffer: str) -> None:
    from typer.testing import CliRunner

    from ringbench.cli.app import app

    with tempfile.TemporaryDirectory() as out:
        args = ["simulate", "--world", str(world), "--seq", str(64 * world), "--heads", "8", "--head-dim", "128",
                "--dtype", "bfloat16", "--mask", "causal", "--layout", "zigzag", "--buffer", buffer, "--iters", "1",
                "--out", out, "--json", "--quiet"]  # fmt: skip
        for fault in faults:
            args += ["--fault", fault]
        started = time.perf_counter()
        result = CliRunner().invoke(app, args)
        seconds = time.perf_counter() - started
        if result.exit_code != 0:
            sys.exit(result.output)
        case = json.loads(result.stdout)["cases"][0]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"world": world, "seconds": seconds, "peak_mb": peak_mb, "step_ms": case["step_ms"],
                      "exposed_comm_frac": case["exposed_comm_frac"], "events": case["events"]}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, action="append")
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--buffer", default="double")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--example", action="store_true", help="the worked example of docs/simulate.md")
    args = parser.parse_args()
    if args.example:
        example()
        return
    worlds = args.world or sorted(TARGETS)
    if args.child:
        child(worlds[0], args.fault, args.buffer)
        return
    failed = False
    for world in worlds:
        command = [sys.executable, __file__, "--child", "--world", str(world), "--buffer", args.buffer]
        for fault in args.fault:
            command += ["--fault", fault]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"world={world}: {done.stdout}{done.stderr}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        seconds, memory = TARGETS.get(world, (None, None))
        verdict = ""
        if seconds is not None:
            ok = row["seconds"] <= seconds and (memory is None or row["peak_mb"] <= memory)
            failed |= not ok
            verdict = f"   target <= {seconds:g} s" + (f", <= {memory:g} MB" if memory else "") + (
                " ok" if ok else " MISSED")  # fmt: skip
        print(f"simulate N={world:>6}: {row['seconds']:6.1f} s, peak {row['peak_mb']:6.0f} MB, SIMULATED step "
              f"{row['step_ms']:.1f} ms, exposed {100 * row['exposed_comm_frac']:.1f}%, events "
              f"{row['events']}{verdict}")  # fmt: skip
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
