"""A pool of rank processes for one world size that runs many check cases, each within a deadline.

Starting a gloo group costs seconds (processes, the rendezvous, a connection per pair of ranks); a check case costs
tens of milliseconds. So ranks start once per world size (ringbench.run.launch.start_ranks: forked from a server
that has imported torch, bound to their parent, in their own process groups) and serve cases from a queue
(ringbench/conformance/worker.py) until the pool closes.

Every case has a deadline: the group's own timeout (a rank waiting on a peer gives up then, and says so) plus a
grace period. A rank silent at the deadline stalled: it is named, with the phase (forward or backward) it was in,
and so are the ranks that timed out waiting for it. A rank that exits is named with its exit code. After a stall,
a death, or an error that left the group in doubt (a barrier within a second decides), the pool is stopped --
every process, SIGKILL at the latest -- and the next case starts a fresh one.
"""

from __future__ import annotations

import contextlib
import pickle
import queue
import time
from dataclasses import dataclass, field

from ringbench.run.launch import RankProcesses, phase_of, start_ranks

GRACE_S = 3.0  # past the group's timeout: the waiting ranks' own time-outs arrive within it (less for short ones)
FAILURE_GRACE_S = 1.0  # after a rank failed by itself: the others either finish or wait on it (no point waiting)
STARTUP_S = 120.0  # forking, importing the implementation, the rendezvous
PING_S = 2.0


@dataclass(frozen=True, kw_only=True, slots=True)
class CaseFailure:
    """Why a case gave no tensors: ``kind`` one of error, refused, shape, hang, died; one line; the ranks named."""

    kind: str
    line: str
    ranks: tuple[int, ...]
    phase: str = ""


@dataclass(slots=True)
class CaseRun:
    shards: list[dict] | None = None
    failure: CaseFailure | None = None
    seconds: float = 0.0
    restarts: int = 0


