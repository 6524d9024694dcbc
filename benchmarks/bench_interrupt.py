"""How fast an interrupted run ends, and whether its resume gives the uninterrupted record.

    .venv/bin/python benchmarks/bench_interrupt.py [--trials 10] [--out DIR] [--json FILE]

For each of SIGTERM, SIGINT, SIGHUP and SIGKILL, ``--trials`` times: start ``ringbench run`` (2 local ranks, 4 cases)
in its own session, wait until its first case is stored, wait a random share of one case's duration (seeded), send
the signal to the parent, and time

  parent exit     signal -> the parent process has exited;
  last gone       signal -> the last process of its tree (parent, ranks, their children) is gone (zombies count as
                  gone: they hold nothing but an exit status);

then resume with the command the run printed (SIGKILL prints none: ``ringbench run --resume DIR``) and compare the
resumed record with an uninterrupted run of the same sweep, case for case (ids and event counts per kind; timings
aside). Prints median and worst per signal, where the signals landed (meta.json ``interrupted.where``) and the
resume results. Every number is measured here; on a shared machine they carry its load.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}
SWEEP = ["--world", "2", "--seq", "512", "--heads", "2", "--head-dim", "16", "--iters", "24", "--warmup", "1",
         "--kernel", "emulated:20", "--layout", "contiguous", "--layout", "zigzag", "--buffer", "sync", "--buffer",
         "double"]  # fmt: skip
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL)


def _stat(pid: int) -> tuple[str, int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _tree(root: int) -> set[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if (stat := _stat(pid)) is not None:
            found.add((pid, stat[2]))
            todo += children.get(pid, [])
    return found


def _alive(tree: set[tuple[int, int]]) -> list[int]:
    alive = []
    for pid, start in list(tree):
        stat = _stat(pid)
        if stat is not None and stat[2] == start and stat[0] != "Z":
            alive.append(pid)
            tree |= _tree(pid)  # a rank's children, found late
    return alive


class Run:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "ringbench", *args], cwd=ROOT, env=ENV,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_line(self, text: str, timeout_s: float = 300.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for stamp, line in list(self.lines):
                if text in line:
                    return stamp
            if self.proc.poll() is not None:
                break
            time.sleep(0.005)
        raise RuntimeError(f"no line with {text!r}")


def summary(run_dir: Path) -> tuple[list[str], dict]:
    from ringbench.record.store import load_run

    data = load_run(run_dir)
    counts = {f"{c}|{k}": int(n) for (c, k), n in data.events.groupby(["case_id", "kind"]).size().items()}
    return sorted(data.cases["case_id"].astype(str)), counts


def only_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def reference(out: Path) -> tuple[tuple[list[str], dict], float]:
    run = Run(["run", *SWEEP, "--out", str(out)])
    if run.proc.wait(timeout=600) != 0:
        raise RuntimeError("the uninterrupted run failed:\n" + "\n".join(line for _, line in run.lines[-20:]))
    stamps = [run.wait_line(f"[{i}/4]") for i in range(1, 5)]
    return summary(only_dir(out)), statistics.median(b - a for a, b in itertools.pairwise(stamps))


def trial(out: Path, signum: int, delay_s: float, expected) -> dict:
    run = Run(["run", *SWEEP, "--out", str(out)])
    run.wait_line("[1/4]")
    time.sleep(delay_s)
    tree = _tree(run.proc.pid)
    sent = time.monotonic()
    os.kill(run.proc.pid, signum)
    code = run.proc.wait(timeout=60)
    exited = time.monotonic() - sent
    while _alive(tree) and time.monotonic() - sent < 30:
        time.sleep(0.005)
    gone = time.monotonic() - sent
    left = _alive(tree)
    run_dir = only_dir(out)
    from ringbench.record.store import load_run

    kept = len(load_run(run_dir).cases)  # what the record holds, whatever the signal let the parent write
    meta = json.loads((run_dir / "meta.json").read_text())
    state = meta.get("interrupted") or {}
    text = "\n".join(line for _, line in run.lines)
    printed = [line for line in text.splitlines() if "resume with: " in line]
    if printed:
        command = shlex.split(printed[-1].split("resume with: ", 1)[1])
        args = command[1:]  # "ringbench" -> this interpreter's -m ringbench
    else:
        args = ["run", "--resume", str(run_dir)]
    resumed = subprocess.run([sys.executable, "-m", "ringbench", *args], cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    same = resumed.returncode == 0 and summary(run_dir) == expected
    return {"signal": signal.Signals(signum).name, "exit": code, "parent_exit_s": round(exited, 3),
            "last_gone_s": round(gone, 3), "left": left, "kept": kept,
            "where": state.get("where") or ("finished" if meta.get("finished") else "not recorded (SIGKILL)"),
            "resume_exit": resumed.returncode, "resumed_equal": same, "delay_s": round(delay_s, 3)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every trial here")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="ringbench-bench-interrupt-"))
    expected, case_s = reference(out / "reference")
    print(f"uninterrupted: 4 cases, {case_s:.2f} s per case (median); trials at U(0, 1) x that after case 1 is stored")
    rng = random.Random(args.seed)
    trials = []
    for signum in SIGNALS:
        for index in range(args.trials):
            result = trial(out / f"{signal.Signals(signum).name}-{index}", signum, rng.uniform(0, case_s), expected)
            trials.append(result)
            print(json.dumps(result), flush=True)
    print()
    print("signal   parent exit s (median / worst)   last process gone s (median / worst)   resumed = uninterrupted")
    for signum in SIGNALS:
        mine = [t for t in trials if t["signal"] == signal.Signals(signum).name]
        exits, gones = [t["parent_exit_s"] for t in mine], [t["last_gone_s"] for t in mine]
        equal = sum(t["resumed_equal"] for t in mine)
        print(f"{mine[0]['signal']:<8} {statistics.median(exits):>8.3f} / {max(exits):.3f}"
              f"{statistics.median(gones):>26.3f} / {max(gones):.3f}{equal:>22d}/{len(mine)}")  # fmt: skip
    wheres: dict[str, int] = {}
    for t in trials:
        key = "ring step" if "ring step" in str(t["where"]) else str(t["where"])
        wheres[key] = wheres.get(key, 0) + 1
    print("where the signals landed:", ", ".join(f"{k}: {v}" for k, v in sorted(wheres.items())))
    print(f"processes left after 30 s: {sum(bool(t['left']) for t in trials)} trial(s)")
    if args.json:
        args.json.write_text(json.dumps(trials, indent=1))
    return 0 if all(t["resumed_equal"] and not t["left"] for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
