"""`ringbench analyze` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("analyze", help="(not implemented yet)")
    def _analyze() -> None:
        raise typer.Exit(2)
