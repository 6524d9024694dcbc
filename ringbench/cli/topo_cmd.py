"""`ringbench topo` (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("topo", help="(not implemented yet)")
    def _topo() -> None:
        raise typer.Exit(2)
