"""`ringbench run` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("run", help="(not implemented yet)")
    def _run() -> None:
        raise typer.Exit(2)
