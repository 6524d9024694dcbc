"""The all-to-all of a Ulysses group, through the ring's one communication class.

``PeerComm`` is a RingComm (ringbench/engine/comm.py: the bounded waits, the stall that names rank, phase, step and
peer, the timelines) that also exchanges with every peer of a group at once: one batched send to and receive from
each peer (``batch_isend_irecv``), so every pair is its own transfer with its bytes, and the record has a ``send``
and a ``recv`` span per pair -- what the per-hop tables, the critical path and the emulated links work on.

    chunks = pc.all_to_all(parts, group, phase="fwd", step=0, exchange="qkv", flows=flows)   # dict peer -> tensor

``parts[peer]`` is what this rank sends to ``peer`` (its own entry is kept as it is); the result holds what each
peer sent here. Completion on the host timeline (gloo): one watcher job per all-to-all waits on every work and
stamps each pair's completion; an emulated link delay (ringbench.scenario.faults, priced with the exchange's ``flows``
for NIC sharing) holds each pair's arrival ``delay`` after its transfer completed, the pairs in parallel (a rank's
transfers of one exchange already share its port in the price). On a stream timeline (NCCL) the batch is posted
from the comm stream after the compute stream, and NCCL runs it as one kernel: every pair shares its end.

Recorded (when the recorder is on): per peer a ``send`` (post .. this rank's send done) and a ``recv`` (post .. the
peer's chunk in hand), and one ``wait`` for the time this rank sat blocked, charged to the peer whose chunk came
last (so the critical path follows the transfer that ended the wait). Rows carry ``exchange``: what moved.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringbench.engine.comm import RingComm, RingStall, Transfer, _short


@dataclass(slots=True, eq=False)
class PairTransfer:
    """One peer's part of an all-to-all: the marks of its send and of its receive."""

    peer: int
    nbytes: int
    send_done: object = None
    recv_done: object = None


@dataclass(slots=True, eq=False)
class AllToAll:
    """One posted all-to-all of this rank."""

    phase: str
    step: int
    exchange: str
    start: object
    pairs: dict[int, PairTransfer]
    received: dict[int, torch.Tensor]
    works: list = field(default_factory=list)  # (direction, peer, work)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    error_peer: int = -1
    error_direction: str = "recv"
    end: object = None  # stream timeline: the one mark all pairs share


