"""report.html: one self-contained file. Figures are inlined as base64 PNG; no script, no font, nothing fetched.

Every string that comes from the run (ids, scenario and case names, paths, fault specs, the command line, table
cells, section lines) goes through ``html.escape``.
"""

from __future__ import annotations

import base64
from html import escape

from ringbench.report.content import ReportContent, Section, Table

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1150px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.label { background: #fff3cd; border: 2px solid #e0a800; padding: 0.6em 0.9em; font-weight: 600; margin: 1em 0; }
.verdict { background: #eef4fb; border-left: 5px solid #4C72B0; padding: 0.6em 1.2em; }
.verdict li { margin: 0.25em 0; }
figure { margin: 1.2em 0; } figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.6em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.note { color: #555; font-size: 0.85em; } .meta td { text-align: left; font-family: monospace; }
tr.flagged td { color: #b00020; font-weight: bold; }
"""


def _table(table: Table, level: int = 2) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in table.columns)
    body = "".join(
        ('<tr class="flagged">' if index in table.highlight else "<tr>")
        + "".join(f"<td>{escape(cell)}</td>" for cell in row)
        + "</tr>"
        for index, row in enumerate(table.rows)
    )
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    heading = f"<h{level}>{escape(table.title)}</h{level}>"
    return f"{heading}\n<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{note}"


def render_section(section: Section) -> str:
    """One section of the content model: its lines as a list, its tables, its notes (every string escaped)."""
    parts = [f"<h2>{escape(section.title)}</h2>"]
    if section.lines:
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in section.lines) + "</ul>")
    parts.extend(_table(table, level=3) for table in section.tables)
    parts.extend(f'<p class="note">{escape(note)}</p>' for note in section.notes)
    return "\n".join(parts)


def render_html(content: ReportContent) -> str:
    """The whole page as one string."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>ringbench report: {escape(content.run_id)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>ringbench report: {escape(content.run_id)}</h1>",
    ]
    if content.label:
        parts.append(f'<div class="label" id="label">{escape(content.label)}</div>')
    items = "".join(f"<li>{escape(line)}</li>" for line in content.verdict)
    parts.append(f'<h2>Verdict</h2>\n<ul class="verdict" id="verdict">{items}</ul>')
    parts.extend(f'<p class="note">{escape(note)}</p>' for note in content.notes)
    parts.append("<h2>Figures</h2>")
    for figure in content.figures:
        data = base64.b64encode(figure.data).decode("ascii")
        parts.append(
            f'<figure id="fig-{escape(figure.name)}"><img alt="{escape(figure.title)}" '
            f'src="data:image/png;base64,{data}"><figcaption>{escape(figure.title)}</figcaption></figure>'
        )
    parts.extend(_table(table) for table in content.tables)
    parts.extend(render_section(section) for section in content.sections)
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in content.meta)
    parts.append(f'<h2>Run</h2>\n<table class="meta">{rows}</table>')
    parts.append(
        '<p class="note">Trace: open trace.json (next to this file) in https://ui.perfetto.dev or chrome://tracing.</p>'
    )
    parts.append("</body></html>")
    return "\n".join(parts)
