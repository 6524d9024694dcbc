"""`ringbench probe`: latency and bandwidth of every ordered pair of ranks, saved as a run with its topology.

ringbench probe                                       # 2 local ranks (gloo on CPU, NCCL with a GPU per rank)
ringbench probe --world 4 --sizes 8,64KiB,4MiB --round-trips 9
ringbench probe --emulate-links cluster.yaml          # the YAML topology's link costs injected as delays
torchrun --nproc-per-node 8 -m ringbench probe        # the launched group (RANK / WORLD_SIZE set)
ringbench recommend results/<run-id>                  # then: the ring order for the measured topology
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ringbench.cli.common import (
    DEFAULT_TIMEOUT_S,
    OUTPUT_PANEL,
    TIMEOUT_HELP,
    JsonOption,
    Output,
    QuietOption,
    TopologyOption,
    cli_errors,
)

MAX_MATRIX_COLUMNS = 16


def _matrix_table(title: str, matrix, fmt: str) -> Table:
    world = len(matrix)
    table = Table(title=title, title_justify="left")
    table.add_column("src \\ dst", justify="right")
    for dst in range(world):
        table.add_column(str(dst), justify="right")
    for src in range(world):
        cells = ["X" if src == dst or not math.isfinite(matrix[src][dst]) else fmt.format(matrix[src][dst])
                 for dst in range(world)]  # fmt: skip
        table.add_row(str(src), *cells)
    return table


def _render(result, run_dir: Path, out) -> None:
    import numpy as np

    from ringbench.experiments.probe import format_bytes

    sizes = ", ".join(format_bytes(size) for size in result.sizes)
    where = f"emulated links from {result.emulated_from}" if result.emulated_from else f"{result.backend}"
    out.print(
        f"probe: {result.world} ranks ({result.launcher}, {where}); sizes {sizes}; "
        f"{result.repeats} round trips per pair and size; {result.elapsed_s:.1f} s"
    )
    if result.world <= MAX_MATRIX_COLUMNS:
        out.print(_matrix_table("latency, us (half round trip, median)", result.latency_us, "{:,.1f}"))
        title = f"bandwidth, GB/s ({format_bytes(result.sizes[-1])} messages)"
        out.print(_matrix_table(title, result.bandwidth_gbps, "{:.3g}"))
    off = ~np.eye(result.world, dtype=bool)
    lat, bw = result.latency_us[off], result.bandwidth_gbps[off]
    out.print(
        f"latency {lat.min():,.1f}-{lat.max():,.1f} us (median {float(np.median(lat)):,.1f}); "
        f"bandwidth {bw.min():.3g}-{bw.max():.3g} GB/s"
    )
    out.progress(f"wrote {run_dir}/ (meta.json, probe.parquet, probe_heatmap.png)")
    out.print(f"next: ringbench recommend {run_dir}")


def register(app: typer.Typer) -> None:
    @app.command(
        "probe",
        help="Measure latency and bandwidth of every ordered pair of ranks (ping-pong); save a run with its topology.",
    )
    def probe(
        world: Annotated[
            Optional[int],
            typer.Option(help="Local ranks (default: the --topology's devices, else 2).", show_default=False),
        ] = None,
        sizes: Annotated[
            str, typer.Option(help="Message sizes: smallest gives latency, largest bandwidth (e.g. 8,64KiB,1MiB).")
        ] = "8,64KiB,1MiB",
        round_trips: Annotated[
            int, typer.Option("--round-trips", help="Timed round trips per pair and size (median kept).")
        ] = 5,
        timeout: Annotated[float, typer.Option(help=TIMEOUT_HELP)] = DEFAULT_TIMEOUT_S,
        topology: TopologyOption = None,
        emulate_links: Annotated[
            bool,
            typer.Option(
                "--emulate-links", help="Inject the --topology's link costs as delays: probe an emulated cluster."
            ),
        ] = False,
        device: Annotated[Optional[str], typer.Option(help="cpu or cuda (default: cuda with a GPU per rank).")] = None,
        out_dir: Annotated[
            Path,
            typer.Option(
                "--out", help="Results folder (the probe writes out/<run-id>/).", rich_help_panel=OUTPUT_PANEL
            ),
        ] = Path("results"),
        json_output: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.errors import bad_value
        from ringbench.experiments.probe import run_probe, save_probe

        out = Output(json=json_output, quiet=quiet, document="probe")
        with cli_errors():
            if emulate_links and topology is None:
                raise bad_value("emulate_links", True, "only together with --topology FILE")
            result = run_probe(
                world, sizes=sizes, repeats=round_trips, timeout_s=timeout, device=device,
                emulate_links=str(topology) if emulate_links else None,
            )  # fmt: skip
            if result is None:  # a non-zero rank of a torchrun / SLURM launch: rank 0 writes
                return
            run_dir = save_probe(result, out_dir, command=shlex.join(["ringbench", *sys.argv[1:]]))
        _render(result, run_dir, out)
        out.emit({"run_dir": str(run_dir), **result.to_dict()})