@dataclass(slots=True)
class RankPool:
    """``world`` ranks of implementation ``impl`` (started on first use; ``close`` always)."""

    impl: str
    world: int
    timeout_s: float
    device: str | None = None
    _ranks: RankProcesses | None = None
    _inboxes: list = field(default_factory=list)
    _next: int = 0
    starts: int = 0

    @property
    def grace_s(self) -> float:
        return min(GRACE_S, 1.0 + self.timeout_s / 2)

    def _start(self) -> None:
        from ringbench.conformance.worker import serve
        from ringbench.run.launch import _context

        spawn = _context()
        self._inboxes = [spawn.Queue() for _ in range(self.world)]
        self._ranks = start_ranks(self.world, serve, (self.impl, self._inboxes), timeout_s=self.timeout_s,
                                  device=self.device)  # fmt: skip
        self.starts += 1
        ready, errors = self._gather("ready", -1, STARTUP_S + self.timeout_s)
        if len(ready) < self.world:
            failure = self._failure(ready, errors, "setup")
            self.close()
            raise PoolFailure(failure)

    def _gather(self, kind: str, index: int, seconds: float) -> tuple[dict, dict]:
        """Messages ``kind`` for ``index`` from every rank until all came, or ``seconds`` passed, or a rank failed
        by itself FAILURE_GRACE_S ago; (payload per rank, one line per rank whose process ended)."""
        got, errors = {}, {}
        deadline = time.monotonic() + seconds
        procs = self._ranks.procs
        while len(got) + len(errors) < self.world and time.monotonic() < deadline:
            try:
                message = self._ranks.channels.messages.get(timeout=0.05)
            except queue.Empty:
                for rank, proc in enumerate(procs):
                    if proc.exitcode is not None and rank not in got and rank not in errors:
                        errors[rank] = f"exited with code {proc.exitcode}"
                        deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
                continue
            if message[0] == "item":
                item_kind, item_index, rank, payload = pickle.loads(message[2])
                if item_kind == kind and item_index == index:
                    got[rank] = payload
                    if isinstance(payload, dict) and payload.get("failure") in ("error", "shape", "refused"):
                        deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
            elif message[0] == "error":
                errors[message[1]] = message[2]
        return got, errors

    def _failure(self, got: dict, errors: dict, phase_default: str) -> CaseFailure:
        silent = [r for r in range(self.world) if r not in got and r not in errors]
        if silent:
            phases = {self._phase(r) or phase_default for r in silent}
            waited = sorted(r for r, p in got.items() if isinstance(p, dict) and "failure" in p)
            waiting = f"; rank(s) {', '.join(map(str, waited))} timed out waiting" if waited else ""
            line = (f"rank(s) {', '.join(map(str, silent))} stalled in the {'/'.join(sorted(phases))} (no answer "
                    f"within {self.timeout_s + self.grace_s:g} s){waiting}")  # fmt: skip
            return CaseFailure(kind="hang", line=line, ranks=tuple(silent), phase="/".join(sorted(phases)))
        rank = min(errors)
        return CaseFailure(kind="died", line=f"rank {rank} {errors[rank]}", ranks=tuple(sorted(errors)))

    def _phase(self, rank: int) -> str:
        return phase_of(self._ranks.channels.progress, rank)

    def run(self, case) -> CaseRun:
        """Run one case on every rank (see the module doc)."""
        restarts = 0
        if self._ranks is None:
            self._start()
            restarts = 1
        index = self._next
        self._next += 1
        started = time.monotonic()
        for inbox in self._inboxes:
            inbox.put(("case", index, case))
        got, errors = self._gather("case", index, self.timeout_s + self.grace_s)
        seconds = time.monotonic() - started
        own = {r: p for r, p in got.items() if p.get("failure") in ("error", "shape", "refused")}
        if not own and len(got) < self.world:  # nobody failed by itself: a rank stalled or died
            failure = self._failure(got, errors, "setup")
            self.close()
            return CaseRun(failure=failure, seconds=seconds, restarts=restarts)
        if not own and not any("failure" in p for p in got.values()):
            return CaseRun(shards=[got[r] for r in range(self.world)], seconds=seconds, restarts=restarts)
        own = own or {r: p for r, p in got.items() if "failure" in p}
        kinds = {p["failure"] for p in own.values()}
        kind = "refused" if kinds == {"refused"} else "shape" if "shape" in kinds else "error"
        first = min(r for r, p in own.items() if p["failure"] == kind or kind == "error")
        line = own[first]["line"]
        others = sorted(set(own) - {first})
        line += f" (rank {first}" + (f"; also rank(s) {', '.join(map(str, others))}" if others else "") + ")"
        left = [r for r in range(self.world) if r not in got]
        if left:
            line += f"; rank(s) {', '.join(map(str, left))} left waiting"
        failure = CaseFailure(kind=kind, line=line, ranks=tuple(sorted(own)))
        if left or (kind != "refused" and not self._healthy()):
            self.close()
        return CaseRun(failure=failure, seconds=seconds, restarts=restarts)

    def _healthy(self) -> bool:
        """Every rank passes a barrier within PING_S (a group that a failed case left waiting does not)."""
        index = self._next
        self._next += 1
        for inbox in self._inboxes:
            inbox.put(("ping", index, None))
        got, _ = self._gather("pong", index, PING_S)
        return len(got) == self.world

    def close(self) -> None:
        if self._ranks is None:
            return
        for inbox in self._inboxes:
            with contextlib.suppress(Exception):
                inbox.put(None)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and any(p.exitcode is None for p in self._ranks.procs):
            time.sleep(0.02)
        self._ranks.stop()
        for inbox in self._inboxes:
            with contextlib.suppress(Exception):
                inbox.close()
                inbox.cancel_join_thread()
        self._ranks, self._inboxes = None, []


class PoolFailure(Exception):
    """The pool could not start (every rank must report ready)."""

    def __init__(self, failure: CaseFailure) -> None:
        super().__init__(failure.line)
        self.failure = failure


__all__ = ["CaseFailure", "CaseRun", "PoolFailure", "RankPool"]
