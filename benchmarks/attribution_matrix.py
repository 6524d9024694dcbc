"""The attribution matrix: user-written rings with one fault each, profiled, imported, analysed; what the verdict
names and what it says the fault costs, beside the slowdown the program measured itself.

    .venv/bin/python benchmarks/attribution_matrix.py                       # world 4, 48 programs (~2 min)
    .venv/bin/python benchmarks/attribution_matrix.py --traces /tmp/m       # keep (or reuse) the traces
    .venv/bin/python benchmarks/attribution_matrix.py --world 3 --delay 6 --json

The programs come from tests/user_rings.py (plain torch.distributed over gloo, torch.profiler, modelled block
times): every fault (none, late before the post, late after the compute, late inside the annotated compute, a
slow hop by a helper thread's late send, a slow hop by a delayed post) x barrier (after each iteration or none)
x K, V as one message or two x isend/irecv or batch_isend_irecv. Each is imported twice: with the default
compute patterns, and with ``--compute-pattern`` naming its annotated compute range. ``slowdown`` is the program's
own step time minus that of the same program without the fault.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from user_rings import COMPUTE_RANGE, UserRing, run_programs


def programs(world: int, delay_ms: float, fault_rank: int, iters: int) -> list[UserRing]:
    out = []
    for fault, barrier, kv, api in itertools.product(
        ("none", "before_post", "after_compute", "in_compute", "link_thread", "link_post"),
        ("end", "none"),
        (1, 2),
        ("isend", "batch"),
    ):
        name = f"{fault}-b{barrier}-kv{kv}-{api}"
        out.append(UserRing(name=name, fault=fault, fault_rank=fault_rank if fault != "none" else -1,
                            delay_ms=delay_ms if fault != "none" else 0.0, barrier=barrier, kv_messages=kv,
                            api=api, iters=iters))  # fmt: skip
    return out


def verdict(trace_dir: Path, out: Path, patterns: tuple[str, ...]) -> dict:
    from ringbench.analysis.findings import analyze, verdict_document, verdict_lines
    from ringbench.record.store import load_run
    from ringbench.traces.importer import import_traces

    try:
        result = import_traces([trace_dir], out=out, compute_patterns=patterns)
    except Exception as exc:
        return {"error": str(exc).splitlines()[0]}
    analysis = analyze(load_run(result.run_dir))
    doc = verdict_document(analysis)
    return {
        "kind": doc["straggler_kind"],
        "rank": doc["straggler_rank"],
        "hop": doc["slow_hop"],
        "cost_ms": doc["straggler_cost_ms"],
        "confidence": doc["confidence"],
        "step_ms": doc["cases"][0]["step_ms"],
        "lines": verdict_lines(analysis),
    }


def named(row: dict) -> str:
    if "error" in row:
        return "refused: " + row["error"][:40]
    if row["kind"] == "compute":
        return f"rank {row['rank']} (compute)"
    if row["kind"] == "link":
        return f"hop {row['hop'][0]}->{row['hop'][1]} (link)"
    return "inconclusive" if row["confidence"] == "inconclusive" else "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--delay", type=float, default=8.0, help="ms per ring step")
    parser.add_argument("--fault-rank", type=int, default=2)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--traces", type=Path, default=None, help="where the traces go (reused when present)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = args.traces or Path(tempfile.mkdtemp(prefix="attribution-"))
    listing = root / "programs.json"
    if listing.exists():
        document = json.loads(listing.read_text())
        measured = {p["name"]: p["step_ms"] for p in document["programs"]}
        world = document["world"]
        progs = [UserRing(**{k: v for k, v in p.items() if k not in ("step_ms", "iteration_ms")})
                 for p in document["programs"]]  # fmt: skip
    else:
        world = args.world
        progs = programs(world, args.delay, args.fault_rank, args.iters)
        measured = run_programs(progs, root, world, timeout_s=900)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for program in progs:
            clean = program.name.replace(program.fault, "none", 1)
            slowdown = measured[program.name] - measured[clean]
            for patterns in ((), (COMPUTE_RANGE,)):
                row = verdict(root / program.name, Path(tmp), patterns)
                rows.append({"program": program.name, "fault": program.fault, "patterns": list(patterns),
                             "measured_step_ms": measured[program.name], "slowdown_ms": slowdown} | row)  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return
    print(f"world {world}; traces in {root}")
    print(f"{'program':34} {'pattern':8} {'named':28} {'cost ms':>8} {'slowdown ms':>11}")
    for row in rows:
        cost = row.get("cost_ms")
        cost_text = f"{cost:8.1f}" if isinstance(cost, (int, float)) else f"{'-':>8}"
        pattern = "range" if row["patterns"] else "default"
        print(f"{row['program']:34} {pattern:8} {named(row):28} {cost_text} {row['slowdown_ms']:11.1f}")


if __name__ == "__main__":
    main()
