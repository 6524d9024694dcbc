"""`ringbench plan` for the masks users train with, checked against measured CPU runs.

    python benchmarks/validate_plan_masks.py                 # calibrate, plan, measure, compare (a few minutes)
    python benchmarks/validate_plan_masks.py --reuse OUT     # recompute the table from runs already made

On CPU, 8 local ranks as 2 hosts x 4 GPUs (tests/data/topology/two_host_4gpu_10x.yaml, EMULATED links) and
EMULATED compute (`modelled:RATE`: each block takes its computed FLOPs' time, no arithmetic):

1. a calibration run at another length (S = --calibrate-seq; contiguous and zigzag, sync and double, the local
   transport): causal, and packed documents of another draw (another seed), so that the many short calls of a
   document mask are measured (a causal ring's one or two calls per step cannot tell a call's cost from its work);
2. per mask -- a sliding window of S/8 (``window:W``) and packed documents (``causal-document`` with lognormal
   lengths) -- `ringbench plan --from` the calibration, ring candidates only: the full ring, the short ring
   (``double-short``, where it stops early) and, for documents, the doc-balanced layout (PREDICTED);
3. one run per mask measuring every planned candidate (``--emulate-links``), and per candidate the plan's step
   beside the measured median (p10-p90): within 25 % is the acceptance.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = ROOT / "tests" / "data" / "topology" / "two_host_4gpu_10x.yaml"
SHAPE = ["--world", "8", "--heads", "4", "--head-dim", "32", "--dtype", "float32", "--no-check"]
WITHIN = 0.25


def _run(args: list[str], out: Path) -> Path:
    command = [sys.executable, "-m", "ringbench", "run", *args, "--out", str(out), "--json", "-q"]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if result.returncode != 0:
        raise SystemExit(f"run failed ({result.returncode}): {result.stderr[-2000:]}")
    run_dir = Path(json.loads(result.stdout)["run_dir"])
    print(f"  {run_dir.name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return run_dir


def _masks(seq: int, docs_spec: str) -> dict[str, dict]:
    return {"window": {"mask": f"window:{seq // 8}", "docs": "none", "layout": "contiguous"},
            "documents": {"mask": "causal-document", "docs": docs_spec, "layout": "zigzag"}}  # fmt: skip


def _plan(mask: dict, seq: int, calibration: Path):
    from ringbench.advise.planner import PlanRequest, make_plan
    from ringbench.scenario.workload import Workload

    workload = Workload(world=8, seq=seq, heads=4, head_dim=32, dtype="float32", mask=mask["mask"], docs=mask["docs"],
                        layout=mask["layout"])  # fmt: skip
    return make_plan(PlanRequest(workload=workload, topology=TOPOLOGY, calibrate_from=calibration, emulate_links=True, strategies=("ring",),
                                 detect=False))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/validate-plan-masks"))
    parser.add_argument("--rate", default="modelled:20", help="the emulated kernel")
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--calibrate-seq", type=int, default=4096)
    parser.add_argument("--docs", default="lognormal:512:1.0:7:0.25", help="the document pack")
    parser.add_argument("--calibrate-docs", default="lognormal:512:1.0:3:0.25", help="the calibration's pack")
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--reuse", type=Path, default=None)
    args = parser.parse_args()
    from ringbench.record.store import load_run

    timing = ["--kernel", args.rate, "--iters", str(args.iters), "--warmup", "1"]
    out = args.reuse or args.out
    runs_file = out / "runs.json"
    masks = _masks(args.seq, args.docs)
    if args.reuse is None:
        out.mkdir(parents=True, exist_ok=True)
        print("calibration run:", file=sys.stderr)
        calibration = _run([*SHAPE, *timing, "--seq", str(args.calibrate_seq), "--mask", "causal", "--mask",
                            "causal-document", "--docs", args.calibrate_docs, "--layout", "contiguous", "--layout",
                            "zigzag", "--buffer", "double", "--buffer", "sync"], out / "calibration")  # fmt: skip
        runs = {"calibration": str(calibration)}
        for name, mask in masks.items():
            plan = _plan(mask, args.seq, calibration)
            layouts = [w for layout in dict.fromkeys(c.layout for c in plan.candidates) for w in ("--layout", layout)]
            buffers = [w for b in dict.fromkeys(c.buffer for c in plan.candidates if c.strategy == "ring")
                       for w in ("--buffer", b)]  # fmt: skip
            print(f"{name} ({mask['mask']}):", file=sys.stderr)
            runs[name] = str(_run([*SHAPE, *timing, "--seq", str(args.seq), "--mask", mask["mask"], "--docs",
                                   mask["docs"], *layouts, *buffers, "--topology", str(TOPOLOGY), "--emulate-links"],
                                  out / name))  # fmt: skip
        runs_file.write_text(json.dumps(runs, indent=1))
    runs = json.loads(runs_file.read_text())
    calibration = Path(runs["calibration"])
    print("| mask | layout | buffer | measured step ms (p10–p90) | planned ms | error | planned rank | measured rank |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    worst = 0.0
    for name, mask in masks.items():
        plan = _plan(mask, args.seq, calibration)
        planned = {(c.layout, c.buffer): c.step_ms for c in plan.candidates if c.strategy == "ring"}
        cases = load_run(runs[name]).cases.drop_duplicates("case_id")
        rows = [(str(r["layout"]), str(r["buffer"]), float(r["step_ms"]), float(r["step_ms_p10"]),
                 float(r["step_ms_p90"])) for r in cases.to_dict("records")
                if (str(r["layout"]), str(r["buffer"])) in planned]  # fmt: skip
        measured_order = sorted(rows, key=lambda r: r[2])
        planned_order = sorted(rows, key=lambda r: planned[(r[0], r[1])])
        for layout, buffer, step, p10, p90 in measured_order:
            predicted = planned[(layout, buffer)]
            error = predicted / step - 1
            worst = max(worst, abs(error))
            print(f"| {mask['mask']}{' ' + mask['docs'] if mask['docs'] != 'none' else ''} | {layout} | {buffer} | "
                  f"{step:.1f} ({p10:.1f}–{p90:.1f}) | {predicted:.1f} | {100 * error:+.1f}% | "
                  f"{planned_order.index((layout, buffer, step, p10, p90)) + 1} | "
                  f"{measured_order.index((layout, buffer, step, p10, p90)) + 1} |")  # fmt: skip
    print(
        f"\nworst |planned / measured - 1| = {100 * worst:.1f}% (acceptance: within {100 * WITHIN:.0f}%): "
        f"{'PASS' if worst <= WITHIN else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
