"""Detection quality of the straggler verdict on REAL runs: 8 local ranks, emulated compute, injected faults.

    .venv/bin/python benchmarks/detection_real.py                       # 20 trials + 6 controls, ~8-10 min
    .venv/bin/python benchmarks/detection_real.py --trials 4 --controls 2 --out /tmp/det

Each trial is one `ringbench run` (Python API) of an 8-rank ring, causal zigzag, S=2048, 2 heads x 32, forward only,
kernel ``emulated:1`` (one step's compute is modelled at ~8.4 ms, its arithmetic takes well under 1 ms, so the cores
stay free for gloo), with a random buffer (double | sync), a random ring order and one fault drawn at random:

  slow-rank:R:F    random rank R, factor F in [1.5, 3]                     hit: rank R named, kind compute
  slow-link:S:D:MS random ring hop S -> D, MS in [20%, 60%] of a step's     hit: hop S -> D named, kind link,
                   compute (the modelled step time)                         and no rank blamed

Controls are the same runs without a fault: anything named there is a false alarm, and so is a wrong name in a
trial. Spawning 8 ranks costs ~10-20 s on a 2-core machine, so each run takes about 20 s.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

WORLD, SEQ, HEADS, HEAD_DIM, GFLOPS = 8, 2048, 2, 32, 1.0
# One zigzag step: every (query shard, key shard) pair is half visible: 4 * H * L * L * D * 0.5 FLOPs.
STEP_MS = 4.0 * HEADS * (SEQ // WORLD) ** 2 * HEAD_DIM * 0.5 / (GFLOPS * 1e9) * 1e3


def one_run(out: Path, *, buffer: str, order: str, fault: str | None, iters: int) -> dict:
    from ringbench.analysis.findings import analyze, verdict_document
    from ringbench.record.store import load_run
    from ringbench.run.sweep import execute
    from ringbench.scenario.scenario import Scenario

    scenario = Scenario(
        name="detection", world=(WORLD,), seq=(SEQ,), heads=(HEADS,), head_dim=(HEAD_DIM,), mask=("causal",),
        layout=("zigzag",), buffer=(buffer,), order=(order,), kernel=(f"emulated:{GFLOPS:g}",), backward=False,
        iters=iters, warmup=1, check=False, faults=(fault,) if fault else (),
    )  # fmt: skip
    state = execute(scenario, out=out)
    document = verdict_document(analyze(load_run(state.run_dir)))
    case = document["cases"][0]
    return {"run_dir": str(state.run_dir), "case": case, "doc": document}


def named(case: dict) -> str | None:
    if case["straggler_kind"] == "compute":
        return f"rank {case['straggler_rank']}"
    if case["straggler_kind"] == "link":
        return f"hop {case['slow_hop'][0]}->{case['slow_hop'][1]}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="faulty runs (half slow ranks, half slow links)")
    parser.add_argument("--controls", type=int, default=6, help="fault-free runs")
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    out = args.out or Path(tempfile.mkdtemp(prefix="detection-real-"))
    plan = [("rank" if i % 2 == 0 else "link") for i in range(args.trials)] + ["none"] * args.controls
    rng.shuffle(plan)
    rows = []
    started = time.monotonic()
    for index, kind in enumerate(plan):
        ring = list(range(WORLD))
        order = "identity"
        if rng.random() < 0.5:
            rng.shuffle(ring)
            order = "-".join(map(str, ring))
        buffer = rng.choice(["double", "sync"])
        fault = injected = None
        if kind == "rank":
            rank, factor = rng.randrange(WORLD), rng.uniform(1.5, 3.0)
            fault, injected = f"slow-rank:{rank}:{factor:.2f}", f"rank {rank}"
        elif kind == "link":
            pos = rng.randrange(WORLD)
            src, dst = ring[pos - 1], ring[pos]
            extra = rng.uniform(0.2, 0.6) * STEP_MS
            fault, injected = f"slow-link:{src}:{dst}:{extra:.2f}", f"hop {src}->{dst}"
        t0 = time.monotonic()
        result = one_run(out, buffer=buffer, order=order, fault=fault, iters=args.iters)
        case = result["case"]
        name = named(case)
        hit = kind != "none" and name == injected and (kind != "link" or case["straggler_rank"] is None)
        row = {
            "kind": kind, "fault": fault, "buffer": buffer, "order": order, "injected": injected, "named": name,
            "hit": hit, "false_alarm": name is not None and name != injected, "ratio": case["ratio"],
            "clock_violations": case["clock_violations"], "seconds": round(time.monotonic() - t0, 1),
            "run_dir": result["run_dir"],
        }  # fmt: skip
        rows.append(row)
        print(
            f"[{index + 1}/{len(plan)}] {kind:4s} {fault or '-':24s} {buffer:6s} {order:16s} named={name} "
            f"hit={hit} false_alarm={row['false_alarm']} ({row['seconds']} s)",
            flush=True,
        )
    faulty = [r for r in rows if r["kind"] != "none"]
    summary = {
        "trials": len(faulty),
        "hits": sum(r["hit"] for r in faulty),
        "rank_hits": f"{sum(r['hit'] for r in faulty if r['kind'] == 'rank')}/{sum(r['kind'] == 'rank' for r in faulty)}",
        "link_hits": f"{sum(r['hit'] for r in faulty if r['kind'] == 'link')}/{sum(r['kind'] == 'link' for r in faulty)}",
        "controls": len(rows) - len(faulty),
        "false_alarms": sum(r["false_alarm"] for r in rows),
        "false_alarms_in_controls": sum(r["false_alarm"] for r in rows if r["kind"] == "none"),
        "max_clock_violations": max((r["clock_violations"] or 0.0) for r in rows) if rows else None,
        "minutes": round((time.monotonic() - started) / 60, 1),
        "runs": str(out),
    }
    (out / "detection_real.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
