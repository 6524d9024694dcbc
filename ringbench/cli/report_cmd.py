"""`ringbench report` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("report", help="(not implemented yet)")
    def _report() -> None:
        raise typer.Exit(2)
