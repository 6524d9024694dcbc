"""Reader for PyTorch profiler (Kineto) Chrome traces: ``.json`` or ``.json.gz``, streamed.

A trace is one JSON object: metadata keys (``schemaVersion``, ``distributedInfo``, ``baseTimeNanoseconds``,
``deviceProperties``, ``host_name``, ...) around a ``traceEvents`` list. Complete events (``ph: "X"``) have ``ts``
and ``dur`` in microseconds; ``ts * 1000 + baseTimeNanoseconds`` is unix-epoch nanoseconds (traces without
``baseTimeNanoseconds`` carry absolute microseconds). CPU ops (cat ``cpu_op``), ``record_function`` ranges
(``user_annotation``, including gloo's ``gloo:send`` / ``gloo:recv`` transfer spans) and, with CUDA activities,
GPU ``kernel`` / ``gpu_memcpy`` events on ``stream``s linked by ``correlation`` id to their ``cuda_runtime``
launch on the host.

Streaming: the file is decompressed and decoded in chunks, and each event is decoded on its own by the standard
library's C scanner (``json.JSONDecoder.raw_decode``) and reduced at once to one row of plain columns, so memory
holds the columns, never the document. Measured against ``ijson`` (C backend, ``items("traceEvents.item")``) with
the same reduction per event: the same speed, while ijson would need extra passes for the metadata keys around the
list; so no dependency is added. Most of the time goes to reducing events to rows, not to parsing.

Bad input raises UsageError with one line naming the file and what was found.
"""

from __future__ import annotations

import codecs
import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError

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
)

# Bytes per element of the dtype names the profiler writes in "Input type" (c10 spellings included).
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "Half": 2, "BFloat16": 2, "long int": 8,
    "long long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}  # fmt: skip
_COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "record_param_comms")
_PEER_OPS = ("c10d::send", "c10d::recv_", "c10d::recv_any_source_")
_ARG_OPS = ("c10d::", "_c10d_functional::")  # ops whose concrete inputs go to comm_args
PARAM_COMMS = "record_param_comms"
# What record_param_comms carries (torch/csrc/profiler/util.h); "Src Rank" / "Dst Rank" are a P2P op's peer.
COMM_ARG_KEYS = (
    "Collective name", "In msg nelems", "Out msg nelems", "dtype", "In split size", "Out split size",
    "Global rank start", "Global rank stride", "Group size", "Process Group Name", "Process Group Ranks", "Rank",
    "Src Rank", "Dst Rank", "Seq",
)  # fmt: skip
_CHUNK = 1 << 20  # bytes read per refill
_MAX_VALUE_CHARS = 64 << 20  # one event (or metadata value) larger than this is not a profiler trace
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


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

    @property
    def rank(self) -> int:
        return int(self.distributed_info.get("rank", -1))

    @property
    def world_size(self) -> int:
        return int(self.distributed_info.get("world_size", -1))

    @property
    def backend(self) -> str:
        return str(self.distributed_info.get("backend", ""))


