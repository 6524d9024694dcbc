"""`ringbench check-timeline RUN_DIR [--json]`: the recorder's spans against the profiler's (run --profile).

Exit 0 when every kind agrees within tolerance, 1 when one does not, 2 on bad input (e.g. a run without profile/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from ringbench.cli.common import JsonOption, Output, QuietOption, cli_errors

_LEGEND = (
    "pairs: spans matched across recorder and profiler; missing: spans on one side only; |Δ| and tol in ms,\n"
    "median/p90 over pairs; overlap: share of the kind's time during which the rank computed (for compute: had\n"
    "a transfer in flight), from the recorder's / the profiler's spans; *: medians judged, p90s not (see note)"
)


def _ms(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"  # NaN: nothing to compare


def _share(value: float) -> str:
    return "-" if value != value else f"{value:.0%}"


def _table(check) -> Table:
    table = Table(
        title=f"run {check.run_id}: recorder vs profiler, profiled iteration"
        + ("" if check.iteration is None else f" {check.iteration}"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
    )
    for header in ("kind", "pairs", "missing", "|Δstart|", "|Δdur|", "overlap", "tol", ""):
        table.add_column(header, justify="left" if header in ("kind", "") else "right", no_wrap=True)
    for row in check.agreement.itertuples(index=False):
        table.add_row(
            row.kind,
            str(row.matched),
            str(row.unmatched),
            f"{_ms(row.start_median_ms)}/{_ms(row.start_p90_ms)}",
            f"{_ms(row.duration_median_ms)}/{_ms(row.duration_p90_ms)}",
            f"{_share(row.recorded_overlap)}/{_share(row.profiled_overlap)}",
            _ms(row.tolerance_ms),
            Text("pass" if row.passed else "FAIL", style="green" if row.passed else "bold red")
            + ("" if row.p90_judged else "*"),
        )
    return table


def register(app: typer.Typer) -> None:
    @app.command(
        "check-timeline",
        help="Check the recorder against the PyTorch profiler for the profiled iteration of a run made with "
        "`run --profile`: per kind (compute, send, recv) matched spans, |Δstart| and |Δduration|, overlap. "
        "Exit 0 within tolerance, 1 beyond.",
    )
    def _check_timeline(
        run_dir: Annotated[
            Path, typer.Argument(help="A results/<run-id>/ folder with a profile/.", show_default=False)
        ],
        json_out: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.analysis.timeline_check import check_timeline, timeline_document
        from ringbench.record.store import load_run

        out = Output(json=json_out, quiet=quiet, document="check-timeline")
        with cli_errors():
            check = check_timeline(load_run(run_dir))
        verdict = "agree within tolerance" if check.passed else "DISAGREE beyond tolerance"
        out.print(f"recorder and profiler {verdict}", style="bold green" if check.passed else "bold red")
        out.print(_table(check))
        out.print(_LEGEND)
        failed = check.by_case[~check.by_case["passed"]]
        for case_id in failed["case_id"].unique():
            kinds = ", ".join(failed[failed["case_id"] == case_id]["kind"])
            out.print(f"case {case_id}: beyond tolerance in {kinds}")
        if check.emulated:
            out.print("emulated compute: the profiler sees the modelled time as 'ringbench:emulated pad'")
        for note in check.notes:
            out.note(note)
        out.emit({"run_dir": str(run_dir)} | timeline_document(check))
        raise typer.Exit(0 if check.passed else 1)