class PeerComm(RingComm):
    """The ring's communicator for traffic with arbitrary peers of the same process group (global ranks)."""

    def __init__(self, rank: int, group=None, **options) -> None:
        super().__init__([rank], rank, group, **{k: v for k, v in options.items() if k != "loopback"})
        self._a2a_jobs = None  # the host watcher of all-to-alls (one thread, FIFO like the ring's watchers)

    def _peer_global(self, peer: int) -> int:
        if self.group is None:
            return peer
        return dist.get_global_rank(self.group, peer)

    def _pair_delay(self, peer: int, nbytes: int, flows) -> float:
        if self.link_delay is None:
            return 0.0
        if getattr(self.link_delay, "accepts_flows", False):
            return float(self.link_delay(peer, self.rank, nbytes, flows=flows))
        return float(self.link_delay(peer, self.rank, nbytes))

    def all_to_all(self, parts: dict[int, torch.Tensor], *, phase: str, step: int, exchange: str,
                   flows=None, recorder=None) -> dict[int, torch.Tensor]:  # fmt: skip
        """Send ``parts[peer]`` to every peer and receive an equally shaped tensor from each; blocks (bounded)
        until every pair is done. ``parts[self.rank]`` is returned as it is."""
        a2a = self.post_all_to_all(parts, phase=phase, step=step, exchange=exchange, flows=flows)
        wait_start = self.timeline.mark() if recorder is not None and recorder.enabled else None
        received = self.wait_all_to_all(a2a)
        if recorder is not None and recorder.enabled:
            self._record(a2a, recorder, wait_start, self.timeline.mark())
        return received

    def post_all_to_all(self, parts: dict[int, torch.Tensor], *, phase: str, step: int, exchange: str,
                        flows=None) -> AllToAll:  # fmt: skip
        self._raise_stall()
        peers = sorted(p for p in parts if p != self.rank)
        sends = {p: parts[p].contiguous() for p in peers}
        received = {p: torch.empty_like(sends[p]) for p in peers}
        received[self.rank] = parts[self.rank]
        pairs = {p: PairTransfer(peer=p, nbytes=sends[p].numel() * sends[p].element_size()) for p in peers}
        streamed = self.streamed
        if streamed:
            self.timeline.comm_after_compute(self.lane)
        context = self.timeline.on_comm(self.lane) if streamed else contextlib.nullcontext()
        with context:
            a2a = AllToAll(phase=phase, step=step, exchange=exchange, start=self.timeline.mark(self.lane), pairs=pairs,
                           received=received)  # fmt: skip
            if not peers:
                a2a.done.set()
                return a2a
            ops = []
            for p in peers:  # sends and receives in one batch: no pair waits for another to be posted
                ops.append(dist.P2POp(dist.isend, sends[p], self._peer_global(p), self.pg))
                ops.append(dist.P2POp(dist.irecv, received[p], self._peer_global(p), self.pg))
            try:
                works = list(dist.batch_isend_irecv(ops))
            except RuntimeError as exc:
                raise self._peer_stall(a2a, peers[0], exc, "send") from None
            if len(works) == len(ops):
                a2a.works = [(d, p, w) for (d, p), w in zip([(d, p) for p in peers for d in ("send", "recv")], works,
                                                            strict=True)]  # fmt: skip
            else:  # a backend that coalesces the batch into one work: it stands for every pair
                a2a.works = [("all", -1, w) for w in works]
            if streamed:
                for _, _, work in a2a.works:
                    self.timeline.wait_work(work, self.timeout_s)
                delay = max(self._pair_delay(p, pairs[p].nbytes, flows) for p in peers)
                self.timeline.spin(self.lane, delay)  # the slowest pair's injected delay holds the batch on the device
                a2a.end = self.timeline.mark(self.lane)
                for pair in pairs.values():
                    pair.send_done = pair.recv_done = a2a.end
        if streamed:
            watched = Transfer(recv_buffer=torch.empty(0), phase=phase, step=step, start=a2a.start, nbytes=0)
            watched.recv_done = a2a.end
            with self._lock:
                self._inflight.append(watched)
            self._start_watchdog()
            return a2a
        delays = {p: self._pair_delay(p, pairs[p].nbytes, flows) for p in peers}
        if self.watch:
            self._a2a_watcher().put((a2a, delays))
        else:
            a2a.done.set()  # waited for on the caller's thread
        return a2a

    def wait_all_to_all(self, a2a: AllToAll) -> dict[int, torch.Tensor]:
        """Make what follows depend on every pair of the all-to-all (host: block until all are done, bounded)."""
        if self.streamed:
            self._raise_stall()
            if a2a.end is not None:
                self.timeline.compute_after(a2a.end)
            return a2a.received
        if not a2a.works:
            for pair in a2a.pairs.values():
                pair.send_done = pair.recv_done = self.timeline.mark(self.lane)
            return a2a.received
        if self.watch:
            if not a2a.done.wait(self.timeout_s + 1.0):
                late = next((p for p, t in a2a.pairs.items() if t.recv_done is None), -1)
                raise self._peer_stall(a2a, late, TimeoutError("not completed"), "recv")
            if a2a.error is not None:
                raise self._peer_stall(a2a, a2a.error_peer, a2a.error, a2a.error_direction)
            return a2a.received
        for direction, peer, work in a2a.works:
            try:
                self._wait_work(work)
            except BaseException as exc:
                raise self._peer_stall(a2a, peer, exc, direction) from None
        stamp = self.timeline.mark(self.lane)
        for pair in a2a.pairs.values():
            pair.send_done = pair.recv_done = stamp
        return a2a.received

    # -- the host watcher ---------------------------------------------------------------------------------------
    def _a2a_watcher(self):
        if self._a2a_jobs is None:
            import queue

            self._a2a_jobs = queue.Queue()
            thread = threading.Thread(target=self._watch_a2a, name="ringbench-a2a-watch", daemon=True)
            thread.start()
            self._a2a_thread = thread
        return self._a2a_jobs

    def _watch_a2a(self) -> None:
        while True:
            job = self._a2a_jobs.get()
            if job is None:
                return
            a2a, delays = job
            try:
                landed = {}
                for direction, peer, work in a2a.works:
                    try:
                        self._wait_work(work)
                    except BaseException as exc:
                        a2a.error, a2a.error_peer, a2a.error_direction = exc, peer, direction
                        raise
                    stamp = time.perf_counter_ns()
                    peers = list(a2a.pairs) if direction == "all" else [peer]
                    for p in peers:
                        if direction in ("send", "all"):
                            a2a.pairs[p].send_done = stamp
                        if direction in ("recv", "all"):
                            landed[p] = stamp
                # Each pair arrives its own delay after it landed; the pairs' delays run side by side.
                for p in sorted(landed, key=lambda q: landed[q] + delays.get(q, 0.0) * 1e9):
                    target = landed[p] + delays.get(p, 0.0) * 1e9
                    wait_s = (target - time.perf_counter_ns()) / 1e9
                    if wait_s > 0:
                        time.sleep(wait_s)
                    a2a.pairs[p].recv_done = max(int(target), landed[p])
            except BaseException:
                pass
            finally:
                a2a.done.set()

    def close(self) -> None:
        if self._a2a_jobs is not None:
            self._a2a_jobs.put(None)
            self._a2a_jobs = None
        super().close()

    # -- records and failures -----------------------------------------------------------------------------------
    def _record(self, a2a: AllToAll, recorder, wait_start, wait_end) -> None:
        last_peer, last_end = -1, None
        for peer, pair in sorted(a2a.pairs.items()):
            recorder.span(phase=a2a.phase, step=a2a.step, kind="send", start=a2a.start, end=pair.send_done,
                          src=self.rank, dst=peer, nbytes=pair.nbytes, exchange=a2a.exchange, group=self.label)  # fmt: skip
            recorder.span(phase=a2a.phase, step=a2a.step, kind="recv", start=a2a.start, end=pair.recv_done,
                          src=peer, dst=self.rank, nbytes=pair.nbytes, exchange=a2a.exchange, group=self.label)  # fmt: skip
            if self.streamed or last_end is None or pair.recv_done >= last_end:
                last_peer, last_end = peer, pair.recv_done
        if last_peer >= 0:
            recorder.span(phase=a2a.phase, step=a2a.step, kind="wait", start=wait_start, end=wait_end, src=last_peer,
                          dst=self.rank, exchange=a2a.exchange, group=self.label)  # fmt: skip

    def _peer_stall(self, a2a: AllToAll, peer: int, exc: BaseException, direction: str) -> RingStall:
        what = f"its chunk was not taken by rank {peer}" if direction == "send" else f"no chunk from rank {peer}"
        return RingStall(
            f"rank {self.rank} stalled at {a2a.phase} step {a2a.step} ({a2a.exchange} all-to-all): {what} within "
            f"{self.timeout_s:g} s ({_short(exc)})"
        )


__all__ = ["AllToAll", "PairTransfer", "PeerComm"]
