"""Accuracy of ``ringbench simulate`` against measured runs on this machine.

Calibrates on one measured 4-rank emulated run, then predicts measured runs at N = 2, 3, 6 and 8 (S = 2048 to
8192, double and sync, zigzag and contiguous, with and without a slow rank or a slow link, and two-host cases
with ``--topology --emulate-links``) and prints, per case, the measured and predicted step time and exposed
communication share. Targets (docs/simulate.md): median |predicted - measured| / measured of the step time at
most 10 %, worst at most 25 %; exposed-communication share within 0.05 absolute.

    python benchmarks/validate_simulate.py                 # measure (about 10-20 min on 2 cores), then predict
    python benchmarks/validate_simulate.py --reuse DIR     # predict again from the runs measured into DIR
    python benchmarks/validate_simulate.py --quick         # the calibration run and one small target only

Measured runs use ``--kernel emulated:auto`` (a rate whose real arithmetic stays under a third of the modelled time,
with 2 ms of room for the CPU scheduler;
chosen per case and recorded as ``emulated_gflops``); the simulator models each case at that rate.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.advise.simulation import SimRequest, run_simulation
from ringbench.calibration.calibrate import calibrate
from ringbench.record.store import load_run

COMMON = ["--heads", "2", "--head-dim", "32", "--mask", "causal", "--kernel", "emulated:auto", "--iters", "5",
          "--warmup", "1", "--no-check"]  # fmt: skip
BOTH = ["--layout", "zigzag", "--layout", "contiguous", "--buffer", "double", "--buffer", "sync"]
TWO_HOSTS = """# 2 emulated hosts x 4 GPUs: NVLink inside a host, one slow network link between them (exaggerated, so
# that it shows over loopback gloo). Written by benchmarks/validate_simulate.py.
name: two-host-4x2-slow-net
intra: NV4
inter: NET
hosts:
  - name: node
    count: 2
    gpus: 4
class_costs:
  NET: {latency_us: 2000.0, bandwidth_gbps: 0.05}
