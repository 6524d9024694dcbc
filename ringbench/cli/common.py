"""Shared CLI plumbing: consoles, and turning library errors into one line and an exit code."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import typer
from rich.console import Console
from rich.markup import escape

from ringbench.errors import RunFailure, UsageError

# Human output goes to stderr so that `--json` can own stdout.
console = Console(stderr=True, highlight=False, emoji=False)
stdout = Console(highlight=False, soft_wrap=True, emoji=False)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one line to stderr and return the Exit to raise (2: usage, 1: run failure)."""
    console.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Map library errors to one line and an exit code: UsageError/ValueError/OSError -> 2, RunFailure -> 1."""
    try:
        yield
    except UsageError as exc:
        raise fail(str(exc), 2) from None
    except RunFailure as exc:
        raise fail(str(exc), 1) from None
    except OSError as exc:  # unreadable input or unwritable output: one line, not a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        raise fail(f"{where}{exc.strerror or exc}", 2) from None
    except KeyboardInterrupt:
        console.print("interrupted")
        raise typer.Exit(130) from None


def emit_json(document: object) -> None:
    """Write one JSON document to stdout (human output stays on stderr)."""
    import json

    sys.stdout.write(json.dumps(document, indent=2, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()
