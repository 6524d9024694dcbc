"""`ringbench run [SCENARIO]`: run rings across a sweep and record every step of every rank.

Single machine (local processes, gloo on CPU or NCCL on local GPUs):
    ringbench run                                  # the embedded default sweep
    ringbench run scenarios/masks.yaml --world 8 --seq 8192
torchrun (one process per GPU):
    torchrun --nproc-per-node 8 -m ringbench run scenarios/orderings.yaml
SLURM (MASTER_ADDR / MASTER_PORT exported by the batch script):
    srun --ntasks-per-node 8 python -m ringbench run scenarios/scaling.yaml

Progress (one line per finished case) goes to stderr; the table and the answers to stdout.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ringbench.cli.axis_options import with_axes
from ringbench.cli.common import (
    OUTPUT_PANEL,
    TIMEOUT_HELP,
    JsonOption,
    Output,
    QuietOption,
    TopologyOption,
    cli_errors,
    diag,
)
from ringbench.cli.views import case_line, summary_table
from ringbench.fmt import json_value
from ringbench.scenario.scenario import DEFAULT_SCENARIO

AXES_PANEL = "Sweep axes (repeatable; defaults: without a scenario file)"
RUN_PANEL = "Run settings"


def _default(name: str) -> str:
    """The embedded default scenario's value, as --help shows it."""
    value = getattr(DEFAULT_SCENARIO, name)
    return ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


