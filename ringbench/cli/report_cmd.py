"""`ringbench report RUN_DIR [--out reports/]`: report.html, report.md, trace.json and figures of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.common import OUTPUT_PANEL, JsonOption, Output, QuietOption, cli_errors


def register(app: typer.Typer) -> None:
    @app.command(
        "report",
        help="Write reports/<run-id>/: report.html (self-contained), report.md, trace.json (Perfetto), figures.",
    )
    def _report(
        run_dir: Annotated[Path, typer.Argument(help="A results/<run-id>/ folder.", show_default=False)],
        out_dir: Annotated[
            Path, typer.Option("--out", help="Parent folder of the report folder.", rich_help_panel=OUTPUT_PANEL)
        ] = Path("reports"),
        json_out: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.record.store import load_run
        from ringbench.report import write_report

        out = Output(json=json_out, quiet=quiet, document="report")
        with cli_errors():
            folder = write_report(load_run(run_dir), out_dir)
        out.progress(f"wrote {folder}/ (report.html, report.md, trace.json, figures/)")
        out.print(str(folder / "report.html"))
        files = {name: str(folder / name) for name in ("report.html", "report.md", "trace.json")}
        out.emit({"run_dir": str(run_dir), "report_dir": str(folder), "files": files})
