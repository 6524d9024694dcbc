"""Baseline files: one run's per-iteration samples in a compact, versioned JSON fit to commit to a repository.

A baseline keeps what the gate needs and nothing else: the must-match metadata, each case's axes and its
per-iteration step times (ms, rounded to the nanosecond) per repeat; not the events table. One case per line keeps
diffs readable.

Format versions (``format_version``); every version ever written stays readable, with a fixture under
tests/data/gate/:
  1 -- first version (this file). Earlier versions: none.

Layout of version 1::

    {"format": "ringbench-baseline", "format_version": 1, "comment": "...", "created": "<ISO 8601 UTC>",
     "source": {"run_id": ..., "command": ..., "created": ...},
     "meta": {"schema_version": 1, "backend": ..., "device_kind": ..., "torch_version": ..., "emulated": ...},
     "unit": "ms",
     "cases": [{"case_id": ..., "axes": {<CASE_AXES and faults>}, "emulated": false,
                "repeats": [[<step_ms of each iteration of repeat 0>], ...]}, ...]}
A case may also carry "emulated_gflops" (the rate an emulated kernel ran at, e.g. the one emulated:auto chose);
readers that predate it ignore it, and a case without it compares with any rate.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ringbench.errors import UsageError
from ringbench.fmt import native
from ringbench.gate.match import MUST_MATCH_META
from ringbench.gate.samples import AXIS_DEFAULTS, MATCH_FIELDS, CaseSamples, SampleSet
from ringbench.record.atomic import write_bytes

BASELINE_FORMAT = "ringbench-baseline"
BASELINE_VERSION = 1
_META_KEYS = ("schema_version", *MUST_MATCH_META)
_COMMENT = (
    "ringbench baseline: per-iteration step times (ms) per repeat of each case, for `ringbench compare`. "
    "Written by `ringbench baseline save RUN_DIR PATH`; regenerate rather than edit."
)


def baseline_document(samples: SampleSet) -> dict:
    """The version-1 baseline document of one side (usually a run)."""
    meta = samples.meta
    return {
        "format": BASELINE_FORMAT,
        "format_version": BASELINE_VERSION,
        "comment": _COMMENT,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "source": {"run_id": samples.run_id, "command": meta.get("command"), "created": meta.get("created")},
        "meta": {key: native(meta.get(key)) for key in _META_KEYS} | {"emulated": samples.emulated},
        "unit": "ms",
        "cases": [
            {
                "case_id": case.case_ids[0],
                "axes": {name: native(case.axes.get(name)) for name in MATCH_FIELDS},
                "emulated": case.emulated,
                **({"emulated_gflops": case.emulated_gflops} if case.emulated_gflops is not None else {}),
                "repeats": [[round(float(value), 6) for value in repeat] for repeat in case.repeats],
            }
            for case in samples.cases
        ],
    }


def dumps_baseline(document: dict) -> str:
    """Indented JSON, except that each case sits on one line (a baseline of 20 cases is 20 lines of cases)."""
    head = {key: value for key, value in document.items() if key != "cases"}
    text = json.dumps(head, indent=2, allow_nan=False)
    cases = ",\n".join(
        "    " + json.dumps(case, allow_nan=False, separators=(", ", ": ")) for case in document["cases"]
    )
    return text[:-2] + ',\n  "cases": [\n' + cases + "\n  ]\n}\n"


def write_baseline(samples: SampleSet, path: str | Path) -> Path:
    """Write ``samples`` as a baseline file, atomically (temporary file in the same folder, fsync, rename)."""
    if not samples.cases:
        raise UsageError(f"{samples.source}: no case has timed iterations; nothing to save as a baseline")
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"path={str(path)!r} is a directory; expected a file name such as baseline.json")
    write_bytes(path, dumps_baseline(baseline_document(samples)).encode())
    return path


def _read_v1(document: dict, source: str) -> SampleSet:
    cases = []
    for index, case in enumerate(document.get("cases", [])):
        try:
            repeats = tuple(np.asarray(repeat, dtype=float) for repeat in case["repeats"] if len(repeat))
            axes = {name: native(case["axes"].get(name, AXIS_DEFAULTS.get(name))) for name in MATCH_FIELDS}
            if axes.get("strategy") is None:  # a baseline from before strategies: the ring, or allgather's
                axes["strategy"] = "allgather" if axes.get("buffer") == "allgather" else "ring"
            cases.append(
                CaseSamples(
                    axes=axes,
                    emulated=bool(case.get("emulated", False)),
                    case_ids=(str(case.get("case_id", f"case{index}")),),
                    repeats=repeats,
                    emulated_gflops=case.get("emulated_gflops"),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{source}: case #{index} is malformed ({type(exc).__name__}: {exc})") from None
    return SampleSet(
        source=source,
        kind="baseline",
        run_id=str(document.get("source", {}).get("run_id")),
        meta=dict(document.get("meta", {})),
        cases=tuple(case for case in cases if case.repeats),
    )


_READERS = {1: _read_v1}


def read_baseline(path: str | Path) -> SampleSet:
    """Read a baseline file of any known format version; a bad file raises UsageError with one line."""
    source = str(path)
    try:
        document = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"baseline file {source!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source}: not a ringbench baseline (not valid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != BASELINE_FORMAT:
        raise UsageError(f'{source}: not a ringbench baseline (expected "format": "{BASELINE_FORMAT}")')
    version = document.get("format_version")
    reader = _READERS.get(version)
    if reader is None:
        known = ", ".join(str(v) for v in _READERS)
        raise UsageError(f"{source}: format_version={version!r} is not supported; expected one of: {known}")
    return reader(document, source)
