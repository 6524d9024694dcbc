"""The fast reader of a profiler trace: msgspec's C decoder into typed structs, whole or in chunks.

Each event decodes into an ``_Event`` that holds only what the record needs: its phase, name, category, times,
lanes and an ``_Args`` whose bulky values (input dims and types, concrete inputs, the communication keys) stay raw
JSON bytes; every other field of the file is skipped by the decoder itself. Reduction to columns then touches each
event a few times in list comprehensions, and decodes raw values only for the few events that need them
(communication ops) or once per distinct text (dims and types repeat: a cache keyed by the raw bytes).

Whole file: one ``msgspec.json.decode`` of the (decompressed) bytes. Streamed: the text is read in chunks; the
events array is cut after the last complete event of a chunk (the last ``}`` followed by ``,`` that decodes as a
list of events with everything before it -- a cut inside a string or a nested object fails to decode and the
previous candidate is tried), decoded and reduced at once, and the rest carried over. The metadata keys before
and after the array are decoded as one small object.

Anything the typed decoder rejects (not JSON, a truncated file, a field of an unusual type) raises ``Unusual``:
the careful reader (kineto_scan.py) then reads the file and words the error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import numpy as np

from ringbench.traces.trace_format import (
    ARG_OPS,
    COMM_ARG_KEYS,
    COMM_PREFIXES,
    PARAM_COMMS,
    PEER_OPS,
    int_column,
    message_bytes,
    open_trace,
    param_peer,
    peer_and_tag,
)

_NONE = msgspec.Raw()
_COMM_FIELDS = tuple(f"k{i}" for i in range(len(COMM_ARG_KEYS)))


class Unusual(Exception):
    """The typed decoder could not read the file: the careful reader decides."""


def _args_struct():
    fields = [
        ("dims", msgspec.Raw, msgspec.field(name="Input Dims", default=_NONE)),
        ("types", msgspec.Raw, msgspec.field(name="Input type", default=_NONE)),
        ("concrete", msgspec.Raw, msgspec.field(name="Concrete Inputs", default=_NONE)),
        ("stream", int, -1),
        ("correlation", int, -1),
        ("external", int, msgspec.field(name="External id", default=-1)),
        ("nbytes", object, msgspec.field(name="bytes", default=msgspec.UNSET)),  # UNSET: no "bytes" key
    ]
    fields += [(f, msgspec.Raw, msgspec.field(name=key, default=_NONE)) for f, key in zip(_COMM_FIELDS, COMM_ARG_KEYS,
                                                                                          strict=True)]  # fmt: skip
    return msgspec.defstruct("_Args", fields, gc=False)


_Args = _args_struct()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float = float("nan")
    dur: float = 0.0
    pid: int | str = -1
    tid: int | str = -1
    args: _Args = msgspec.field(default_factory=_Args)  # the fields the record needs; the decoder skips the rest


class _Whole(msgspec.Struct):
    traceEvents: list[_Event] | msgspec.UnsetType = msgspec.UNSET
    schemaVersion: object = msgspec.UNSET
    baseTimeNanoseconds: object = msgspec.UNSET
    distributedInfo: object = msgspec.UNSET
    host_name: object = msgspec.UNSET
    deviceProperties: object = msgspec.UNSET


_WHOLE = msgspec.json.Decoder(_Whole)
_SLICE = 1 << 15  # events reduced at once
_EVENTS = msgspec.json.Decoder(list[_Event])
_ANY = msgspec.json.Decoder()
_META_KEYS = ("schemaVersion", "baseTimeNanoseconds", "distributedInfo", "host_name", "deviceProperties")


def _raw(value) -> bytes:
    return bytes(value)


def _compact(raw: bytes) -> str:
    return b"".join(raw.split()).decode()


class _Reducer:
    """Events -> column chunks, with caches of the texts that repeat across events."""

    def __init__(self) -> None:
        self.chunks: list[dict[str, np.ndarray]] = []
        self.strings: dict[str, str] = {}
        self.dims: dict[bytes, str] = {b"": ""}
        self.types: dict[bytes, str] = {b"": ""}

    def add(self, events: list) -> None:
        events = [e for e in events if e.ph == "X"]
        for start in range(0, len(events), _SLICE):
            self._add(events[start : start + _SLICE])

    def _add(self, events: list) -> None:
        if not events:
            return
        intern = self.strings.setdefault
        names = [intern(e.name, e.name) for e in events]
        cats = [intern(e.cat, e.cat) for e in events]
        args = [e.args for e in events]
        dims, types = self.dims, self.types
        dims_raw = [_raw(a.dims) for a in args]
        types_raw = [_raw(a.types) for a in args]
        for raw in set(dims_raw) - dims.keys():
            dims[raw] = intern(text := _compact(raw), text)
        for raw in set(types_raw) - types.keys():
            listed = _ANY.decode(raw)
            text = ",".join(map(str, listed)) if isinstance(listed, list) else ""
            types[raw] = intern(text, text)
        n = len(events)
        peer, tag = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
        nbytes = np.full(n, -1, np.int64)
        comm = [""] * n
        for i in [i for i, a in enumerate(args) if a.nbytes is not msgspec.UNSET]:
            value = args[i].nbytes
            nbytes[i] = value if isinstance(value, int) and not isinstance(value, bool) else -1
        for i in [i for i, name in enumerate(names) if name.startswith(COMM_PREFIXES)]:
            name, a = names[i], args[i]
            found = {}
            if name == PARAM_COMMS:
                found = {key: _ANY.decode(_raw(getattr(a, f))) for f, key in zip(_COMM_FIELDS, COMM_ARG_KEYS,
                                                                                  strict=True) if _raw(getattr(a, f))}  # fmt: skip
                peer[i] = param_peer(found)
                comm[i] = intern(text := json.dumps(found, separators=(",", ":")) if found else "", text)
            concrete = _raw(a.concrete)
            if name in PEER_OPS and concrete:
                peer[i], tag[i] = peer_and_tag(_ANY.decode(concrete))
            if name != PARAM_COMMS and name.startswith(ARG_OPS) and concrete:
                text = json.dumps({"concrete": _ANY.decode(concrete)}, separators=(",", ":"))
                comm[i] = intern(text, text)
            if nbytes[i] < 0 and a.nbytes is msgspec.UNSET:
                dims_value = _ANY.decode(dims_raw[i]) if dims_raw[i] else None
                types_value = _ANY.decode(types_raw[i]) if types_raw[i] else None
                nbytes[i] = message_bytes(found, dims_value, types_value)
        self.chunks.append(
            {
                "ts": np.fromiter((e.ts for e in events), np.float64, n),
                "dur": np.fromiter((e.dur for e in events), np.float64, n),
                "pid": int_column([e.pid if type(e.pid) is int else -1 for e in events]),
                "tid": int_column([e.tid if type(e.tid) is int else -1 for e in events]),
                "stream": np.fromiter((a.stream for a in args), np.int64, n),
                "correlation": np.fromiter((a.correlation for a in args), np.int64, n),
                "external_id": np.fromiter((a.external for a in args), np.int64, n),
                "peer": peer,
                "tag": tag,
                "bytes": nbytes,
                "name": np.array(names, dtype=object),
                "cat": np.array(cats, dtype=object),
                "input_dims": np.array([dims[r] for r in dims_raw], dtype=object),
                "input_types": np.array([types[r] for r in types_raw], dtype=object),
                "comm_args": np.array(comm, dtype=object),
            }
        )


def read(path: Path, *, whole: bool, chunk_bytes: int, progress: Callable[[int], None] | None = None):
    """(metadata, column chunks) of a trace; Unusual when the typed decoder cannot read it."""
    reducer = _Reducer()
    try:
        if whole:
            data = bytearray()
            with open_trace(path) as handle:
                while chunk := handle.read(16 << 20):
                    data += chunk
                    if progress is not None:
                        progress(len(chunk))
            document = _WHOLE.decode(data)
            del data
            if document.traceEvents is msgspec.UNSET or document.schemaVersion is msgspec.UNSET:
                raise Unusual("not a profiler trace")  # the careful reader names the keys it has
            reducer.add(document.traceEvents)
            metadata = {
                key: getattr(document, key) for key in _META_KEYS if getattr(document, key) is not msgspec.UNSET
            }
            metadata["traceEvents"] = len(document.traceEvents)
        else:
            metadata = _stream(path, reducer, chunk_bytes, progress)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        raise Unusual(str(exc)) from None
    return metadata, reducer.chunks


_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_CLOSE = re.compile(rb"\}\s*\]")


def _stream(path: Path, reducer: _Reducer, chunk_bytes: int, progress) -> dict:
    """The streamed path (module doc). The buffer always opens with the events array's ``[``: a cut turns the
    comma after the last whole event into ``]`` to decode the events in place (no copy), and the rest (opened
    with ``[`` again) becomes the next buffer."""
    with open_trace(path) as handle:
        buffer = bytearray()
        while True:  # the head: everything up to the events array
            found = _KEY.search(buffer)
            if found:
                break
            data = handle.read(chunk_bytes)
            if not data:
                raise Unusual("no traceEvents")
            buffer += data
            if progress is not None:
                progress(len(data))
        head = bytes(buffer[: found.start()]).rstrip()
        buffer = bytearray(buffer[found.end() - 1 :])  # from the "["
        count, eof = 0, False
        while True:
            if not eof:
                data = handle.read(chunk_bytes)
                eof = not data
                buffer += data
                if progress is not None and data:
                    progress(len(data))
                del data
            if eof:
                break
            cut = _last_cut(buffer)
            if cut is None:
                continue
            events, buffer = cut
            del cut
            count += len(events)
            reducer.add(events)
            del events  # the chunk's events (and the text they point into) go before the next chunk is read
        events, tail = _final(buffer)
        count += len(events)
        reducer.add(events)
    text = head + (b"," if not head.endswith((b"{", b",")) else b"") + bytes(tail).lstrip().lstrip(b",")
    metadata = _ANY.decode(text if text.rstrip().endswith(b"}") else text + b"}")
    if not isinstance(metadata, dict) or "schemaVersion" not in metadata:
        raise Unusual("not a profiler trace")
    metadata["traceEvents"] = count
    return metadata


def _last_cut(buffer: bytearray):
    """(events, the rest opened with ``[``) cut after the last complete event of ``buffer`` (a few candidates
    tried), or None."""
    end = len(buffer)
    for _ in range(8):
        brace = buffer.rfind(b"}", 0, end)
        if brace < 0:
            return None
        comma = brace + 1
        while comma < len(buffer) and buffer[comma] in b" \t\r\n":
            comma += 1
        if comma < len(buffer) and buffer[comma] == ord(","):
            buffer[comma] = ord("]")
            try:
                events = _EVENTS.decode(memoryview(buffer)[: comma + 1])
            except (msgspec.DecodeError, msgspec.ValidationError):
                events = None
            buffer[comma] = ord("[")
            if events is not None:
                return events, bytearray(memoryview(buffer)[comma:])
        end = brace
    return None


def _final(buffer: bytearray):
    """(the last events, the text after the array) at the end of the file."""
    for close in _CLOSE.finditer(buffer):
        try:
            events = _EVENTS.decode(memoryview(buffer)[: close.end()])
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        return events, bytes(buffer[close.end() :])
    rest = bytes(buffer).strip()
    if rest.startswith(b"[") and rest[1:].strip().startswith(b"]"):  # an empty array, or one that ended at a cut
        return [], rest[1:].strip()[1:]
    raise Unusual("the events array does not close")


__all__ = ["Unusual", "read"]
