"""`ringbench plan`: which strategy, degrees, placement and ring orders to use for a workload on a topology.

ringbench plan --topology cluster.yaml --world 64 --seq 1048576 --heads 32 --kv-heads 8
ringbench plan --topology results/<run> --world 8 --seq 16384 --heads 8 --from results/<calibration-run> --json
ringbench plan --topology node.txt --world 8 --seq 131072 --heads 32 --memory-per-rank 40
ringbench plan --topology dgx_a100.txt --gpu a100-sxm --world 8 --seq 131072 --heads 32 --head-dim 32
ringbench plan --topology node.txt --gpu l20 --world 8 --seq 65536 --heads 32 --mask causal-document \
               --docs lognormal:2048:1.0:0 --layers "window:4096 x3, causal x1"
ringbench plan --list-gpus

Every figure it prints is PREDICTED by the simulator (docs/simulate.md); the last lines say what the prediction rests
on and give the `ringbench run` command that measures the top candidates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ringbench.cli.axis_options import with_axes
from ringbench.cli.common import JsonOption, Output, QuietOption, cli_errors
from ringbench.cli.views import render_catalogue, render_plan

PLAN_DEFAULTS = {"head_dim": "128", "batch": "1", "dtype": "bfloat16", "mask": "causal", "docs": "none",
                 "layers": "1", "layout": "zigzag", "strategy": "every one the degrees allow"}  # fmt: skip
WORKLOAD_PANEL = "Workload (the axes of run, one value each)"


@with_axes("plan", panel=WORKLOAD_PANEL, shown=lambda axis: PLAN_DEFAULTS.get(axis.name))
def plan(
    topology: Annotated[
        Optional[Path],
        typer.Option(help="Topology file (nvidia-smi text or YAML) or a run directory that recorded one."),
    ] = None,
    axes: dict | None = None,
    kv_heads: Annotated[Optional[int], typer.Option(help="Key/value heads (grouped-query attention).")] = None,
    gpu: Annotated[
        Optional[str],
        typer.Option(
            help="The GPU (NVML name or alias, e.g. a100-sxm, h100-sxm, l20; --list-gpus): prices "
            "compute and links from the hardware catalogue (default: what NVML finds here)."
        ),
    ] = None,
    attention: Annotated[
        Optional[str], typer.Option(help="The attention kernel: fa2, fa3, cudnn (default: the GPU's first).")
    ] = None,
    framework: Annotated[
        Optional[str],
        typer.Option(
            help="The implementation that runs it: ringbench, ring-flash-attn, usp, te (its host time per ring step "
            "and per all-to-all are priors; default ringbench's engine; --list-gpus lists them)."
        ),
    ] = None,
    detect: Annotated[
        bool, typer.Option("--detect/--no-detect", help="Ask NVML which GPUs this machine has (fills --gpu).")
    ] = True,
    list_gpus: Annotated[
        bool, typer.Option("--list-gpus", help="Print the hardware catalogue with each figure's source, then exit.")
    ] = False,
    memory_per_rank: Annotated[
        Optional[float], typer.Option(help="GB of attention memory a rank may hold (refuses the rest).")
    ] = None,
    calibration: Annotated[
        list[Path],
        typer.Option("--from", help="Measured runs whose costs to use (repeatable; else the priors or defaults)."),
    ] = [],  # noqa: B006
    emulate_links: Annotated[
        Optional[bool],
        typer.Option(
            "--emulate-links/--real-links",
            help="Price links as --emulate-links injects them (default: as the topology's run did; real for a file).",
        ),
    ] = None,
    no_backward: Annotated[bool, typer.Option("--no-backward", help="Forward only.")] = False,
    settings_for: Annotated[
        int,
        typer.Option(help="The candidate (its rank) to give framework settings and a launcher mapping for."),
    ] = 1,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Rank strategies (ring, ulysses, hybrid, double ring) for a workload on a topology.\f

    Long because Typer reads each option from one parameter of the command's signature: one annotated parameter
    per option makes most of its lines; the body (check, build the request, plan, print) alone is well under 80.
    (The ``\\f`` ends what --help shows of this docstring.)
    """
    from ringbench.advise.planner import PlanRequest, make_plan
    from ringbench.scenario.workload import Workload
    from ringbench.vocab import DTYPE_ALIASES, DTYPES, Layout, MaskSpec

    out = Output(json=json_out, quiet=quiet, document="plan")
    with cli_errors():
        from ringbench.errors import UsageError, bad_value

        if list_gpus:
            out.emit(render_catalogue(out))
            return
        if topology is not None and axes["world"] is None:  # every device the topology describes
            from ringbench.topology import load_topology

            axes["world"] = load_topology(Path(topology)).world
        for name, value in (("topology", topology), ("seq", axes["seq"]), ("heads", axes["heads"])):
            if value is None:
                raise UsageError(f"--{name} is missing; plan needs --topology, --seq and --heads (--world: the "
                                 "topology's devices unless given), or --list-gpus")  # fmt: skip
        dtype = axes["dtype"] or "bfloat16"
        dtype = DTYPE_ALIASES.get(dtype, dtype)
        if dtype not in DTYPES:
            raise bad_value("dtype", dtype, "one of: " + ", ".join(DTYPES))
        given = {name: axes[name] for name in ("head_dim", "batch") if axes[name] is not None}
        workload = Workload(world=axes["world"], seq=axes["seq"], heads=axes["heads"], kv_heads=kv_heads or 0,
                            dtype=dtype, mask=MaskSpec.parse(axes["mask"] or "causal", "mask").text,
                            layout=Layout.parse(axes["layout"] or "zigzag", "layout").value,
                            docs=axes["docs"] or "none", layers=axes["layers"] or "1", **given)  # fmt: skip
        request = PlanRequest(workload=workload, topology=topology, memory_per_rank_gb=memory_per_rank, calibrate_from=tuple(calibration) or None,
                              emulate_links=emulate_links, backward=not no_backward, gpu=gpu, attention=attention,
                              detect=detect, strategies=tuple(axes["strategy"]), framework=framework,
                              settings_for=settings_for)  # fmt: skip
        result = make_plan(request)
    render_plan(result, out)
    out.emit(result.to_dict())


def register(app: typer.Typer) -> None:
    app.command("plan", help="Rank strategies (ring, ulysses, hybrid, double ring) for a workload on a topology.")(plan)
