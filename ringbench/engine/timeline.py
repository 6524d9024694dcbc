"""Timelines: where the ring's spans get their times, and how compute and communication are ordered.

The ring loop asks its timeline for *marks* (points in time on a lane: ``compute`` or ``comm``) and resolves
them into nanoseconds on the run's host clock only after the iteration. Two timelines, one interface:

``HostTimeline`` (CPU, gloo). The host runs the work, so the host clock is the work's clock: a mark is
``time.perf_counter_ns()`` when the host reaches that point, and resolves to itself. Lanes are the same thread.

``StreamTimeline`` (a GPU). The host only enqueues; the device runs the work later, on streams. A mark is an
event recorded on the stream that runs the work, so it fires when the *device* reaches that point:

  * compute runs on the current stream, resolved at each use, never kept from construction: a context built once
    and called later under another current stream (FSDP's or Megatron's side streams, ``torch.cuda.stream(s)``)
    launches its kernels on that stream, so its marks and waits must act on that stream too, or the kernels would
    read receive buffers before their transfers ended; each exchange is posted from a dedicated high-priority comm
    stream that first waits for the compute stream (the block to send is ready), so NCCL's own stream (which waits
    for the stream that posts) starts the transfer only then; ``work.wait()`` on the comm stream orders the comm
    stream after the transfer, and a mark there is the transfer's end on the device clock (autograd runs the
    backward on the forward's stream, so both phases resolve the same one);
  * each communicator has a comm lane (a stream) of its own (``comm:<channel>``; ringbench/engine/pgroups.py):
    ``work.wait()`` orders the posting stream after the transfer, so two rings posting from one stream would
    queue each other's transfers (and injected link delays) behind their own however many groups they had;
  * the compute stream waits for that mark before it uses the received block, and the wait is bracketed by two
    compute-stream marks (the time the compute stream sat idle waiting: the exposed communication);
  * nothing in the loop synchronises the host: ``settle`` polls the iteration's events after the loop (bounded by
    the timeout), and ``resolve`` turns each event into host nanoseconds through one anchor per iteration (an event
    recorded on an idle device right after the host read its clock, so the two agree to the launch latency).

A *runtime* supplies streams and events: ``CudaRuntime`` on a GPU; the test suite drives the same loop on CPU with
a fake runtime whose events complete later than they are recorded, as a GPU's do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import torch

from ringbench.kernels.spin import spin

COMPUTE = "compute"
COMM = "comm"


class HostTimeline:
    """CPU: marks are host nanoseconds taken when the host (which does the work) reaches that point."""

    kind = "host"

    def mark(self, lane: str = COMPUTE) -> int:
        return time.perf_counter_ns()

    def begin_iteration(self) -> int:
        return time.perf_counter_ns()

    def resolve(self, mark) -> int:
        return int(mark)

    def settle(self, timeout_s: float) -> list:
        """Nothing is in flight on the host once the loop returned: no mark is pending."""
        return []

    # Ordering between lanes is the program order of the one host thread.
    @contextlib.contextmanager
    def on_comm(self, lane: str = COMM) -> Iterator[None]:
        yield

    def comm_after_compute(self, lane: str = COMM) -> None:
        pass

    def compute_after(self, mark) -> None:
        pass

    def is_done(self, mark) -> bool:
        return True

    def spin(self, lane: str, seconds: float) -> None:
        """Hold the lane for ``seconds`` (a modelled duration or an injected delay)."""
        if seconds > 0:
            time.sleep(seconds)

    def wait_work(self, work, timeout_s: float) -> None:
        host_wait(work, timeout_s)

    def bind_thread(self) -> None:
        """Called first by a helper thread that will query marks (the comm watchdog): nothing to do on the host."""


def host_wait(work, timeout_s: float) -> None:
    """Block the host until a backend work completed, bounded by ``timeout_s`` (gloo: the host is the lane)."""
    if work.wait(timedelta(seconds=timeout_s)) is False:
        raise TimeoutError(f"no completion within {timeout_s:g} s")


class CudaRuntime:
    """Streams and events of one CUDA device (the real thing; tests use a fake with the same methods)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    def new_stream(self, priority: int):
        return torch.cuda.Stream(self.device, priority=priority)

    def new_event(self):
        return torch.cuda.Event(enable_timing=True)

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def wait_work(self, work, timeout_s: float) -> None:
        # NCCL: makes the *current* stream wait for the transfer's end; the host returns at once. (A timeout
        # argument would make it block the host, so the bound is kept by the watchdog and settle instead.)
        work.wait()

    def spin(self, stream, seconds: float) -> None:
        spin(seconds, self.device, stream)

    def bind_thread(self) -> None:
        """Make this device the calling thread's current one (a new thread starts on device 0)."""
        torch.cuda.set_device(self.device)


