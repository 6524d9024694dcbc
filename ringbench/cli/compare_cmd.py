"""`ringbench compare BASELINE CURRENT`: the CI performance gate (exit 0 pass, 1 regression, 2 usage error).

ringbench compare results/base results/pr --markdown gate.md
ringbench compare baselines/ring.json results/pr --json > gate.json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.common import OUTPUT_PANEL, JsonOption, Output, QuietOption, cli_errors, fail

_THRESHOLDS = "Thresholds"


def _parse_percent(value: str) -> float:
    """``5``, ``5%`` or ``5.0`` -> 0.05."""
    text = value.strip().removesuffix("%")
    try:
        percent = float(text)
    except ValueError:
        raise typer.BadParameter(f"max_regression={value!r} is not a number; expected a percentage such as 5") from None
    if not 0.0 <= percent < 100.0:
        raise typer.BadParameter(f"max_regression={value!r} is not allowed; expected a percentage in [0, 100)")
    return percent / 100.0


def compare(
    baseline: Annotated[Path, typer.Argument(help="Baseline: a run directory or a baseline file.")],
    current: Annotated[Path, typer.Argument(help="Current: a run directory or a baseline file.")],
    alpha: Annotated[
        float,
        typer.Option(help="Significance level of the two-sided Mann–Whitney test.", rich_help_panel=_THRESHOLDS),
    ] = 0.01,
    max_regression: Annotated[
        str,
        typer.Option(
            "--max-regression",
            metavar="PCT",
            help="Tolerated slowdown in percent; a larger significant slowdown fails the gate.",
            rich_help_panel=_THRESHOLDS,
        ),
    ] = "5",
    allow_mismatch: Annotated[
        bool,
        typer.Option(
            "--allow-mismatch",
            help="Compare even if device, backend, torch, world, dtype or emulation differ.",
            rich_help_panel=_THRESHOLDS,
        ),
    ] = False,
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples per case.", rich_help_panel=_THRESHOLDS)] = 4000,
    seed: Annotated[
        int, typer.Option(help="Bootstrap seed (verdicts are reproducible).", rich_help_panel=_THRESHOLDS)
    ] = 0,
    markdown: Annotated[
        Path | None,
        typer.Option(
            "--markdown",
            metavar="FILE",
            help="Also write a Markdown report (PR comment).",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = None,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Compare two runs (or baseline files) case by case; exit 1 when any case regressed."""
    from ringbench.gate.compare import compare as compare_runs
    from ringbench.gate.render import (
        comparison_document,
        headline,
        notes,
        render_markdown,
        render_table,
        summary_line,
    )
    from ringbench.gate.verdict import GateConfig

    try:
        threshold = _parse_percent(max_regression)
    except typer.BadParameter as exc:
        raise fail(str(exc), 2) from None
    with cli_errors():
        config = GateConfig(
            alpha=alpha, max_regression=threshold, resamples=resamples, seed=seed, allow_mismatch=allow_mismatch
        )
        result = compare_runs(baseline, current, config=config)
        if markdown is not None:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            markdown.write_text(render_markdown(result))
    out = Output(json=json_output, quiet=quiet, document="compare")
    out.print(
        headline(result),
        style="bold red" if result.regressed else "bold yellow" if result.too_few else "bold green",
    )
    out.print(render_table(result))
    for line in notes(result):
        out.note(line)
    out.print(summary_line(result))
    out.emit(comparison_document(result))
    raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