"""
SLOW_NET = TWO_HOSTS.replace("bandwidth_gbps: 0.05", "bandwidth_gbps: 0.002").replace("4x2-slow-net", "4x2-slower-net")


def plan(topology: Path, slow_net: Path) -> dict[str, list[str]]:
    """Run name -> `ringbench run` arguments (each one launch of local processes)."""
    zigzag = ["--layout", "zigzag", "--buffer", "double", "--buffer", "sync"]
    hosts = ["--order", "identity", "--order", "stride:2", "--emulate-links", "--topology"]
    return {
        "calibration-w4": ["--world", "4", "--seq", "2048", "--seq", "4096", *BOTH],
        "w2": ["--world", "2", "--seq", "2048", "--seq", "8192", *BOTH],
        "w3": ["--world", "3", "--seq", "3072", *BOTH],
        "w6": ["--world", "6", "--seq", "6144", *BOTH],
        "w8": ["--world", "8", "--seq", "4096", *BOTH],
        "w8-slow-rank": ["--world", "8", "--seq", "4096", *zigzag, "--fault", "slow-rank:3:1.5"],
        "w6-slow-link": ["--world", "6", "--seq", "6144", *BOTH, "--fault", "slow-link:2:3:5"],
        "w8-two-hosts": ["--world", "8", "--seq", "4096", *zigzag, *hosts, str(topology)],
        # communication-heavy: a 100 ms slow link, and a network 25x slower (a NET hop: ~130 ms per block)
        "w6-slow-link-100ms": ["--world", "6", "--seq", "6144", *zigzag, "--fault", "slow-link:2:3:100"],
        "w8-two-hosts-slower-net": ["--world", "8", "--seq", "4096", *zigzag, *hosts, str(slow_net)],
    }


QUICK = ("calibration-w4", "w2")


def measure(out: Path, names: tuple[str, ...] | None) -> dict[str, Path]:
    """Run the plan (or the ``names`` of it) into ``out``; runs measured earlier there are kept."""
    out.mkdir(parents=True, exist_ok=True)
    topology, slow_net = out / "two_hosts_4x2.yaml", out / "two_hosts_4x2_slower_net.yaml"
    topology.write_text(TWO_HOSTS)
    slow_net.write_text(SLOW_NET)
    index = out / "runs.json"
    runs = {k: Path(v) for k, v in json.loads(index.read_text()).items()} if index.exists() else {}
    for name, args in plan(topology, slow_net).items():
        if names is not None and name not in names:
            continue
        folder = out / name
        command = [sys.executable, "-m", "ringbench", "run", *COMMON, *args, "--out", str(folder), "--json",
                   "--quiet"]  # fmt: skip
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{name}: ringbench run failed ({done.returncode}): {done.stderr.strip()[-800:]}")
        runs[name] = Path(json.loads(done.stdout)["run_dir"])
        print(f"measured {name}: {runs[name]} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        index.write_text(json.dumps({k: str(v) for k, v in runs.items()}, indent=2))
    return runs


def predict(runs: dict[str, Path], scratch: Path) -> pd.DataFrame:
    """One row per measured case of every target run: measured and predicted figures."""
    rows = []
    for name, run_dir in runs.items():
        if name.startswith("calibration"):
            continue
        measured = load_run(run_dir)
        outcome = run_simulation(SimRequest(calibrate_from=runs["calibration-w4"], like=run_dir, iterations=5,
                                            out=scratch))  # fmt: skip
        predicted = outcome.run.cases.set_index(["world", "seq", "layout", "buffer", "order"])
        for row in measured.cases.to_dict("records"):
            key = (row["world"], row["seq"], row["layout"], row["buffer"], row["order"])
            sim = predicted.loc[key]
            rows.append({
                "run": name, "N": row["world"], "S": row["seq"], "layout": row["layout"], "buffer": row["buffer"],
                "order": row["order"], "rate": row["emulated_gflops"], "saturated": row["saturated_blocks"],
                "step_ms": row["step_ms"], "sim_step_ms": float(sim["step_ms"]),
                "exposed": row["exposed_comm_frac"], "sim_exposed": float(sim["exposed_comm_frac"]),
            })  # fmt: skip
    table = pd.DataFrame(rows)
    table["step_err"] = (table["sim_step_ms"] - table["step_ms"]) / table["step_ms"]
    table["exposed_diff"] = table["sim_exposed"] - table["exposed"]
    return table


def report(table: pd.DataFrame, calibration) -> int:
    fit = ", ".join(f"{phase} {100 * v['median_rel_residual']:.1f}%" for phase, v in calibration.compute_fit.items())
    print(
        f"calibration: {calibration.costs.source} (nominal {calibration.costs.gflops:.3g} GFLOP/s, "
        f"compute fit residual {fit})"
    )
    print()
    print(
        "| run | N | S | layout | buffer | order | GFLOP/s | measured step ms | predicted | error | measured exposed"
        " | predicted | Δ |"
    )
    print("|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in table.to_dict("records"):
        print(f"| {r['run']} | {r['N']} | {r['S']} | {r['layout']} | {r['buffer']} | {r['order']} | {r['rate']:g} | "
              f"{r['step_ms']:.1f} | {r['sim_step_ms']:.1f} | {100 * r['step_err']:+.1f}% | {r['exposed']:.3f} | "
              f"{r['sim_exposed']:.3f} | {r['exposed_diff']:+.3f} |")  # fmt: skip
    errors = table["step_err"].abs()
    exposed = table["exposed_diff"].abs()
    median, worst, diff = float(np.median(errors)), float(errors.max()), float(exposed.max())
    print()
    print(
        f"{len(table)} cases: step time |error| median {100 * median:.1f}% (target <= 10%), worst "
        f"{100 * worst:.1f}% (target <= 25%); exposed-communication share |Δ| median {np.median(exposed):.3f}, "
        f"worst {diff:.3f} (target <= 0.05)"
    )
    saturated = int(table["saturated"].fillna(0).sum())
    if saturated:
        print(f"note: {saturated} emulated blocks saturated in the measured runs: their times are not the model's")
    return 0 if median <= 0.10 and worst <= 0.25 and diff <= 0.05 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/validate-simulate"))
    parser.add_argument("--reuse", type=Path, help="a folder of earlier measurements (its runs.json)")
    parser.add_argument("--quick", action="store_true", help="the calibration run and the 2-rank target only")
    parser.add_argument("--only", action="append", help="measure only these runs of the plan (kept with earlier ones)")
    args = parser.parse_args()
    if args.reuse:
        runs = {k: Path(v) for k, v in json.loads((args.reuse / "runs.json").read_text()).items()}
    else:
        runs = measure(args.out, tuple(args.only) if args.only else QUICK if args.quick else None)
    table = predict(runs, args.out / "predicted")
    sys.exit(report(table, calibrate(load_run(runs["calibration-w4"]))))


if __name__ == "__main__":
    main()
