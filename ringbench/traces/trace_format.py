"""What ringbench keeps of a PyTorch profiler (Kineto) trace's events: the columns, the names of the
communication ops and their arguments, bytes from shapes and dtypes, and opening a (gzipped) file. Shared by the
readers (kineto_fast.py: msgspec, whole or streamed; kineto_scan.py: the standard library's careful scanner) and
the reader's front (kineto.py).
"""

from __future__ import annotations

import gzip
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

TRACE_EVENT_COLUMNS = (
    "name",
    "cat",
    "start_ns",  # unix-epoch ns (int64)
    "dur_ns",
    "end_ns",
    "pid",  # process id (GPU events: device index); -1 where the trace names a non-numeric lane
    "tid",  # thread id (GPU events: stream); -1 where non-numeric
    "stream",  # GPU stream (kernel, memcpy, memset); -1 on host events
    "correlation",  # links a GPU event to its host launch (cuda_runtime / cuda_driver); -1 if none
    "external_id",  # links host ops to the launches they made; -1 if none
    "peer",  # c10d::send / c10d::recv_: the peer rank (concrete input 2); -1 otherwise
    "tag",  # c10d::send / c10d::recv_: the tag (concrete input 3); -1 otherwise
    "input_dims",  # args "Input Dims" as compact JSON, e.g. "[[2,1,4,512,64],[]]" ("" when absent)
    "input_types",  # args "Input type" joined by commas, e.g. "float,Scalar" ("" when absent)
    "bytes",  # communication spans and copies: bytes moved, from dims x dtype (or the trace's own count); -1
    # communication ops only: their arguments as compact JSON ("" otherwise). record_param_comms: the keys of
    # COMM_ARG_KEYS it has (collective name, message sizes, split sizes, group, peers, sequence number); c10d and
    # functional-collective ops: {"concrete": their concrete inputs} (e.g. an all-to-all's split sizes)
    "comm_args",
)  # the text columns (name, cat, input_dims, input_types, comm_args) are categoricals

# Bytes per element of the dtype names the profiler writes in "Input type" (c10 spellings included).
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2, "long int": 8,
    "long long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}  # fmt: skip
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "record_param_comms")
PEER_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
ARG_OPS = ("c10d::", "_c10d_functional::")  # ops whose concrete inputs go to comm_args
PARAM_COMMS = "record_param_comms"
# What record_param_comms carries (torch/csrc/profiler/util.h); "Src Rank" / "Dst Rank" are a P2P op's peer.
COMM_ARG_KEYS = (
    "Collective name", "In msg nelems", "Out msg nelems", "dtype", "In split size", "Out split size",
    "Global rank start", "Global rank stride", "Group size", "Process Group Name", "Process Group Ranks", "Rank",
    "Src Rank", "Dst Rank", "Seq",
)  # fmt: skip
# A trace's JSON up to this size is decoded whole (the text and its events in memory at once: about three times
# the file); a larger one is streamed in CHUNK_MB chunks, so the reader holds a chunk or two of text and their
# events, never the document. Small chunks cost nothing in speed (measured: 2 MB chunks read a 56 MB trace 20-40%
# faster than 8 MB ones or the whole file, the decoded events staying in the CPU's caches).
MEMORY_BUDGET_MB = float(os.environ.get("RINGBENCH_IMPORT_MEMORY_MB", "2"))
CHUNK_MB = 2  # the streamed path's read size
INT_COLUMNS = ("pid", "tid", "stream", "correlation", "external_id", "peer", "tag", "bytes")
OBJECT_COLUMNS = ("name", "cat", "input_dims", "input_types", "comm_args")


@dataclass(frozen=True, kw_only=True, slots=True)
class KinetoTrace:
    """One rank's profiler trace: its metadata and a DataFrame of complete events (TRACE_EVENT_COLUMNS)."""

    path: Path
    schema_version: int
    base_time_ns: int  # added to ts * 1000 (0: the trace's ts are absolute unix-epoch microseconds)
    distributed_info: dict = field(default_factory=dict)  # backend, rank, world_size, pg_config, ...
    host_name: str = ""
    device_properties: tuple = ()  # one dict per visible GPU (name, totalGlobalMem, computeMajor, ...)
    events: pd.DataFrame = field(default_factory=pd.DataFrame)
    reader: str = ""  # how it was read: "whole file (msgspec)", "streamed (msgspec)", "careful (stdlib)"

    @property
    def rank(self) -> int:
        return int(self.distributed_info.get("rank", -1))

    @property
    def world_size(self) -> int:
        return int(self.distributed_info.get("world_size", -1))

    @property
    def backend(self) -> str:
        return str(self.distributed_info.get("backend", ""))


