"""Benchmark: `ringbench plan` at 64 and 1,024 ranks (target: 1,024 ranks on 128 hosts within 5 s).

    python benchmarks/bench_plan.py                 # 8 x 8 and 128 x 8 GPUs, S = 1M, 32 heads (8 KV) x 128, bf16
    python benchmarks/bench_plan.py --hosts 16      # another size

Each size: a YAML cluster of hosts of 8 GPUs on NVSwitch (NV18) joined by 50 GB/s, 10 us links (round figures,
not a measured machine), the command end to end in a fresh process (wall time), and its first choice.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = """name: cluster-{world}
intra: NV18
inter: NET
class_costs:
  NET: {{latency_us: 10.0, bandwidth_gbps: 50.0}}
hosts:
  - name: node
    count: {hosts}
    gpus: 8
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, action="append", default=None)
    parser.add_argument("--seq", type=int, default=1 << 20)
    args = parser.parse_args()
    for hosts in args.hosts or [8, 128]:
        world = 8 * hosts
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"cluster-{world}.yaml"
            path.write_text(CLUSTER.format(world=world, hosts=hosts))
            command = [sys.executable, "-m", "ringbench", "plan", "--topology", str(path), "--world", str(world),
                       "--seq", str(args.seq), "--heads", "32", "--kv-heads", "8", "--json", "-q"]  # fmt: skip
            started = time.perf_counter()
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - started
        if result.returncode != 0:
            raise SystemExit(result.stderr)
        plan = json.loads(result.stdout)
        first = plan["candidates"][0]
        print(
            f"{world:>5} ranks on {hosts} hosts: {wall:.1f} s wall ({plan['elapsed_s']:.1f} s planning), "
            f"{len(plan['candidates'])} candidates + {len(plan['refused'])} refused; first choice "
            f"{first['strategy']} {first['placement_name']}: {first['step_ms']:.1f} ms (PREDICTED)"
        )


if __name__ == "__main__":
    main()
