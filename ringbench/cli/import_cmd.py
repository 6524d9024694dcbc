"""`ringbench import TRACES... [--out results/] [--json]`: PyTorch profiler traces of any program -> a record.

ringbench import traces/                       # a folder with one trace per rank (*.json or *.json.gz)
ringbench import dumps/                         # torch's flight-recorder dumps of a stuck job (one per rank):
                                                # the stalled ring edge and the ranks that never posted
ringbench import rank0.json.gz rank1.json.gz --iteration-marker train_step --compute-pattern my_attn_kernel
then: ringbench analyze results/<run-id>, report, compare, recommend --topology FILE results/<run-id>

Exit 0 on success, 2 on bad input (one line: what was found, what to pass).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from ringbench.cli import common
from ringbench.cli.common import OUTPUT_PANEL, JsonOption, Output, cli_errors
from ringbench.fmt import exposed_text, ring_text

# Before pandas loads Arrow: Arrow's default allocator keeps what it frees, and an import frees a trace's worth of
# text columns per rank (traces/arrow_memory.py says how much that held); the system allocator returns it. Set for
# the whole process here, since parts of Arrow allocate from the process default whatever pyarrow is told later;
# a value the user set wins.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")


def register(app: typer.Typer) -> None:
    @app.command(
        "import",
        help="Import PyTorch profiler traces (one per rank, any ring-attention program) into a results/<run-id>/ "
        "record: ring order, steps, compute, send/recv and waits per rank, so that analyze, report, compare and "
        "recommend work on it. Given torch's flight-recorder dumps of a stuck job instead (one per rank, JSON or "
        "pickled), it names the stalled ring edge and the ranks that never posted.",
    )
    def _import(
        traces: Annotated[
            list[Path],
            typer.Argument(help="Trace files (.json / .json.gz), or folders holding them.", show_default=False),
        ],
        out_dir: Annotated[
            Path, typer.Option("--out", help="Where the record's folder is created.", rich_help_panel=OUTPUT_PANEL)
        ] = Path("results"),
        iteration_marker: Annotated[
            Optional[str],
            typer.Option(
                "--iteration-marker",
                help="A record_function name that marks one iteration (default: "
                "ProfilerStep#N, else ringbench:iteration K, else the whole trace).",
            ),
        ] = None,
        compute_pattern: Annotated[
            Optional[list[str]],
            typer.Option(
                "--compute-pattern",
                help="A regular expression naming attention ops or kernels, added to the default list (repeatable).",
            ),
        ] = None,
        json_out: JsonOption = False,
        quiet: Annotated[
            bool,
            typer.Option(
                "--quiet",
                "-q",
                help="Print only where the record went (and errors; the JSON document with --json).",
                rich_help_panel=OUTPUT_PANEL,
            ),
        ] = False,
    ) -> None:
        import sys

        from ringbench.traces.flight_recorder import dump_files, read_hang
        from ringbench.traces.importer import import_traces

        out = Output(json=json_out, quiet=quiet, document="import")
        if dump_files(traces):  # a stuck job's flight recorder, not profiler traces
            with cli_errors():
                hang = read_hang(traces)
            out.print(hang.line)
            out.emit({"kind": "hang"} | hang.document())
            return
        with cli_errors(), _progress(disable=quiet or json_out) as progress:
            result = import_traces(traces, out=out_dir, iteration_marker=iteration_marker,
                                   compute_patterns=tuple(compute_pattern or ()),
                                   command=" ".join(["ringbench", *sys.argv[1:]]), progress=progress)  # fmt: skip
        _render(out, result, quiet=quiet and not json_out)
        common.exit_when_done = True  # the record is written and the answer printed (cli/common.py)


def _render(out: Output, result, quiet: bool) -> None:
    """The import's summary: where it went, the ring, what was taken as compute, the notes; the --json document.
    ``quiet``: only where the record went (the one thing a script needs)."""
    if quiet:
        Output(document="import").print(str(result.run_dir))
    case = result.cases.iloc[0]
    rate = result.trace_bytes / 1e6 / result.seconds if result.seconds > 0 else float("nan")
    imported = result.meta["imported"]
    readers = ", ".join(sorted(set(imported.get("readers", [])))) or "n/a"
    out.print(f"imported {len(imported['traces'])} traces ({result.trace_bytes / 1e6:.1f} MB in "
              f"{result.seconds:.1f} s, {rate:.1f} MB/s; read {readers}) -> {result.run_dir}")  # fmt: skip
    exposed = exposed_text(case["exposed_comm_frac"], case["world"])
    out.print(f"ring {ring_text(result.ring)}; {int(case['iters'])} iteration(s); step "
              f"{case['step_ms']:.2f} ms (median); exposed communication {exposed}"
              + (" — EMULATED compute (modelled kernel times)" if bool(case["emulated"]) else ""))  # fmt: skip
    taken = [note for note in result.notes if note.startswith("compute taken:")]
    for line in taken:  # what was taken as the block computation: the user checks it first
        out.print(line)
    out.print(f"next: ringbench analyze {result.run_dir}")
    for note in result.notes:
        if note not in taken:
            out.note(note)
    out.emit({"run_dir": str(result.run_dir), "ring": result.ring, "world": int(case["world"]),
              "iterations": int(case["iters"]), "step_ms": float(case["step_ms"]),
              "exposed_comm_frac": float(case["exposed_comm_frac"]), "seconds": result.seconds,
              "trace_mb": result.trace_bytes / 1e6, "emulated": bool(case["emulated"]),
              "readers": imported.get("readers", []), "compute": imported.get("compute"),
              "notes": list(result.notes)})  # fmt: skip


class _progress:
    """A rich progress bar per trace on stderr (MB read, MB/s); nothing when disabled (-q, --json)."""

    def __init__(self, disable: bool) -> None:
        self.disable = disable
        self.bar = None
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        if self.disable:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        from ringbench.cli.common import diag

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            console=diag, transient=True)  # fmt: skip
        self.bar.__enter__()
        return self.update

    def update(self, name: str, nbytes: int, total: int) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.bar.add_task(name, total=total)
        self.bar.advance(self.tasks[name], nbytes)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
