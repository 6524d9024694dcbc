"""`ringbench analyze RUN_DIR [--json]`: the verdict of a stored run, in words or as one JSON document."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.common import cli_errors, emit_json, stdout


def register(app: typer.Typer) -> None:
    @app.command(
        "analyze",
        help="Verdict of a run: the straggler (rank or hop) and its cost per iteration, exposed communication, "
        "imbalance, worst numerical error. Simulated/emulated runs and injected faults are labelled.",
    )
    def _analyze(
        run_dir: Annotated[Path, typer.Argument(help="A results/<run-id>/ folder.", show_default=False)],
        json_out: Annotated[
            bool, typer.Option("--json", help="One JSON document on stdout (straggler_rank, slow_hop, cases, ...).")
        ] = False,
    ) -> None:
        from ringbench.analysis.findings import analyze, verdict_document, verdict_lines
        from ringbench.store import load_run

        with cli_errors():
            analysis = analyze(load_run(run_dir))
        if json_out:
            emit_json(verdict_document(analysis))
            return
        stdout.print(f"run {analysis.run.run_id}", markup=False)
        for line in verdict_lines(analysis):
            stdout.print(f"  {line}", markup=False)
