"""report.md: the same verdicts and tables as report.html, for pasting into an issue or a pull request.

Figures are linked (figures/*.png next to the file). Cells escape ``|`` and newlines, which would break a table.
"""

from __future__ import annotations

from ringbench.report.content import ReportContent, Section, Table


def _cell(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")


def _table(table: Table) -> str:
    lines = [f"### {_cell(table.title)}", ""]
    lines.append("| " + " | ".join(_cell(c) for c in table.columns) + " |")
    lines.append("|" + "|".join("---" for _ in table.columns) + "|")
    for index, row in enumerate(table.rows):
        cells = [_cell(cell) for cell in row]
        if index in table.highlight and cells:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    if table.note:
        lines += ["", f"_{_cell(table.note)}_"]
    return "\n".join(lines)


def render_section(section: Section) -> list[str]:
    lines = [f"## {_cell(section.title)}", ""]
    lines += [f"- {_cell(line)}" for line in section.lines]
    for table in section.tables:
        lines += ["", _table(table)]
    lines += [""] + [_cell(note) for note in section.notes] + [""]
    return lines


def render_markdown(content: ReportContent, figure_dir: str = "figures") -> str:
    lines = [f"# ringbench report: {_cell(content.run_id)}", ""]
    if content.label:
        lines += [f"> **{_cell(content.label)}**", ""]
    lines += ["## Verdict", ""]
    lines += [f"- {_cell(line)}" for line in content.verdict]
    lines += [""] + [f"_{_cell(note)}_" for note in content.notes]
    lines += ["", "## Figures", ""]
    lines += [f"- [{_cell(f.title)}]({figure_dir}/{f.name}.png)" for f in content.figures]
    lines += ["", "## Tables", ""]
    for table in content.tables:
        lines += [_table(table), ""]
    for section in content.sections:
        lines += render_section(section)
    lines += ["## Run", "", "| | |", "|---|---|"]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in content.meta]
    lines += ["", "Trace: `trace.json` opens in https://ui.perfetto.dev or chrome://tracing.", ""]
    return "\n".join(lines)
