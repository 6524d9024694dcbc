"""`ringbench plan`: which strategy, degrees, placement and ring orders to use for a workload on a topology.

ringbench plan --topology cluster.yaml --world 64 --seq 1048576 --heads 32 --kv-heads 8
ringbench plan --topology results/<run> --world 8 --seq 16384 --heads 8 --from results/<calibration-run> --json
ringbench plan --topology node.txt --world 8 --seq 131072 --heads 32 --memory-per-rank 40

Every figure it prints is PREDICTED by the simulator (docs/simulate.md); the last lines say what the prediction rests
on and give the `ringbench run` command that measures the top candidates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ringbench.cli.common import JsonOption, Output, QuietOption, cli_errors
from ringbench.fmt import number


def _hops(ring: dict) -> str:
    hops = ", ".join(f"{label}×{count}" for label, count in sorted(ring["hops"].items()))
    copies = f" (×{ring['copies']})" if ring["copies"] > 1 else ""
    return f"{ring['ring']} {ring['ranks']}{copies}: {hops or 'no hops'}"


def render(plan, out: Output) -> None:
    request = plan.request
    out.print(f"ringbench plan (PREDICTED): {request.world} ranks on {plan.topology_text}; S={request.seq:,}, "
              f"{request.heads} heads ({request.kv_heads or request.heads} KV) × {request.head_dim}, {request.dtype}, "
              f"{request.mask} {request.layout}")  # fmt: skip
    table = Table(title_justify="left")
    for name, justify in (("#", "right"), ("strategy", "left"), ("placement", "left"), ("step ms", "right"),
                          ("exposed", "right"), ("MiB/rank", "right"), ("rings", "left")):  # fmt: skip
        table.add_column(name, justify=justify)
    for index, candidate in enumerate(plan.candidates[:12], start=1):
        placement = "-"
        if candidate.placement_name and candidate.placement:
            placement = f"{candidate.placement_name} " + "-".join(map(str, candidate.placement))
        table.add_row(str(index), candidate.strategy, placement, number(candidate.step_ms, ",.2f"),
                      f"{number(100 * candidate.exposed_frac, '.0f')}%", number(candidate.memory_mb, ",.1f"),
                      "; ".join(_hops(r) for r in candidate.rings))  # fmt: skip
    out.print(table)
    if len(plan.candidates) > 12:
        out.print(f"({len(plan.candidates) - 12} more candidates in --json)")
    out.print("Why the others lose:")
    for candidate in [*plan.candidates[1:6], *plan.refused]:
        out.print(f"  {candidate.why}")
    for note in plan.notes:
        out.print(f"note: {note}")
    out.print(f"Measure the top candidates: {plan.command}")
    out.print(f"Confidence: {plan.confidence}")
    out.print(f"({len(plan.candidates) + len(plan.refused)} candidates in {plan.elapsed_s:.1f} s)")


def register(app: typer.Typer) -> None:
    @app.command("plan", help="Rank strategies (ring, ulysses, hybrid, double ring) for a workload on a topology.")
    def plan(
        topology: Annotated[
            Path, typer.Option(help="Topology file (nvidia-smi text or YAML) or a run directory that recorded one.")
        ],
        world: Annotated[int, typer.Option(help="Ranks N.")],
        seq: Annotated[int, typer.Option(help="Total sequence length S.")],
        heads: Annotated[int, typer.Option(help="Attention (query) heads.")],
        kv_heads: Annotated[Optional[int], typer.Option(help="Key/value heads (grouped-query attention).")] = None,
        head_dim: Annotated[int, typer.Option(help="Head dimension.")] = 128,
        batch: Annotated[int, typer.Option(help="Batch size.")] = 1,
        dtype: Annotated[str, typer.Option(help="float32, float64, bfloat16, float16.")] = "bfloat16",
        mask: Annotated[str, typer.Option(help="none, causal, causal-naive.")] = "causal",
        layout: Annotated[str, typer.Option(help="contiguous, zigzag, striped.")] = "zigzag",
        memory_per_rank: Annotated[
            Optional[float], typer.Option(help="GB of attention memory a rank may hold (refuses the rest).")
        ] = None,
        calibration: Annotated[
            list[Path],
            typer.Option("--from", help="Measured runs whose costs to use (repeatable; else the defaults)."),
        ] = [],  # noqa: B006
        emulate_links: Annotated[
            Optional[bool],
            typer.Option(
                "--emulate-links/--real-links",
                help="Price links as --emulate-links injects them (default: as the topology's run did; real for a file).",
            ),
        ] = None,
        no_backward: Annotated[bool, typer.Option("--no-backward", help="Forward only.")] = False,
        json_out: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.rank.scenario import DTYPE_ALIASES
        from ringbench.simulate.plan import PlanRequest, make_plan
        from ringbench.vocab import DTYPES, Layout, Mask

        out = Output(json=json_out, quiet=quiet, document="plan")
        with cli_errors():
            from ringbench.errors import bad_value

            dtype = DTYPE_ALIASES.get(dtype, dtype)
            if dtype not in DTYPES:
                raise bad_value("dtype", dtype, "one of: " + ", ".join(DTYPES))
            request = PlanRequest(topology=topology, world=world, seq=seq, heads=heads, kv_heads=kv_heads or 0,
                                  head_dim=head_dim, batch=batch, dtype=dtype, mask=Mask.parse(mask, "mask").value,
                                  layout=Layout.parse(layout, "layout").value, memory_per_rank_gb=memory_per_rank,
                                  calibrate_from=tuple(calibration) or None, emulate_links=emulate_links,
                                  backward=not no_backward)  # fmt: skip
            result = make_plan(request)
        render(result, out)
        out.emit(result.to_dict())
