"""`ringbench` entry point. Each command lives in its own module, which exposes ``register(app)``.

The console entry point imports only the command it runs (``ringbench plan`` never loads the run command's
torch-heavy modules); ``app`` (what tests and ``--help`` use) has every command.

Every command shares these behaviours (one group class, so nothing depends on a command remembering them):
``-h``/``--help``; ``ringbench --version``; shell completion (``--install-completion``); a usage error (an
unknown option, a bad number, a missing argument) is one line on stderr with a hint and exit code 2, never a box;
and help shows names for values (``RUN_DIR``, ``N``), never Python types.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from ringbench.cli import common
from ringbench.cli.common import CONTEXT_SETTINGS

# Typer vendors its own copy of click in some versions: take the exception classes from Typer, not from click.
_USAGE_ERROR = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "UsageError")


def _metavar(param) -> str:
    name = (param.name or "value").upper()
    if param.param_type_name == "argument":
        return name
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return "N" if annotation in (int, list[int]) else "X" if annotation in (float, list[float]) else name


def _tidy(command) -> None:
    """Values named like a man page (RUN_DIR, N, FILE); flags and arguments without a Python type; usage lines
    ``RUN_DIR`` / ``[SCENARIO]`` rather than Typer's ``{run_dir}``."""
    for param in command.params:
        if param.metavar is None:
            param.metavar = _metavar(param)
        if param.param_type_name == "argument":
            shown = param.metavar + ("..." if param.nargs != 1 else "")
            param._usage_display_name = lambda shown=shown, required=param.required: shown if required else f"[{shown}]"
            param.display_type_rich = lambda ctx: None
    original = command.get_help_option

    def help_option(ctx, original=original):
        option = original(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub)


def _given(exc, args) -> str:
    """`` (got VALUE)`` for a bad option value, from the command line (click's message does not repeat it)."""
    param = getattr(exc, "param", None)
    opts = getattr(param, "opts", None) or ()
    argv = list(sys.argv[1:] if args is None else args)
    for index, token in enumerate(argv):
        for opt in opts:
            if token == opt and index + 1 < len(argv):
                return f" (got {argv[index + 1]!r})"
            if opt.startswith("--") and token.startswith(opt + "="):
                return f" (got {token[len(opt) + 1 :]!r})"
    return ""


class RingbenchGroup(TyperGroup):
    """Usage errors as one line with a hint (exit 2), in every command."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        _tidy(self)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _USAGE_ERROR as exc:
            path = exc.ctx.command_path if exc.ctx is not None else "ringbench"
            message = exc.format_message()
            if not message.strip():  # no command given: the help was printed, there is nothing to add
                code = 0
            else:
                sys.stderr.write(f"error: {message}{_given(exc, args)} (see: {path} -h)\n")
                code = exc.exit_code
        except typer.Abort:
            sys.stderr.write("interrupted\n")
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


_app = typer.Typer(
    name="ringbench",
    cls=RingbenchGroup,
    help="Benchmark and profile ring attention: exact rings, per-step records, reports, CI gate, ring-order advice.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT_SETTINGS,
)


def _version(value: bool) -> None:
    if value:
        from ringbench._version import __version__

        typer.echo(f"ringbench {__version__}")
        raise typer.Exit(0)


@_app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Benchmark and profile ring attention: exact rings, per-step records, reports, CI gate, ring-order advice."""


# Order here is the order in `--help`.
COMMAND_MODULES = (
    "run_cmd",
    "simulate_cmd",
    "calibrate_cmd",
    "analyze_cmd",
    "report_cmd",
    "compare_cmd",
    "baseline_cmd",
    "check_cmd",
    "check_timeline_cmd",
    "import_cmd",
    "topo_cmd",
    "recommend_cmd",
    "plan_cmd",
    "probe_cmd",
)

_registered: set[str] = set()


def _register(names) -> typer.Typer:
    """Register ``names`` (command modules) in --help order; each once."""
    for name in COMMAND_MODULES:
        if name in names and name not in _registered:
            importlib.import_module(f"ringbench.cli.{name}").register(_app)
            _registered.add(name)
    return _app


def __getattr__(name: str):
    if name == "app":  # the whole CLI (tests, help)
        return _register(COMMAND_MODULES)
    raise AttributeError(name)


def _command_module(argv: list[str]) -> str | None:
    """The module of the command ``argv`` names (the first word that is not an option), or None."""
    for word in argv:
        if word.startswith("-"):
            return None  # options before the command (--version, --help, completion): the whole CLI
        module = word.replace("-", "_") + "_cmd"
        return module if module in COMMAND_MODULES else None
    return None


def main() -> None:
    module = _command_module(sys.argv[1:])
    _register([module] if module is not None and "_TYPER_COMPLETE_ARGS" not in os.environ else COMMAND_MODULES)
    common.exit_when_done = False  # only this invocation's command may ask for it
    try:
        _app()
    except SystemExit as exc:
        if common.stopped_by_signal or common.exit_when_done:
            # A signal stopped the command, or the command is done, and everything worth keeping is on disk and
            # printed: leave now. The interpreter's own teardown (torch's, pyarrow's) takes a tenth of a second
            # idle and seconds on a loaded machine, and whoever waits (a user, SLURM, a CI runner) counts them.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.code if isinstance(exc.code, int) else 1)
        raise
