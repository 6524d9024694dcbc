"""`ringbench report RUN_DIR [--out reports/]`: report.html, report.md, trace.json and figures of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.common import cli_errors, console, stdout


def register(app: typer.Typer) -> None:
    @app.command(
        "report",
        help="Write reports/<run-id>/: report.html (self-contained), report.md, trace.json (Perfetto), figures.",
    )
    def _report(
        run_dir: Annotated[Path, typer.Argument(help="A results/<run-id>/ folder.", show_default=False)],
        out: Annotated[Path, typer.Option("--out", help="Parent folder of the report folder.")] = Path("reports"),
    ) -> None:
        from ringbench.report import write_report
        from ringbench.store import load_run

        with cli_errors():
            run = load_run(run_dir)
            folder = write_report(run, out)
        console.print(f"report written: {folder}/ (report.html, report.md, trace.json, figures/)", markup=False)
        stdout.print(str(folder / "report.html"), markup=False)
