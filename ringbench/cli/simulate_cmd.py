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
from rich.table import Table

from ringbench.cli.common import OUTPUT_PANEL, JsonOption, Output, QuietOption, TopologyOption, cli_errors
from ringbench.fmt import duration, json_value, number
from ringbench.simulate.costs import DEFAULTS

AXES_PANEL = "Sweep axes (repeatable; the cartesian product is simulated)"
MODEL_PANEL = "Costs and cluster"
SIM_PANEL = "Simulation"


def _axis(help_text: str):
    return typer.Option(help=help_text, rich_help_panel=AXES_PANEL, show_default="the default sweep of run")


def _worlds(text: str | None) -> tuple[int, ...]:
    from ringbench.errors import bad_value

    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise bad_value("scale", text, "comma-separated world sizes, e.g. 8,64,512,4096") from None


def _source_cell(sources: dict, cost: str) -> str:
    source = sources.get(cost)
    if source is None:
        return ""
    return "measured" if source.determined else "ASSUMED"


def calibration_table(calibration) -> Table:
    """The fitted costs: compute per phase and kind, links per class, host gaps, noise; each marked measured or
    ASSUMED (a stated prior: the notes below the table say which and why)."""
    costs = calibration.costs
    sources = {source.cost: source for source in calibration.sources}
    title = f"calibration from {costs.source} (what the model charges; ASSUMED: a stated prior, not measured)"
    table = Table(title=title, title_justify="left")
    for name in ("cost", "fwd", "bwd", "source (fwd / bwd)", "fit"):
        table.add_column(name, justify="left" if name in ("cost", "source (fwd / bwd)") else "right")

    def both(cost: str) -> str:
        cells = [_source_cell(sources, cost.format(phase=p)) for p in ("fwd", "bwd")]
        return " / ".join(cells) if cells[0] != cells[1] else cells[0]

    for kind in ("full", "causal", "partial"):
        cells = [number(costs.ms_per_gflop(phase, kind), ".4g") for phase in ("fwd", "bwd")]
        table.add_row(f"compute ms/GFLOP ({kind})", *cells, both("compute.{phase}.efficiency." + kind), "")
    fit = calibration.compute_fit
    residual = ", ".join(f"{p} {100 * v['median_rel_residual']:.1f}%" for p, v in fit.items())
    calls = (number(costs.call_ms.get(p), ".3f") for p in ("fwd", "bwd"))
    table.add_row("kernel call ms", *calls, both("compute.{phase}.call_ms"), f"residual {residual}")
    for buffer in ("double", "sync"):
        for step in ("enter_ms", "pre_ms", "mid_ms", "post_ms"):
            table.add_row(f"host {buffer} {step[:-3]} ms", *(number(costs.host(p, buffer)[step], ".3f")
                                                             for p in ("fwd", "bwd")),
                          both("host.{phase}." + buffer) if step == "enter_ms" else "", "")  # fmt: skip
    for name, link in costs.links.items():
        info = calibration.link_fit.get(name, {})
        table.add_row(f"link {name}: latency us / GB/s", number(link.latency_us, ".1f"),
                      number(link.bandwidth_gbps, ".4g"), _source_cell(sources, f"link.{name}"),
                      f"{info.get('transfers', 0)} transfers")  # fmt: skip
    table.add_row("noise CV compute / link", number(costs.compute_cv, ".3f"), number(costs.link_cv, ".3f"), "", "")
    factors = calibration.rank_factors
    if factors:
        worst = max(factors, key=lambda r: factors[r])
        table.add_row("per-rank compute (max ratio)", f"rank {worst}", number(factors[worst], ".3f"), "",
                      f"{len(factors)} ranks")  # fmt: skip
    return table


def extrapolation_table(assumptions) -> Table:
    """What the calibration measured beside what the prediction asks, and how the model treats the difference."""
    table = Table(title="what the calibration measured, and what this prediction assumes", title_justify="left")
    for name in ("aspect", "calibration measured", "prediction", "how the model prices it"):
        table.add_column(name, justify="left")
    for item in assumptions:
        table.add_row(
            item.aspect, item.measured, item.predicted, ("ASSUMED: " if item.assumed else "") + item.treatment
        )
    return table


def cases_table(cases) -> Table:
    table = Table(title="SIMULATED (a model's prediction, not a measurement)", title_justify="left")
    for name in ("case", "step", "fwd", "bwd", "exposed", "TFLOP/s per rank", "events"):
        table.add_column(name, justify="left" if name == "case" else "right")
    for row in cases:
        strategy = str(row.get("strategy") or "ring")
        extra = "" if strategy in ("ring", "allgather") else f" {strategy}" + (
            f"@{row['placement']}" if row.get("placement") else "")  # fmt: skip
        label = (f"w{row['world']} S={row['seq']} {row['mask']}/{row['layout']}/{row['buffer']}/{row['order']}{extra}"
                 + (f" [{row['faults']}]" if row["faults"] else ""))  # fmt: skip
        per_rank = row["tflops"] / row["world"] if row["world"] else float("nan")  # the record's figure is all ranks'
        table.add_row(label, duration(row["step_ms"]), duration(row["fwd_ms"]), duration(row["bwd_ms"]),
                      f"{number(100 * row['exposed_comm_frac'], '.1f')}%", number(per_rank, ".4g"),
                      row.get("events", ""))  # fmt: skip
    return table


