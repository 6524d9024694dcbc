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
# Every --json document opens with "format" (which document: ringbench-<command>) and "format_version" (bumped when
# a key changes meaning or goes; new keys do not bump it), and gives "run_dir" wherever a record exists.
# docs/results.md lists them. Documents with a life of their own (compare's gate document, a topology) carry their
# own format and version.
JSON_DOCUMENTS = {
    "run": 1, "analyze": 1, "report": 1, "import": 1, "simulate": 1, "probe": 1, "recommend": 1, "topo": 1,
    "check-timeline": 1, "baseline": 1, "baseline-noise": 1, "compare": 1, "plan": 1, "calibrate": 1, "check": 1,
}  # fmt: skip
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def _console(stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 120  # a file or a pipe gets whole lines, not the 80-column default
    return Console(stderr=stderr, highlight=False, emoji=False, width=width)


diag = _console(stderr=True)  # progress, notes, errors
stopped_by_signal = False  # set when a stop signal ended the command (the console entry point then exits at once)
# Set by a command whose work is all on disk and printed when it returns: the console entry point then exits at
# once, without the interpreter's teardown of pandas and Arrow (about 0.1 s, a twentieth of importing 4 traces).
exit_when_done = False


@dataclass(slots=True)
class Output:
    """Where one command invocation writes: human output (stdout, or stderr under --json), or nothing (--quiet)."""

    json: bool = False
    quiet: bool = False
    console: Console | None = None
    document: str = ""  # which --json document this command writes (JSON_DOCUMENTS)

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

    def emit(self, document: dict) -> None:
        """The --json document, on stdout, opening with its format and format_version."""
        if self.json:
            emit_json(json_document(self.document, document))


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


def json_document(kind: str, body: dict) -> dict:
    """``body`` under the envelope every --json document opens with (a document with its own format keeps it)."""
    if "format" in body:
        assert "format_version" in body, f"{body['format']}: a document with a format gives its format_version"
        return body
    return {"format": f"ringbench-{kind}", "format_version": JSON_DOCUMENTS[kind], **body}


def emit_json(document: object) -> None:
    """Write one JSON document to stdout (NaN and infinities as null)."""
    from ringbench.fmt import json_value

    sys.stdout.write(json.dumps(json_value(document), indent=2, default=str, allow_nan=False) + "\n")
    sys.stdout.flush()
