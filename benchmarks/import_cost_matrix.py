"""The import's cost against what removing the fault saves: user rings with one fault each, profiled, imported,
analysed, beside the same program without the fault, twice over (two launches) for stability.

    flock /tmp/ringbench-heavy.lock .venv/bin/python benchmarks/import_cost_matrix.py          # ~6 min, 2 cores
    .venv/bin/python benchmarks/import_cost_matrix.py --runs 1 --pairs 1 --iters 8 --out /tmp/m --json

Programs (tests/user_rings.py: plain torch.distributed over gloo, torch.profiler, EMULATED block compute of
``--block`` ms so the 2 cores stay free; 4 ranks; a barrier after each iteration):

  slow compute      rank 2 spends ``--delay`` ms more inside its compute at every step
  slow hop          hop 2 -> 3: rank 2's sends are posted by a helper thread ``--delay`` ms late (the link, or the
                    sender's code: the trace does not hold those sends)
  held-back send    rank 2 posts its receive, then its send ``--delay`` ms later (its own code holds the hop back)
  two slow ranks    ranks 1 and 3 spend ``--delay`` ms more inside their compute
  jitter only       every rank spends a random 0..``--delay`` ms more inside its compute at every step (noise)
  causal only       causal attention over a contiguous layout: rank r computes r + 1 of the 4 blocks (imbalance of
                    the work); its twin is the same work spread evenly (each rank half of every block)

Each program runs next to its twin (the same program without the fault) in the same launch, ``--iters`` timed
iterations each, the pair ``--pairs`` times over, alternating with the other programs (the machine's drift lands
on both alike). ``measured`` is the program's own step time minus its twin's (medians of the slowest rank per
iteration, pooled over the pairs; the interval: p10-p90 of 2000 bootstrap resamples of the iterations); the import
reads the first pair's traces. ``cost`` is the import's
straggler cost per iteration (median, p10-p90 over iterations) and ``ratio`` the culprit's ratio to its peers with
its p10-p90 over iterations. A program whose fault is no one's (jitter, causal) is right when nobody is named.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from user_rings import UserRing, run_programs

WORLD = 4
PROGRAMS = {  # name: (fault, fault rank, expected verdict)
    "slow compute": ("in_compute", 2, ("compute", [2])),
    "slow hop": ("link_thread", 2, ("link", [2, 3])),
    "held-back send": ("link_post", 2, ("link", [2, 3])),
    "two slow ranks": ("two_slow", 1, ("compute", [1, 3])),
    "jitter only": ("jitter", -1, (None, None)),
    "causal only": ("causal", -1, (None, None)),
}


def programs(args, run: int) -> list[UserRing]:
    """Each program and its twin, ``--pairs`` times, alternating (the machine's drift lands on both alike)."""
    out = []
    for pair in range(args.pairs):
        for label, (fault, rank, _) in PROGRAMS.items():
            slug = _slug(label)
            twin = "balanced" if fault == "causal" else "none"
            common = dict(iters=args.iters, block_ms=args.block, barrier="end", seed=run * 100 + pair)
            out.append(UserRing(name=f"r{run}-{slug}-twin-{pair}", fault=twin, **common))
            out.append(UserRing(name=f"r{run}-{slug}-{pair}", fault=fault, fault_rank=rank, delay_ms=args.delay,
                                **common))  # fmt: skip
    return out


def _slug(label: str) -> str:
    return label.replace(" ", "_").replace("-", "_")


def _bootstrap(fault: list[float], twin: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    fault, twin = np.asarray(fault), np.asarray(twin)
    samples = [np.median(rng.choice(fault, len(fault))) - np.median(rng.choice(twin, len(twin)))
               for _ in range(2000)]  # fmt: skip
    return float(np.median(fault) - np.median(twin)), float(np.quantile(samples, 0.1)), float(np.quantile(samples, 0.9))


def verdict(trace_dir: Path, out: Path) -> dict:
    from ringbench.analysis.findings import analyze, verdict_document
    from ringbench.record.store import load_run
    from ringbench.traces.importer import import_traces

    result = import_traces([trace_dir], out=out)
    doc = verdict_document(analyze(load_run(result.run_dir)))
    kind = doc["straggler_kind"]
    named = doc["straggler_ranks"] if kind == "compute" else doc["slow_hop"]
    return {"kind": kind, "named": named, "cost_ms": doc["straggler_cost_ms"],
            "cost_p10": doc["cases"][0]["cost_ms_p10"], "cost_p90": doc["cases"][0]["cost_ms_p90"],
            "ratio": doc["straggler_ratio"], "ratio_p10": doc["straggler_ratio_p10"],
            "ratio_p90": doc["straggler_ratio_p90"], "hop_cause": doc["hop_cause"], "confidence": doc["confidence"],
            "imbalance": doc["imbalance"]}  # fmt: skip


def _right(expected, row: dict) -> bool:
    kind, who = expected
    if kind is None:
        return row["kind"] is None and row["confidence"] == "conclusive"
    return row["kind"] == kind and sorted(row["named"] or []) == sorted(who)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="launches (the stability check compares them)")
    parser.add_argument("--iters", type=int, default=10, help="timed iterations per program")
    parser.add_argument("--pairs", type=int, default=3, help="each program and its twin this many times per run")
    parser.add_argument("--block", type=float, default=4.0, help="modelled ms per block computation")
    parser.add_argument("--delay", type=float, default=8.0, help="the fault's ms per ring step")
    parser.add_argument("--out", type=Path, default=None, help="where the traces go (kept)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="import-cost-"))
    rng = np.random.default_rng(0)
    rows = []
    for run in range(args.runs):
        progs = programs(args, run)
        run_programs(progs, root / f"run{run}", WORLD, timeout_s=900)
        listed = json.loads((root / f"run{run}" / "programs.json").read_text())
        times = {p["name"]: p["iteration_ms"] for p in listed["programs"]}
        for label, (_, _, expected) in PROGRAMS.items():
            name = f"r{run}-{_slug(label)}"
            pooled = [t for pair in range(args.pairs) for t in times[f"{name}-{pair}"]]
            twins = [t for pair in range(args.pairs) for t in times[f"{name}-twin-{pair}"]]
            measured, low, high = _bootstrap(pooled, twins, rng)
            with tempfile.TemporaryDirectory() as tmp:
                row = verdict(root / f"run{run}" / f"{name}-0", Path(tmp))
            row |= {"program": label, "run": run, "measured_ms": measured, "measured_p10": low, "measured_p90": high,
                    "right": _right(expected, row)}  # fmt: skip
            cost = row["cost_ms"] if row["kind"] is not None else 0.0
            row["cost_vs_measured"] = cost / measured - 1.0 if measured > 0 and row["kind"] is not None else None
            rows.append(row)
    (root / "import_cost_matrix.json").write_text(json.dumps(rows, indent=1))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"world {WORLD}, {args.iters} timed iterations, block {args.block} ms, delay {args.delay} ms; traces in {root}"
    )
    print(table(rows))
    return 0


def _fmt(value, spec=".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and not np.isfinite(value)) else format(value, spec)


def table(rows: list[dict]) -> str:
    """The Markdown table of docs/import.md (one row per program and run)."""
    lines = ["| program | run | named | cost ms/iter (p10-p90) | measured with - without ms (p10-p90) | cost vs "
             "measured | ratio (p10-p90) |", "| --- | ---: | --- | --- | --- | ---: | --- |"]  # fmt: skip
    for row in rows:
        if row["kind"] == "compute":
            named = "ranks " + ", ".join(map(str, row["named"])) if len(row["named"]) > 1 else f"rank {row['named'][0]}"
        elif row["kind"] == "link":
            named = f"hop {row['named'][0]} -> {row['named'][1]} ({row['hop_cause']})"
        else:
            named = "nobody" + ("" if row["confidence"] == "conclusive" else " (inconclusive)")
        named += "" if row["right"] else " **wrong**"
        cost = f"{_fmt(row['cost_ms'])} ({_fmt(row['cost_p10'])}-{_fmt(row['cost_p90'])})" if row["kind"] else "0"
        measured = f"{_fmt(row['measured_ms'])} ({_fmt(row['measured_p10'])}-{_fmt(row['measured_p90'])})"
        versus = f"{100 * row['cost_vs_measured']:+.0f}%" if row["cost_vs_measured"] is not None else "-"
        ratio = (f"{_fmt(row['ratio'], '.2f')} ({_fmt(row['ratio_p10'], '.2f')}-{_fmt(row['ratio_p90'], '.2f')})"
                 if row["kind"] else "-")  # fmt: skip
        lines.append(f"| {row['program']} | {row['run'] + 1} | {named} | {cost} | {measured} | {versus} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
