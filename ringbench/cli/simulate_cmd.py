"""`ringbench simulate [SCENARIO]`: predict rings of 8 to 65,536 ranks with a model calibrated on a measured run.

    ringbench simulate --world 1024 --seq 1048576 --fault slow-host:3:1.5 --topology cluster.yaml
    ringbench simulate --from results/<run> --world 8 --world 64 --layout zigzag --buffer double --buffer sync
    ringbench simulate --like results/<run> --from results/<calibration-run>   # predict a measured run
    ringbench simulate --world 64 --scale 8,64,512,4096 --json

Every number it prints or stores is SIMULATED (meta ``simulated: true``, kernel ``simulated``); the record it
writes is read by ``analyze``, ``report`` and ``compare`` like a run's. docs/simulate.md: the model, calibration
and its measured accuracy.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ringbench.cli.axis_options import with_axes
from ringbench.cli.common import OUTPUT_PANEL, JsonOption, Output, QuietOption, TopologyOption, cli_errors
from ringbench.cli.views import assumed_lines, calibration_table, cases_table, caveat_line, extrapolation_table
from ringbench.fmt import duration, json_value, number

AXES_PANEL = "Sweep axes (repeatable; the cartesian product is simulated)"
MODEL_PANEL = "Costs and cluster"
SIM_PANEL = "Simulation"


def _worlds(text: str | None) -> tuple[int, ...]:
    from ringbench.errors import bad_value

    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise bad_value("scale", text, "comma-separated world sizes, e.g. 8,64,512,4096") from None


@with_axes("simulate", panel=AXES_PANEL, shown=lambda axis: "the default sweep of run")
def simulate(
    scenario: Annotated[
        Optional[str],
        typer.Argument(
            help="Scenario YAML file or shipped name (its kernel axis is ignored).",
            show_default="the default sweep of run",
        ),
    ] = None,
    axes: dict | None = None,
    backward: Annotated[
        Optional[bool],
        typer.Option(
            "--backward/--no-backward",
            help="Simulate the backward ring too.",
            rich_help_panel=SIM_PANEL,
            show_default="yes",
        ),
    ] = None,
    fault: Annotated[
        list[str],
        typer.Option(
            help="slow-rank:R:F, slow-host:H:F, slow-link:S:D:MS or jitter:MS (repeatable).",
            rich_help_panel=SIM_PANEL,
        ),
    ] = [],  # noqa: B006
    iters: Annotated[int, typer.Option(help="Simulated iterations per case.", rich_help_panel=SIM_PANEL)] = 1,
    seed: Annotated[
        Optional[int],
        typer.Option(help="Seed of the model's noise (>= 0).", min=0, rich_help_panel=SIM_PANEL, show_default="0"),
    ] = None,
    calibrate_from: Annotated[
        Optional[Path],
        typer.Option(
            "--from",
            metavar="RUN_DIR",
            rich_help_panel=MODEL_PANEL,
            help="Calibrate on a measured run (real, emulated or imported): compute rates, links, "
            "host overheads, noise. Without it: the documented defaults.",
        ),
    ] = None,
    like: Annotated[
        Optional[Path],
        typer.Option(
            metavar="RUN_DIR",
            rich_help_panel=MODEL_PANEL,
            help="Predict this measured run: its cases, faults, topology and emulated rates.",
        ),
    ] = None,
    compute_tflops: Annotated[
        Optional[float],
        typer.Option(help="Nominal compute rate per rank, TFLOP/s (default 400).", rich_help_panel=MODEL_PANEL),
    ] = None,
    link_gbps: Annotated[
        Optional[str],
        typer.Option(
            help="Bandwidth between ranks without a topology: GB/s, or with a unit (100Gbps, 12.5GB/s; default 100 "
            "GB/s).",
            rich_help_panel=MODEL_PANEL,
        ),
    ] = None,
    topology: TopologyOption = None,
    gpu: Annotated[
        Optional[str],
        typer.Option(
            help="The GPU (NVML name or alias; ringbench plan --list-gpus): price compute and links "
            "from the hardware catalogue (PRIOR figures; default: what NVML finds here).",
            rich_help_panel=MODEL_PANEL,
        ),
    ] = None,
    attention: Annotated[
        Optional[str],
        typer.Option(help="The attention kernel with --gpu: fa2, fa3, cudnn.", rich_help_panel=MODEL_PANEL),
    ] = None,
    detect: Annotated[
        bool,
        typer.Option(
            "--detect/--no-detect",
            help="Ask NVML which GPUs this machine has (fills --gpu).",
            rich_help_panel=MODEL_PANEL,
        ),
    ] = True,
    emulate_links: Annotated[
        bool,
        typer.Option(
            "--emulate-links",
            rich_help_panel=MODEL_PANEL,
            help="The topology's links are emulated, as in run --topology FILE --emulate-links.",
        ),
    ] = False,
    gpus_per_host: Annotated[
        int,
        typer.Option(help="Ranks per host without a topology (what slow-host counts).", rich_help_panel=MODEL_PANEL),
    ] = 8,
    scale: Annotated[
        Optional[str],
        typer.Option(
            metavar="N,N,...",
            rich_help_panel=SIM_PANEL,
            help="Scale view over these world sizes: step time, exposed communication "
            "and efficiency per buffer and layout, blast radius of a slow rank.",
        ),
    ] = None,
    fixed_seq: Annotated[
        bool,
        typer.Option(
            "--fixed-seq",
            rich_help_panel=SIM_PANEL,
            help="Scale view: keep S fixed (default: tokens per rank fixed).",
        ),
    ] = False,
    max_events: Annotated[
        int,
        typer.Option(
            help="Events per case above which the record is bounded (docs/simulate.md).",
            rich_help_panel=OUTPUT_PANEL,
        ),
    ] = 1_000_000,
    out: Annotated[Path, typer.Option(help="Results folder.", rich_help_panel=OUTPUT_PANEL)] = Path("results"),
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Predict rings with a calibrated model; write results/<run-id>/ labelled SIMULATED.\f

    Long because Typer reads each option from one parameter of the command's signature: one annotated parameter
    per option makes most of its lines; the body (build the request, simulate, print) alone is well under 80.
    (The ``\\f`` ends what --help shows of this docstring.)
    """
    from ringbench.advise.simulation import SimRequest, run_simulation
    from ringbench.report.markdown import render_section
    from ringbench.report.scale import scale_section
    from ringbench.scenario.scenario import DEFAULT_SCENARIO, load_scenario
    from ringbench.topology.units import parse_bandwidth

    output = Output(json=json_out, quiet=quiet, document="simulate")
    with cli_errors():
        base = load_scenario(scenario) if scenario else DEFAULT_SCENARIO
        if gpu is not None and not axes.get("dtype") and not scenario and like is None:
            axes = axes | {"dtype": ("bfloat16",)}  # a GPU's attention kernels run bf16/fp16, not the CPU's float32
            output.note("dtype bfloat16 (the default with --gpu; --dtype float16 for the other)")
        chosen = base.with_overrides(**axes, backward=backward, faults=fault, seed=seed)
        request = SimRequest(
            scenario=chosen, iterations=iters, calibrate_from=calibrate_from, like=like,
            compute_tflops=compute_tflops, link_gbps=None if link_gbps is None else parse_bandwidth(link_gbps,
            "link_gbps"), topology=topology, emulate_links=emulate_links,
            gpus_per_host=gpus_per_host, scale=_worlds(scale), fixed_seq=fixed_seq, max_events=max_events,
            out=out, command=shlex.join(["ringbench", *sys.argv[1:]]), gpu=gpu, attention=attention,
            detect=detect,
        )  # fmt: skip

        def on_case(result, done: int, total: int) -> None:
            row = result.row
            output.progress(
                f"[{done}/{total}] SIMULATED w={row['world']} S={row['seq']} {row['layout']}/{row['buffer']}: "
                f"step {duration(row['step_ms'])}, exposed comm "
                f"{number(100 * row['exposed_comm_frac'], '.1f')}%" + (" (bounded events)" if result.bounded
                                                                      else "")
            )  # fmt: skip

        outcome = run_simulation(request, on_case=on_case)
    if outcome.calibration is not None:
        output.print(calibration_table(outcome.calibration))
        for note in outcome.calibration.notes + outcome.calibration.excluded:
            output.note(note)
        for line in assumed_lines(outcome.calibration):
            output.note(line)
        output.print(extrapolation_table(outcome.assumptions))
    for note in outcome.notes:
        output.note(note)
    rows = [r.row | {"events": r.profile.get("events") or ("bounded" if r.bounded else "full")}
            for r in outcome.results]  # fmt: skip
    output.print(cases_table(rows))
    caveat = caveat_line(outcome)
    if caveat is not None:
        output.print(caveat)
    section = scale_section(outcome.scale)
    if section is not None:
        output.print("\n".join(line for line in render_section(section) if not line.startswith(("<a id", "!["))))
    output.progress(f"wrote {outcome.run_dir}/ (events.parquet, cases.parquet, cases.csv, meta.json) -- SIMULATED")
    output.emit(json_document(outcome))


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)


def json_document(outcome) -> dict:
    """``--json``: ``run --json``'s per-case keys plus ``simulated: true``, the calibration and the scale view."""
    cases = []
    for result in outcome.results:
        row = dict(json_value(result.row))
        row["ring"] = [int(r) for r in str(row["ring"]).split("-")]
        cases.append(row | {"simulated": True, "events": result.profile.get("events") or (
                            "bounded" if result.bounded else "full"),
                            "critical_path": json_value(result.critical)})  # fmt: skip
    document = {"run_dir": str(outcome.run_dir), "simulated": True, "emulated": True, "cases": cases,
                "costs": outcome.costs.to_dict()}  # fmt: skip
    if outcome.calibration is not None:
        document["calibration"] = outcome.calibration.to_dict()
        document["extrapolation"] = [item.to_dict() for item in outcome.assumptions]
        document["assumed"] = [source.to_dict() for source in outcome.calibration.assumed()]
    if outcome.notes:
        document["notes"] = list(outcome.notes)
    if outcome.scale is not None:
        document["scale"] = outcome.scale
    return json_value(document)
