"""The simulator's accuracy matrix: calibrate on ONE measured case, predict bigger rings, measure them, side by side.

Every layout x mask x buffer, with emulated and real kernels, forward-only and forward+backward: each case of a
calibration run at world 2 (S = 4096) is taken alone (the record of that one case: what a user's single-case run gives the
simulator) to calibrate, and predicts the same case at 2x and 4x the world (same S) and at 2x the sequence (same
world), against measured runs of those. One ``ringbench run`` per (kernel, phases, world, seq) sweeps the 27
cases, so the record of a case is the one a single-case run would have written (the cases of a sweep run one
after the other; calibration reads one case's spans only).

    python benchmarks/accuracy_matrix.py                      # measure (about an hour on 2 shared cores), predict
    python benchmarks/accuracy_matrix.py --reuse DIR          # predict again from the runs measured into DIR
    python benchmarks/accuracy_matrix.py --quick              # one kernel, forward only, 2 layouts x 2 masks x 1 buffer

Targets (issue 23, docs/simulate.md): median |step time error| <= 10 %, worst <= 25 %, and no prediction without a
caveat where a cost came from a prior. Emulated compute: ``emulated:1`` (1 GFLOP/s, pinned, so the truth is
known); real compute: the ``torch`` kernel on this machine's CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from ringbench.record.store import RunData, load_run

LAYOUTS = ("contiguous", "zigzag", "striped")
MASKS = ("none", "causal", "causal-naive")
BUFFERS = ("double", "sync", "allgather")
KERNELS = ("emulated:1", "torch")
WORLD, SEQ = 2, 4096  # blocks large enough (L = 512 at 4x the world) that compute, not the shared cores, leads
TARGETS = {"2x world": (2 * WORLD, SEQ), "4x world": (4 * WORLD, SEQ), "2x seq": (WORLD, 2 * SEQ)}
COMMON = ["--heads", "2", "--head-dim", "32", "--warmup", "1", "--no-check", "--timeout", "600"]
ITERS = {"calibration": 3, "2x world": 3, "4x world": 3, "2x seq": 2}  # 2x seq: four times the compute per step


def plan(quick: bool) -> list[dict]:
    """One measured run per (kernel, phases, world, seq): the sweep of layouts x masks x buffers."""
    kernels = KERNELS[:1] if quick else KERNELS
    phases = (False,) if quick else (False, True)
    layouts, masks, buffers = (LAYOUTS[:2], MASKS[:2], BUFFERS[:1]) if quick else (LAYOUTS, MASKS, BUFFERS)
    runs = []
    for kernel, backward in itertools.product(kernels, phases):
        for name, (world, seq) in {"calibration": (WORLD, SEQ), **TARGETS}.items():
            runs.append({"kernel": kernel, "backward": backward, "name": name, "world": world, "seq": seq,
                         "layouts": layouts, "masks": masks, "buffers": buffers})  # fmt: skip
    return runs


def _key(spec: dict) -> str:
    return f"{spec['kernel'].replace(':', '_')}-{'fb' if spec['backward'] else 'f'}-{spec['name'].replace(' ', '')}"


def measure(out: Path, quick: bool) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    index = out / "runs.json"
    runs = json.loads(index.read_text()) if index.exists() else {}
    for spec in plan(quick):
        key = _key(spec)
        if key in runs:
            continue
        args = [sys.executable, "-m", "ringbench", "run", "--world", str(spec["world"]), "--seq", str(spec["seq"]),
                "--kernel", spec["kernel"], *COMMON, "--iters", str(ITERS[spec["name"]]), "--out", str(out / key),
                "--json", "--quiet"]  # fmt: skip
        args += ["--backward"] if spec["backward"] else ["--no-backward"]
        for axis in ("layouts", "masks", "buffers"):
            for value in spec[axis]:
                args += [f"--{axis[:-1]}", value]
        started = time.perf_counter()
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"{key}: ringbench run failed ({done.returncode}): {done.stderr.strip()[-800:]}")
        runs[key] = json.loads(done.stdout)["run_dir"]
        index.write_text(json.dumps(runs, indent=2))
        print(f"measured {key}: {runs[key]} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return runs


def one_case(run: RunData, case_id: str) -> RunData:
    """The record of one case of a run: what a run of that case alone would have written."""
    return RunData(path=run.path, events=run.events[run.events["case_id"] == case_id].reset_index(drop=True),
                   cases=run.cases[run.cases["case_id"] == case_id].reset_index(drop=True), meta=dict(run.meta))  # fmt: skip


AXES = ["layout", "mask", "buffer"]


def predict(runs: dict[str, str]) -> pd.DataFrame:
    """One row per (calibration case, target): measured and predicted step time, error, the priors it used."""
    from ringbench.calibration import cases_like, run_cores
    from ringbench.calibration.calibrate import calibrate
    from ringbench.simulate import Cluster, simulate_case

    try:  # what a prediction assumed (absent before the calibration said so)
        from ringbench.calibration.coverage import extrapolation
    except ImportError:
        extrapolation = None
    loaded = {key: load_run(path) for key, path in runs.items()}
    rows = []
    for key, run in loaded.items():
        if not key.endswith("-calibration"):
            continue
        family = key.removesuffix("-calibration")
        for case in run.cases.drop_duplicates("case_id").to_dict("records"):
            axes = {axis: case[axis] for axis in AXES}
            base = {"kernel": case["kernel"], "phases": "fwd+bwd" if case["backward"] else "fwd", **axes}
            try:
                calibration = calibrate(one_case(run, case["case_id"]))
                error = ""
            except Exception as exc:
                calibration, error = None, f"{type(exc).__name__}: {exc}"[:160]
            for target in TARGETS:
                measured_run = loaded.get(f"{family}-{target.replace(' ', '')}")
                if measured_run is None:
                    continue
                cases = measured_run.cases
                match = cases[(cases[AXES] == pd.Series(axes)).all(axis=1)]
                if match.empty:
                    continue
                measured = float(match["step_ms"].median())
                row = base | {"target": target, "world": int(match["world"].iloc[0]), "seq": int(match["seq"].iloc[0]),
                              "measured_ms": measured, "predicted_ms": math.nan, "error": math.nan,
                              "assumed": "", "refused": error, "saturated": int(match["saturated_blocks"].sum())}  # fmt: skip
                if calibration is not None:
                    try:
                        like = [c for c in cases_like(one_case(measured_run, match["case_id"].iloc[0]), 3)]
                        sim_case = like[0]
                        costs = calibration.costs
                        chooser = getattr(calibration, "costs_for", None)
                        if chooser is not None and getattr(sim_case, "family", None):
                            costs = chooser(sim_case.family) or costs
                        cluster = Cluster(cpu_cores=run_cores(measured_run))
                        predicted = float(simulate_case(sim_case, costs, cluster).row["step_ms"])
                        row |= {"predicted_ms": predicted, "error": predicted / measured - 1}
                        if extrapolation is not None:
                            row["assumed"] = "; ".join(a.aspect for a in extrapolation(calibration, [sim_case],
                                                       cluster, costs) if a.assumed)  # fmt: skip
                    except Exception as exc:
                        row["refused"] = f"{type(exc).__name__}: {exc}"[:160]
                rows.append(row)
    return pd.DataFrame(rows)


def matrix(table: pd.DataFrame) -> pd.DataFrame:
    """One row per calibration case: each target's error, and the row's median and worst |error|."""
    keys = ["kernel", "phases", *AXES]
    out = []
    for values, part in table.groupby(keys, sort=False):
        row = dict(zip(keys, values, strict=True))
        for r in part.to_dict("records"):
            row[r["target"]] = r["error"]
            row[f"{r['target']} measured"] = r["measured_ms"]
            row[f"{r['target']} predicted"] = r["predicted_ms"]
        errors = part["error"].abs().dropna()
        row["median"] = float(errors.median()) if len(errors) else math.nan
        row["worst"] = float(errors.max()) if len(errors) else math.nan
        row["caveat"] = "yes" if part["assumed"].astype(bool).any() else "no"
        row["refused"] = next((r for r in part["refused"] if r), "")
        out.append(row)
    return pd.DataFrame(out)


def _pct(value: float) -> str:
    return "–" if value != value else f"{100 * value:+.1f}%"


def report(table: pd.DataFrame) -> int:
    rows = matrix(table)
    print("| kernel | phases | layout | mask | buffer | " + " | ".join(f"{t}: measured / predicted / error" for t in TARGETS)
          + " | median abs | worst abs | caveat |")  # fmt: skip
    print("|---|---|---|---|---|" + "---:|" * len(TARGETS) + "---:|---:|---|")
    for r in rows.to_dict("records"):
        cells = []
        for target in TARGETS:
            measured, predicted = r.get(f"{target} measured", math.nan), r.get(f"{target} predicted", math.nan)
            cells.append(f"{measured:,.0f} / {predicted:,.0f} / {_pct(r.get(target, math.nan))}"
                         if predicted == predicted else f"{measured:,.0f} / refused")  # fmt: skip
        worst = "–" if r["worst"] != r["worst"] else f"{100 * r['worst']:.1f}%"
        median = "–" if r["median"] != r["median"] else f"{100 * r['median']:.1f}%"
        print(f"| {r['kernel']} | {r['phases']} | {r['layout']} | {r['mask']} | {r['buffer']} | {' | '.join(cells)} | "
              f"{median} | {worst} | {r['caveat']} |")  # fmt: skip
    errors = table["error"].abs().dropna()
    print()
    for (kernel, phases), part in table.groupby(["kernel", "phases"], sort=False):
        e = part["error"].abs().dropna()
        print(f"{kernel} {phases}: {len(e)} predictions, |error| median {100 * e.median():.1f}%, worst "
              f"{100 * e.max():.1f}%; {int(part['predicted_ms'].isna().sum())} refused")  # fmt: skip
    uncaveated = table[(table["assumed"] == "") & table["predicted_ms"].notna()]
    print(f"all: {len(errors)} predictions, |error| median {100 * errors.median():.1f}% (target <= 10%), worst "
          f"{100 * errors.max():.1f}% (target <= 25%); {int(table['predicted_ms'].isna().sum())} refused; "
          f"{len(uncaveated)} without a caveat")  # fmt: skip
    ok = len(errors) and errors.median() <= 0.10 and errors.max() <= 0.25
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/accuracy-matrix"))
    parser.add_argument("--reuse", type=Path, help="a folder of earlier measurements (its runs.json)")
    parser.add_argument("--quick", action="store_true", help="one kernel, forward only, 2 x 2 x 1 cases")
    parser.add_argument("--csv", type=Path, help="also write the per-prediction table here")
    args = parser.parse_args()
    if args.reuse:
        runs = json.loads((args.reuse / "runs.json").read_text())
    else:
        runs = measure(args.out, args.quick)
    table = predict(runs)
    if args.csv:
        table.to_csv(args.csv, index=False)
    sys.exit(report(table))


if __name__ == "__main__":
    main()
