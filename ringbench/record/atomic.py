"""Atomic file writes: every file ringbench produces appears whole or not at all.

Write to a temporary file in the same folder, fsync, rename over the target (0644, to be shared). Results,
metadata, reports, baselines and profiler captures all go through here.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """Write through ``write(handle)`` into a temporary file beside ``path``, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results and reports are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data``."""
    atomic_write(path, lambda handle: handle.write(data))


def write_json(path: Path, document: dict) -> None:
    data = json.dumps(document, indent=2, sort_keys=True, default=str).encode()
    write_bytes(Path(path), data)
