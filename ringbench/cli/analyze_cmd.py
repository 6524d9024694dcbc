"""`ringbench analyze RUN_DIR [--json]`: the answers and the verdict of a stored run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.common import JsonOption, Output, QuietOption, cli_errors


def register(app: typer.Typer) -> None:
    @app.command(
        "analyze",
        help="Answers and verdict of a run: the comparison each varied axis was run for, the straggler (rank or "
        "hop) and its cost per iteration, exposed communication, imbalance, worst numerical error. Simulated and "
        "emulated runs and injected faults are labelled.",
    )
    def _analyze(
        run_dir: Annotated[Path, typer.Argument(help="A results/<run-id>/ folder.", show_default=False)],
        json_out: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.analysis.answers import answers
        from ringbench.analysis.findings import analyze, interrupted_line, verdict_document, verdict_lines
        from ringbench.record.store import load_run

        out = Output(json=json_out, quiet=quiet, document="analyze")
        with cli_errors():
            analysis = analyze(load_run(run_dir))
            block = answers(analysis, str(run_dir))
        out.print(f"run {analysis.run.run_id}")
        stopped = interrupted_line(analysis.run)
        if stopped:
            out.print(stopped)
        for line in block.lines():
            out.print(f"  {line}")
        out.print("verdict:")
        for line in verdict_lines(analysis):
            out.print(f"  {line}")
        document = {"run_dir": str(run_dir)} | verdict_document(analysis) | {"answers": block.document()}
        out.emit(document | {"interrupted": analysis.run.meta.interrupted})
