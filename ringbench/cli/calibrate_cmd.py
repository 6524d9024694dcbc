"""`ringbench calibrate`: one short run that measures what `ringbench simulate --from` needs, on this machine.

    ringbench calibrate                                    # 2 ranks, torch kernel, S = 1024 and 2048
    ringbench calibrate --kernel emulated:1 --world 4 --seq 4096
    ringbench calibrate --mask causal --mask causal-naive --dtype bfloat16 --device cuda --world 8
    ringbench simulate --from results/<calibration-run> --world 1024 --seq 1048576 --topology cluster.yaml

It runs S/2 and S (two block sizes per mask kind, several message sizes), sync and double buffering, forward and
backward (ringbench/experiments/calibration_run.py), fits the simulator's costs, prints them with their source
(measured, or the prior a cost still needs) and keeps them in the run's meta.json.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ringbench.cli.axis_options import with_axes
from ringbench.cli.common import OUTPUT_PANEL, TIMEOUT_HELP, JsonOption, Output, QuietOption, TopologyOption, cli_errors

PANEL = "Calibration run"


CALIBRATE_DEFAULTS = {"world": 2, "seq": 2048, "heads": 2, "head_dim": 32, "batch": 1, "dtype": "float32",
                      "kernel": "torch", "mask": "causal", "layout": "contiguous"}  # fmt: skip


@with_axes("calibrate", panel=PANEL, shown=lambda axis: str(CALIBRATE_DEFAULTS.get(axis.name)))
def calibrate(
    axes: dict | None = None,
    iters: Annotated[int, typer.Option(help="Timed iterations per case.", rich_help_panel=PANEL)] = 5,
    warmup: Annotated[int, typer.Option(help="Warm-up iterations.", rich_help_panel=PANEL)] = 1,
    check: Annotated[
        bool, typer.Option("--check/--no-check", help="Also check against float64 (slower).", rich_help_panel=PANEL)
    ] = False,
    timeout: Annotated[float, typer.Option(help=TIMEOUT_HELP, rich_help_panel=PANEL)] = 60.0,
    topology: TopologyOption = None,
    emulate_links: Annotated[
        bool,
        typer.Option("--emulate-links", help="Emulate the topology's links (as run does).", rich_help_panel=PANEL),
    ] = False,
    device: Annotated[
        Optional[str],
        typer.Option(help="cpu or cuda (default: cuda when there is a GPU per rank).", rich_help_panel=PANEL),
    ] = None,
    out: Annotated[Path, typer.Option(help="Results folder.", rich_help_panel=OUTPUT_PANEL)] = Path("results"),
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Measure what the simulator needs in one short run; print the fitted costs and where each came from.

    --seq is the larger length (S/2 runs too); --heads the heads you mean to predict; on a CPU --world is at most
    its cores; every --mask given is measured (default causal: full and causal blocks)."""
    from ringbench.cli.views import assumed_lines, calibration_table
    from ringbench.experiments.calibration_run import calibration_scenario, run_calibration

    given = {name: CALIBRATE_DEFAULTS[name] if value is None else value for name, value in axes.items()}
    world, seq, kernel = given["world"], given["seq"], given["kernel"]
    output = Output(json=json_out, quiet=quiet, document="calibrate")
    with cli_errors():
        scenario = calibration_scenario(
            world=world, seq=seq, heads=given["heads"], head_dim=given["head_dim"], batch=given["batch"],
            dtype=given["dtype"], kernel=kernel, masks=tuple(given["mask"]) or ("causal",), layout=given["layout"],
            iters=iters, warmup=warmup, check=check, timeout=timeout, topology=str(topology) if topology else None,
            emulate_links=emulate_links,
        )  # fmt: skip
        cases = len(scenario.cases())
        output.progress(f"ringbench calibrate: {cases} cases (S = {seq // 2} and {seq}, sync and double, "
                        f"forward and backward) on {world} ranks, kernel {kernel}")  # fmt: skip

        def on_case(row: dict, done: int, total: int) -> None:
            output.progress(f"[{done}/{total}] {row['mask']}/{row['buffer']} S={row['seq']}: step "
                            f"{row['step_ms']:.2f} ms")  # fmt: skip

        run_dir, calibration = run_calibration(scenario, out=out, on_case=on_case, device=device,
                                               command=shlex.join(["ringbench", *sys.argv[1:]]))  # fmt: skip
    if calibration is None:  # a launched rank other than 0
        return
    output.print(calibration_table(calibration))
    determined = sum(source.determined for source in calibration.sources)
    output.print(f"{determined} of {len(calibration.sources)} costs measured by this run; the rest are priors:")
    for line in assumed_lines(calibration) or ["(none)"]:
        output.print(f"  {line}")
    output.progress(f"wrote {run_dir}/ (a run record; meta.json keeps the calibration)")
    output.progress(f"next: ringbench simulate --from {run_dir} --world N --seq S ...")
    output.emit({"run_dir": str(run_dir), "calibration": calibration.to_dict()})


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate)
