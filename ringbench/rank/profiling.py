"""One profiled iteration per rank: torch.profiler around it, with ring-step markers, exported as a Chrome trace.

The profiler is the independent witness of the recorder (see docs/results.md, ``profile/``). The markers only say
which ring step an op belongs to; every time compared by ``ringbench check-timeline`` comes from the profiler's
own op and kernel timestamps. Markers, all ``record_function`` ranges (cat ``user_annotation``):

    ringbench:iteration K      the whole timed iteration K (forward and backward); starts at the same instant as
                               the recorder's iteration start, which is what aligns the two clocks
    ringbench:fwd step S       ring step S of the forward (bwd likewise), from the step's start to the next
                               step's start or the end of the phase's ring loop

Use (what the runner does for the profiled iteration of a case)::

    with ProfileCapture(run_dir / "profile" / case_id / f"r{repeat}-rank{rank}.json.gz", device) as capture:
        barrier()                        # after the profiler started: its start costs ms, unequal across ranks
        with capture.iteration(k):       # the recorder stamps the iteration start here
            ...                          # recorder.on_step(phase, step) -> capture.step(phase, step)
            ...                          # recorder.end_phase(phase)     -> capture.end_phase()
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ringbench.markers import (
    EMULATED_MARKER,
    ITERATION_MARKER,
    WARM_UP_MARKER,
    iteration_marker,
    step_marker,
)
from ringbench.record.atomic import atomic_write

_GZIP_LEVEL = 6  # traces reach hundreds of MB: level 9 costs several times the CPU for a few % of size
# The profiler's library prints two status lines per capture per rank on stderr ("USDT: ... profiler_start /
# profiler_stop") at every level below 6; a sweep of profiled cases drowned its own lines in them. Quiet unless the
# user set the level (KINETO_LOG_LEVEL=4 brings back its errors). Read when the profiler first starts.
_PROFILER_LOG_LEVEL = ("KINETO_LOG_LEVEL", "6")


class ProfileCapture:
    """torch.profiler over one timed iteration of one rank; the Chrome trace is written atomically on exit.

    ``path`` ends in ``.json.gz`` (gzip-compressed) or ``.json``. CPU activities always, CUDA ones too when
    ``device`` is a CUDA device; ``record_shapes`` so that c10d ops carry their peer and tag and the transfers
    their shapes and dtypes. A capture that ends by an exception writes nothing.
    """

    def __init__(self, path: Path, device: torch.device) -> None:
        self.path = Path(path)
        if not self.path.name.endswith((".json", ".json.gz")):
            raise ValueError(f"profile path {str(self.path)!r} must end in .json or .json.gz")
        self.device = torch.device(device)
        self._profiler: profile | None = None
        self._step_range: record_function | None = None

    def __enter__(self) -> ProfileCapture:
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        os.environ.setdefault(*_PROFILER_LOG_LEVEL)
        self._profiler = profile(activities=activities, record_shapes=True)
        self._profiler.__enter__()
        # The first range of a profiling process pays a one-off setup (about 1 ms on CPU) between the start stamp
        # and the code it wraps; paid here, it cannot shift the iteration marker against the recorder's stamp.
        with record_function(WARM_UP_MARKER):
            pass
        return self

    def __exit__(self, *exc) -> None:
        profiler, self._profiler = self._profiler, None
        if profiler is None:
            return
        try:
            self.end_phase()
        finally:
            profiler.__exit__(*exc)
        if exc[0] is None:
            self._export(profiler)

    @contextlib.contextmanager
    def iteration(self, index: int) -> Iterator[None]:
        """Mark the whole timed iteration ``index`` (forward and backward)."""
        with record_function(iteration_marker(index)):
            try:
                yield
            finally:
                self.end_phase()  # a step range never outlives its iteration

    def step(self, phase: str, step: int) -> None:
        """Close the previous step range (if any) and open the one of ring step ``step`` of ``phase``."""
        self.end_phase()
        step_range = record_function(step_marker(phase, step))
        step_range.__enter__()
        self._step_range = step_range

    def end_phase(self) -> None:
        """Close the open step range (the phase's ring loop ended)."""
        step_range, self._step_range = self._step_range, None
        if step_range is not None:
            step_range.__exit__(None, None, None)

    def _export(self, profiler: profile) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # The profiler writes plain JSON to a name of its own; compress (or copy) it into place atomically.
        fd, raw = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".json", dir=self.path.parent)
        os.close(fd)
        try:
            profiler.export_chrome_trace(raw)
            with open(raw, "rb") as source:
                if self.path.name.endswith(".gz"):
                    atomic_write(self.path, lambda handle: _gzip_into(source, handle))
                else:
                    atomic_write(self.path, lambda handle: shutil.copyfileobj(source, handle, 1 << 20))
        finally:
            Path(raw).unlink(missing_ok=True)


def _gzip_into(source, handle) -> None:
    with gzip.GzipFile(fileobj=handle, mode="wb", compresslevel=_GZIP_LEVEL, mtime=0) as packed:
        shutil.copyfileobj(source, packed, 1 << 20)


__all__ = ["EMULATED_MARKER", "ITERATION_MARKER", "ProfileCapture", "iteration_marker", "step_marker"]
