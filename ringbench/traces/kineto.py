"""Reader for PyTorch profiler (Kineto) Chrome traces: ``.json`` or ``.json.gz``.

A trace is one JSON object: metadata keys (``schemaVersion``, ``distributedInfo``, ``baseTimeNanoseconds``,
``deviceProperties``, ``host_name``, ...) around a ``traceEvents`` list. Complete events (``ph: "X"``) have ``ts``
and ``dur`` in microseconds; ``ts * 1000 + baseTimeNanoseconds`` is unix-epoch nanoseconds (traces without
``baseTimeNanoseconds`` carry absolute microseconds). CPU ops (cat ``cpu_op``), ``record_function`` ranges
(``user_annotation``, including gloo's ``gloo:send`` / ``gloo:recv`` transfer spans) and, with CUDA activities,
GPU ``kernel`` / ``gpu_memcpy`` events on ``stream``s linked by ``correlation`` id to their ``cuda_runtime``
launch on the host.

Three ways to read one, chosen per file (``KinetoTrace.reader`` says which):

* whole file (msgspec): a trace whose JSON fits the memory budget (``memory_mb``, default MEMORY_BUDGET_MB,
  or the environment's ``RINGBENCH_IMPORT_MEMORY_MB``) is
  decoded in one call by msgspec's C decoder straight into typed structs that keep only the fields the record
  needs (an event's args as raw JSON where they are bulky), then reduced to columns (kineto_fast.py).
* streamed (msgspec): a larger one is read in chunks of CHUNK_MB; each chunk's whole events are decoded the same
  way and reduced at once, so memory holds one chunk and the columns, never the document.
* careful (stdlib): when the fast decoder rejects a file (not JSON, truncated, a field of an unusual type), the
  standard library's scanner reads it value by value (kineto_scan.py): it accepts any valid JSON and, for bad
  input, says in one line what is wrong and where.

Bad input raises UsageError with one line naming the file and what was found.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ringbench.errors import UsageError
from ringbench.traces.trace_format import (
    CHUNK_MB,
    MEMORY_BUDGET_MB,
    TRACE_EVENT_COLUMNS,
    KinetoTrace,
    Malformed,
    events_frame,
    json_size,
)


def read_kineto_trace(
    path: str | Path, *, memory_mb: float | None = None, progress: Callable[[int], None] | None = None
) -> KinetoTrace:
    """Read a profiler trace (module doc for the three ways); bad input raises UsageError naming the file and
    what was found. ``progress(bytes)`` is called as the JSON is read (bytes of JSON consumed since the last call)."""
    from ringbench.traces import kineto_fast, kineto_scan

    path = Path(path)
    budget = (MEMORY_BUDGET_MB if memory_mb is None else memory_mb) * (1 << 20)
    try:
        size = json_size(path)
        whole = size <= budget
        try:
            metadata, chunks = kineto_fast.read(
                path, whole=whole, chunk_bytes=max(1, int(CHUNK_MB * (1 << 20))), progress=progress
            )
            reader = "whole file (msgspec)" if whole else f"streamed (msgspec, {CHUNK_MB:g} MB chunks)"
        except kineto_fast.Unusual:
            metadata, chunks = kineto_scan.read(path)
            reader = "careful (stdlib)"
        check_metadata(metadata)
        events = events_frame(chunks, metadata.get("baseTimeNanoseconds", 0))
    except Malformed as exc:
        raise UsageError(f"{path}: {exc}") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise UsageError(f"{path}: truncated or corrupt gzip stream ({exc})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a PyTorch profiler trace (not UTF-8 text)") from None
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, expected a .json or .json.gz trace") from None
    devices = metadata.get("deviceProperties") or []
    return KinetoTrace(
        path=path,
        schema_version=metadata["schemaVersion"],
        base_time_ns=metadata.get("baseTimeNanoseconds", 0),
        distributed_info=metadata.get("distributedInfo") or {},
        host_name=str(metadata.get("host_name", "")),
        device_properties=tuple(devices) if isinstance(devices, list) else (),
        events=events,
        reader=reader,
    )


def check_metadata(metadata: dict) -> None:
    for key in ("traceEvents", "schemaVersion"):
        if key not in metadata:
            keys = ", ".join(sorted(metadata)[:8]) or "none"
            raise Malformed(f"not a PyTorch profiler trace (no {key}; found keys: {keys})")
    for key, kind in (("schemaVersion", int), ("baseTimeNanoseconds", int), ("distributedInfo", dict)):
        value = metadata.get(key)
        if value is not None and type(value) is not kind:
            raise Malformed(f"not a PyTorch profiler trace ({key} is {value!r}, expected {kind.__name__})")


def iter_trace_paths(folder: Path) -> Iterator[Path]:
    """Trace files under ``folder`` (``*.json`` and ``*.json.gz``), sorted."""
    yield from sorted(p for p in Path(folder).rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file())


__all__ = ["TRACE_EVENT_COLUMNS", "KinetoTrace", "iter_trace_paths", "read_kineto_trace"]
