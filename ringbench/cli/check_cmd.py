"""`ringbench check --impl NAME`: is a context-parallel attention implementation right, and if not, where and why.

    ringbench check --impl torch-ring                   # the default matrix (a seeded sample; --full: all of it)
    ringbench check --impl my_pkg.ring:attention --world 3 --mask window:5 --layout zigzag --dtype bf16
    ringbench check --impl ringbench --json > check.json

Every case runs forward and backward on local ranks (gloo on CPU) and each tensor (out, lse where the function
returns it, dq, dk, dv) of each rank is compared with float64 single-device attention. Stdout: the findings first,
then the matrix and the error against world size; stderr: progress. Exit 0 when every case passes, 1 when any
fails, 2 on a usage error (or an implementation that cannot run here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.axis_options import with_axes
from ringbench.cli.common import OUTPUT_PANEL, JsonOption, Output, QuietOption, cli_errors, diag

AXES_PANEL = "Cases (repeatable; without any: the default matrix)"
CHECK_PANEL = "Check settings"


@with_axes("check", panel=AXES_PANEL)
def check(
    impl: Annotated[
        str,
        typer.Option(
            help="ringbench, torch-ring[:alltoall|:allgather], ring-attention-pytorch, ring-flash-attn, "
            "transformer-engine, or module:function (docs/implementations.md).",
            rich_help_panel=CHECK_PANEL,
            show_default=False,
        ),
    ],
    axes: dict | None = None,
    full: Annotated[
        bool, typer.Option("--full", help="Run the whole default matrix, not a sample.", rich_help_panel=CHECK_PANEL)
    ] = False,
    seed: Annotated[int, typer.Option(help="Seed of the default matrix's sample.", rich_help_panel=CHECK_PANEL)] = 0,
    cases: Annotated[
        int | None,
        typer.Option(
            "--cases",
            help="Cases in the default matrix's sample (default 72; never fewer than the ladder and one "
            "case of each mask variant and layout).",
            rich_help_panel=CHECK_PANEL,
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a rank may wait on another within one case; a rank silent for longer is named as stalled.",
            rich_help_panel=CHECK_PANEL,
        ),
    ] = 20.0,
    device: Annotated[str, typer.Option(help="cpu or cuda.", rich_help_panel=CHECK_PANEL)] = "cpu",
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            metavar="DIR",
            help="Also write DIR/report.html (the matrix as a grid, findings, error against world size).",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Check an implementation against float64 attention, per tensor and rank; say what is wrong and why.\f

    Long because Typer reads each option from one parameter; the body is parse, plan, run, render.
    """
    from ringbench.cli.check_views import check_document, check_lines, progress_line
    from ringbench.conformance import check_implementation, plan_cases
    from ringbench.errors import UsageError

    out = Output(json=json_out, quiet=quiet, document="check")
    with cli_errors():
        if device not in ("cpu", "cuda"):
            raise UsageError(f"device={device!r} is not allowed; expected cpu or cuda")
        if timeout <= 0:
            raise UsageError(f"timeout={timeout!r} is not allowed; expected a number of seconds > 0")
        if cases is not None and cases < 1:
            raise UsageError(f"cases={cases!r} is not allowed; expected an integer >= 1")
        given = dict(axes or {})
        planned, note, skipped, adapter = plan_cases(impl, given, seed=seed, full=full, budget=cases,
                                                     device_type=device)  # fmt: skip
        out.progress(f"ringbench check {impl}: {note}")
        for line in skipped[:5]:
            out.note(line)
        if len(skipped) > 5:
            out.note(f"... and {len(skipped) - 5} more combination(s) not supported")

        def on_case(row: dict, done: int, total: int) -> None:
            if not quiet:
                diag.print(progress_line(row, done, total), markup=False, highlight=False, soft_wrap=True)

        outcome = check_implementation(impl, planned, timeout_s=timeout, device=device, on_case=on_case, note=note,
                                       skipped=skipped, adapter=adapter)  # fmt: skip
        for line in check_lines(outcome):
            out.print(line)
        if report is not None:
            from ringbench.conformance.tolerance import CHECK_TOLERANCE
            from ringbench.report.check_section import write_check_report

            written = write_check_report(outcome.cases, outcome.findings, outcome.invariance, report, impl=impl,
                                         verdict=outcome.verdict, note=note,
                                         rtol={d: limits[0] for d, limits in CHECK_TOLERANCE.items()})  # fmt: skip
            out.progress(f"wrote {written}")
        out.emit(check_document(outcome))
    raise typer.Exit({"pass": 0, "fail": 1}.get(outcome.verdict, 2))  # skip: every case refused at run time


def register(app: typer.Typer) -> None:
    app.command("check")(check)
