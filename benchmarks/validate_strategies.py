"""Acceptance of the strategies and of `ringbench plan`: measured step time per strategy against the plan's ranking.

    python benchmarks/validate_strategies.py                     # calibrate, measure two contexts, plan, compare
    python benchmarks/validate_strategies.py --reuse OUT_DIR     # recompute the tables from runs already made

On CPU, 8 local ranks as 2 hosts x 4 GPUs (tests/data/topology/two_host_4gpu_10x.yaml: the network 10x slower than
the link inside a host), EMULATED compute (`modelled:RATE`: each block takes its FLOPs' time at RATE, no
arithmetic, so 8 ranks on 2 cores do not fight over the cores) and EMULATED links (`--emulate-links`):

1. a calibration run at a third sequence length, over the local transport (no emulated links: the simulator adds
   the topology's delays itself, as the run injects them): the ring (sync and double) for the costs, and every
   other strategy for its own host time per event (calibration/strategy_fit.py);
2. one run per context (two sequence lengths): every strategy the plan considers -- ring, allgather, ulysses,
   hybrid:2, hybrid:4, double-ring:2, double-ring:4, the grouped ones heads-first and interleaved;
3. `ringbench plan` on each run's topology, calibrated on run 1 (PREDICTED): the plan's first choice against the
   best measured strategy, the Spearman correlation of planned and measured order;
4. `ringbench simulate --like` each run `--from` run 1: the simulator's accuracy per strategy; the attention's
   counted peak memory per rank against the predicted one;
5. the network slowed (``--slow-net 4``: the NET class's latency x 4 and bandwidth / 4, a topology written beside
   the runs) and the first context run again: per strategy, the measured effect (slow step - step) against the
   plan's predicted effect (the same difference of the plan on both runs): the same sign and within 30 % in size;
   and the plan's first choice on the slow network within 10 % of the best measured there.

Prints markdown tables (docs/simulate.md, docs/strategies.md) and the accuracy entries of
ringbench/advise/accuracy.py.
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
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = ROOT / "tests" / "data" / "topology" / "two_host_4gpu_10x.yaml"
SHAPE = ["--world", "8", "--heads", "8", "--head-dim", "32", "--dtype", "float32", "--layout", "zigzag",
         "--mask", "causal", "--no-check"]  # fmt: skip
COMMON = [*SHAPE, "--topology", str(TOPOLOGY), "--emulate-links"]
STRATEGIES = ["ring", "allgather", "ulysses", "hybrid:2", "hybrid:4", "double-ring:2", "double-ring:4"]


def _run(args: list[str], out: Path) -> Path:
    command = [sys.executable, "-m", "ringbench", "run", *args, "--out", str(out), "--json", "-q"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise SystemExit(f"run failed ({result.returncode}): {result.stderr[-2000:]}")
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    print(f"  {run_dir.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return run_dir


def _key(row) -> tuple[str, str]:
    strategy = str(row["strategy"])
    if strategy in ("ring", "allgather", "ulysses"):
        return strategy, ""
    return strategy, str(row["ring"]) if "ring" in row and isinstance(row["ring"], str) else str(row["placement"])


def _plan(run_dir: Path, seq: int, calibration: tuple[Path, ...]):
    from ringbench.advise.planner import PlanRequest, make_plan
    from ringbench.scenario.workload import Workload

    workload = Workload(world=8, seq=seq, heads=8, head_dim=32, dtype="float32")
    return make_plan(PlanRequest(workload=workload, topology=run_dir, calibrate_from=calibration))


def _like(run_dir: Path, calibration: tuple[Path, ...], out: Path) -> pd.DataFrame:
    """What `ringbench simulate --like RUN --from CALIBRATION` predicts, with several calibration runs merged."""
    from ringbench.advise.simulation import SimRequest, _cluster
    from ringbench.calibration import cases_like
    from ringbench.calibration.calibrate import calibrate
    from ringbench.calibration.strategy_fit import merge_runs
    from ringbench.record.store import load_run
    from ringbench.simulate import simulate_case

    costs = calibrate(merge_runs(calibration)).costs
    run = load_run(run_dir)
    cluster = _cluster(SimRequest(like=Path(run_dir)), run)
    return pd.DataFrame([simulate_case(case, costs, cluster).row for case in cases_like(run)])


def _slow_topology(out: Path, factor: float) -> Path:
    """TOPOLOGY with its NET class ``factor`` times slower (latency x factor, bandwidth / factor)."""
    import yaml

    spec = yaml.safe_load(TOPOLOGY.read_text())
    net = spec["class_costs"]["NET"]
    spec["class_costs"]["NET"] = {"latency_us": net["latency_us"] * factor,
                                  "bandwidth_gbps": net["bandwidth_gbps"] / factor}  # fmt: skip
    spec["name"] = f"{spec['name']}-net{factor:g}x"
    path = out / f"two_host_4gpu_net{factor:g}x.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _planned(run_dir: Path, seq: int, calibration: tuple[Path, ...]) -> dict:
    plan = _plan(run_dir, seq, calibration)
    out = {}
    for candidate in plan.candidates:
        placement = "-".join(map(str, candidate.placement)) if candidate.placement_name else ""
        out[(candidate.strategy, placement)] = candidate.step_ms
    return out


def net_effect(base_dir: Path, slow_dir: Path, seq: int, calibration: tuple[Path, ...], factor: float) -> list[str]:
    """Per strategy: the measured and the planned effect of the slower network; the verdict lines."""
    from ringbench.record.store import load_run

    planned_base, planned_slow = _planned(base_dir, seq, calibration), _planned(slow_dir, seq, calibration)
    measured = {}
    for name, run_dir in (("base", base_dir), ("slow", slow_dir)):
        cases = load_run(run_dir).cases.drop_duplicates("case_id")
        measured[name] = {_key(row): (row["step_ms"], row["step_ms_p10"], row["step_ms_p90"])
                          for row in cases.to_dict("records")}  # fmt: skip
    print(
        f"\n| strategy | placement | measured step ms | with NET {factor:g}x slower | measured effect ms | "
        "planned effect ms | effect error | verdict |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|")
    agree, lines = 0, []
    keys = [k for k in measured["base"] if k in measured["slow"]]
    for key in sorted(keys, key=lambda k: measured["base"][k][0]):
        base, slow = measured["base"][key], measured["slow"][key]
        effect = slow[0] - base[0]
        predicted = planned_slow.get(key, np.nan) - planned_base.get(key, np.nan)
        error = predicted / effect - 1 if effect else np.nan
        ok = bool(np.sign(predicted) == np.sign(effect) and abs(error) <= 0.30)
        agree += ok
        print(f"| {key[0]} | {key[1] or '-'} | {base[0]:.1f} ({base[1]:.1f}–{base[2]:.1f}) | {slow[0]:.1f} "
              f"({slow[1]:.1f}–{slow[2]:.1f}) | {effect:+.1f} | {predicted:+.1f} | {100 * error:+.1f}% | "
              f"{'agrees' if ok else 'DISAGREES'} |")  # fmt: skip
    lines.append(f"NET {factor:g}x slower, S={seq}: the planned effect agrees in sign and within 30% with the measured "
                 f"one for {agree} of {len(keys)} strategy cases")  # fmt: skip
    slow_rows = measured["slow"]
    first = min(planned_slow, key=planned_slow.get)
    best = min(v[0] for v in slow_rows.values())
    if first in slow_rows:
        lines.append(f"NET {factor:g}x slower: plan's first choice {first[0]} {first[1]} measured "
                     f"{slow_rows[first][0]:.1f} ms vs the best measured {best:.1f} ms "
                     f"({100 * (slow_rows[first][0] / best - 1):+.1f}%, target <= 10%)")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/validate-strategies"))
    parser.add_argument("--rate", default="modelled:20", help="the emulated kernel")
    parser.add_argument("--seq", type=int, nargs=2, default=[4096, 16384], help="the two contexts")
    parser.add_argument("--calibrate-seq", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--reuse", type=Path, default=None, help="a folder of runs made before (skip the runs)")
    parser.add_argument("--slow-net", type=float, default=4.0, help="how much slower the NET of the last check is")
    parser.add_argument("--net-seq", type=int, default=4096, help="the context of the slow-network check")
    parser.add_argument(
        "--calibration",
        type=Path,
        action="append",
        default=None,
        help="with --reuse: calibrate on these runs instead (merged)",
    )
    args = parser.parse_args()
    from ringbench.record.store import load_run
    from ringbench.simulate.grouped import predicted_memory_mb

    timing = ["--kernel", args.rate, "--iters", str(args.iters), "--warmup", "1"]
    out = args.reuse or args.out
    runs_file = out / "runs.json"
    if args.reuse is None:
        out.mkdir(parents=True, exist_ok=True)
        print("calibration run (ring only):", file=sys.stderr)
        strategies = [w for s in STRATEGIES for w in ("--strategy", s)]
        calibration = _run([*SHAPE, *timing, "--seq", str(args.calibrate_seq), "--buffer", "double", "--buffer", "sync",
                            *strategies, "--placement", "heads-first"], out / "calibration")  # fmt: skip
        contexts = {}
        for seq in args.seq:
            print(f"context S={seq}:", file=sys.stderr)
            contexts[seq] = str(_run([*COMMON, *timing, "--seq", str(seq), "--buffer", "double", *strategies,
                                      "--placement", "heads-first", "--placement", "interleaved"],
                                     out / f"s{seq}"))  # fmt: skip
        slow = _slow_topology(out, args.slow_net)
        print(f"context S={args.net_seq}, NET {args.slow_net:g}x slower:", file=sys.stderr)
        slow_run = _run([*SHAPE, "--topology", str(slow), "--emulate-links", *timing, "--seq", str(args.net_seq),
                         "--buffer", "double", *strategies, "--placement", "heads-first", "--placement",
                         "interleaved"], out / f"s{args.net_seq}-net{args.slow_net:g}x")  # fmt: skip
        runs_file.write_text(json.dumps({"calibration": str(calibration), "contexts": contexts,
                                         "slow_net": {"factor": args.slow_net, "seq": args.net_seq,
                                                      "run": str(slow_run)}}, indent=1))  # fmt: skip
    runs = json.loads(runs_file.read_text())
    if args.calibration:
        runs["calibration"] = [str(p) for p in args.calibration]
    calibration = tuple(Path(p) for p in ([runs["calibration"]] if isinstance(runs["calibration"], str)
                                          else runs["calibration"]))  # fmt: skip
    accuracy_rows, memory_rows = [], []
    print(
        "\n| S | strategy | placement | measured step ms (p10–p90) | planned ms | error | planned rank | measured rank |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    verdicts = []
    for seq, run_dir in sorted(runs["contexts"].items(), key=lambda kv: int(kv[0])):
        run = load_run(run_dir)
        measured = run.cases.drop_duplicates("case_id").copy()
        plan = _plan(Path(run_dir), int(seq), calibration)
        planned = {}
        for rank, candidate in enumerate(plan.candidates, start=1):
            placement = "-".join(map(str, candidate.placement)) if candidate.placement_name else ""
            planned[(candidate.strategy, placement)] = (candidate.step_ms, rank, candidate)
        rows = []
        for row in measured.to_dict("records"):
            key = _key(row)
            step, rank, _ = planned.get(key, (np.nan, None, None))
            rows.append({"key": key, "measured": row["step_ms"], "p10": row["step_ms_p10"], "p90": row["step_ms_p90"],
                         "planned": step, "placement": row.get("placement") or ""})  # fmt: skip
        table = pd.DataFrame(rows)
        table["measured_rank"] = table["measured"].rank().astype(int)
        table["planned_rank"] = table["planned"].rank().astype(int)
        for row in table.sort_values("measured").to_dict("records"):
            error = 100 * (row["planned"] / row["measured"] - 1)
            print(f"| {seq} | {row['key'][0]} | {row['placement'] or '-'} | {row['measured']:.1f} "
                  f"({row['p10']:.1f}–{row['p90']:.1f}) | {row['planned']:.1f} | {error:+.1f}% | {row['planned_rank']} | "
                  f"{row['measured_rank']} |")  # fmt: skip
        rho = float(spearmanr(table["planned"], table["measured"]).statistic)
        first = table.loc[table["planned"].idxmin()]
        best = table["measured"].min()
        verdicts.append(f"S={seq}: plan's first choice {first['key'][0]} {first['placement'] or ''} measured "
                        f"{first['measured']:.1f} ms vs the best measured {best:.1f} ms ({100 * (first['measured'] / best - 1):+.1f}%, "
                        f"target <= 10%); Spearman {rho:.2f} (target >= 0.8); plan took {plan.elapsed_s:.1f} s")  # fmt: skip
        simulated = _like(Path(run_dir), calibration, out / "simulated")
        simulated["placement"] = simulated["placement"].fillna("")
        measured["placement"] = measured["placement"].fillna("")
        joined = measured.merge(simulated, on=["strategy", "placement"], suffixes=("", "_sim"))
        for row in joined.to_dict("records"):
            accuracy_rows.append({"seq": seq, "strategy": row["strategy"], "placement": row["placement"],
                                  "measured": row["step_ms"], "predicted": row["step_ms_sim"],
                                  "exposed": row["exposed_comm_frac"], "exposed_sim": row["exposed_comm_frac_sim"]})  # fmt: skip
        for row in measured.to_dict("records"):
            from ringbench.scenario.workload import Workload
            from ringbench.simulate.case import SimCase

            case = SimCase(
                workload=Workload(
                    world=8,
                    seq=int(seq),
                    heads=8,
                    head_dim=32,
                    dtype="float32",
                    layout="zigzag",
                    buffer=str(row["buffer"]),
                    strategy=str(row["strategy"]),
                    placement=str(row["placement"] or ""),
                )
            )
            memory_rows.append({"seq": seq, "strategy": row["strategy"], "placement": row["placement"] or "-",
                                "counted": row["attn_mem_mb"], "predicted": predicted_memory_mb(case)})  # fmt: skip
    slow = runs.get("slow_net")
    if slow is not None and str(slow["seq"]) in runs["contexts"]:
        verdicts += net_effect(Path(runs["contexts"][str(slow["seq"])]), Path(slow["run"]), int(slow["seq"]),
                               calibration, float(slow["factor"]))  # fmt: skip
    print()
    for line in verdicts:
        print(line)
    acc = pd.DataFrame(accuracy_rows)
    acc["error"] = 100 * (acc["predicted"] / acc["measured"] - 1)
    print("\n| S | strategy | placement | measured step ms | predicted | error | measured exposed | predicted |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for row in acc.to_dict("records"):
        print(
            f"| {row['seq']} | {row['strategy']} | {row['placement'] or '-'} | {row['measured']:.1f} | "
            f"{row['predicted']:.1f} | {row['error']:+.1f}% | {row['exposed']:.3f} | {row['exposed_sim']:.3f} |"
        )
    print("\nMEASURED = {")
    acc["kind"] = acc["strategy"].str.split(":").str[0]
    for kind, part in acc.groupby("kind"):
        errors = part["error"].abs()
        print(
            f'    "{kind}": {{"cases": {len(part)}, "median_pct": {errors.median():.1f}, "worst_pct": '
            f'{errors.max():.1f}, "where": "8 ranks, 2 emulated hosts x 4, CPU"}},'
        )
    print("}")
    print("\n| S | strategy | placement | counted MiB per rank | predicted |")
    print("|---:|---|---|---:|---:|")
    for row in memory_rows:
        print(
            f"| {row['seq']} | {row['strategy']} | {row['placement']} | {row['counted']:.1f} | {row['predicted']:.1f} |"
        )


if __name__ == "__main__":
    main()
