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
from rich.table import Table

from ringbench.cli.common import JsonOption, Output, QuietOption, cli_errors
from ringbench.fmt import number

MASK_HELP_TEXT = ("none, causal, causal-naive, causal-document, full-document, window:W, causal-document+window:W "
                  "(document masks need --docs).")  # fmt: skip
DOCS_HELP_TEXT = ("Packed documents of a document mask: lengths:8192,1024,.. | file:PATH[:COLUMN] | "
                  "lognormal:MEAN:SIGMA:SEED[:CAP] | uniform:MIN:MAX:SEED[:CAP].")  # fmt: skip
LAYERS_HELP_TEXT = "Attention layers per iteration: a count, or a pattern such as 'window:4096 x5, causal x1'."


def _hops(ring: dict) -> str:
    hops = ", ".join(f"{label}×{count}" for label, count in sorted(ring["hops"].items()))
    copies = f" (×{ring['copies']})" if ring["copies"] > 1 else ""
    return f"{ring['ring']} {ring['ranks']}{copies}: {hops or 'no hops'}"


def render(plan, out: Output) -> None:
    request = plan.request
    shape = request.mask + (f" docs {request.docs}" if request.docs != "none" else "")
    shape += f", layers {request.layers}" if request.layers != "1" else ""
    hardware = f" on {plan.gpu}" if plan.gpu else ""
    out.print(f"ringbench plan (PREDICTED): {request.world} ranks{hardware} on {plan.topology_text}; S={request.seq:,}, "
              f"{request.heads} heads ({request.kv_heads or request.heads} KV) × {request.head_dim}, {request.dtype}, "
              f"{shape}, {request.layout}{'' if request.backward else ', forward only'}")  # fmt: skip
    table = Table(title_justify="left")
    for name, justify in (("#", "right"), ("strategy", "left"), ("placement", "left"), ("step ms", "right"),
                          ("exposed", "right"), ("MiB/rank", "right"), ("rings", "left")):  # fmt: skip
        table.add_column(name, justify=justify)
    for index, candidate in enumerate(plan.candidates[:12], start=1):
        placement = "-"
        if candidate.placement_name and candidate.placement:
            placement = f"{candidate.placement_name} " + "-".join(map(str, candidate.placement))
        name = candidate.strategy + "".join(f" [{x}]" for x in (candidate.buffer, candidate.layout)
                                            if x in ("double-short", "sync-short", "doc-balanced"))  # fmt: skip
        table.add_row(str(index), name, placement, number(candidate.step_ms, ",.2f"),
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
    if plan.priors:
        out.print(f"Priors (the hardware catalogue's figures for {plan.gpu}; `ringbench plan --list-gpus` cites each "
                  "source; a calibration run on the cluster, --from, replaces what it measures):")  # fmt: skip
        for prior in plan.priors:
            out.print(f"  {prior.cost}: {prior.how}")
    for measured in plan.measured:
        out.print(f"  MEASURED {measured.cost}: {measured.how}")
    out.print(f"Measure the top candidates: {plan.command}")
    out.print(f"Confidence: {plan.confidence}")
    out.print(f"({len(plan.candidates) + len(plan.refused)} candidates in {plan.elapsed_s:.1f} s)")


def render_catalogue(out: Output) -> dict:
    """`plan --list-gpus`: every GPU of the catalogue with its figures and their sources, then the citations."""
    from ringbench.hardware import load_catalogue

    catalogue = load_catalogue()
    table = Table(title="The hardware catalogue: PRIOR figures, each followed by its source key in brackets (cited below)",
                  title_justify="left")  # fmt: skip
    for name, justify in (("gpu", "left"), ("NVML names / aliases", "left"), ("dense bf16 TFLOP/s", "right"),
                          ("memory GB/s", "right"), ("links", "left"), ("attention (default first)", "left")):  # fmt: skip
        table.add_column(name, justify=justify)
    rows = []
    for key, gpu in catalogue.gpus.items():
        peak, memory = gpu.peak_tflops("bfloat16"), gpu.figure("memory_gbps")
        links = f"PCIe Gen{int(gpu.value('pcie_gen'))}"
        if gpu.has_nvlink:
            links = (f"NVLink{int(gpu.value('nvlink.generation'))} {int(gpu.value('nvlink.links'))} x "
                     f"{gpu.value('nvlink.gbps_per_link'):g} GB/s [{gpu.figure('nvlink.links').source_key}]; {links}")  # fmt: skip
        rates = gpu.kernel_rates("bfloat16")
        kernels = ", ".join(gpu.kernels) + f" ({rates.rate_tflops('fwd', False, 8192, 128):.0f} fwd TFLOP/s at 8K)"
        table.add_row(key, "; ".join([*gpu.names, *gpu.aliases]), f"{peak.value:g} [{peak.provenance()}]",
                      f"{memory.value:g} [{memory.provenance()}]", links, kernels)  # fmt: skip
        rows.append({"gpu": key, "names": list(gpu.names), "aliases": list(gpu.aliases), "arch": gpu.arch,
                     "figures": {name: {"value": f.value, "source": f.source_key, "derived": f.derived}
                                 for name, f in gpu.figures.items()},
                     "kernels": list(gpu.kernels)})  # fmt: skip
    out.print(table)
    out.print("Attention kernels (fitted to published curves; benchmarks/fit_kernel_rates.py):")
    for family, arches in catalogue.kernels.items():
        for arch, entry in arches.items():
            if isinstance(entry, dict) and ("fwd" in entry or "same_as" in entry):
                out.print(f"  {family} on {arch}: {catalogue.kernel_provenance(family, arch)}")
    out.print("Sources:")
    for key, citation in catalogue.sources.items():
        out.print(f"  [{key}] {citation}")
    return {"gpus": rows, "sources": dict(catalogue.sources)}


def register(app: typer.Typer) -> None:
    @app.command("plan", help="Rank strategies (ring, ulysses, hybrid, double ring) for a workload on a topology.")
    def plan(
        topology: Annotated[
            Optional[Path],
            typer.Option(help="Topology file (nvidia-smi text or YAML) or a run directory that recorded one."),
        ] = None,
        world: Annotated[Optional[int], typer.Option(help="Ranks N.")] = None,
        seq: Annotated[Optional[int], typer.Option(help="Total sequence length S.")] = None,
        heads: Annotated[Optional[int], typer.Option(help="Attention (query) heads.")] = None,
        kv_heads: Annotated[Optional[int], typer.Option(help="Key/value heads (grouped-query attention).")] = None,
        head_dim: Annotated[int, typer.Option(help="Head dimension.")] = 128,
        batch: Annotated[int, typer.Option(help="Batch size.")] = 1,
        dtype: Annotated[str, typer.Option(help="float32, float64, bfloat16, float16.")] = "bfloat16",
        mask: Annotated[str, typer.Option(help=MASK_HELP_TEXT)] = "causal",
        docs: Annotated[str, typer.Option(help=DOCS_HELP_TEXT)] = "none",
        layers: Annotated[str, typer.Option(help=LAYERS_HELP_TEXT)] = "1",
        layout: Annotated[str, typer.Option(help="contiguous, zigzag, striped, doc-balanced.")] = "zigzag",
        strategy: Annotated[
            list[str],
            typer.Option(help="Only these strategies (repeatable): ring, ulysses, hybrid:U, double-ring:W, allgather."),
        ] = [],  # noqa: B006
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
        json_out: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.rank.scenario import DTYPE_ALIASES
        from ringbench.simulate.plan import PlanRequest, make_plan
        from ringbench.vocab import DTYPES, Layout, MaskSpec

        out = Output(json=json_out, quiet=quiet, document="plan")
        with cli_errors():
            from ringbench.errors import UsageError, bad_value

            if list_gpus:
                out.emit(render_catalogue(out))
                return
            for name, value in (("topology", topology), ("world", world), ("seq", seq), ("heads", heads)):
                if value is None:
                    raise UsageError(f"--{name} is missing; plan needs --topology, --world, --seq and --heads "
                                     "(or --list-gpus)")  # fmt: skip
            dtype = DTYPE_ALIASES.get(dtype, dtype)
            if dtype not in DTYPES:
                raise bad_value("dtype", dtype, "one of: " + ", ".join(DTYPES))
            request = PlanRequest(topology=topology, world=world, seq=seq, heads=heads, kv_heads=kv_heads or 0,
                                  head_dim=head_dim, batch=batch, dtype=dtype, mask=MaskSpec.parse(mask, "mask").text,
                                  layout=Layout.parse(layout, "layout").value, memory_per_rank_gb=memory_per_rank,
                                  calibrate_from=tuple(calibration) or None, emulate_links=emulate_links,
                                  backward=not no_backward, gpu=gpu, attention=attention, detect=detect,
                                  docs=docs, layers=layers, strategies=tuple(strategy))  # fmt: skip
            result = make_plan(request)
        render(result, out)
        out.emit(result.to_dict())
