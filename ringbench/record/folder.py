"""A results folder being written, for every producer: `results/<run-id>/` with events, cases and meta.json.

    folder = RecordFolder.create(out, "default", meta, producer="run")   # a new, uniquely named folder
    folder.add(events, row)                                            # one atomic rewrite per finished case
    folder = RecordFolder.reopen(run_dir)                              # an existing record, to add to it
    RecordFolder.write(run, "simulate")                                # a whole record at once, at run.path

Every producer stores here: the measured run case by case (run/results.py: ``ResultsFolder`` adds its cases'
figures and notes; ``ringbench calibrate`` then adds the fitted costs to its meta.json), the simulator and the trace
importer, which make every case before they write, with ``write``. One name scheme (``new_run_dir``), one meta.json
writer (record/meta.py), one atomic store (record/store.py), so an interrupted producer loses nothing it finished.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ringbench.errors import UsageError
from ringbench.record import store
from ringbench.record.meta import RunMeta, write_meta
from ringbench.record.schema import CASE_COLUMNS, SCHEMA_VERSION
from ringbench.record.store import RunData


def new_run_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:40] or "run"
    return f"{stamp}-{safe}"


def new_run_dir(out: str | Path, name: str) -> Path:
    """Create results/<run-id>/ (a suffix keeps two runs started within one second apart)."""
    base_id = run_id = new_run_id(name)
    suffix = 1
    while True:
        run_dir = Path(out) / run_id
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            suffix += 1
            run_id = f"{base_id}-{suffix}"
        except OSError as exc:
            raise UsageError(f"out={str(out)!r} is not writable ({exc.strerror})") from None


@dataclass(slots=True)
class RecordFolder:
    """What is on disk for one results folder, kept in memory so that each case is one atomic rewrite."""

    run_dir: Path
    meta: RunMeta
    producer: str = "run"
    events: list[pd.DataFrame] = field(default_factory=list)
    cases: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(CASE_COLUMNS)))
    notes: list[str] = field(default_factory=list)  # said once to the user (e.g. what a resume left out)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # one writer at a time

    @classmethod
    def create(cls, out: str | Path, name: str, meta: dict, producer: str = "run") -> RecordFolder:
        """A new folder under ``out``, its meta.json written first (``run_id`` and the schema version added)."""
        run_dir = new_run_dir(out, name)
        folder = cls(run_dir=run_dir, meta=RunMeta(meta), producer=producer)
        folder.meta.update(run_id=run_dir.name, schema_version=SCHEMA_VERSION)
        folder.save_meta()
        return folder

    @classmethod
    def reopen(cls, run_dir: str | Path) -> RecordFolder:
        """An existing record, to add cases to (UsageError when it is not one)."""
        previous = store.load_run(run_dir)
        folder = cls(run_dir=Path(run_dir), meta=previous.meta, cases=previous.cases)
        if len(previous.events):
            folder.events.append(previous.events)
        return folder

    @classmethod
    def write(cls, run: RunData, producer: str) -> RecordFolder:
        """Store a whole record at ``run.path`` (made if missing): events, then cases, then meta.json, each written
        atomically, so a folder with a meta.json holds every table it names."""
        folder = cls(run_dir=Path(run.path), meta=RunMeta(run.meta), producer=producer, events=[run.events],
                     cases=run.cases)  # fmt: skip
        store.write_events(folder.run_dir, run.events)
        store.write_cases(folder.run_dir, run.cases)
        folder.save_meta()
        return folder

    def add(self, events: pd.DataFrame, row: dict) -> None:
        """Store one case: its events appended, its row replacing one of the same (case, repeat); the tables
        rewritten atomically (meta.json: ``save_meta`` after the caller noted what it keeps there)."""
        self.events.append(events)
        if len(self.cases):
            same = (self.cases["case_id"] == row["case_id"]) & (self.cases["repeat"] == row["repeat"])
            self.cases = pd.concat([self.cases[~same], pd.DataFrame([row])], ignore_index=True)
        else:
            self.cases = pd.DataFrame([row], columns=list(CASE_COLUMNS))
        store.write_events(self.run_dir, pd.concat(self.events, ignore_index=True))
        store.write_cases(self.run_dir, self.cases)

    def save_meta(self) -> None:
        write_meta(self.run_dir, self.meta, self.producer)

    def finish(self) -> None:
        self.meta["finished"] = datetime.now(timezone.utc).isoformat()
        self.save_meta()


__all__ = ["RecordFolder", "new_run_dir", "new_run_id"]
