"""report.md: the same words, figures and tables as report.html, for an issue or a pull request.

Figures are images from figures/*.png next to the file. Cells escape ``|`` and newlines, which would break a
table; a short case label links to its section, and the full case ids are in their own table.
"""

from __future__ import annotations

from ringbench.report.model import Cell, ReportContent, Section, Table


def _cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def _link_text(text: str) -> str:
    return _cell(text).replace("[", "\\[").replace("]", "\\]")


def _value(cell: str | Cell) -> str:
    if isinstance(cell, Cell) and cell.href:
        return f"[{_link_text(cell.text)}]({cell.href})"
    return _cell(str(cell))


def _table(table: Table, level: int = 3) -> str:
    lines = [f"{'#' * level} {_cell(table.title)}", ""] if table.title else []
    columns = ["", ""] if table.key_value else table.columns
    lines.append("| " + " | ".join(_cell(c) for c in columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    for index, row in enumerate(table.rows):
        cells = [_value(cell) for cell in row]
        if table.key_value and cells:
            cells[0] = f"**{cells[0]}**"
        if index in table.highlight and cells:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    if table.note:
        lines += ["", f"_{_cell(table.note)}_"]
    return "\n".join(lines)


def render_section(section: Section, level: int = 2, figure_dir: str = "figures") -> list[str]:
    """One section as Markdown lines: an anchor, the heading, lead, lines, figures, tables, notes, sub-sections."""
    lines = [f'<a id="{_cell(section.slug)}"></a>', "", f"{'#' * level} {_cell(section.title)}", ""]
    if section.lead:
        lines += [f"**{_cell(section.lead)}**", ""]
    if section.lines:
        lines += [f"- {_cell(line)}" for line in section.lines] + [""]
    for figure in section.figures:
        lines += [f"![{_link_text(figure.title)}]({figure_dir}/{figure.name}.png)", ""]
    for table in section.tables:
        lines += [_table(table, min(level + 1, 6)), ""]
    lines += [f"_{_cell(note)}_" for note in section.notes]
    lines += [""] if section.notes else []
    for child in section.children:
        lines += render_section(child, min(level + 1, 6), figure_dir)
    return lines


def _toc(sections, depth: int = 0) -> list[str]:
    lines = []
    for section in sections:
        lines.append(f"{'  ' * depth}- [{_link_text(section.title)}](#{section.slug})")
        lines += _toc(section.children, depth + 1)
    return lines


def render_markdown(content: ReportContent, figure_dir: str = "figures") -> str:
    lines = [f"# ringbench report: {_cell(content.run_id)}", ""]
    if content.label:
        lines += [f"> **{_cell(content.label)}**", ""]
    lines += ["**Contents**", "", *_toc(content.sections), ""]
    for section in content.sections:
        lines += render_section(section, 2, figure_dir)
        if section.slug == "verdict":
            lines += [f"_{_cell(note)}_" for note in content.notes] + ([""] if content.notes else [])
    return "\n".join(lines)
