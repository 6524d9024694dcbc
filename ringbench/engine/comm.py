"""All ring traffic goes through one class that knows its neighbours: RingComm.

An exchange sends one buffer to the ring successor and receives one into a given buffer from the ring predecessor
(``batch_isend_irecv``). ``post`` starts it and returns a Transfer; ``wait`` makes what follows depend on it.
The all-gather baseline's collectives go through the same class. Every wait is bounded by the timeout, and a
failure raises RingStall naming this rank, the phase, the ring step and the peer.

Completion is tracked on the ring's timeline (ringbench/engine/timeline.py):

* host timeline (gloo on CPU): gloo P2P works have no futures and report ``is_completed() == False`` until
  ``wait()``, so when recording (or when a link fault must delay a block) a watcher thread per direction calls
  ``wait()`` and stamps the time; the main thread then waits on the watcher's event (bounded).
* stream timeline (NCCL on a GPU): the exchange is posted from the comm stream after it waited for the compute
  stream; ``work.wait()`` there orders the comm stream after the transfer and a mark on it is the transfer's end
  on the device clock. ``wait`` only makes the compute stream wait for that mark: the host never blocks. NCCL runs
  the batched send and receive as one kernel, so both directions share that end. A watchdog thread polls the
  in-flight transfers off the critical path; one that has not finished ``timeout`` after it could start is
  a stall, reported at the next call (or through ``on_stall`` when the host is stuck elsewhere).

An exchange may also go one way only (``sending=False``: receive from the predecessor; ``receiving=False``: send to
the successor), which the short ring uses where a block has no further to go. A RingComm built on the reversed
ring order sends to the predecessor instead (the short ring's dK/dV on their way home).

An injected link delay (emulated links, a slow-link fault) holds a received block for the hop's price after the
local transport delivered it. Where the delay function carries a ``LinkClock`` (``delay.clock``), the blocks of
every lane that arrive over the same hop take turns on it, as on a real link: the backward's K/V of step s + 1
and dK/dV of step s, posted together, arrive one hop price apart, not both after one.

A ring of one rank has no neighbour; with ``loopback`` it still exchanges with itself once per step (a real
SendRecv kernel on NCCL: the one-GPU test of the transfer path; gloo cannot send to itself, so there it is a copy).

``channel`` (ringbench/engine/pgroups.py): the process group the exchanges go over (ring ranks stay ranks of
``group``) and its label, recorded with every span as ``comm_group``; on a stream timeline the communicator posts
from a comm lane of its own, so two rings never queue behind each other's transfers.
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringbench.engine.timeline import COMM, HostTimeline, host_wait
from ringbench.errors import RunFailure


def _short(exc: BaseException) -> str:
    """The gist of a backend error: its first sentence without the source location gloo prefixes."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ")[0][:160]


class RingStall(RunFailure):
    """A bounded wait expired or a peer failed: names the rank, the phase, the ring step and the peer."""


@dataclass(slots=True, eq=False)
class Transfer:
    """One posted exchange: the receive buffer and the marks of its start and of each direction's completion."""

    recv_buffer: torch.Tensor
    phase: str
    step: int
    start: object  # mark: posted (host) / could start on the device (stream)
    nbytes: int
    works: list = field(default_factory=list)
    send_done: object = None  # marks (host: ns stamps; stream: events)
    recv_done: object = None
    watched: bool = False
    events: dict = field(default_factory=dict)  # host watchers: "send" / "recv" -> threading.Event
    error: BaseException | None = None
    error_direction: str = "recv"
    waited: bool = False
    started_at: float | None = None  # stream watchdog: host monotonic time the start mark was seen done
    posted_at: float = field(default_factory=time.monotonic)  # host time of the post (a failure says how long after)
    directions: tuple[str, ...] = ("send", "recv")  # what this exchange does: both, or one way only

    def nccl_ms(self) -> float | None:
        """NCCL's own duration of this exchange (``TORCH_NCCL_ENABLE_TIMING=1``), once it completed; else None."""
        if not self.works or not os.environ.get("TORCH_NCCL_ENABLE_TIMING"):
            return None
        try:
            return float(self.works[-1]._get_duration())
        except Exception:  # not NCCL, timing off, or not completed: no figure rather than a made-up one
            return None


