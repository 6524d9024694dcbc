"""Every trace of a job reduced to its rank's tables (rank_import.reduce_rank), in parallel processes where that pays.

A user's set is one trace per rank, tens of MB each, and each trace is read and reduced alone, so the ranks are
shared among the cores: the importing process reads its share itself and forked readers read the rest (a forked
reader pays the libraries' first use again, about 25 MB and a few tenths of a second of CPU, so the parent is one of
the readers rather than waiting on them). Progress from the readers is relayed through a queue to the caller's
``progress``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from ringbench.traces.rank_import import reduce_rank

ProgressFn = Callable[[str, int, int], None]  # (trace file name, bytes of JSON read since the last call, its total)
# Read the ranks in parallel processes from this much JSON on: a forked reader costs tens of milliseconds (the fork,
# pickling its rank back) and its first calls, a 12 MB trace about 0.3 s of reading and reducing.
PARALLEL_MIN_MB = 16


def read_ranks(files: list[Path], pattern: re.Pattern, marker, progress: ProgressFn | None, workers: int | None,
               override: re.Pattern | None = None):  # fmt: skip
    """The reduced rank of every trace, in ``files``' order. ``workers``: processes that read (the caller's own
    included; default: one per core, up to one per trace, from PARALLEL_MIN_MB of JSON on; else 1); ``pattern``,
    ``override``: rank_import.reduce_rank."""
    from ringbench.traces.kineto import json_size

    sizes = {path: json_size(path) for path in files}
    if workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = min(cores, len(files)) if sum(sizes.values()) >= PARALLEL_MIN_MB * 1e6 else 1
    workers = min(workers, len(files))
    if workers <= 1:
        return [reduce_rank(path, pattern, marker, progress=_reporter(progress, path, sizes[path]), override=override)
                for path in files]  # fmt: skip
    return _read_parallel(files, sizes, pattern, marker, progress, workers, override)


def _reporter(progress: ProgressFn | None, path: Path, total: int):
    return None if progress is None else (lambda n: progress(path.name, n, total))


def _read_parallel(files, sizes, pattern, marker, progress, workers, override):
    """The largest traces first, dealt in turn to this process and ``workers`` - 1 forked readers."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    largest_first = sorted(files, key=lambda path: -sizes[path])
    mine = largest_first[::workers]
    context = mp.get_context("fork")
    relay = context.Queue() if progress is not None else None
    done: dict[Path, object] = {}
    with ProcessPoolExecutor(max_workers=workers - 1, mp_context=context, initializer=_worker_init,
                             initargs=(relay,)) as pool:  # fmt: skip
        given = override.pattern if override is not None else None
        futures = {path: pool.submit(_reduce_in_worker, str(path), pattern.pattern, marker, sizes[path], given)
                   for path in largest_first if path not in mine}  # fmt: skip
        for path in mine:
            report = None if progress is None else _relaying(progress, relay, path, sizes[path])
            done[path] = reduce_rank(path, pattern, marker, progress=report, override=override)
        while relay is not None and not all(f.done() for f in futures.values()):
            _drain(progress, relay, timeout=0.1)
        done.update((path, future.result()) for path, future in futures.items())
    if relay is not None:
        _drain(progress, relay)
    return [done[path] for path in files]


def _relaying(progress: ProgressFn, relay, path: Path, total: int):
    """This process's own progress, with the readers' relayed as it goes (it cannot wait on the queue meanwhile)."""

    def report(n: int) -> None:
        progress(path.name, n, total)
        _drain(progress, relay)

    return report


def _drain(progress: ProgressFn, relay, timeout: float | None = None) -> None:
    """Pass on what the readers reported: everything queued, or one report within ``timeout`` seconds."""
    import queue as queues

    try:
        if timeout is not None:
            progress(*relay.get(timeout=timeout))
        while True:
            progress(*relay.get_nowait())
    except queues.Empty:
        return


_RELAY = None


def _worker_init(relay) -> None:
    global _RELAY
    _RELAY = relay


def _reduce_in_worker(path: str, pattern: str, marker, total: int, override: str | None):
    name = Path(path).name
    report = None if _RELAY is None else (lambda n: _RELAY.put((name, n, total)))
    given = re.compile(override) if override is not None else None
    return reduce_rank(Path(path), re.compile(pattern), marker, progress=report, override=given)


__all__ = ["PARALLEL_MIN_MB", "ProgressFn", "read_ranks"]
