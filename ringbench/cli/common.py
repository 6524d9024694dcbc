"""Shared CLI plumbing: where output goes, the options every command shares, and errors as one line.

Streams, the same in every command: results and human output on **stdout** (so ``| less``, ``| grep`` and
``> file`` work); progress, notes and errors on **stderr**. With ``--json`` the one JSON document owns stdout and
the human output moves to stderr; ``--quiet`` keeps only errors (and the JSON document).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from ringbench.errors import Interrupted, RunFailure, UsageError

OUTPUT_PANEL = "Output"
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 120  # a file or a pipe gets whole lines, not the 80-column default
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


diag = _console(stderr=True)  # progress, notes, errors
stopped_by_signal = False  # set when a stop signal ended the command (the console entry point then exits at once)


@dataclass(slots=True)
class Output:
    """Where one command invocation writes: human output (stdout, or stderr under --json), or nothing (--quiet)."""

    json: bool = False
    quiet: bool = False
    console: Console | None = None

    def __post_init__(self) -> None:
        if self.console is None:
            self.console = _console(stderr=self.json)

    def print(self, *objects, **kwargs) -> None:
        """Human output (results, tables, answers)."""
        if not self.quiet:
            self.console.print(*objects, **({"markup": False, "soft_wrap": True} | kwargs))

    def note(self, message: str) -> None:
        """A diagnostic: stderr, unless --quiet."""
        if not self.quiet:
            diag.print(f"note: {message}", markup=False, soft_wrap=True)

    def progress(self, message: str) -> None:
        if not self.quiet:
            diag.print(message, markup=False, soft_wrap=True)

    def emit(self, document: object) -> None:
        """The --json document, on stdout."""
        if self.json:
            emit_json(document)


JsonOption = Annotated[
    bool,
    typer.Option("--json", help="One JSON document on stdout (human output moves to stderr).",
                 rich_help_panel=OUTPUT_PANEL),
]  # fmt: skip
QuietOption = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="Print only errors (and the JSON document with --json).",
                 rich_help_panel=OUTPUT_PANEL),
]  # fmt: skip
PlainQuietOption = Annotated[  # commands without --json
    bool,
    typer.Option("--quiet", "-q", help="Print only errors.", rich_help_panel=OUTPUT_PANEL),
]  # fmt: skip
TopologyOption = Annotated[
    Optional[Path],
    typer.Option("--topology", "-t", metavar="FILE",
                 help="`nvidia-smi topo -m` output, a YAML topology, or a results folder (format detected)."),
]  # fmt: skip
TIMEOUT_HELP = "Seconds any distributed wait may take before the run is declared stalled."
DEFAULT_TIMEOUT_S = 60.0


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print one line to stderr and return the Exit to raise (2: usage, 1: run failure)."""
    diag.print(f"[bold red]error:[/] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Map library errors to one line and an exit code: UsageError/ValueError/OSError -> 2, RunFailure -> 1,
    Interrupted (a stop signal) -> 128 + the signal."""
    from ringbench.run.interrupt import StopRequested, signal_name

    global stopped_by_signal
    try:
        yield
    except Interrupted as exc:
        stopped_by_signal = True
        diag.print(str(exc), markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except StopRequested as stop:  # a signal outside a run's own handling (a command's StopSignals)
        stopped_by_signal = True
        diag.print(f"interrupted by {signal_name(stop.signum)}", markup=False, highlight=False)
        raise typer.Exit(128 + stop.signum) from None
    except UsageError as exc:
        raise fail(str(exc), 2) from None
    except RunFailure as exc:
        raise fail(str(exc), 1) from None
    except OSError as exc:  # unreadable input or unwritable output: one line, not a traceback
        where = f"{exc.filename}: " if exc.filename else ""
        raise fail(f"{where}{exc.strerror or exc}", 2) from None
    except KeyboardInterrupt:
        diag.print("interrupted")
        raise typer.Exit(130) from None


def emit_json(document: object) -> None:
    """Write one JSON document to stdout (NaN and infinities as null)."""
    from ringbench.fmt import json_value

    sys.stdout.write(json.dumps(json_value(document), indent=2, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()