class StreamTimeline:
    """A device: marks are events on the stream that runs the work, resolved after the iteration."""

    kind = "stream"
    COMM_PRIORITY = -1  # higher than the default: a transfer's bookkeeping is never queued behind attention

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self.comm = runtime.new_stream(self.COMM_PRIORITY)
        self.lanes = {COMM: self.comm}  # comm lane -> its stream (one per communicator, made on first use)
        self._events: list | None = None  # this iteration's marks, in recording order (kept from begin_iteration)
        self._anchor = None
        self._anchor_ns = 0
        # Events are made once and recorded again every iteration: creating about six per ring step would cost
        # host time inside the measured spans. An iteration's marks are resolved before the next one begins.
        self._pool: list = []

    @property
    def compute(self):
        """The stream the ring's kernels run on: the caller's current stream now (module docstring)."""
        return self.runtime.current_stream()

    def _stream(self, lane: str):
        if lane == COMPUTE:
            return self.compute
        stream = self.lanes.get(lane)
        if stream is None:
            stream = self.lanes[lane] = self.runtime.new_stream(self.COMM_PRIORITY)
        return stream

    def _event(self):
        if self._events is None:  # a mark outside an iteration: nobody recycles it
            return self.runtime.new_event()
        used = len(self._events)
        if used == len(self._pool):
            self._pool.append(self.runtime.new_event())
        return self._pool[used]

    def mark(self, lane: str = COMPUTE):
        event = self._event()
        event.record(self._stream(lane))
        if self._events is not None:
            self._events.append(event)
        return event

    def begin_iteration(self):
        """Anchor this iteration's events to the host clock (outside the ring loop: the device is drained). The
        previous iteration's marks are recycled from here on: resolve them before (ListRecorder.finish_iteration)."""
        self.runtime.synchronize()
        self._events = []
        self._anchor_ns = time.perf_counter_ns()
        self._anchor = self._event()
        self._anchor.record(self.compute)
        self._events.append(self._anchor)
        return self._anchor

    def resolve(self, mark) -> int:
        if mark is self._anchor:
            return self._anchor_ns
        return self._anchor_ns + round(self._anchor.elapsed_time(mark) * 1e6)

    def settle(self, timeout_s: float) -> list:
        """Wait (bounded, by polling) until every mark of the iteration fired; returns the marks still pending."""
        deadline = time.monotonic() + timeout_s
        events = self._events or []
        for index, event in enumerate(events):
            while not event.query():
                if time.monotonic() > deadline:
                    return events[index:]
                time.sleep(50e-6)
        return []

    @contextlib.contextmanager
    def on_comm(self, lane: str = COMM) -> Iterator[None]:
        with self.runtime.stream(self._stream(lane)):
            yield

    def comm_after_compute(self, lane: str = COMM) -> None:
        """The comm lane starts nothing before the compute stream produced what is sent."""
        self._stream(lane).wait_stream(self.compute)

    def compute_after(self, mark) -> None:
        self.compute.wait_event(mark)

    def is_done(self, mark) -> bool:
        return bool(mark.query())

    def spin(self, lane: str, seconds: float) -> None:
        self.runtime.spin(self._stream(lane), seconds)

    def wait_work(self, work, timeout_s: float) -> None:
        self.runtime.wait_work(work, timeout_s)

    def bind_thread(self) -> None:
        """A helper thread that queries this timeline's events makes the timeline's device its own first."""
        self.runtime.bind_thread()


def timeline_for(device: torch.device):
    """The one place that picks the timeline: events on the device's streams for CUDA, host time otherwise."""
    if device.type == "cuda":
        return StreamTimeline(CudaRuntime(device))
    return HostTimeline()
