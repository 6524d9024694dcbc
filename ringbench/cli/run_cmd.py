"""`ringbench run [SCENARIO]`: run rings across a sweep and record every step of every rank.

Single machine (local processes, gloo on CPU or NCCL on local GPUs):
    ringbench run                                  # the embedded default sweep
    ringbench run scenarios/masks.yaml --world 8 --seq 8192
torchrun (one process per GPU):
    torchrun --nproc-per-node 8 -m ringbench run scenarios/orderings.yaml
SLURM (MASTER_ADDR / MASTER_PORT exported by the batch script):
    srun --ntasks-per-node 8 python -m ringbench run scenarios/scaling.yaml
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ringbench.cli.common import cli_errors, console, emit_json
from ringbench.fmt import json_value, number

AXES_PANEL = "Sweep axes (repeatable; the cartesian product is run)"
RUN_PANEL = "Run settings"
OUT_PANEL = "Output"


def _fmt(value: float, digits: int = 2) -> str:
    return number(value, f".{digits}f", missing="n/a")


def _case_line(row: dict, done: int, total: int) -> str:
    label = " [emulated]" if row["emulated"] else ""
    check = "" if math.isnan(row["fwd_max_abs_err"]) else ("  check ok" if row["passed"] else "  [red]CHECK FAILED[/]")
    kernel = row["kernel"]
    rate = row.get("emulated_gflops")
    if kernel == "emulated:auto" and rate is not None and not math.isnan(rate):
        kernel += f" (chose {rate:g} GFLOP/s)"
    if row.get("check_note"):
        check += f" [{row['check_note']}]"
    return (
        f"[{done}/{total}] {row['mask']}/{row['layout']}/{row['buffer']}/{row['order']} w={row['world']} "
        f"S={row['seq']} {kernel}{label}: step {_fmt(row['step_ms'])} ms "
        f"(p10 {_fmt(row['step_ms_p10'])}, p90 {_fmt(row['step_ms_p90'])}), "
        f"exposed comm {_fmt(100 * row['exposed_comm_frac'], 1)}%{check}"
    )


def _summary_table(cases, emulated: bool, faults: list[str]) -> Table:
    """One row per (case, repeat); axes that are the same for every row go into the title."""
    varying = [axis for axis in ("world", "seq", "heads", "head_dim", "batch", "dtype", "mask", "layout", "buffer",
                                 "order", "kernel") if cases[axis].nunique() > 1]  # fmt: skip
    constant = [axis for axis in ("world", "seq", "heads", "head_dim", "dtype") if axis not in varying]
    first = cases.iloc[0]
    title = "ringbench run: " + ", ".join(f"{axis}={first[axis]}" for axis in constant)
    if emulated:
        title += "\n* EMULATED: compute time modelled by the emulated kernel, or links injected from a topology"
    if faults:
        title += f"\ninjected faults: {', '.join(faults)}"
    table = Table(title=title, title_justify="left")
    table.add_column("case")
    for name in ("step ms", "p10–p90", "exposed", "tok/s", "max err"):
        table.add_column(name, justify="right")
    shown = [axis for axis in varying if axis not in ("world", "seq", "heads", "head_dim", "dtype")] or ["mask"]
    for row in cases.to_dict("records"):
        parts = [str(row[axis]) for axis in shown]
        parts += [f"{axis[0]}{row[axis]}" for axis in ("world", "seq") if axis in varying]
        if int(row.get("repeat", 0)):
            parts.append(f"r{row['repeat']}")
        label = " ".join(parts) + (" *" if row["emulated"] else "")
        bwd = row["bwd_max_abs_err"] if not math.isnan(row["bwd_max_abs_err"]) else 0.0
        if math.isnan(row["fwd_max_abs_err"]):
            err_text = "unchecked"
        else:
            err_text = f"{max(row['fwd_max_abs_err'], bwd):.1e}" + ("" if row["passed"] else " FAIL")
        table.add_row(
            label, _fmt(row["step_ms"]), f"{_fmt(row['step_ms_p10'], 1)}–{_fmt(row['step_ms_p90'], 1)}",
            f"{_fmt(100 * row['exposed_comm_frac'], 1)}%", f"{row['tokens_per_s']:,.0f}", err_text,
        )  # fmt: skip
    return table


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        scenario: Annotated[
            str | None, typer.Argument(help="Scenario YAML file or shipped name (default, masks, ...).")
        ] = None,
        world: Annotated[list[int], typer.Option(help="Ranks.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        seq: Annotated[list[int], typer.Option(help="Total sequence length S.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        heads: Annotated[list[int], typer.Option(help="Attention heads.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        head_dim: Annotated[list[int], typer.Option(help="Head dimension.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        batch: Annotated[list[int], typer.Option(help="Batch size.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        dtype: Annotated[
            list[str], typer.Option(help="float32, float64, bfloat16, float16.", rich_help_panel=AXES_PANEL)
        ] = [],  # noqa: B006
        mask: Annotated[list[str], typer.Option(help="none, causal, causal-naive.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        layout: Annotated[
            list[str], typer.Option(help="contiguous, zigzag, striped.", rich_help_panel=AXES_PANEL)
        ] = [],  # noqa: B006
        buffer: Annotated[list[str], typer.Option(help="sync, double, allgather.", rich_help_panel=AXES_PANEL)] = [],  # noqa: B006
        order: Annotated[
            list[str],
            typer.Option(help="identity, reverse, random:SEED, stride:K, or 0-3-1-2.", rich_help_panel=AXES_PANEL),
        ] = [],  # noqa: B006
        kernel: Annotated[
            list[str], typer.Option(help="torch, math, triton, emulated:GFLOPS.", rich_help_panel=AXES_PANEL)
        ] = [],  # noqa: B006
        impl: Annotated[
            list[str],
            typer.Option(help="ringbench, torch-ring, ring-attention-pytorch, ..., module:function.",
                         rich_help_panel=AXES_PANEL),
        ] = [],  # noqa: B006
        backward: Annotated[
            bool | None,
            typer.Option("--backward/--no-backward", help="Time the backward ring.", rich_help_panel=RUN_PANEL),
        ] = None,
        iters: Annotated[int | None, typer.Option(help="Timed iterations per case.", rich_help_panel=RUN_PANEL)] = None,
        warmup: Annotated[int | None, typer.Option(help="Warm-up iterations.", rich_help_panel=RUN_PANEL)] = None,
        check: Annotated[
            bool | None,
            typer.Option("--check/--no-check", help="Compare with float64 attention.", rich_help_panel=RUN_PANEL),
        ] = None,
        timeout: Annotated[
            float | None,
            typer.Option(help="Seconds any distributed wait may take (default 60).", rich_help_panel=RUN_PANEL),
        ] = None,
        repeat: Annotated[
            int | None,
            typer.Option(help="Fresh process groups per case (noise for the CI gate).", rich_help_panel=RUN_PANEL),
        ] = None,
        fault: Annotated[
            list[str],
            typer.Option(
                help="slow-rank:R:F, slow-link:S:D:MS, jitter:MS, crash:R:STEP, hang:R:STEP.", rich_help_panel=RUN_PANEL
            ),
        ] = [],  # noqa: B006
        topology: Annotated[
            Path | None,
            typer.Option(
                help="Topology file (nvidia-smi topo -m text or YAML) of the ranks.", rich_help_panel=RUN_PANEL
            ),
        ] = None,
        emulate_links: Annotated[
            bool,
            typer.Option(
                "--emulate-links",
                help="Inject the topology's link costs as transfer delays.",
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
                help="A 1-rank ring still exchanges its blocks with itself (the one-GPU test of the transfer path).",
                rich_help_panel=RUN_PANEL,
            ),
        ] = False,
        out: Annotated[Path, typer.Option(help="Results folder.", rich_help_panel=OUT_PANEL)] = Path("results"),
        resume: Annotated[
            Path | None,
            typer.Option(help="Continue this run directory: run only its missing cases.", rich_help_panel=OUT_PANEL),
        ] = None,
        no_trace: Annotated[
            bool,
            typer.Option(
                "--no-trace", help="Record iteration times only, no per-step spans.", rich_help_panel=OUT_PANEL
            ),
        ] = False,
        report: Annotated[
            bool, typer.Option("--report", help="Also write reports/<run-id>/.", rich_help_panel=OUT_PANEL)
        ] = False,
        profile: Annotated[
            bool,
            typer.Option(
                "--profile",
                help="Capture the last timed iteration of each case with the PyTorch profiler (results/<run>/profile/;"
                " compare with `ringbench check-timeline`).",
                rich_help_panel=OUT_PANEL,
            ),
        ] = False,
        json_out: Annotated[
            bool,
            typer.Option(
                "--json", help="One JSON document on stdout (human output on stderr).", rich_help_panel=OUT_PANEL
            ),
        ] = False,
    ) -> None:
        """Run rings across a sweep; write results/<run-id>/ (events, cases, metadata)."""
        from ringbench.scenario import DEFAULT_SCENARIO, load_scenario
        from ringbench.store import load_run
        from ringbench.sweep import execute, recorded_scenario

        with cli_errors():
            if scenario:
                base = load_scenario(scenario)
            else:
                base = recorded_scenario(resume) if resume is not None else DEFAULT_SCENARIO
            chosen = base.with_overrides(
                world=world, seq=seq, heads=heads, head_dim=head_dim, batch=batch, dtype=dtype, mask=mask,
                layout=layout, buffer=buffer, order=order, kernel=kernel, impl=impl, backward=backward, iters=iters,
                warmup=warmup, check=check, timeout=timeout, repeat=repeat, faults=fault,
                topology=str(topology) if topology else None, emulate_links=emulate_links or None,
            ).validate()  # fmt: skip
            cases = chosen.cases()
            total = len(cases) * chosen.repeat
            emulated = any(c.emulated for c in cases) or chosen.emulate_links
            console.print(
                f"ringbench: scenario [bold]{chosen.name}[/] ({chosen.source}), {total} case(s)"
                + (" — [yellow]EMULATED compute[/]" if emulated else "")
                + (f" — [yellow]faults: {', '.join(chosen.faults)}[/]" if chosen.faults else "")
            )
            with Progress(
                TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=console, transient=True,
            ) as progress:  # fmt: skip
                task = progress.add_task("cases", total=total)

                def on_case(row: dict, done: int, total_cases: int) -> None:
                    progress.console.print(_case_line(row, done, total_cases), highlight=False)
                    progress.update(task, completed=done)

                state = execute(
                    chosen, out=out, resume=resume, trace=not no_trace, on_case=on_case, device=device,
                    command=shlex.join(["ringbench", *sys.argv[1:]]), profile=profile, loopback=loopback,
                )  # fmt: skip
            if state is None:  # a non-zero rank under torchrun / SLURM: rank 0 reports
                return
            for note in state.notes:
                console.print(note)
            console.print(_summary_table(state.cases, emulated, list(chosen.faults)))
            run_data = load_run(state.run_dir)
            verdict = _verdict(run_data)
            if verdict:
                console.print(f"verdict: {verdict}")
            console.print(f"wrote {state.run_dir}/ (events.parquet, cases.parquet, cases.csv, meta.json)")
            if report:
                from ringbench.report.writer import write_report

                report_dir = write_report(run_data, Path("reports"))
                console.print(f"wrote {report_dir}/ (report.html, report.md, trace.json, figures)")
            if json_out:
                emit_json({"run_dir": str(state.run_dir), "emulated": emulated, "cases": _json_cases(state.cases)})
            failed = state.cases[~state.cases["passed"].astype(bool)]
            if len(failed):
                console.print(f"[red]error:[/] {len(failed)} case(s) failed the correctness check")
                raise typer.Exit(1)


def _verdict(run_data) -> str | None:
    from ringbench.analysis.findings import verdict_line

    if not run_data.events["kind"].isin(["compute", "wait"]).any():
        return "not available: --no-trace recorded iteration times only"
    return verdict_line(run_data)


def _json_cases(cases) -> list[dict]:
    records = []
    for row in cases.to_dict("records"):
        clean = json_value(row)
        clean["ring"] = [int(r) for r in str(row["ring"]).split("-")]
        records.append(clean)
    return records
