"""`ringbench probe` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("probe", help="(not implemented yet)")
    def _probe() -> None:
        raise typer.Exit(2)
