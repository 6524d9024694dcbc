"""`ringbench baseline save RUN_DIR PATH`: keep a run's per-iteration samples as a small file to commit;
`ringbench baseline noise RUN...`: how noisy those samples are, before picking a gate's threshold (docs/ci-gate.md).

ringbench baseline noise results/a results/b
ringbench baseline save results/main-2024-06-01 baselines/ring-4rank.json
ringbench compare baselines/ring-4rank.json results/pr
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ringbench.cli.common import CONTEXT_SETTINGS, JsonOption, Output, QuietOption, cli_errors

baseline_app = typer.Typer(
    name="baseline",
    help="Save a run as a compact, versioned baseline file for `ringbench compare`; measure a run's noise.",
    no_args_is_help=True,
    context_settings=CONTEXT_SETTINGS,
)


@baseline_app.command("save")
def save(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (results/<run-id>).")],
    path: Annotated[Path, typer.Argument(help="The baseline file to write (JSON), e.g. baselines/ring.json.")],
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Write RUN_DIR's must-match metadata, case axes and per-iteration samples to PATH."""
    from ringbench.gate.baseline import write_baseline
    from ringbench.gate.samples import sample_set_from_run
    from ringbench.record.store import load_run

    with cli_errors():
        samples = sample_set_from_run(load_run(run_dir), source=str(run_dir))
        written = write_baseline(samples, path)
    size = written.stat().st_size
    total = sum(case.n_samples for case in samples.cases)
    out = Output(json=json_out, quiet=quiet, document="baseline")
    out.print(
        f"saved {len(samples.cases)} cases ({total} samples) from run {samples.run_id} to {written} ({size} bytes)"
    )
    out.emit({"run_dir": str(run_dir), "run_id": samples.run_id, "baseline": str(written), "bytes": size,
              "cases": len(samples.cases), "samples": total})  # fmt: skip


@baseline_app.command("noise")
def noise(
    runs: Annotated[list[str], typer.Argument(metavar="RUN...", help="Run directories or baseline files.")],
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Per case of each RUN: the CV of step times within a repeat and the CV of the per-repeat medians (run to
    run), the noise a gate's threshold must sit well above."""
    from dataclasses import asdict

    from ringbench.gate.noise import format_noise, noise_of

    with cli_errors():
        noise_by_run = noise_of(runs)
    out = Output(json=json_out, quiet=quiet, document="baseline-noise")
    for run, rows in noise_by_run.items():
        out.print(run)
        out.print(format_noise(rows))
    out.emit({"runs": [{"run": run, "cases": [asdict(row) for row in rows]} for run, rows in noise_by_run.items()]})


def register(app: typer.Typer) -> None:
    app.add_typer(baseline_app)
