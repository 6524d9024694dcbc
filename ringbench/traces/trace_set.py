"""The traces of one job: one PyTorch profiler trace per rank, found, read, checked and described.

``find_trace_files(paths)`` takes folders and files (a folder holds ``*.json`` / ``*.json.gz`` traces, searched
recursively); ``check_ranks`` checks that the traces are one job's: every rank of ``distributedInfo.world_size``
exactly once, one backend and one world size, overlapping in time. Each problem raises UsageError with one line
that says what was found and what to pass.

The files' names, sizes and SHA-256 hashes go into the imported record's meta.json (``describe_file``), so a
record says exactly which traces it came from.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from ringbench.errors import UsageError

TRACE_SUFFIXES = (".json", ".json.gz")
# Traces of one job overlap in time; windows further apart than this are different jobs (or runs of one job).
# Generous: the hosts' wall clocks may disagree by seconds before the import aligns them.
SAME_JOB_GAP_S = 600.0
# On one host the traces share a clock: the ranks of one run are profiled at the same time, give or take the start.
SAME_HOST_GAP_S = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class TraceFile:
    """What the import keeps about one trace file (meta.json ``traces``)."""

    path: Path
    rank: int
    world_size: int
    backend: str
    host: str
    size_bytes: int
    sha256: str
    first_ns: int  # earliest event start, unix-epoch ns (the trace's base time applied)
    last_ns: int
    distributed_info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "file": self.path.name,
            "rank": self.rank,
            "host": self.host,
            "bytes": self.size_bytes,
            "sha256": self.sha256,
            "backend": self.backend,
            "world_size": self.world_size,
        }


def find_trace_files(paths) -> list[Path]:
    """The trace files named by ``paths`` (files, or folders searched for ``*.json`` / ``*.json.gz``), sorted."""
    found: list[Path] = []
    if not paths:
        raise UsageError("no traces given: pass the profiler's trace files (one per rank) or a folder holding them")
    for entry in paths:
        path = Path(entry)
        if path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not inside:
                raise UsageError(f"{path}: no *.json or *.json.gz traces in this folder; pass the profiler's traces")
            found.extend(inside)
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{path}: no such file or folder; pass the profiler's traces (one per rank)")
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return [Path(p) for p in unique]


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex) of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def describe_file(path: Path, trace, first_ns: int, last_ns: int) -> TraceFile:
    """A TraceFile from a read KinetoTrace (ringbench.traces.kineto) and its time window."""
    size, sha = file_digest(path)
    info = trace.distributed_info
    if not info or "rank" not in info:
        raise UsageError(
            f"{path}: the trace has no distributedInfo.rank (was it recorded inside an initialised process group?); "
            "pass traces of a torch.distributed program, one per rank"
        )
    return TraceFile(
        path=Path(path), rank=trace.rank, world_size=trace.world_size, backend=trace.backend,
        host=trace.host_name or "", size_bytes=size, sha256=sha, first_ns=first_ns, last_ns=last_ns,
        distributed_info=dict(info),
    )  # fmt: skip


def _names(files) -> str:
    return ", ".join(f.path.name for f in files)


def check_ranks(files: list[TraceFile], complete: bool = True) -> int:
    """Check that the traces are one job's, one per rank (every rank with ``complete``); returns the world size.
    UsageError otherwise."""
    worlds = sorted({f.world_size for f in files})
    if len(worlds) > 1:
        detail = "; ".join(f"world_size {w}: {_names([f for f in files if f.world_size == w])}" for w in worlds)
        raise UsageError(f"traces of different jobs ({detail}); pass the traces of one job")
    backends = sorted({f.backend for f in files})
    if len(backends) > 1:
        raise UsageError(f"traces of different jobs (backends {', '.join(backends)}); pass the traces of one job")
    world = worlds[0]
    by_rank: dict[int, list[TraceFile]] = {}
    for f in files:
        by_rank.setdefault(f.rank, []).append(f)
    doubled = {rank: group for rank, group in by_rank.items() if len(group) > 1}
    if doubled:
        rank, group = sorted(doubled.items())[0]
        hint = (
            " (ringbench run --profile writes one folder per case under profile/: pass one of them)"
            if len({f.path.name for f in group}) == 1 else ""
        )  # fmt: skip
        raise UsageError(
            f"rank {rank} appears in {len(group)} traces ({_names(group[:4])}{', ...' if len(group) > 4 else ''})"
            f"; pass one trace per rank{hint}"
        )
    strangers = sorted(r for r in by_rank if not 0 <= r < world)
    if strangers:
        raise UsageError(f"rank {strangers[0]} is outside world_size {world} ({_names(by_rank[strangers[0]])})")
    first, last = min(f.first_ns for f in files), max(f.last_ns for f in files)
    latest_start = max(f.first_ns for f in files)
    earliest_end = min(f.last_ns for f in files)
    hosts = {f.host for f in files}
    gap_limit_s = SAME_HOST_GAP_S if len(hosts) == 1 and "" not in hosts else SAME_JOB_GAP_S
    if latest_start - earliest_end > gap_limit_s * 1e9:
        early = min(files, key=lambda f: f.last_ns)
        late = max(files, key=lambda f: f.first_ns)
        gap_s = (late.first_ns - early.last_ns) / 1e9
        raise UsageError(
            f"traces of different jobs: {late.path.name} starts {gap_s:.0f} s after {early.path.name} ends "
            f"(traces span {(last - first) / 1e9:.0f} s); pass traces of one run of one job"
        )
    missing = [r for r in range(world) if r not in by_rank]
    if missing and complete:
        shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
        raise UsageError(
            f"rank(s) {shown} missing: found traces of {len(by_rank)} of {world} ranks "
            f"({', '.join(map(str, sorted(by_rank)))}); pass one trace for every rank of the job"
        )
    return world


__all__ = ["TraceFile", "check_ranks", "describe_file", "file_digest", "find_trace_files"]
