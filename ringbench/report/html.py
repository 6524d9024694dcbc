"""report.html: one self-contained file. Figures are inlined as base64 PNG; no script, no font, nothing fetched.

Every string that comes from the run (ids, scenario and case names, paths, fault specs, the command line, table
cells, section lines, tooltips) goes through ``html.escape``. A figure is shown at half its pixel size (it is
drawn at 2x, figures.DPI), so its labels have their point size at 100% zoom.
"""

from __future__ import annotations

import base64
import re
from html import escape

from ringbench.report.charts import Png
from ringbench.report.model import Cell, ReportContent, Section, Table

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { font-size: 1.5em; margin-bottom: 0.3em; overflow-wrap: anywhere; }
h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.08em; margin-top: 1.4em; overflow-wrap: anywhere; }
section > section { border-left: 3px solid #dfe6ef; padding-left: 1em; margin-top: 1.5em; }
.label { background: #fff3cd; border: 2px solid #e0a800; padding: 0.6em 0.9em; font-weight: 600; margin: 1em 0; }
nav.toc { background: #f7f7f9; border: 1px solid #e3e3e8; padding: 0.4em 1em; font-size: 0.92em; }
nav.toc > ol { columns: 2 20em; margin: 0.3em 0; } nav.toc li { break-inside: avoid; }
nav.toc ol ol { columns: 1; margin: 0; }
#answers .lead { font-size: 1.15em; font-weight: 600; margin: 0.6em 0 0.3em; }
#answers ul, #verdict ul { background: #eef4fb; border-left: 5px solid #4C72B0; padding: 0.5em 1.2em 0.5em 2em; }
#answers ul { background: #f1f8f1; border-left-color: #55A868; }
li { margin: 0.2em 0; overflow-wrap: anywhere; }
figure { margin: 1em 0; max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
.figrow { display: flex; flex-wrap: wrap; gap: 0 1.5em; align-items: flex-start; }
.figrow figure { flex: 0 1 auto; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.4em; text-align: left; white-space: normal;
         vertical-align: top; }
th { background: #f3f3f3; hyphens: auto; } .n { text-align: right; font-variant-numeric: tabular-nums; }
td { overflow-wrap: break-word; } td.n { white-space: nowrap; } td.id, td[title] { overflow-wrap: anywhere; }
table.kv td, table.kv th { text-align: left; white-space: normal; overflow-wrap: anywhere; }
table.kv th { width: 11em; } td.id { font-family: monospace; font-size: 0.95em; }
td[title] { text-decoration: underline dotted #999; cursor: help; }
.note { color: #555; font-size: 0.85em; overflow-wrap: anywhere; }
tr.flagged td { color: #b00020; font-weight: bold; }
"""


def _cell(cell: str | Cell, tag: str = "td") -> str:
    """``tag``: the element with its attributes (``td class="id"``); it closes with the element's name."""
    close = tag.split()[0]
    if not isinstance(cell, Cell):
        return f"<{tag}>{escape(cell)}</{close}>"
    title = f' title="{escape(cell.title)}"' if cell.title else ""
    text = f'<a href="{escape(cell.href)}">{escape(cell.text)}</a>' if cell.href else escape(cell.text)
    return f"<{tag}{title}>{text}</{close}>"


NUMBER = re.compile(r"^[-+]?[\d,.]+(e[-+]?\d+)?%?(–[-+]?[\d,.]+)?$|^–$")


def _column_class(table: Table, index: int) -> str:
    """``id`` (monospace identifiers), ``n`` (numbers: right-aligned) or nothing (words: left-aligned)."""
    if index in table.monospace:
        return "id"
    cells = [str(row[index]) for row in table.rows if index < len(row)]
    return "n" if cells and all(NUMBER.match(c) for c in cells) and any(c != "–" for c in cells) else ""


def _table(table: Table, level: int = 3) -> str:
    heading = f"<h{level}>{escape(table.title)}</h{level}>" if table.title else ""
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    if table.key_value:
        rows = "".join(f"<tr>{_cell(row[0], 'th')}{''.join(_cell(c) for c in row[1:])}</tr>" for row in table.rows)
        return f'{heading}\n<div class="scroll"><table class="kv">{rows}</table></div>{note}'
    kinds = [_column_class(table, i) for i in range(len(table.columns))]
    head = "".join(_cell(c, f'th class="{k}"' if k else "th") for c, k in zip(table.columns, kinds, strict=False))
    body = "".join(
        ('<tr class="flagged">' if index in table.highlight else "<tr>")
        + "".join(_cell(c, f'td class="{k}"' if k else "td") for c, k in zip(row, kinds, strict=False))
        + "</tr>"
        for index, row in enumerate(table.rows)
    )
    return (
        f'{heading}\n<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>{note}'
    )


def _figure(figure: Png) -> str:
    data = base64.b64encode(figure.data).decode("ascii")
    width, height = figure.size
    return (
        f'<figure id="fig-{escape(figure.name)}"><img alt="{escape(figure.title)}" width="{width // 2}" '
        f'height="{height // 2}" src="data:image/png;base64,{data}"><figcaption>{escape(figure.title)}</figcaption>'
        "</figure>"
    )


def _figures(pngs: tuple[Png, ...]) -> list[str]:
    """Full-width figures one by one; consecutive half-width ones side by side while the page is wide enough."""
    parts, row = [], []
    for figure in (*pngs, None):
        if figure is not None and figure.half:
            row.append(_figure(figure))
            continue
        if row:
            parts.append('<div class="figrow">' + "".join(row) + "</div>")
            row = []
        if figure is not None:
            parts.append(_figure(figure))
    return parts


def render_section(section: Section, level: int = 2) -> str:
    """One section of the content model (every string escaped), its sub-sections one level down."""
    parts = [f'<section id="{escape(section.slug)}">', f"<h{level}>{escape(section.title)}</h{level}>"]
    if section.lead:
        parts.append(f'<p class="lead">{escape(section.lead)}</p>')
    if section.lines:
        parts.append("<ul>" + "".join(f"<li>{escape(line)}</li>" for line in section.lines) + "</ul>")
    parts.extend(_figures(section.figures))
    parts.extend(_table(table, level=min(level + 1, 6)) for table in section.tables)
    parts.extend(f'<p class="note">{escape(note)}</p>' for note in section.notes)
    parts.extend(render_section(child, level=min(level + 1, 6)) for child in section.children)
    parts.append("</section>")
    return "\n".join(parts)


def _toc(sections: list[Section]) -> str:
    def items(entries: list[Section] | tuple[Section, ...]) -> str:
        out = []
        for section in entries:
            nested = f"<ol>{items(section.children)}</ol>" if section.children else ""
            out.append(f'<li><a href="#{escape(section.slug)}">{escape(section.title)}</a>{nested}</li>')
        return "".join(out)

    return f'<nav class="toc" id="contents"><strong>Contents</strong><ol>{items(sections)}</ol></nav>'


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
    parts.append(_toc(content.sections))
    for section in content.sections:
        parts.append(render_section(section))
        if section.slug == "verdict":  # what the report itself leaves out (e.g. a capped trace)
            parts.extend(f'<p class="note">{escape(note)}</p>' for note in content.notes)
    parts.append("</body></html>")
    return "\n".join(parts)
