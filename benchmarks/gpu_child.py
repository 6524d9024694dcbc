"""The GPU check's children: each check runs in a process of its own, in its own session, killed as a group when
its share of the deadline is up (benchmarks/gpu_check.py); what it printed so far is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

RESULT = "GPU_CHECK_RESULT "


@dataclass
class Check:
    name: str
    ok: bool | None = None  # None: not checked
    facts: list[str] = field(default_factory=list)
    seconds: float = 0.0
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"check": self.name, "ok": self.ok, "facts": self.facts, "seconds": round(self.seconds, 1),
                "data": self.data}  # fmt: skip


class Deadline:
    def __init__(self, budget_s: float) -> None:
        self.started = time.monotonic()
        self.budget_s = budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass
class Child:
    code: int | None  # None: killed at its deadline
    stdout: str
    stderr: str
    seconds: float

    @property
    def results(self) -> list[dict]:
        found = []
        for line in self.stdout.splitlines():
            if line.startswith(RESULT):
                try:
                    found.append(json.loads(line[len(RESULT) :]))
                except json.JSONDecodeError:
                    continue
        return found

    def tail(self, lines: int = 2) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return " ".join(text[-lines:])[:300]


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found[1:]


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, 3 s, SIGKILL to it, then to every descendant still alive (a rank
    that made a group of its own)."""
    tree = _descendants(proc.pid) if sys.platform.startswith("linux") else []
    for signum, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(proc.pid, signum)
        except OSError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=2.0)


def run_child(command: list[str], timeout_s: float, env: dict | None = None, cwd: Path | None = None) -> Child:
    """Run ``command`` in its own session; killed as a group after ``timeout_s``; its output so far is kept.

    It runs outside the checkout (the temporary folder) by default: ``python -m`` puts its working folder first on
    sys.path, and the checkout's ``ringbench/`` would then shadow the installed package, which alone holds
    ``ringbench.kernels`` (a bundle's install)."""
    cwd = cwd if cwd is not None else Path(tempfile.gettempdir())
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda s=s, b=b: b.extend(s), daemon=True)
               for s, b in ((proc.stdout, out), (proc.stderr, err))]  # fmt: skip
    for reader in readers:
        reader.start()
    try:
        code = proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        code = None
    for reader in readers:
        reader.join(timeout=2.0)
    return Child(code=code, stdout="".join(out), stderr="".join(err), seconds=time.monotonic() - started)


def ringbench_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ringbench", *args]


def json_document(text: str) -> dict:
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("{"):
            try:
                return json.loads("\n".join(lines[index:]))
            except json.JSONDecodeError:
                continue
    return {}


def killed_fact(child: Child, limit: float) -> str:
    return f"not checked: stopped by the deadline after {child.seconds:.0f} s (its share: {limit:.0f} s)"