class Malformed(Exception):
    """Internal: the text is not a profiler trace; turned into a UsageError naming the file."""


def peer_and_tag(concrete) -> tuple[int, int]:
    """c10d::send(tensors, group, dstRank, tag) / c10d::recv_(tensors, group, srcRank, tag)."""
    try:
        return int(concrete[2]), int(concrete[3])
    except (TypeError, ValueError, IndexError):
        return -1, -1


def param_peer(found: dict) -> int:
    """The peer of a P2P record_param_comms (send: "Dst Rank", recv: "Src Rank"); -1 for a collective."""
    name = str(found.get("Collective name", ""))
    key = "Dst Rank" if name.startswith("send") else "Src Rank" if name.startswith("recv") else None
    value = found.get(key) if key else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def message_bytes(args: dict, dims, types) -> int:
    """Bytes of a communication span: the trace's own count when it has one, else product(dims) x dtype size."""
    nelems, dtype = args.get("In msg nelems"), args.get("dtype")
    if isinstance(nelems, int) and dtype in DTYPE_BYTES:
        return nelems * DTYPE_BYTES[dtype]
    if not isinstance(dims, list) or not isinstance(types, list):
        return -1
    total, found = 0, False
    for shape, dtype in zip(dims, types, strict=False):
        size = DTYPE_BYTES.get(dtype)
        if size is not None and isinstance(shape, list) and all(isinstance(n, int) for n in shape):
            total += math.prod(shape) * size
            found = True
    return total if found else -1


def int_column(values) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):  # a stray float or string: keep what is an integer
        return np.asarray([v if isinstance(v, int) and not isinstance(v, bool) else -1 for v in values], np.int64)


def events_frame(chunks: list[dict[str, np.ndarray]], base_time_ns: int) -> pd.DataFrame:
    """Column chunks (ts, dur in float microseconds, INT_COLUMNS, OBJECT_COLUMNS) -> the events DataFrame."""

    def joined(name, dtype):  # each chunk's column is dropped once joined: the columns are never held twice
        parts = [chunk.pop(name) for chunk in chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    ts, dur = joined("ts", np.float64), joined("dur", np.float64)
    whole = np.floor(ts)  # microseconds: the integer part is exact in float64 up to 2**53 us
    start = whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000).astype(np.int64) + base_time_ns
    dur_ns = np.rint(np.nan_to_num(dur) * 1000).astype(np.int64)
    columns = {"start_ns": start, "dur_ns": dur_ns, "end_ns": start + dur_ns}
    for name in INT_COLUMNS:
        columns[name] = joined(name, np.int64)
    for name in OBJECT_COLUMNS:
        # A trace repeats a few dozen names and a few hundred shapes over its events: as categoricals a text column
        # costs a small integer per event (as Arrow strings, a 56 MB trace's took 30 MB), and every test of a
        # text runs once per distinct value.
        columns[name] = pd.Categorical(joined(name, object))
    return pd.DataFrame(columns, copy=False)[list(TRACE_EVENT_COLUMNS)]


def open_trace(path: Path):
    """A binary handle on the trace's JSON (gzip decompressed on the fly when the content is gzip)."""
    handle = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = handle.read(2)
    handle.seek(0)
    return gzip.GzipFile(fileobj=handle, mode="rb") if magic == b"\x1f\x8b" else handle


def json_size(path: Path) -> int:
    """Bytes of the trace's JSON: the file's size, or for gzip its trailer's uncompressed size (modulo 4 GiB,
    so at least the compressed size times the usual ratio's floor)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        if handle.read(2) != b"\x1f\x8b" or size < 18:
            return size
        handle.seek(-4, os.SEEK_END)
        stated = int.from_bytes(handle.read(4), "little")
    while stated < size:  # the trailer wraps at 4 GiB
        stated += 1 << 32
    return stated
