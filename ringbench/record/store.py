"""The results store: `results/<run-id>/` with events.parquet, cases.parquet, cases.csv and meta.json.

Files are replaced atomically (write to a temporary file in the same folder, fsync, rename), case by case, so a
killed run never leaves a corrupt file and `--resume` can tell which cases are done. Nothing here unpickles:
Parquet, CSV and JSON only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ringbench.errors import UsageError
from ringbench.record.atomic import atomic_write
from ringbench.record.meta import RunMeta, read_meta
from ringbench.record.schema import CASE_COLUMNS, CASE_DEFAULTS, EVENT_COLUMNS, EVENT_DEFAULTS, EVENTS_SCHEMA

EVENTS_FILE = "events.parquet"
CASES_FILE = "cases.parquet"
CASES_CSV = "cases.csv"


@dataclass(slots=True)
class RunData:
    """A loaded run: the events table, the per-case summary and the metadata record."""

    path: Path
    events: pd.DataFrame
    cases: pd.DataFrame
    meta: RunMeta = field(default_factory=RunMeta)

    def __post_init__(self) -> None:
        if not isinstance(self.meta, RunMeta):
            self.meta = RunMeta(self.meta)

    @property
    def run_id(self) -> str:
        return str(self.meta.run_id or self.path.name)

    @property
    def emulated(self) -> bool:
        return self.meta.emulated or bool(self.cases.get("emulated", pd.Series([False])).any())


def with_event_columns(events: pd.DataFrame) -> pd.DataFrame:
    """Every column of the current schema, in order; columns an older file lacks read as null (``censored`` as
    false: EVENT_DEFAULTS)."""
    missing = [name for name in EVENT_COLUMNS if name not in events]
    if missing:
        events = events.assign(**{name: EVENT_DEFAULTS.get(name, float("nan")) for name in missing})
    for name, default in EVENT_DEFAULTS.items():
        column = events[name]
        if isinstance(default, bool) and column.dtype != bool:  # NaN (older producers) reads as the default
            events = events.assign(**{name: column.astype(object).where(column.notna(), default).astype(bool)})
        elif column.isna().any():
            events = events.assign(**{name: column.fillna(default)})
    return events[list(EVENT_COLUMNS)]


CATEGORY_COLUMNS = ("case_id", "phase", "kind", "pair")  # few distinct values in millions of rows


def as_categories(events: pd.DataFrame) -> pd.DataFrame:
    """The events with their few-valued text columns as categoricals: the same values, and grouping, merging and
    selecting on them costs integer work instead of string work (a million-event record analyses in seconds)."""
    out = {}
    for name in CATEGORY_COLUMNS:
        if name in events and not isinstance(events[name].dtype, pd.CategoricalDtype):
            column = events[name].astype("category")  # ordered as text below: min / max / sort unchanged
            out[name] = column.cat.reorder_categories(sorted(column.cat.categories, key=str), ordered=True)
    return events.assign(**out) if out else events


def write_events(run_dir: Path, events: pd.DataFrame) -> None:
    table = pa.Table.from_pandas(with_event_columns(events), schema=EVENTS_SCHEMA, preserve_index=False)
    atomic_write(Path(run_dir) / EVENTS_FILE, lambda handle: pq.write_table(table, handle, compression="zstd"))


def write_cases(run_dir: Path, cases: pd.DataFrame) -> None:
    cases = cases.reset_index(drop=True)
    atomic_write(Path(run_dir) / CASES_FILE, lambda handle: cases.to_parquet(handle, index=False))
    atomic_write(Path(run_dir) / CASES_CSV, lambda handle: handle.write(cases.to_csv(index=False).encode()))


def load_run(run_dir: str | Path) -> RunData:
    """Load a run directory; a missing or malformed one raises UsageError with one clear line."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run_dir={str(run_dir)!r} is not a directory")
    meta = read_meta(run_dir)
    try:
        events = pq.read_table(run_dir / EVENTS_FILE).to_pandas() if (run_dir / EVENTS_FILE).exists() else None
        cases = pd.read_parquet(run_dir / CASES_FILE) if (run_dir / CASES_FILE).exists() else None
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError(f"{run_dir}: unreadable results ({exc})") from None
    events = EVENTS_SCHEMA.empty_table().to_pandas() if events is None else with_event_columns(events)
    if cases is None:
        cases = pd.DataFrame(columns=list(CASE_COLUMNS))
    missing = [name for name in CASE_COLUMNS if name not in cases]
    if missing:  # a file written before these columns existed: they read as null (axes: their default)
        cases = cases.assign(**{name: CASE_DEFAULTS.get(name, float("nan")) for name in missing})
    if meta.kind == "run" and meta.scenario is not None and "finished" not in meta and len(events):
        events = finished_events(events, cases)  # a sweep's folder that did not finish: its finished cases only
    return RunData(path=run_dir, events=events, cases=cases, meta=meta)


def finished_events(events: pd.DataFrame, cases: pd.DataFrame) -> pd.DataFrame:
    """The events of the cases the cases table holds. A run killed between a case's two files (events first, then
    cases) leaves that case's events without its row: an unfinished case, which analyses and a resume leave out."""

    def keys_of(frame: pd.DataFrame) -> pd.MultiIndex:
        repeat = pd.to_numeric(frame["repeat"], errors="coerce").fillna(0).astype(int)
        return pd.MultiIndex.from_arrays([frame["case_id"].astype(str), repeat])

    stored, keys = keys_of(cases), keys_of(events)
    keep = keys.isin(stored)
    return events if keep.all() else events[keep].reset_index(drop=True)