class _Columns:
    """Complete events reduced to rows of plain values, packed into column arrays every ``_PACK`` events."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []  # one tuple per event, in _ROW_FIELDS order
        self.packed: list[dict[str, np.ndarray]] = []
        self.strings: dict[str, str] = {}  # one object per distinct name / category / dims text

    def add(self, event: dict) -> None:
        args = event.get("args") or {}
        get = args.get
        name = event.get("name", "")
        if type(name) is not str:
            name = str(name)
        cat = event.get("cat", "")
        if type(cat) is not str:
            cat = str(cat)
        pid, tid = event.get("pid"), event.get("tid")
        peer = tag = -1
        comm = ""
        if name in _PEER_OPS:
            peer, tag = _peer_and_tag(get("Concrete Inputs"))
        if name == PARAM_COMMS:
            found = {key: args[key] for key in COMM_ARG_KEYS if key in args}
            peer = _param_peer(found)
            comm = json.dumps(found, separators=(",", ":")) if found else ""
        elif name.startswith(_ARG_OPS) and "Concrete Inputs" in args:
            comm = json.dumps({"concrete": get("Concrete Inputs")}, separators=(",", ":"))
        dims, types = get("Input Dims"), get("Input type")
        dims_text = "" if dims is None else repr(dims).replace(" ", "")  # lists of ints: valid JSON
        types_text = "" if types is None else ",".join(map(str, types))
        nbytes = -1
        if "bytes" in args:  # memcpy / memset events count their own bytes
            nbytes = args["bytes"]
        elif name.startswith(_COMM_PREFIXES):
            nbytes = _message_bytes(args, dims, types)
        intern = self.strings.setdefault
        self.rows.append(
            (
                intern(name, name),
                intern(cat, cat),
                event.get("ts", math.nan),
                event.get("dur", 0.0),
                pid if type(pid) is int else -1,
                tid if type(tid) is int else -1,
                get("stream", -1),
                get("correlation", -1),
                get("External id", -1),
                peer,
                tag,
                intern(dims_text, dims_text),
                intern(types_text, types_text),
                nbytes,
                intern(comm, comm),
            )
        )
        if len(self.rows) >= _PACK:
            self.pack()

    def pack(self) -> None:
        """Move the rows into arrays (Python ints and floats cost about 4x the memory of int64 slots)."""
        if not self.rows:
            return
        values = dict(zip(_ROW_FIELDS, zip(*self.rows, strict=True), strict=True))
        self.rows = []
        try:
            chunk = {
                "ts": np.asarray(values["ts"], dtype=np.float64),
                "dur": np.asarray(values["dur"], dtype=np.float64),
            }
        except (TypeError, ValueError):
            raise _Malformed("not a PyTorch profiler trace (an event's ts or dur is not a number)") from None
        for name in _INT_COLUMNS:
            chunk[name] = _int_column(values[name])
        for name in _OBJECT_COLUMNS:
            chunk[name] = np.asarray(values[name], dtype=object)
        self.packed.append(chunk)

    def frame(self, base_time_ns: int) -> pd.DataFrame:
        self.pack()

        def joined(name, dtype):
            parts = [chunk[name] for chunk in self.packed]
            return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

        ts, dur = joined("ts", np.float64), joined("dur", np.float64)
        whole = np.floor(ts)  # microseconds: the integer part is exact in float64 up to 2**53 us
        start = whole.astype(np.int64) * 1000 + np.rint((ts - whole) * 1000).astype(np.int64) + base_time_ns
        dur_ns = np.rint(np.nan_to_num(dur) * 1000).astype(np.int64)
        columns = {"start_ns": start, "dur_ns": dur_ns, "end_ns": start + dur_ns}
        for name in _INT_COLUMNS:
            columns[name] = joined(name, np.int64)
        for name in _OBJECT_COLUMNS:
            columns[name] = joined(name, object)
        return pd.DataFrame(columns)[list(TRACE_EVENT_COLUMNS)]


_ROW_FIELDS = ("name", "cat", "ts", "dur", "pid", "tid", "stream", "correlation", "external_id", "peer", "tag",
               "input_dims", "input_types", "bytes", "comm_args")  # fmt: skip
_INT_COLUMNS = ("pid", "tid", "stream", "correlation", "external_id", "peer", "tag", "bytes")
_OBJECT_COLUMNS = ("name", "cat", "input_dims", "input_types", "comm_args")
_PACK = 1 << 16


def _int_column(values: list) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):  # a stray float or string: keep what is an integer
        return np.asarray([v if isinstance(v, int) else -1 for v in values], dtype=np.int64)


def _peer_and_tag(concrete) -> tuple[int, int]:
    """c10d::send(tensors, group, dstRank, tag) / c10d::recv_(tensors, group, srcRank, tag)."""
    try:
        return int(concrete[2]), int(concrete[3])
    except (TypeError, ValueError, IndexError):
        return -1, -1


def _param_peer(found: dict) -> int:
    """The peer of a P2P record_param_comms (send: "Dst Rank", recv: "Src Rank"); -1 for a collective."""
    name = str(found.get("Collective name", ""))
    key = "Dst Rank" if name.startswith("send") else "Src Rank" if name.startswith("recv") else None
    value = found.get(key) if key else None
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _message_bytes(args: dict, dims, types) -> int:
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


class _TextStream:
    """Decoded text of a (possibly gzip-compressed) file, read in chunks; ``pos`` indexes ``buffer``."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.buffer = ""
        self.pos = 0
        self.eof = False

    def refill(self) -> bool:
        """Append the next chunk (dropping what was consumed); False at the end of the file."""
        if self.eof:
            return False
        raw = self.handle.read(_CHUNK)
        self.eof = not raw
        text = self.decoder.decode(raw, final=self.eof)
        self.buffer = self.buffer[self.pos :] + text
        self.pos = 0
        return bool(text) or not self.eof

    def peek(self) -> str:
        """The next non-whitespace character ('' at the end of the file), without consuming it."""
        while True:
            self.pos = _WHITESPACE.match(self.buffer, self.pos).end()
            if self.pos < len(self.buffer):
                return self.buffer[self.pos]
            if not self.refill():
                return ""

    def expect(self, char: str, what: str) -> None:
        found = self.peek()
        if found == "":
            raise _Malformed(f"the JSON ends early (truncated file; expected {char!r} {what})")
        if found != char:
            raise _Malformed(f"expected {char!r} {what}, found {found!r}")
        self.pos += 1

    def value(self):
        """Decode the next JSON value; refills while the value may be cut at the end of the buffer."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buffer, self.pos)
            except json.JSONDecodeError as exc:
                # Near the end of the buffer the value may just be cut (a literal, number or string in half): read
                # on and retry. At the end of the file, or anywhere else, the text is not JSON.
                near_end = exc.pos >= len(self.buffer) - 16 or exc.msg.startswith("Unterminated string")
                if near_end and not self.eof and len(self.buffer) - self.pos < _MAX_VALUE_CHARS:
                    self.refill()  # re-bases the buffer: decode again before judging
                    continue
                if self.eof and (exc.pos >= len(self.buffer) - 1 or exc.msg.startswith("Unterminated string")):
                    raise _Malformed("the JSON ends early (truncated file)") from None
                raise _Malformed(f"not valid JSON ({exc.msg} at character {exc.pos - self.pos} of a value)") from None
            if end < len(self.buffer) or self.eof or not self.refill():  # a number may continue past the buffer
                self.pos = end
                return value


class _Malformed(Exception):
    """Internal: the text is not a profiler trace; turned into a UsageError naming the file."""


def _scan(stream: _TextStream, columns: _Columns) -> dict:
    """Walk the top-level object; complete events go to ``columns``, other keys are returned as metadata."""
    first = stream.peek()
    if first != "{":
        kind = {"[": "a JSON array", "": "an empty file"}.get(first, f"text starting with {first!r}")
        raise _Malformed(f"not a PyTorch profiler trace: found {kind}, expected a JSON object with traceEvents")
    stream.pos += 1
    metadata: dict = {}
    while stream.peek() != "}":
        if metadata:
            stream.expect(",", "between top-level keys")
        key = stream.value()
        if not isinstance(key, str):
            raise _Malformed(f"expected a key string, found {type(key).__name__}")
        stream.expect(":", f"after key {key!r}")
        if key == "traceEvents":
            metadata[key] = _scan_events(stream, columns)
        else:
            metadata[key] = stream.value()
        if stream.peek() == "":
            raise _Malformed("the JSON ends early (truncated file)")
    return metadata


def _scan_events(stream: _TextStream, columns: _Columns) -> int:
    stream.expect("[", "to open traceEvents")
    count = 0
    add = columns.add
    while stream.peek() != "]":
        if count:
            stream.expect(",", "between events")
        event = stream.value()
        if type(event) is not dict:
            raise _Malformed(f"event {count} is a {type(event).__name__}, not an object")
        if event.get("ph") == "X":
            add(event)
        count += 1
    stream.pos += 1
    return count


def _open(path: Path):
    handle = open(path, "rb")  # noqa: SIM115 - closed by the caller
    magic = handle.read(2)
    handle.seek(0)
    return gzip.GzipFile(fileobj=handle, mode="rb") if magic == b"\x1f\x8b" else handle


def read_kineto_trace(path: str | Path) -> KinetoTrace:
    """Read a profiler trace; bad input raises UsageError naming the file and what was found."""
    path = Path(path)
    columns = _Columns()
    try:
        with _open(path) as handle:
            metadata = _scan(_TextStream(handle), columns)
        _check_metadata(metadata)
        events = columns.frame(metadata.get("baseTimeNanoseconds", 0))
    except _Malformed as exc:
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
    )


def _check_metadata(metadata: dict) -> None:
    for key in ("traceEvents", "schemaVersion"):
        if key not in metadata:
            keys = ", ".join(sorted(metadata)[:8]) or "none"
            raise _Malformed(f"not a PyTorch profiler trace (no {key}; found keys: {keys})")
    for key, kind in (("schemaVersion", int), ("baseTimeNanoseconds", int), ("distributedInfo", dict)):
        value = metadata.get(key)
        if value is not None and type(value) is not kind:
            raise _Malformed(f"not a PyTorch profiler trace ({key} is {value!r}, expected {kind.__name__})")


def iter_trace_paths(folder: Path) -> Iterator[Path]:
    """Trace files under ``folder`` (``*.json`` and ``*.json.gz``), sorted."""
    yield from sorted(p for p in Path(folder).rglob("*") if p.name.endswith((".json", ".json.gz")) and p.is_file())
