"""The careful reader of a profiler trace: the standard library's JSON scanner, value by value, streamed.

The fast reader (kineto_fast.py) hands a file here when its typed decoder rejects it. This one accepts any valid
JSON (an event's field of an unusual type included) and, for bad input, says in one line what is wrong and where:
the file is decompressed and decoded in chunks, each event decoded on its own by ``json.JSONDecoder.raw_decode``
(C) and reduced at once to one row of plain columns, so memory holds the columns, never the document. About
37 MB/s: reducing events to rows in Python costs most of it.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from pathlib import Path

import numpy as np

from ringbench.traces.trace_format import (
    ARG_OPS,
    COMM_ARG_KEYS,
    COMM_PREFIXES,
    INT_COLUMNS,
    OBJECT_COLUMNS,
    PARAM_COMMS,
    PEER_OPS,
    Malformed,
    int_column,
    message_bytes,
    open_trace,
    param_peer,
    peer_and_tag,
)

_CHUNK = 1 << 20  # bytes read per refill
_MAX_VALUE_CHARS = 64 << 20  # one event (or metadata value) larger than this is not a profiler trace
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


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
        if name in PEER_OPS:
            peer, tag = peer_and_tag(get("Concrete Inputs"))
        if name == PARAM_COMMS:
            found = {key: args[key] for key in COMM_ARG_KEYS if key in args}
            peer = param_peer(found)
            comm = json.dumps(found, separators=(",", ":")) if found else ""
        elif name.startswith(ARG_OPS) and "Concrete Inputs" in args:
            comm = json.dumps({"concrete": get("Concrete Inputs")}, separators=(",", ":"))
        dims, types = get("Input Dims"), get("Input type")
        dims_text = "" if dims is None else repr(dims).replace(" ", "")  # lists of ints: valid JSON
        types_text = "" if types is None else ",".join(map(str, types))
        nbytes = -1
        if "bytes" in args:  # memcpy / memset events count their own bytes
            nbytes = args["bytes"]
        elif name.startswith(COMM_PREFIXES):
            nbytes = message_bytes(args, dims, types)
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
            raise Malformed("not a PyTorch profiler trace (an event's ts or dur is not a number)") from None
        for name in INT_COLUMNS:
            chunk[name] = int_column(values[name])
        for name in OBJECT_COLUMNS:
            chunk[name] = np.asarray(values[name], dtype=object)
        self.packed.append(chunk)

    def chunks(self) -> list[dict[str, np.ndarray]]:
        self.pack()
        return self.packed


_ROW_FIELDS = ("name", "cat", "ts", "dur", "pid", "tid", "stream", "correlation", "external_id", "peer", "tag",
               "input_dims", "input_types", "bytes", "comm_args")  # fmt: skip
_PACK = 1 << 16


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
            raise Malformed(f"the JSON ends early (truncated file; expected {char!r} {what})")
        if found != char:
            raise Malformed(f"expected {char!r} {what}, found {found!r}")
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
                    raise Malformed("the JSON ends early (truncated file)") from None
                raise Malformed(f"not valid JSON ({exc.msg} at character {exc.pos - self.pos} of a value)") from None
            if end < len(self.buffer) or self.eof or not self.refill():  # a number may continue past the buffer
                self.pos = end
                return value


def _scan(stream: _TextStream, columns: _Columns) -> dict:
    """Walk the top-level object; complete events go to ``columns``, other keys are returned as metadata."""
    first = stream.peek()
    if first != "{":
        kind = {"[": "a JSON array", "": "an empty file"}.get(first, f"text starting with {first!r}")
        raise Malformed(f"not a PyTorch profiler trace: found {kind}, expected a JSON object with traceEvents")
    stream.pos += 1
    metadata: dict = {}
    while stream.peek() != "}":
        if metadata:
            stream.expect(",", "between top-level keys")
        key = stream.value()
        if not isinstance(key, str):
            raise Malformed(f"expected a key string, found {type(key).__name__}")
        stream.expect(":", f"after key {key!r}")
        if key == "traceEvents":
            metadata[key] = _scan_events(stream, columns)
        else:
            metadata[key] = stream.value()
        if stream.peek() == "":
            raise Malformed("the JSON ends early (truncated file)")
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
            raise Malformed(f"event {count} is a {type(event).__name__}, not an object")
        if event.get("ph") == "X":
            add(event)
        count += 1
    stream.pos += 1
    return count


def read(path: Path) -> tuple[dict, list[dict[str, np.ndarray]]]:
    """(metadata, column chunks) of a trace; Malformed (a line) for text that is not a profiler trace."""
    columns = _Columns()
    with open_trace(path) as handle:
        metadata = _scan(_TextStream(handle), columns)
    return metadata, columns.chunks()
