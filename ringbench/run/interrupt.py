"""Signals that end a run, and ranks that never outlive their parent.

Clusters stop jobs with signals: SLURM sends SIGTERM on preemption or at the time limit (SIGKILL follows after
KillWait, 30 s by default), CI runners send SIGTERM on a timeout, a dropped ssh session sends SIGHUP, a person types
Ctrl-C. Whatever the signal, a run ends the same way: the ranks stop within seconds, every finished case stays on
disk, meta.json says the run was interrupted and which case was in flight, and one line says how to resume.

* The parent of a local run (``StopSignals``, installed by ringbench.run.sweep.execute) turns SIGTERM, SIGINT and
  SIGHUP into ``StopRequested`` wherever it is -- except while it stores a case (``shielded``), which finishes first
  so that the files on disk always agree -- and the launcher stops the ranks (``stop_processes``: SIGTERM, a
  bounded wait, then SIGKILL to each rank's process group); the sweep writes the run's state and the CLI exits with
  128 + the signal.
* A rank binds itself to its parent (``bind_to_parent``): Linux's parent-death signal, checked once against the
  parent it was started by (which may have died before the rank could ask), with a polling thread where prctl is
  not available. A parent killed by anything, SIGKILL included, takes its ranks with it.
* A launched rank (torchrun, srun) cannot count on its main thread to see a signal while it sits in a collective
  (Python runs signal handlers only between bytecodes of the main thread), so ``RankSignals`` hears it on a thread
  through the interpreter's wakeup fd, which the C-level handler writes to whatever the main thread is doing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_GRACE_S = 2.0  # after SIGTERM, how long the ranks get before their process groups are killed
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequested(BaseException):
    """A stop signal reached the parent of a run. A BaseException (like KeyboardInterrupt), so that no ``except
    Exception`` on the way swallows it. ``where``: the launcher fills in where the slowest rank was."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum
        self.where: str | None = None


class StopSignals:
    """While active (in the main thread), SIGTERM, SIGINT and SIGHUP raise ``StopRequested``; the first one decides
    and later ones are ignored, so the bounded cleanup it starts runs to its end. Elsewhere than the main thread
    (a library caller's worker thread) nothing is installed: Python delivers signals to the main thread only."""

    _active: StopSignals | None = None

    def __init__(self) -> None:
        self.pending: int | None = None  # a signal that arrived while shielded
        self.fired: int | None = None
        self.depth = 0
        self._previous: dict[int, object] = {}
        self._outer: StopSignals | None = None

    def __enter__(self) -> StopSignals:
        self._outer = StopSignals._active
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
            StopSignals._active = self
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if StopSignals._active is self:
            StopSignals._active = self._outer  # nested (the CLI's around the library's): the outer one again

    def _handle(self, signum: int, frame) -> None:
        if self.fired is not None:
            return
        if self.depth:
            self.pending = signum
            return
        self.fired = signum
        raise StopRequested(signum)


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """A stop signal that arrives inside this block takes effect when it ends (e.g. once a case is stored)."""
    guard = StopSignals._active
    if guard is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    guard.depth += 1
    try:
        yield
    finally:
        guard.depth -= 1
        if guard.depth == 0 and guard.pending is not None and guard.fired is None:
            guard.fired, guard.pending = guard.pending, None
            raise StopRequested(guard.fired)


def stop_processes(procs, grace_s: float = STOP_GRACE_S) -> None:
    """End ``procs`` (multiprocessing processes, each the leader of its own process group): SIGTERM to the live
    ones, a wait of at most ``grace_s`` for all of them, then SIGKILL to each one's group (children included)."""
    started = [proc for proc in procs if proc.pid is not None]
    for proc in started:
        if proc.exitcode is None:
            with contextlib.suppress(OSError):
                proc.terminate()
    deadline = time.monotonic() + grace_s
    while any(proc.exitcode is None for proc in started) and time.monotonic() < deadline:
        time.sleep(0.02)
    for proc in started:
        with contextlib.suppress(OSError):  # gone already, or a rank that never made its own group
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.exitcode is None:
            with contextlib.suppress(OSError):
                proc.kill()
    for proc in started:
        proc.join(timeout=1.0)


def _set_parent_death_signal(signum: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def bind_to_parent(parent_pid: int, death_signal: int = signal.SIGKILL, poll_s: float = 0.5) -> str:
    """End this process with ``death_signal`` once ``parent_pid`` is gone; returns how it watches ("prctl" or
    "polling"). Linux sends the parent-death signal when the parent exits, however it died; the parent may have died
    before we asked, hence the check of our parent right after."""
    method = "prctl" if _set_parent_death_signal(death_signal) else "polling"
    # A rank started from a fork server (ringbench.run.launch) has the server as its parent: the death signal then
    # follows the server, which exits when the run's parent does; the run's parent itself is watched as well.
    direct = os.getppid()

    def gone() -> bool:
        return os.getppid() != direct or not _alive(parent_pid)

    if gone():
        os.kill(os.getpid(), death_signal)
    if method == "polling" or direct != parent_pid:

        def watch() -> None:
            while True:
                time.sleep(poll_s)
                if gone():
                    os.kill(os.getpid(), death_signal)
                    return

        threading.Thread(target=watch, name="ringbench-parent-watch", daemon=True).start()
    return method


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


class RankSignals:
    """A launched rank's stop signals, heard on a thread: ``on_signal(signum)`` runs there (the main thread may be
    inside a collective for as long as the timeout) and is expected to end the process."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self.on_signal = on_signal
        self.active = False

    def start(self) -> RankSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, lambda *_: None)  # a Python handler makes the C handler write the wakeup fd
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._listen, args=(read_fd,), name="ringbench-signals", daemon=True).start()
        self.active = True
        return self

    def _listen(self, read_fd: int) -> None:
        while True:
            data = os.read(read_fd, 1)
            if not data:
                return
            if data[0] in STOP_SIGNALS:  # the fd hears every signal with a Python handler; act on ours only
                self.on_signal(data[0])


__all__ = ["STOP_SIGNALS", "RankSignals", "StopRequested", "StopSignals", "bind_to_parent", "shielded",
           "signal_name", "stop_processes"]  # fmt: skip
