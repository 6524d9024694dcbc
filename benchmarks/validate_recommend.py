"""`recommend`'s predicted speedup against `run --emulate-links` on two-host topologies, order by order.

For each current order: measure it (``ringbench run --topology FILE --emulate-links``), ask ``ringbench recommend
--topology FILE --order ORDER`` (the topology alone: the link model's speedup of communication per ring step, its
headline) and ``ringbench recommend RUN_DIR --order ORDER`` (its headline: the step-time speedup the simulator
predicts calibrated on that run), measure the recommended ring, and print them side by side. Target (issues 17 and
30): recommend's headline with a run within 25 % of the measurement.

    python benchmarks/validate_recommend.py                       # 2 hosts x 4 GPUs, three orders (about 5 min)
    python benchmarks/validate_recommend.py --latency-us 200 --kernel modelled:1000000   # next to no compute
    python benchmarks/validate_recommend.py --hosts 2 --gpus 2 --order stride:2

Emulated compute (``modelled:50`` by default: no arithmetic, the cores stay free; a huge rate leaves next to none),
forward only, zigzag, double buffering.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

TOPOLOGY = """name: two-host-{gpus}x{hosts}
intra: NV4
inter: NET
hosts:
  - name: node
    count: {hosts}
    gpus: {gpus}
class_costs:
  NET: {{latency_us: {latency}, bandwidth_gbps: {bandwidth}}}
"""
RUN = ["--heads", "2", "--head-dim", "32", "--mask", "causal", "--layout", "zigzag", "--buffer", "double",
       "--no-backward", "--iters", "4", "--warmup", "1", "--no-check", "--emulate-links",
       "--json", "--quiet"]  # fmt: skip


def _ringbench(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "ringbench", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"ringbench {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()[-600:]}")
    return json.loads(done.stdout)


def _measure(out: Path, topology: Path, order: str, world: int, seq: int, kernel: str) -> tuple[str, float]:
    document = _ringbench("run", "--world", str(world), "--seq", str(seq), "--order", order, "--topology",
                          str(topology), *RUN, "--kernel", kernel, "--out", str(out / order.replace(":", "_")))  # fmt: skip
    return document["run_dir"], float(document["cases"][0]["step_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--latency-us", type=float, default=100.0)
    parser.add_argument("--bandwidth-gbps", type=float, default=0.02)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument(
        "--kernel", default="modelled:50", help="the runs' kernel (modelled:1000000: next to no compute)"
    )
    parser.add_argument("--order", action="append", help="current orders (default: three hostile ones)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per order (medians, with their range)")
    parser.add_argument("--out", type=Path, default=Path("results/validate-recommend"))
    args = parser.parse_args()
    world = args.hosts * args.gpus
    args.out.mkdir(parents=True, exist_ok=True)
    topology = args.out / "topology.yaml"
    topology.write_text(TOPOLOGY.format(hosts=args.hosts, gpus=args.gpus, latency=args.latency_us,
                                        bandwidth=args.bandwidth_gbps))  # fmt: skip
    interleaved = "-".join(str(h * args.gpus + g) for g in range(args.gpus) for h in range(args.hosts))
    # NET hops shared 4, 2 and 3 ways on 2 x 4: every hop crosses; every other; six of eight
    default = [interleaved, "stride:2"] + (["0-4-1-5-2-3-6-7"] if (args.hosts, args.gpus) == (2, 4) else [])
    orders = args.order or default
    recommended_ms: dict[str, list[float]] = {}
    print(f"{world} ranks on {args.hosts} hosts x {args.gpus} GPUs (NV4 inside, NET {args.latency_us:g} us + "
          f"{args.bandwidth_gbps:g} GB/s), S = {args.seq}, {args.kernel}, emulated compute and links, "
          f"{args.repeats} run(s) per order (median (min-max))")  # fmt: skip
    print("| current order | recommended | headline, topology alone (communication only) | headline with the run "
          "(the step, SIMULATED) | measured step speedup | headline with the run / measured |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|")
    for order in orders:
        runs = [
            _measure(args.out / f"r{r}", topology, order, world, args.seq, args.kernel) for r in range(args.repeats)
        ]
        alone = _ringbench("recommend", "--topology", str(topology), "--order", order, "--no-detect", "--json")
        advice = [_ringbench("recommend", run_dir, "--order", order, "--no-detect", "--json") for run_dir, _ in runs]
        recommended = advice[0]["order_arg"]
        if recommended not in recommended_ms:
            recommended_ms[recommended] = [_measure(args.out / f"r{r}", topology, recommended, world, args.seq,
                                                    args.kernel)[1] for r in range(args.repeats)]  # fmt: skip
        base = statistics.median(recommended_ms[recommended])
        measured = [ms / base for _, ms in runs]
        heads = [a["headline"]["speedup"] for a in advice]
        ratio = statistics.median(heads) / statistics.median(measured)
        print(f"| {order} | {recommended} | x{alone['headline']['speedup']:.2f} | x{_spread(heads)} "
              f"({advice[0]['headline']['covers']}) | x{_spread(measured)} "
              f"({statistics.median(ms for _, ms in runs):,.1f} / {base:,.1f} ms) | {ratio:.2f} |")  # fmt: skip


def _spread(values: list[float]) -> str:
    return (
        f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
        if len(values) > 1
        else f"{values[0]:.2f}"
    )


if __name__ == "__main__":
    main()
