"""The ``profile/`` folder of a run: one profiler trace per (case, repeat, rank) for the profiled iteration.

Layout (written by ``ringbench run --profile``, see ringbench/rank/profiling.py)::

    results/<run-id>/meta.json      "profile": {"iteration": K, "dir": "profile"}
    results/<run-id>/profile/<case_id>/r<repeat>-rank<rank>.json.gz

K is the profiled timed iteration. Each trace also names it in its ``ringbench:iteration K`` marker, which is what
the check uses when meta.json gives no integer K.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ringbench.errors import UsageError
from ringbench.traces.kineto import TRACE_EVENT_COLUMNS, read_kineto_trace

TRACE_FILE = re.compile(r"^r(\d+)-rank(\d+)\.json(\.gz)?$")
PROFILE_TRACE_COLUMNS = ["case_id", "repeat", "rank", *TRACE_EVENT_COLUMNS]
# What the timeline check reads: markers and transfer spans, host ops, launches and kernels (not memcpy/memset).
_KEPT_CATS = ("user_annotation", "cpu_op", "cuda_runtime", "cuda_driver", "kernel")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileSet:
    """The traces of a run's profiled iteration, concatenated (PROFILE_TRACE_COLUMNS)."""

    folder: Path
    iteration: int | None  # from meta.json; None: each trace's own marker says
    traces: pd.DataFrame
    files: tuple[Path, ...] = ()
    backends: tuple[str, ...] = ()  # distributedInfo.backend of the traces (gloo, nccl)
    device_properties: tuple = field(default=())


def profile_settings(meta: dict, run_dir: Path) -> tuple[Path, int | None]:
    """(folder, iteration or None) from meta.json's ``profile`` entry; UsageError when the run was not profiled."""
    entry = meta.get("profile")
    if not isinstance(entry, dict):
        raise UsageError(f"{run_dir}: not profiled (no profile in meta.json; run it with `ringbench run --profile`)")
    folder = Path(run_dir) / str(entry.get("dir", "profile"))
    if not folder.is_dir():
        raise UsageError(f"{run_dir}: meta.json names a profile but its folder {folder.name}/ is missing")
    iteration = entry.get("iteration")
    return folder, iteration if type(iteration) is int else None


def load_profile_set(run_dir: Path, meta: dict) -> ProfileSet:
    """Read every ``<case_id>/r<repeat>-rank<rank>.json[.gz]`` under the run's profile folder."""
    folder, iteration = profile_settings(meta, run_dir)
    frames, files, backends, devices = [], [], set(), ()
    for case_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        for path in sorted(case_dir.iterdir()):
            match = TRACE_FILE.match(path.name)
            if match is None:
                continue
            trace = read_kineto_trace(path)
            events = trace.events[trace.events["cat"].isin(_KEPT_CATS)]
            events.insert(0, "rank", int(match.group(2)))
            events.insert(0, "repeat", int(match.group(1)))
            events.insert(0, "case_id", case_dir.name)
            frames.append(events)
            files.append(path)
            backends.add(trace.backend)
            devices = devices or trace.device_properties
    if not frames:
        raise UsageError(f"{folder}: no traces (expected <case_id>/r<repeat>-rank<rank>.json.gz)")
    traces = pd.concat(frames, ignore_index=True)[PROFILE_TRACE_COLUMNS]
    return ProfileSet(folder=folder, iteration=iteration, traces=traces, files=tuple(files),
                      backends=tuple(sorted(b for b in backends if b)), device_properties=devices)  # fmt: skip