class LinkClock:
    """When each emulated hop (src, dst) of one rank is next free: a transfer held for a hop's price starts once
    the hop's previous transfer has finished (module doc). Shared by every lane of the rank; thread-safe."""

    def __init__(self) -> None:
        self._free_at: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def hold(self, hop: tuple[int, int], seconds: float) -> None:
        """Sleep until a transfer that may start now, after the hop's queue, has taken ``seconds`` on it."""
        with self._lock:
            now = time.perf_counter()
            until = max(now, self._free_at.get(hop, 0.0)) + seconds
            self._free_at[hop] = until
        time.sleep(max(0.0, until - now))


class _Watcher(threading.Thread):
    """Host timeline: waits on works in FIFO order and stamps their completion time (one thread per direction)."""

    def __init__(self, name: str, wait_fn: Callable) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs: queue.Queue = queue.Queue()
        self.wait_fn = wait_fn

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            transfer, direction, work, extra_delay_s, hold = job
            try:
                self.wait_fn(work)
                if extra_delay_s > 0:  # injected link delay: the block arrives that much later
                    hold(extra_delay_s)
                stamp = time.perf_counter_ns()
                if direction == "send":
                    transfer.send_done = stamp
                else:
                    transfer.recv_done = stamp
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
        timeline=None,
        loopback: bool = False,
        on_stall: Callable[[str], None] | None = None,
        channel=None,
    ) -> None:
        self.ring = list(ring)
        self.world = len(ring)
        self.rank = rank
        self.group = group  # ring ranks are this group's
        self.pg = channel.group if channel is not None and channel.group is not None else group  # ops go here
        self.label = channel.label if channel is not None else ""
        self.lane = f"{COMM}:{self.label}" if self.label else COMM
        self.position = self.ring.index(rank)
        self.next = self.ring[(self.position + 1) % self.world]  # group ranks
        self.prev = self.ring[(self.position - 1) % self.world]
        self._next_global = self._global(self.next)
        self._prev_global = self._global(self.prev)
        self.timeout_s = float(timeout_s)
        self.link_delay = link_delay  # (src, dst, nbytes) -> extra seconds for this transfer, or None
        clock = getattr(link_delay, "clock", None)  # the hop's turns, shared with the rank's other lanes
        hop = (self.prev, self.rank)
        self._hold = time.sleep if clock is None else (lambda seconds: clock.hold(hop, seconds))
        self.timeline = timeline if timeline is not None else HostTimeline()
        self.streamed = self.timeline.kind == "stream"
        self.watch = watch or link_delay is not None
        self.loopback = loopback and self.world == 1
        self.backend = dist.get_backend(self.pg) if dist.is_initialized() else "none"
        self.on_stall = on_stall
        self.stalled: RingStall | None = None
        self._watchers: dict[str, _Watcher] = {}
        self._pending: list[Transfer] = []
        self._inflight: list[Transfer] = []  # stream timeline: posted, end mark not yet seen done
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._closed = threading.Event()

    def _global(self, group_rank: int) -> int:
        if self.group is None or self.world == 1:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    # -- host watchers ----------------------------------------------------------------------------------------
    def _wait_work(self, work) -> None:
        host_wait(work, self.timeout_s)

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
        self._closed.set()

    # -- the exchange ---------------------------------------------------------------------------------------
    def _ops(self, send: torch.Tensor, recv: torch.Tensor, directions: tuple[str, ...] = ("send", "recv")) -> list:
        if self.loopback and not self.streamed:
            recv.copy_(send)  # gloo cannot send to itself: a 1-rank loopback on CPU is a copy
            return []
        ops = []
        if "send" in directions:
            ops.append(dist.P2POp(dist.isend, send, self._next_global, self.pg))
        if "recv" in directions:
            ops.append(dist.P2POp(dist.irecv, recv, self._prev_global, self.pg))
        return list(dist.batch_isend_irecv(ops))

    def _exchange_ops(self, send, recv, directions: tuple[str, ...]) -> list:
        both = directions == ("send", "recv")
        return self._ops(send, recv) if both else self._ops(send, recv, directions)

    @staticmethod
    def _work_directions(transfer: Transfer) -> tuple[str, ...]:
        """The direction each work stands for: gloo returns one work per op; a backend may coalesce them."""
        if len(transfer.works) == len(transfer.directions):
            return transfer.directions
        return ("recv",) if "recv" in transfer.directions else ("send",)

    def post(self, send: torch.Tensor, *, into: torch.Tensor | None = None, phase: str, step: int,
             sending: bool = True, receiving: bool = True) -> Transfer:  # fmt: skip
        """Send ``send`` to the successor and receive an equally shaped buffer from the predecessor into ``into``
        (``sending`` / ``receiving`` False: that direction is left out)."""
        self._raise_stall()
        if not (sending or receiving):
            raise ValueError("an exchange must send or receive")
        send = send.contiguous()
        recv = torch.empty_like(send) if into is None else into
        nbytes = send.numel() * send.element_size()
        directions = tuple(d for d, on in (("send", sending), ("recv", receiving)) if on)
        if self.streamed:
            return self._post_streamed(send, recv, phase, step, nbytes, directions)
        transfer = Transfer(recv_buffer=recv, phase=phase, step=step, start=self.timeline.mark(self.lane),
                            nbytes=nbytes, directions=directions)  # fmt: skip
        try:
            works = self._exchange_ops(send, recv, directions)
        except RuntimeError as exc:
            raise self._stall(transfer, exc, "send") from None
        transfer.works = works
        if self.watch and works:
            transfer.watched = True
            for direction, work in zip(self._work_directions(transfer), works, strict=True):
                transfer.events[direction] = threading.Event()
                delay = self._delay(transfer) if direction == "recv" else 0.0
                self._watcher(direction).jobs.put((transfer, direction, work, delay, self._hold))
        self._pending.append(transfer)
        return transfer

    def _delay(self, transfer: Transfer) -> float:
        return self.link_delay(self.prev, self.rank, transfer.nbytes) if self.link_delay is not None else 0.0

    def _post_streamed(self, send, recv, phase: str, step: int, nbytes: int, directions=("send", "recv")) -> Transfer:
        timeline = self.timeline
        timeline.comm_after_compute(self.lane)  # the block to send is ready before the transfer may start
        with timeline.on_comm(self.lane):
            transfer = Transfer(recv_buffer=recv, phase=phase, step=step, start=timeline.mark(self.lane),
                                nbytes=nbytes, directions=directions)  # fmt: skip
            try:
                transfer.works = self._exchange_ops(send, recv, directions)
            except RuntimeError as exc:
                raise self._stall(transfer, exc, "send") from None
            for work in transfer.works:
                timeline.wait_work(work, self.timeout_s)  # orders the comm stream after the transfer
            timeline.spin(self.lane, self._delay(transfer))  # an injected link delay holds the block on the device
            transfer.send_done = transfer.recv_done = timeline.mark(self.lane)
        self._pending.append(transfer)
        with self._lock:
            self._inflight.append(transfer)
        self._start_watchdog()
        return transfer

    def wait(self, transfer: Transfer) -> torch.Tensor:
        """Make what follows depend on the exchange (host: block until both directions completed, bounded);
        returns the received buffer."""
        if transfer.waited:
            raise RuntimeError("wait called twice on the same transfer")
        transfer.waited = True
        self._pending.remove(transfer)
        if self.streamed:
            self._raise_stall()
            self.timeline.compute_after(transfer.recv_done)
            return transfer.recv_buffer
        if not transfer.works:  # host loopback: the copy is done
            transfer.send_done = transfer.recv_done = self.timeline.mark(self.lane)
            return transfer.recv_buffer
        if transfer.watched:
            for direction, event in transfer.events.items():
                if not event.wait(self.timeout_s + 1.0):
                    raise self._stall(transfer, TimeoutError(f"{direction} not completed"), direction)
            if transfer.error is not None:
                raise self._stall(transfer, transfer.error, transfer.error_direction)
            if "send" not in transfer.events:
                transfer.send_done = transfer.recv_done
            if "recv" not in transfer.events:
                transfer.recv_done = transfer.send_done
        else:
            # gloo gives one work per direction; a coalesced work stands for both.
            for direction, work in zip(self._work_directions(transfer), transfer.works, strict=True):
                try:
                    self._wait_work(work)
                except BaseException as exc:
                    raise self._stall(transfer, exc, direction) from None
            transfer.send_done = transfer.recv_done = self.timeline.mark(self.lane)
        return transfer.recv_buffer

    def exchange(self, send: torch.Tensor, *, into=None, phase: str, step: int) -> tuple[torch.Tensor, Transfer]:
        """Blocking exchange (the ``sync`` strategy)."""
        transfer = self.post(send, into=into, phase=phase, step=step)
        return self.wait(transfer), transfer

    # -- collectives (the all-gather baseline) ----------------------------------------------------------------
    def collective(self, what: str, launch: Callable[[], object], *, phase: str) -> tuple[object, object]:
        """Run ``launch()`` (an async collective returning a work) bounded; returns its (start, end) marks."""
        self._raise_stall()
        timeline = self.timeline
        if self.streamed:
            timeline.comm_after_compute(self.lane)
            with timeline.on_comm(self.lane):
                start = timeline.mark(self.lane)
                work = launch()
                timeline.wait_work(work, self.timeout_s)
                end = timeline.mark(self.lane)
            timeline.compute_after(end)
            transfer = Transfer(recv_buffer=torch.empty(0), phase=phase, step=0, start=start, nbytes=0)
            transfer.works, transfer.recv_done = [work], end
            with self._lock:
                self._inflight.append(transfer)
            self._start_watchdog()
            return start, end
        start = timeline.mark(self.lane)
        work = launch()
        try:
            host_wait(work, self.timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            raise RingStall(
                f"rank {self.rank} stalled in {phase} {what} within {self.timeout_s:g} s ({_short(exc)})"
            ) from None
        return start, timeline.mark(self.lane)

    # -- bounds -----------------------------------------------------------------------------------------------
    def settle(self, timeout_s: float | None = None) -> None:
        """After the ring call returned: wait (bounded) until every posted transfer finished on the device."""
        if not self.streamed:
            return
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            self._raise_stall()
            with self._lock:
                self._inflight = [t for t in self._inflight if not self.timeline.is_done(t.recv_done)]
                left = list(self._inflight)
            if not left:
                return
            if time.monotonic() > deadline:
                raise self._stall(left[0], TimeoutError("transfer not completed on the device"))
            time.sleep(50e-6)

    def _start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch_inflight, name="ringbench-watchdog", daemon=True)
            self._watchdog.start()

    def _watch_inflight(self, poll_s: float = 0.01, grace_s: float = 2.0) -> None:
        """Off the critical path: a transfer not done ``timeout`` after it could start is a stall. The thread
        first makes the rank's device its own: a thread starts on device 0, where querying another device's
        events would create a second context (about 0.5 GiB) or, under EXCLUSIVE_PROCESS, fail."""
        try:
            self.timeline.bind_thread()
            self._watch_loop(poll_s, grace_s)
        except Exception as exc:  # never silently: the ring hears of it at its next call
            self.stalled = RingStall(f"rank {self.rank}: the transfer watchdog failed ({_short(exc)})")

    def _watch_loop(self, poll_s: float, grace_s: float) -> None:
        reported_at = None
        while not self._closed.wait(poll_s):
            now = time.monotonic()
            if self.stalled is not None:
                if reported_at is not None and now - reported_at > grace_s and self.on_stall is not None:
                    self.on_stall(str(self.stalled))  # the host never came back to notice: end the process
                    return
                continue
            with self._lock:
                self._inflight = [t for t in self._inflight if not self.timeline.is_done(t.recv_done)]
                inflight = list(self._inflight)
            for transfer in inflight:
                if transfer.started_at is None:
                    if self.timeline.is_done(transfer.start):
                        transfer.started_at = now
                    continue
                if now - transfer.started_at > self.timeout_s:
                    self.stalled = self._stall(transfer, TimeoutError("transfer not completed on the device"))
                    reported_at = now
                    break

    def _raise_stall(self) -> None:
        if self.stalled is not None:
            stall, self.stalled = self.stalled, None
            self._closed.set()
            raise stall

    def _stall(self, transfer: Transfer, exc: BaseException, direction: str = "recv") -> RingStall:
        detail = _short(exc)
        if direction == "send":
            what = f"its block was not taken by rank {self.next} (ring successor)"
        else:
            what = f"no block from rank {self.prev} (ring predecessor)"
        elapsed = time.monotonic() - transfer.posted_at
        # A wait that ran out says so; one that failed early (a peer's socket closed) says when, not the bound.
        when = f"within {self.timeout_s:g} s" if elapsed >= 0.95 * self.timeout_s else f"after {elapsed:.1f} s"
        return RingStall(
            f"rank {self.rank} stalled at {transfer.phase} ring step {transfer.step}: {what} {when} ({detail})"
        )
