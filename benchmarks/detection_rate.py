"""Benchmark: the straggler verdict's detection rate over N randomised trials on simulated rings (SIMULATED).

    .venv/bin/python benchmarks/detection_rate.py 20       # about 40 of 40 faults named, no false alarm

Each trial simulates a slow rank, a slow link and a fault-free control (tests/support/detection.py says how they are
drawn); a hit names exactly the injected rank or hop, anything named in a control or a wrong name is a false alarm.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the trials live with the tests' scaffolding

from support.detection import detection_trials


def detection_rate(trials: int = 20, **kwargs) -> dict:
    """Summary of detection_trials: faults injected, hits, detection rate, controls, false alarms."""
    table = detection_trials(trials, **kwargs)
    faulty = table[table["fault"] != "none"]
    return {
        "trials": trials,
        "faults": len(faulty),
        "hits": int(faulty["hit"].sum()),
        "detection_rate": float(faulty["hit"].mean()) if len(faulty) else float("nan"),
        "controls": int((table["fault"] == "none").sum()),
        "false_alarms": int(table["false_alarm"].sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trials", type=int, nargs="?", default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    print("detection:", detection_rate(args.trials, seed=args.seed), f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
