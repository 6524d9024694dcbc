"""A fake stream/event runtime for the stream timeline, so the GPU timing path runs on CPU.

Like a GPU's, its events complete *later* than they are recorded: an event records the host time at ``record``
(the fake streams execute in program order on the host), but ``query`` reports it done only ``lag`` later, and
``elapsed_time`` refuses an event that is not done yet (as CUDA does). Every synchronisation is counted, so a
test can assert that nothing inside the ring loop drains the device.
"""

from __future__ import annotations

import contextlib
import threading
import time

from ringbench.engine.timeline import StreamTimeline, host_wait


class FakeEvent:
    def __init__(self, runtime: FakeRuntime, index: int) -> None:
        self.runtime = runtime
        self.index = index  # creation order
        self.recorded_ns: int | None = None
        self.stream = None

    def record(self, stream=None) -> None:
        self.recorded_ns = time.perf_counter_ns()
        self.stream = stream

    def query(self) -> bool:
        self.runtime.check_thread()
        if self.recorded_ns is None or self.runtime.hold or self.index in self.runtime.stuck:
            return False
        return time.perf_counter_ns() >= self.recorded_ns + self.runtime.lag_ns

    def synchronize(self) -> None:
        self.runtime.count_sync()
        while not self.query():
            time.sleep(1e-4)

    def elapsed_time(self, other: FakeEvent) -> float:
        if not (self.query() and other.query()):
            raise RuntimeError("fake CUDA: elapsed_time on an event that has not completed")
        return (other.recorded_ns - self.recorded_ns) / 1e6


class FakeStream:
    def __init__(self, name: str, priority: int = 0) -> None:
        self.name = name
        self.priority = priority
        self.waited_events: list[FakeEvent] = []
        self.waited_streams: list[FakeStream] = []

    def wait_stream(self, other: FakeStream) -> None:
        self.waited_streams.append(other)  # program order on the host already orders the fake streams

    def wait_event(self, event: FakeEvent) -> None:
        self.waited_events.append(event)


class FakeRuntime:
    """Streams and events whose completion lags their recording by ``lag_ms``; ``hold`` stalls every event."""

    def __init__(self, lag_ms: float = 2.0, strict_threads: bool = False) -> None:
        self.lag_ns = int(lag_ms * 1e6)
        # strict_threads: like CUDA under EXCLUSIVE_PROCESS, a thread that queries an event without having set
        # the device first is refused (a real one would have made a context on device 0).
        self.strict_threads = strict_threads
        self.bound_threads = {threading.get_ident()}  # the rank's main thread set its device at start-up
        self.hold = False
        self.stuck: set[int] = set()  # indices of events that never complete (a transfer that never arrives)
        self.events_made = 0
        self.syncs = 0
        self._lock = threading.Lock()
        self.compute = FakeStream("compute")  # the default stream
        self._current = threading.local()  # like CUDA's, the current stream is per thread

    def bind_thread(self) -> None:
        self.bound_threads.add(threading.get_ident())

    def check_thread(self) -> None:
        if self.strict_threads and threading.get_ident() not in self.bound_threads:
            raise RuntimeError("fake CUDA: event queried from a thread that never set its device")

    def count_sync(self) -> None:
        with self._lock:
            self.syncs += 1

    def current_stream(self) -> FakeStream:
        return getattr(self._current, "stream", None) or self.compute

    def new_stream(self, priority: int) -> FakeStream:
        return FakeStream("comm", priority)

    def new_event(self) -> FakeEvent:
        self.events_made += 1
        return FakeEvent(self, self.events_made - 1)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream):
        """Make ``stream`` the current one inside (``torch.cuda.stream``)."""
        saved = getattr(self._current, "stream", None)
        self._current.stream = stream
        try:
            yield
        finally:
            self._current.stream = saved

    def synchronize(self) -> None:
        self.count_sync()
        time.sleep(self.lag_ns / 1e9)

    def wait_work(self, work, timeout_s: float) -> None:
        host_wait(work, timeout_s)  # gloo has no streams: the fake comm stream "runs" on the host

    def spin(self, stream, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


def fake_timeline(lag_ms: float = 2.0) -> StreamTimeline:
    return StreamTimeline(FakeRuntime(lag_ms))
