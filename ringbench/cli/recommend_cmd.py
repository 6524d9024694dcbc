"""`ringbench recommend` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("recommend", help="(not implemented yet)")
    def _recommend() -> None:
        raise typer.Exit(2)
