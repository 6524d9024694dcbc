"""`ringbench` entry point. Each command lives in its own module, which exposes ``register(app)``."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="ringbench",
    help="Benchmark and profile ring attention: exact rings, per-step records, reports, CI gate, ring-order advice.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Order here is the order in `--help`.
COMMAND_MODULES = (
    "run_cmd",
    "analyze_cmd",
    "check_timeline_cmd",
    "import_cmd",
    "report_cmd",
    "compare_cmd",
    "baseline_cmd",
    "topo_cmd",
    "recommend_cmd",
    "probe_cmd",
)

for _name in COMMAND_MODULES:
    importlib.import_module(f"ringbench.cli.{_name}").register(app)


def main() -> None:
    app()
