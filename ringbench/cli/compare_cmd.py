"""`ringbench compare` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("compare", help="(not implemented yet)")
    def _compare() -> None:
        raise typer.Exit(2)