def assumed_lines(calibration) -> list[str]:
    """One line per prior (the costs it stands in for, why, and what run would measure them)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for source in calibration.assumed():
        groups.setdefault((source.how, source.hint), []).append(source.cost)
    return [f"ASSUMED {', '.join(costs)}: {how}" + (f"; to measure it: {hint}" if hint else "")
            for (how, hint), costs in groups.items()]  # fmt: skip


def caveat_line(outcome) -> str | None:
    """One line when any cost of the prediction came from a prior (never a prediction without it)."""
    kernel = outcome.costs.kernel
    if kernel is not None:
        measured = " and what the calibration determined" if outcome.calibration is not None else ""
        return (f"caveat: PRIOR figures of the hardware catalogue for {kernel.gpu}{measured} (the notes above), not "
                "a measurement of this cluster; `ringbench calibrate` there and --from RUN_DIR replace them")  # fmt: skip
    if outcome.calibration is None:
        given = "the rate given (--compute-tflops) and " if outcome.costs.gflops != DEFAULTS.gflops else ""
        return (f"caveat: no calibration: {given}the documented default costs (400 TFLOP/s, 10 us per kernel call, "
                "5 us host gaps, 100 GB/s links), not a measurement of any machine; `ringbench calibrate` and "
                "--from RUN_DIR price a real one")  # fmt: skip
    assumed = [item.aspect for item in outcome.assumptions if item.assumed]
    if not assumed:
        return None
    return (
        f"caveat: this prediction extrapolates the calibration ({', '.join(dict.fromkeys(assumed))}): the "
        "costs marked ASSUMED are priors, not measurements"
    )


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        scenario: Annotated[
            Optional[str],
            typer.Argument(
                help="Scenario YAML file or shipped name (its kernel axis is ignored).",
                show_default="the default sweep of run",
            ),
        ] = None,
        world: Annotated[list[int], _axis("Ranks (8 to 65,536 and beyond).")] = [],  # noqa: B006
        seq: Annotated[list[int], _axis("Total sequence length S.")] = [],  # noqa: B006
        heads: Annotated[list[int], _axis("Attention heads.")] = [],  # noqa: B006
        head_dim: Annotated[list[int], _axis("Head dimension.")] = [],  # noqa: B006
        batch: Annotated[list[int], _axis("Batch size.")] = [],  # noqa: B006
        dtype: Annotated[list[str], _axis("float32, float64, bfloat16, float16.")] = [],  # noqa: B006
        mask: Annotated[
            list[str],
            _axis("none, causal, causal-naive, causal-document, full-document, window:W, causal-document+window:W."),
        ] = [],  # noqa: B006
        layout: Annotated[list[str], _axis("contiguous, zigzag, striped, doc-balanced.")] = [],  # noqa: B006
        buffer: Annotated[list[str], _axis("sync, double, allgather, sync-short, double-short.")] = [],  # noqa: B006
        docs: Annotated[
            list[str],
            _axis(
                "Packed documents of the document masks: lengths:..., file:PATH, "
                "lognormal:MEAN:SIGMA:SEED[:CAP], uniform:MIN:MAX:SEED[:CAP]."
            ),
        ] = [],  # noqa: B006
        order: Annotated[list[str], _axis("identity, reverse, random:SEED, stride:K, or 0-3-1-2.")] = [],  # noqa: B006
        strategy: Annotated[list[str], _axis("ring, ulysses, hybrid:U, double-ring:W, allgather.")] = [],  # noqa: B006
        placement: Annotated[list[str], _axis("heads-first, interleaved, or ranks such as 0-2-1-3.")] = [],  # noqa: B006
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
            Optional[float],
            typer.Option(
                help="Bandwidth between ranks without a topology, GB/s (default 100).", rich_help_panel=MODEL_PANEL
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
            typer.Option(
                help="Ranks per host without a topology (what slow-host counts).", rich_help_panel=MODEL_PANEL
            ),
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
        """Predict rings with a calibrated model; write results/<run-id>/ labelled SIMULATED."""
        from ringbench.rank.scenario import DEFAULT_SCENARIO, load_scenario
        from ringbench.report.markdown import render_section
        from ringbench.report.scale import scale_section
        from ringbench.simulate.sweep import SimRequest, run_simulation

        output = Output(json=json_out, quiet=quiet, document="simulate")
        with cli_errors():
            base = load_scenario(scenario) if scenario else DEFAULT_SCENARIO
            chosen = base.with_overrides(
                world=world, seq=seq, heads=heads, head_dim=head_dim, batch=batch, dtype=dtype, mask=mask,
                layout=layout, buffer=buffer, order=order, strategy=strategy, placement=placement,
                backward=backward, faults=fault, seed=seed, docs=docs,
            )  # fmt: skip
            request = SimRequest(
                scenario=chosen, iterations=iters, calibrate_from=calibrate_from, like=like,
                compute_tflops=compute_tflops, link_gbps=link_gbps, topology=topology, emulate_links=emulate_links,
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
