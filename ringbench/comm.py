"""All ring traffic goes through one class that knows its neighbours: RingComm.

An exchange sends one buffer to the ring successor and receives one from the ring predecessor
(``batch_isend_irecv``). ``post`` starts it and returns a Transfer; ``Transfer.wait`` blocks, bounded by the
timeout, and raises RingStall naming this rank, the ring step and the peer it waited on.

Completion stamps: gloo P2P works have no futures and report ``is_completed() == False`` until ``wait()``, so when
recording (or when a link fault must delay a block) a watcher thread per direction calls ``wait()`` and stamps
the time; the main thread then waits on the watcher's event. On NCCL the watcher polls ``is_completed()``, and
the main thread still calls ``wait()`` so that the compute stream is ordered after the transfer.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from ringbench.errors import RunFailure


def _short(exc: BaseException) -> str:
    """The gist of a backend error: its first sentence without the source location gloo prefixes."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ")[0][:160]


class RingStall(RunFailure):
    """A bounded wait expired or a peer failed: names the rank, the phase, the ring step and the peer."""


@dataclass(slots=True)
class Transfer:
    """One posted exchange: the receive buffer and the completion state of both directions."""

    recv_buffer: torch.Tensor
    phase: str
    step: int
    posted_ns: int
    nbytes: int
    works: list = field(default_factory=list)
    send_done_ns: int = 0
    recv_done_ns: int = 0
    watched: bool = False
    events: dict = field(default_factory=dict)  # "send" / "recv" -> threading.Event (watched transfers)
    error: BaseException | None = None
    error_direction: str = "recv"
    waited: bool = False


class _Watcher(threading.Thread):
    """Waits on works in FIFO order and stamps their completion time (one thread per direction)."""

    def __init__(self, name: str, wait_fn: Callable) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.Queue = queue.Queue()
        self.wait_fn = wait_fn

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            transfer, direction, work, extra_delay_s = job
            try:
                self.wait_fn(work)
                if extra_delay_s > 0:  # injected link delay: the block arrives that much later
                    time.sleep(extra_delay_s)
                stamp = time.perf_counter_ns()
                if direction == "send":
                    transfer.send_done_ns = stamp
                else:
                    transfer.recv_done_ns = stamp
            except BaseException as exc:  # reported by the main thread, which names rank and step
                transfer.error = exc
                transfer.error_direction = direction
            finally:
                transfer.events[direction].set()


class RingComm:
    """Point-to-point traffic of one rank on a ring given as group ranks in ring order."""

    def __init__(
        self,
        ring: list[int],
        rank: int,
        group=None,
        *,
        timeout_s: float = 60.0,
        watch: bool = False,
        link_delay: Callable[[int, int, int], float] | None = None,
    ) -> None:
        self.ring = list(ring)
        self.world = len(ring)
        self.rank = rank
        self.group = group
        self.position = self.ring.index(rank)
        self.next = self.ring[(self.position + 1) % self.world]  # group ranks
        self.prev = self.ring[(self.position - 1) % self.world]
        self._next_global = self._global(self.next)
        self._prev_global = self._global(self.prev)
        self.timeout_s = float(timeout_s)
        self.link_delay = link_delay  # (src, dst, nbytes) -> extra seconds for this transfer, or None
        self.watch = watch or link_delay is not None
        self.backend = dist.get_backend(group) if self.world > 1 else "none"
        self._watchers: dict[str, _Watcher] = {}
        self._pending: list[Transfer] = []

    def _global(self, group_rank: int) -> int:
        if self.group is None or self.world == 1:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    # -- watcher plumbing -------------------------------------------------------------------------------------
    def _wait_work(self, work) -> None:
        if self.backend == "gloo":
            if not work.wait(timedelta(seconds=self.timeout_s)):
                raise TimeoutError("wait returned False")
            return
        deadline = time.monotonic() + self.timeout_s
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no completion within {self.timeout_s:g} s")
            time.sleep(20e-6)

    def _watcher(self, direction: str) -> _Watcher:
        watcher = self._watchers.get(direction)
        if watcher is None:
            watcher = _Watcher(f"ringbench-{direction}-watch", self._wait_work)
            watcher.start()
            self._watchers[direction] = watcher
        return watcher

    def close(self) -> None:
        for watcher in self._watchers.values():
            watcher.jobs.put(None)
        self._watchers.clear()

    # -- the exchange ---------------------------------------------------------------------------------------
    def post(self, send: torch.Tensor, *, phase: str, step: int) -> Transfer:
        """Send ``send`` to the successor and receive an equally shaped buffer from the predecessor."""
        send = send.contiguous()
        recv = torch.empty_like(send)
        transfer = Transfer(
            recv_buffer=recv,
            phase=phase,
            step=step,
            posted_ns=time.perf_counter_ns(),
            nbytes=send.numel() * send.element_size(),
        )
        ops = [
            dist.P2POp(dist.isend, send, self._next_global, self.group),
            dist.P2POp(dist.irecv, recv, self._prev_global, self.group),
        ]
        try:
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as exc:
            raise self._stall(transfer, exc, "send") from None
        transfer.works = list(works)
        if self.watch:
            transfer.watched = True
            # gloo returns one work per op; NCCL may coalesce them into one.
            directions = ("send", "recv") if len(works) == 2 else ("recv",)
            for direction, work in zip(directions, works, strict=True):
                transfer.events[direction] = threading.Event()
                delay = 0.0
                if direction == "recv" and self.link_delay is not None:
                    delay = self.link_delay(self.prev, self.rank, transfer.nbytes)
                self._watcher(direction).jobs.put((transfer, direction, work, delay))
        self._pending.append(transfer)
        return transfer

    def wait(self, transfer: Transfer) -> torch.Tensor:
        """Block until both directions completed (bounded); returns the received buffer."""
        if transfer.waited:
            raise RuntimeError("wait called twice on the same transfer")
        transfer.waited = True
        self._pending.remove(transfer)
        if transfer.watched:
            for direction, event in transfer.events.items():
                if not event.wait(self.timeout_s + 1.0):
                    raise self._stall(transfer, TimeoutError(f"{direction} not completed"), direction)
            if transfer.error is not None:
                raise self._stall(transfer, transfer.error, transfer.error_direction)
            if "send" not in transfer.events:
                transfer.send_done_ns = transfer.recv_done_ns
            if self.backend != "gloo":
                for work in transfer.works:
                    work.wait()
        else:
            # gloo gives [send, recv]; a coalesced (NCCL) work stands for both.
            directions = ("send", "recv") if len(transfer.works) == 2 else ("recv",)
            for direction, work in zip(directions, transfer.works, strict=True):
                try:
                    self._wait_work(work)
                except BaseException as exc:
                    raise self._stall(transfer, exc, direction) from None
            transfer.send_done_ns = transfer.recv_done_ns = time.perf_counter_ns()
        return transfer.recv_buffer

    def exchange(self, send: torch.Tensor, *, phase: str, step: int) -> tuple[torch.Tensor, Transfer]:
        """Blocking exchange (the ``sync`` strategy)."""
        transfer = self.post(send, phase=phase, step=step)
        return self.wait(transfer), transfer

    def _stall(self, transfer: Transfer, exc: BaseException, direction: str = "recv") -> RingStall:
        detail = _short(exc)
        if direction == "send":
            what = f"its block was not taken by rank {self.next} (ring successor)"
        else:
            what = f"no block from rank {self.prev} (ring predecessor)"
        return RingStall(
            f"rank {self.rank} stalled at {transfer.phase} ring step {transfer.step}: {what} within "
            f"{self.timeout_s:g} s ({detail})"
        )
