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
import math
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

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
from ringbench.fmt import exposed_text, json_value, number
from ringbench.rank.scenario import DEFAULT_SCENARIO

AXES_PANEL = "Sweep axes (repeatable; defaults: without a scenario file)"
RUN_PANEL = "Run settings"
SHOWN_AXES = ("world", "seq", "heads", "head_dim", "batch", "dtype", "strategy", "placement", "mask", "layout",
              "buffer", "order", "kernel", "impl", "docs", "layers")  # fmt: skip


def _default(name: str) -> str:
    """The embedded default scenario's value, as --help shows it."""
    value = getattr(DEFAULT_SCENARIO, name)
    return ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _axis(help_text: str, name: str):
    return typer.Option(help=f"{help_text} (default: {_default(name)})", rich_help_panel=AXES_PANEL)


def _fmt(value: float, digits: int = 2) -> str:
    return number(value, f".{digits}f", missing="n/a")


def case_line(row: dict, done: int, total: int) -> str:
    """One finished case, for the progress stream."""
    label = " [emulated]" if row["emulated"] else ""
    check = "" if math.isnan(row["fwd_max_abs_err"]) else ("  check ok" if row["passed"] else "  CHECK FAILED")
    kernel = row["kernel"]
    rate = row.get("emulated_gflops")
    if kernel == "emulated:auto" and rate is not None and not math.isnan(rate):
        kernel += f" ({rate:g} GFLOP/s)"
    if row.get("impl", "ringbench") != "ringbench":
        kernel += f", impl {row['impl']}"
    strategy = str(row.get("strategy") or "ring")
    if strategy not in ("ring", "allgather"):
        kernel += f", {strategy}" + (f" @{row['placement']}" if row.get("placement") else "")
    if str(row.get("layers") or "1") != "1":
        kernel += f", layers {row['layers']}"
    if row.get("check_note"):
        check += f" [{row['check_note']})"
    exposed = f"exposed comm {exposed_text(row['exposed_comm_frac'], row['world'])}"
    return (
        f"[{done}/{total}] {row['mask']}/{row['layout']}/{row['buffer']}/{row['order']} w={row['world']} "
        f"S={row['seq']} {kernel}{label}: step {_fmt(row['step_ms'])} ms "
        f"(p10 {_fmt(row['step_ms_p10'])}, p90 {_fmt(row['step_ms_p90'])}), {exposed}{check}"
    )


def summary_table(cases, emulated: bool, faults: list[str]) -> Table:
    """One row per (case, repeat); axes that are the same for every row go into the title."""
    varying = [axis for axis in SHOWN_AXES if axis in cases and cases[axis].astype(str).nunique() > 1]
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
        exposed = exposed_text(row["exposed_comm_frac"], row["world"])
        table.add_row(
            label, _fmt(row["step_ms"]), f"{_fmt(row['step_ms_p10'], 1)}–{_fmt(row['step_ms_p90'], 1)}",
            exposed, f"{row['tokens_per_s']:,.0f}", err_text,
        )  # fmt: skip
    return table


def register(app: typer.Typer) -> None:
    @app.command("run")
    def run(
        scenario: Annotated[
            str | None,
            typer.Argument(
                help="Scenario YAML file or shipped name (default, masks, buffers, ...).", show_default=False
            ),
        ] = None,
        world: Annotated[list[int], _axis("Ranks.", "world")] = [],  # noqa: B006
        seq: Annotated[list[int], _axis("Total sequence length S.", "seq")] = [],  # noqa: B006
        heads: Annotated[list[int], _axis("Attention heads.", "heads")] = [],  # noqa: B006
        head_dim: Annotated[list[int], _axis("Head dimension.", "head_dim")] = [],  # noqa: B006
        batch: Annotated[list[int], _axis("Batch size.", "batch")] = [],  # noqa: B006
        dtype: Annotated[
            list[str], _axis("float32 (fp32), float64 (fp64), bfloat16 (bf16), float16 (fp16).", "dtype")
        ] = [],  # noqa: B006
        mask: Annotated[
            list[str],
            _axis(
                "none, causal, causal-naive, causal-document, full-document, window:W, causal-document+window:W.",
                "mask",
            ),
        ] = [],  # noqa: B006
        layout: Annotated[
            list[str], _axis("contiguous, zigzag, striped, doc-balanced (document masks).", "layout")
        ] = [],  # noqa: B006
        buffer: Annotated[
            list[str],
            _axis(
                "sync, double, allgather, sync-short, double-short (the ring stops when no rank needs "
                "more: the window-aware ring).",
                "buffer",
            ),
        ] = [],  # noqa: B006
        order: Annotated[list[str], _axis("identity, reverse, random:SEED, stride:K, or 0-3-1-2.", "order")] = [],  # noqa: B006
        kernel: Annotated[
            list[str], _axis("torch, math, triton, emulated:GFLOPS, emulated:auto, modelled:GFLOPS.", "kernel")
        ] = [],  # noqa: B006
        impl: Annotated[
            list[str], _axis("ringbench, torch-ring, ring-attention-pytorch, ..., module:function.", "impl")
        ] = [],  # noqa: B006
        strategy: Annotated[list[str], _axis("ring, ulysses, hybrid:U, double-ring:W, allgather.", "strategy")] = [],  # noqa: B006
        placement: Annotated[
            list[str],
            _axis("hybrid / double ring groups: heads-first, interleaved, or ranks such as 0-2-1-3.", "placement"),
        ] = [],  # noqa: B006
        docs: Annotated[
            list[str],
            _axis(
                "Packed documents of the document masks: lengths:L1,L2,..., file:PATH[:COLUMN], "
                "lognormal:MEAN:SIGMA:SEED[:CAP], uniform:MIN:MAX:SEED[:CAP].",
                "docs",
            ),
        ] = [],  # noqa: B006
        layers: Annotated[
            list[str],
            _axis(
                "Attention layers per iteration: a count, or masks with repeats, e.g. 'window:4096 x5, causal x1'.",
                "layers",
            ),
        ] = [],  # noqa: B006
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
        """Run rings across a sweep; write results/<run-id>/ (events, cases, metadata); print the answers."""
        from ringbench.errors import Interrupted, RunFailure
        from ringbench.rank.scenario import load_scenario
        from ringbench.run.cases import preflight
        from ringbench.run.interrupt import StopRequested, StopSignals, signal_name
        from ringbench.run.state import resume_base
        from ringbench.run.sweep import execute

        out = Output(json=json_out, quiet=quiet, document="run")
        with cli_errors(), StopSignals():  # a signal before or after the sweep ends the command cleanly too
            if scenario:
                base = load_scenario(scenario)
            else:
                base = resume_base(resume) if resume is not None else DEFAULT_SCENARIO
            chosen = base.with_overrides(
                world=world, seq=seq, heads=heads, head_dim=head_dim, batch=batch, dtype=dtype, mask=mask,
                layout=layout, buffer=buffer, order=order, kernel=kernel, impl=impl, strategy=strategy,
                placement=placement, docs=docs, layers=layers, backward=backward, iters=iters,
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
    out.print(summary_table(state.cases, emulated, list(chosen.faults)))
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
        if clean.get("fwd_max_abs_err") is None and clean.get("bwd_max_abs_err") is None:
            clean["passed"] = None  # not checked: no verdict (the cases table keeps True: nothing failed)
        records.append(clean)
    return records
