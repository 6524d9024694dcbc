"""The report's content model: sections, tables and cells, independent of the format they are rendered to.

Both report.html (html.py) and report.md (markdown.py) render one ``ReportContent``, so the two always carry the same
words. Cells are plain strings, or ``Cell`` for a short text with its full form (HTML ``title``) and an in-page
link; each renderer escapes them for its format. The sections are built from it (content.py and the section
modules import this module; it imports none of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ringbench.analysis.answers import AXES, case_labels, varied_axes
from ringbench.analysis.findings import RunAnalysis
from ringbench.fmt import number
from ringbench.report import charts


@dataclass(frozen=True, slots=True)
class Cell:
    """A table cell with more to say: ``title`` (the full text, a tooltip in HTML) and ``href`` (an anchor)."""

    text: str
    title: str = ""
    href: str = ""

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str | Cell]]
    note: str = ""
    highlight: tuple[int, ...] = ()  # indices of rows to emphasise (e.g. flagged hops)
    key_value: bool = False  # a two-column field/value list (the run's metadata)
    monospace: tuple[int, ...] = ()  # indices of columns of identifiers (full case ids)


@dataclass(frozen=True, slots=True)
class Section:
    """A titled part of the report: a lead sentence, lines, figures, tables, notes and sub-sections, in order."""

    title: str
    lines: tuple[str, ...] = ()
    tables: tuple[Table, ...] = ()
    notes: tuple[str, ...] = ()
    figures: tuple[charts.Png, ...] = ()
    anchor: str = ""
    lead: str = ""
    children: tuple[Section, ...] = ()

    @property
    def slug(self) -> str:
        """The anchor, or one made from the title (extra sections come without one)."""
        if self.anchor:
            return self.anchor
        words = "".join(c if c.isalnum() else " " for c in self.title.lower()).split()
        return "-".join(words[:6]) or "section"


@dataclass(slots=True)
class ReportContent:
    run_id: str
    label: str | None
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # about the report itself (e.g. the trace was capped)

    @property
    def figures(self) -> list[charts.Png]:
        """Every figure of the report, in page order."""

        def walk(sections):
            for section in sections:
                yield from section.figures
                yield from walk(section.children)

        return list(walk(self.sections))


def fmt(value, spec: str = ".2f") -> str:
    """A cell: numbers with ``spec``, NaN / None as an en dash, everything else as str."""
    if isinstance(value, str):
        return value
    return number(value, spec, missing="–")


def frame_rows(frame: pd.DataFrame, columns: dict[str, tuple[str, str]]) -> tuple[list[str], list[list[str]]]:
    """columns: source column -> (header, format spec); returns (headers, formatted rows)."""
    rows = [[fmt(row[c], spec) for c, (_, spec) in columns.items()] for _, row in frame.iterrows()]
    return [header for header, _ in columns.values()], rows


def table(title: str, frame: pd.DataFrame, columns: dict[str, tuple[str, str]], note: str = "") -> Table:
    headers, rows = frame_rows(frame, columns)
    return Table(title, headers, rows, note)


def culprit_text(row) -> str:
    if row["straggler_kind"] == "compute":
        return f"rank {int(row['straggler_rank'])} (compute)"
    if row["straggler_kind"] == "link":
        src = int(row["slow_hop_src"])
        kind = {"held_back": f"held back by rank {src}'s code",
                "link_or_sender": f"link, or rank {src}'s code"}.get(row.get("hop_cause"), "link")  # fmt: skip
        return f"hop {src} -> {int(row['slow_hop_dst'])} ({kind})"
    if row.get("confidence") == "inconclusive":
        return "inconclusive"  # the measurement could not have shown one: never "none"
    return "none"


def ring_of(analysis: RunAnalysis, case_id: str) -> list[int]:
    """Ranks in ring order for a case, from the events' ring_position column."""
    rows = analysis.run.events.loc[analysis.run.events["case_id"] == case_id, ["ring_position", "rank"]]
    return [int(r) for r in rows.drop_duplicates().sort_values("ring_position")["rank"]]


@dataclass(frozen=True, slots=True)
class Cases:
    """The cases in table order with what every section says of them: number, short label, axes."""

    frame: pd.DataFrame  # analysis.summary with number, label, kernel, impl, emulated, judged, case row axes
    varied: list[str]

    def number(self, case_id: str) -> int:
        return int(self.frame.loc[self.frame["case_id"] == case_id, "number"].iloc[0])

    def label(self, case_id: str) -> str:
        return str(self.frame.loc[self.frame["case_id"] == case_id, "label"].iloc[0])


def cases_of(analysis: RunAnalysis) -> Cases:
    """The run's cases in table order, numbered and labelled by the axes that varied."""
    summary = analysis.summary.copy()
    summary["case_id"] = summary["case_id"].astype(str)
    cases = analysis.run.cases.assign(case_id=analysis.run.cases["case_id"].astype(str)).drop_duplicates("case_id")
    varied = varied_axes(cases) if len(cases) else []
    extra = [c for c in (*AXES, "emulated") if c in cases and c not in summary]
    frame = summary.merge(cases[["case_id", *extra]], on="case_id", how="left") if len(cases) else summary
    labels = case_labels(cases) if len(cases) else {}
    frame["label"] = [labels.get(cid, cid) for cid in frame["case_id"]]
    seen: dict[str, int] = {}
    for index, label in enumerate(frame["label"]):  # cases that differ only outside the sweep axes
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            frame.loc[index, "label"] = f"{label} ({seen[label]})"
    frame["number"] = range(1, len(frame) + 1)
    frame["emulated"] = frame.get("emulated", pd.Series(False, index=frame.index)).fillna(False).astype(bool)
    frame["judged"] = frame["confidence"] == "conclusive"
    return Cases(frame=frame, varied=varied)