@with_axes("run", panel=AXES_PANEL, shown=lambda axis: _default(axis.name))
def run(
    scenario: Annotated[
        str | None,
        typer.Argument(help="Scenario YAML file or shipped name (default, masks, buffers, ...).", show_default=False),
    ] = None,
    axes: dict | None = None,
    backward: Annotated[
        bool | None,
        typer.Option(
            "--backward/--no-backward",
            help=f"Time the backward ring. (default: {str(DEFAULT_SCENARIO.backward).lower()})",
            rich_help_panel=RUN_PANEL,
        ),
    ] = None,
    iters: Annotated[
        int | None,
        typer.Option(help=f"Timed iterations per case. (default: {_default('iters')})", rich_help_panel=RUN_PANEL),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(help=f"Warm-up iterations. (default: {_default('warmup')})", rich_help_panel=RUN_PANEL),
    ] = None,
    check: Annotated[
        bool | None,
        typer.Option(
            "--check/--no-check",
            help=f"Compare with float64 attention. (default: {str(DEFAULT_SCENARIO.check).lower()})",
            rich_help_panel=RUN_PANEL,
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(help=f"{TIMEOUT_HELP} (default: {_default('timeout')})", rich_help_panel=RUN_PANEL),
    ] = None,
    repeat: Annotated[
        int | None,
        typer.Option(
            help=f"Fresh process groups per case (noise for the CI gate). (default: {_default('repeat')})",
            rich_help_panel=RUN_PANEL,
        ),
    ] = None,
    fault: Annotated[
        list[str],
        typer.Option(
            help="slow-rank:R:F, slow-link:S:D:MS, jitter:MS, crash:R:STEP, hang:R:STEP (repeatable).",
            rich_help_panel=RUN_PANEL,
        ),
    ] = [],  # noqa: B006
    no_fault: Annotated[
        bool,
        typer.Option(
            "--no-fault",
            help="Clear the scenario's faults (those given with --fault are kept).",
            rich_help_panel=RUN_PANEL,
        ),
    ] = False,
    topology: TopologyOption = None,
    emulate_links: Annotated[
        bool,
        typer.Option(
            "--emulate-links",
            help="Inject the --topology's link costs as transfer delays.",
            rich_help_panel=RUN_PANEL,
        ),
    ] = False,
    device: Annotated[
        str | None,
        typer.Option(help="cpu or cuda (default: cuda when there is a GPU per rank).", rich_help_panel=RUN_PANEL),
    ] = None,
    loopback: Annotated[
        bool,
        typer.Option(
            "--loopback",
            help="A 1-rank ring exchanges its blocks with itself (the one-GPU transfer test).",
            rich_help_panel=RUN_PANEL,
        ),
    ] = False,
    out_dir: Annotated[Path, typer.Option("--out", help="Results folder.", rich_help_panel=OUTPUT_PANEL)] = Path(
        "results"
    ),
    resume: Annotated[
        Path | None,
        typer.Option(help="Continue this run directory: run only its missing cases.", rich_help_panel=OUTPUT_PANEL),
    ] = None,
    no_trace: Annotated[
        bool,
        typer.Option(
            "--no-trace", help="Record iteration times only, no per-step spans.", rich_help_panel=OUTPUT_PANEL
        ),
    ] = False,
    report: Annotated[
        bool, typer.Option("--report", help="Also write reports/<run-id>/.", rich_help_panel=OUTPUT_PANEL)
    ] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Capture the last timed iteration of each case with the PyTorch profiler "
            "(results/<run>/profile/; compare with `ringbench check-timeline`).",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Run rings across a sweep; write results/<run-id>/ (events, cases, metadata); print the answers.\f

    Long because Typer reads each option from one parameter of the command's signature: one annotated parameter
    per option makes most of its lines; the body (load, override, run, report) alone is well under 80.
    (The ``\\f`` ends what --help shows of this docstring.)
    """
    from ringbench.errors import Interrupted, RunFailure
    from ringbench.run.cases import preflight
    from ringbench.run.interrupt import StopRequested, StopSignals, signal_name
    from ringbench.run.state import resume_base
    from ringbench.run.sweep import execute
    from ringbench.scenario.scenario import load_scenario

    out = Output(json=json_out, quiet=quiet, document="run")
    with cli_errors(), StopSignals():  # a signal before or after the sweep ends the command cleanly too
        if scenario:
            base = load_scenario(scenario)
        else:
            base = resume_base(resume) if resume is not None else DEFAULT_SCENARIO
        chosen = base.with_overrides(
            **axes, backward=backward, iters=iters,
            warmup=warmup, check=check, timeout=timeout, repeat=repeat, faults=fault,
            topology=str(topology) if topology else None, emulate_links=emulate_links or None,
        )  # fmt: skip
        if no_fault:  # the scenario's faults go; those given with --fault stay
            chosen = dataclasses.replace(chosen, faults=tuple(fault))
        preflight(chosen, device=device, loopback=loopback, trace=not no_trace)  # nothing printed before it
        cases = chosen.cases()
        total = len(cases) * chosen.repeat
        emulated = any(c.emulated for c in cases) or chosen.emulate_links
        out.progress(
            f"ringbench: scenario {chosen.name} ({chosen.source}), {total} case(s)"
            + (" — EMULATED compute" if emulated else "")
            + (f" — faults: {', '.join(chosen.faults)}" if chosen.faults else "")
        )
        if all(c.world == 1 for c in cases) and not loopback:
            out.progress("note: a 1-rank ring has no communication; only compute is measured")
        with Progress(
            TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=diag, transient=True, disable=quiet,
        ) as progress:  # fmt: skip
            task = progress.add_task("cases", total=total)

            def on_case(row: dict, done: int, total_cases: int) -> None:
                if not quiet:
                    progress.console.print(case_line(row, done, total_cases), markup=False, highlight=False)
                progress.update(task, completed=done)

            try:
                state = execute(
                    chosen, out=out_dir, resume=resume, trace=not no_trace, on_case=on_case, device=device,
                    command=shlex.join(["ringbench", *sys.argv[1:]]), profile=profile, loopback=loopback,
                )  # fmt: skip
            except (RunFailure, Interrupted) as exc:  # --json still gets its one document: the kept cases, why
                key = "interrupted" if isinstance(exc, Interrupted) else "error"
                out.emit({"run_dir": exc.run_dir, key: str(exc), "cases": _kept_cases(exc.run_dir)})
                raise
        if state is None:  # a non-zero rank under torchrun / SLURM: rank 0 reports
            return
        try:
            _finish(state, out, chosen, emulated, report)
        except StopRequested as stop:  # the record is whole: say so rather than die mid-table
            raise Interrupted(f"interrupted by {signal_name(stop.signum)} after every case was stored: "
                              f"{state.run_dir} is complete (nothing to resume)", stop.signum,
                              run_dir=str(state.run_dir)) from None  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("run")(run)


def _finish(state, out: Output, chosen, emulated: bool, report: bool) -> None:
    """After the sweep: notes, the table, the answers, the optional report, the --json document."""
    from ringbench.record.store import load_run

    for note in state.notes:
        out.note(note)
    run_data = load_run(state.run_dir)
    block = _answers(run_data, state.run_dir)
    report_dir = None
    if report:
        from ringbench.report.writer import write_report

        report_dir = write_report(run_data, Path("reports"))
        if block is not None:  # the report is written: the next step is to read it
            block = dataclasses.replace(block, next_step=f"open {report_dir / 'report.html'}   (trace.json beside "
                                        "it opens in https://ui.perfetto.dev)")  # fmt: skip
    if len(state.cases):
        out.print(summary_table(state.cases, emulated, list(chosen.faults)))
    else:  # every case was skipped (another implementation that cannot run here): the notes above say why
        out.note("no case ran: every case was skipped")
    for line in block.lines() if block is not None else []:
        out.print(line)
    out.progress(f"wrote {state.run_dir}/ (events.parquet, cases.parquet, cases.csv, meta.json)")
    if report_dir is not None:
        out.progress(f"wrote {report_dir}/ (report.html, report.md, trace.json, figures)")
    out.emit({"run_dir": str(state.run_dir), "emulated": emulated, "cases": json_cases(state.cases),
              "answers": block.document() if block is not None else None}
             | ({"report_dir": str(report_dir)} if report_dir is not None else {}))  # fmt: skip
    failed = state.cases[~state.cases["passed"].astype(bool)]
    if len(failed):
        diag.print(f"error: {len(failed)} case(s) failed the correctness check", markup=False)
        raise typer.Exit(1)


def _kept_cases(run_dir: str | None) -> list[dict]:
    """The cases a failed run finished before it stopped (its results folder), for the --json document."""
    from ringbench.errors import RingbenchError
    from ringbench.record.store import load_run

    if run_dir is None:
        return []
    try:
        cases = load_run(run_dir).cases
    except (OSError, RingbenchError):
        return []
    return json_cases(cases) if len(cases) else []


def _answers(run_data, run_dir):
    from ringbench.analysis.answers import answers
    from ringbench.analysis.findings import analyze

    if run_data.events.empty:
        return None
    return answers(analyze(run_data), str(run_dir))


def json_cases(cases) -> list[dict]:
    records = []
    for row in cases.to_dict("records"):
        clean = json_value(row)
        clean["ring"] = [int(r) for r in str(row["ring"]).split("-")]
        nonfinite = str(row.get("nonfinite") or "")
        if nonfinite and nonfinite != "nan":
            clean["passed"] = False  # NaN errors because the tensors hold NaN: checked, and failed
        elif clean.get("fwd_max_abs_err") is None and clean.get("bwd_max_abs_err") is None:
            clean["passed"] = None  # not checked: no verdict (the cases table keeps True: nothing failed)
        records.append(clean)
    return records
