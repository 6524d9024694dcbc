"""`ringbench baseline` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("baseline", help="(not implemented yet)")
    def _baseline() -> None:
        raise typer.Exit(2)
