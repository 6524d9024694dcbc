"""A `ringbench run` (or torchrun) started in its own session, its stderr lines timestamped, its process tree watched.

"No process left" is judged on the whole tree: every descendant of the launched command seen before the signal, and
any descendant of those found later (a rank's children), identified by (pid, start time) so that a reused pid is
not mistaken for a survivor. Zombies count as gone: they hold nothing but an exit status.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from ringbench.record.store import load_run

ROOT = Path(__file__).resolve().parent.parent
ENV = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"}


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> set[tuple[int, int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is not None:
            found.add((pid, stat[2]))
            todo += children.get(pid, [])
    return found


class Launched:
    def __init__(self, command: list[str], cwd: Path | None = None) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen(command, cwd=cwd or ROOT, env=ENV, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        self.lines: list[tuple[float, str]] = []
        self.stdout = ""
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self.tree: set[tuple[int, int]] = set()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _read_stdout(self) -> None:
        self.stdout = self.proc.stdout.read()

    def wait_line(self, text: str, timeout_s: float = 120.0) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for stamp, line in list(self.lines):
                if text in line:
                    return stamp
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(f"no line with {text!r}: {self.text()[-2000:]}")

    def snapshot(self) -> None:
        self.tree |= descendants(self.proc.pid)

    def signal(self, signum: int, pid: int | None = None) -> float:
        self.snapshot()
        sent = time.monotonic()
        os.kill(pid or self.proc.pid, signum)
        return sent

    def survivors(self) -> list[int]:
        alive = []
        for pid, start in list(self.tree):
            stat = _stat(pid)
            if stat is not None and stat[2] == start and stat[0] != "Z":
                alive.append(pid)
                self.tree |= descendants(pid)
        return alive

    def wait_gone(self, since: float, limit_s: float = 10.0) -> float:
        """Seconds from ``since`` until the whole tree is gone (AssertionError after ``limit_s``)."""
        while self.survivors():
            if time.monotonic() - since > limit_s:
                raise AssertionError(f"processes left {limit_s:g} s after the signal: {self.survivors()}")
            time.sleep(0.01)
        return time.monotonic() - since

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def ringbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "ringbench", *args]


def resume_args(text: str) -> list[str]:
    """The resume command a line printed, as argv for this interpreter (``ringbench`` -> ``python -m ringbench``)."""
    line = next(line for line in text.splitlines() if "resume with: " in line)
    command = shlex.split(line.split("resume with: ", 1)[1])
    if command[0] == "ringbench":
        return ringbench(*command[1:])
    index = command.index("ringbench")  # torchrun ... -m ringbench ...
    return [sys.executable, "-m", "torch.distributed.run", *command[1 : index - 1], *command[index - 1 :]]


def record_summary(run_dir: str | Path) -> tuple[list[str], dict]:
    """What must match between a resumed and an uninterrupted run: the case ids and the events per (case, kind)."""
    data = load_run(run_dir)
    counts = data.events.groupby(["case_id", "kind"]).size().to_dict() if len(data.events) else {}
    ok = data.cases[data.cases["status"] == "ok"] if len(data.cases) else pd.DataFrame(columns=["case_id"])
    return sorted(ok["case_id"].astype(str)), counts


def only_run_dir(out: Path) -> Path:
    (run_dir,) = [path for path in out.iterdir() if path.is_dir()]
    return run_dir
