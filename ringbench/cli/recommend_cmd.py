"""`ringbench recommend`: the ring order that avoids slow hops, with what it changes and how to launch it.

ringbench recommend --topology pcie8.txt                      # compare with the identity ring
ringbench recommend --topology cluster.yaml --order stride:2
ringbench recommend results/run-0412                           # the topology recorded in the run's meta.json
ringbench recommend --topology node.txt --json
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ringbench.cli.common import JsonOption, Output, QuietOption, TopologyOption, cli_errors
from ringbench.cli.topo_cmd import styled
from ringbench.fmt import ring_text

# Beyond this many hops, list class counts rather than every hop.
MAX_HOP_ROWS = 32


def _hop_cell(hop) -> str:
    shared = f" ×{hop.share} shared" if hop.share > 1 else ""
    return f"{hop.src}→{hop.dst} {styled(hop.link_class)}{shared} {hop.shared_us:,.0f} us"


# What each class's hops cross, in words (only ever said of a class the ring's hops have).
_CROSSES = {"NET": "the network link between two hosts", "SYS": "the inter-socket link",
            "NODE": "host bridges of one NUMA node", "PHB": "the PCIe host bridge", "PXB": "PCIe switches",
            "PIX": "a PCIe switch"}  # fmt: skip


def _why_total(r) -> str:
    """Why a lower total helps when the worst hop stays: the hops that were dropped, named by their own class."""
    before, after = r.hop_class_counts(current=True), r.hop_class_counts()
    fewer = [label for label in before if before[label] > after.get(label, 0) and label in _CROSSES]
    if not fewer:
        return "."
    label = max(fewer, key=lambda name: before[name] - after.get(name, 0))
    priced = "their sharing is priced" if label == "NET" else "sharing of that link is not priced"
    return f": {before[label]} -> {after.get(label, 0)} {label} hops crossing {_CROSSES[label]} ({priced})."


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{styled(label)}×{count}" for label, count in sorted(counts.items()))


def _measured_run(run_dir: Path):
    """The run when it is measured and has per-step spans (what the simulator calibrates on), else None."""
    from ringbench.record.store import load_run

    run = load_run(run_dir)
    spans = "kind" in run.events and bool((run.events["kind"] == "compute").any())
    return run if spans and not run.meta.get("simulated") else None


def _run_ring(run_dir: Path) -> str | None:
    """The ring the run measured (its cases' one ring order), to compare with; None when it varied or is absent."""
    from ringbench.record.store import load_run

    cases = load_run(run_dir).cases
    rings = cases["ring"].dropna().astype(str).unique() if "ring" in cases else []
    return str(rings[0]) if len(rings) == 1 else None


def prediction_lines(prediction) -> list[str]:
    """The step-time prediction from a measured run (SIMULATED), beside the run's own measurement."""
    lines = []
    for ring, ms in prediction.step_ms.items():
        measured = prediction.measured_ms.get(ring)
        seen = f" (measured {measured:,.1f} ms)" if measured is not None else ""
        lines.append(f"  {ring}: {ms:,.1f} ms{seen}")
    rings = list(prediction.step_ms)
    head = (f"Predicted step time (SIMULATED: the simulator calibrated on {prediction.run_id}, "
            f"{prediction.cases} case(s), {'emulated' if prediction.emulated_links else 'real'} links as the run had them)")  # fmt: skip
    if len(rings) == 2:
        head += f": ×{prediction.speedup(rings[0], rings[1]):.2f} for the recommended ring"
    lines.insert(0, head + ":")
    if prediction.assumed:
        lines.append(f"  caveat: {len(prediction.assumed)} of the calibration's costs are priors, not measured "
                     "(`ringbench simulate --from RUN_DIR` lists them)")  # fmt: skip
    lines.extend(f"  note: {note}" for note in prediction.notes)
    return lines


def _kv_bytes(run, world: int) -> int | None:
    """The K/V block one rank sends per ring step in the run's first case on ``world`` ranks (bytes)."""
    from ringbench.advise.simulation import cases_like
    from ringbench.errors import UsageError

    try:
        cases = [case for case in cases_like(run, 1) if case.world == world]
    except UsageError:  # no case the simulator can state (an imported ring's own layout, say)
        return None
    return cases[0].block_bytes("kv") if cases else None


def headline(r, prediction=None) -> dict:
    """What the answer leads with, and what it covers. The step's speedup where something predicts the step (a
    measured run: the simulator calibrated on it prices compute, the transport's own cost per transfer and the
    run's K/V block); else the link model's speedup of communication per ring step, said to be communication only:
    a topology says what the links cost, not what compute hides or what each transfer costs beyond its links."""
    if prediction is not None:
        current, recommended = ring_text(r.current_order), r.order_arg
        speedup = prediction.speedup(current, recommended)
        if math.isfinite(speedup):  # both rings predicted
            return {"covers": "step", "speedup": speedup, "current_ms": prediction.step_ms[current],
                    "recommended_ms": prediction.step_ms[recommended],
                    "source": f"SIMULATED: the simulator calibrated on {prediction.run_id}"}  # fmt: skip
    return {"covers": "communication", "speedup": r.predicted_speedup, "current_us": r.current_step_us,
            "recommended_us": r.step_us, "source": "the link model, communication per ring step only"}  # fmt: skip


def headline_text(line: dict) -> str:
    if line["covers"] == "step":
        return (f"Predicted speedup of the step: ×{line['speedup']:.2f} ({line['current_ms']:,.1f} -> "
                f"{line['recommended_ms']:,.1f} ms per step; {line['source']}: its compute, transport and K/V "
                "block on this topology).")  # fmt: skip
    return (f"Predicted speedup of communication per ring step: ×{line['speedup']:.2f} (communication only, the "
            "link model; the step gains that much only where nothing hides communication: `ringbench recommend "
            "RUN_DIR` predicts the step from a measured run).")  # fmt: skip


def render(recommendation, topology, out, prediction=None) -> None:
    r = recommendation
    print_ = out.console.print if not out.quiet else (lambda *a, **k: None)
    print_(f"Topology: {topology.describe()}")
    if r.all_equivalent:
        print_(
            f"Every ring order is equivalent on this topology ({r.equivalence_reason}): "
            f"reordering gains nothing; keep {ring_text(r.current_order)}."
        )
    else:
        verdict = "already optimal" if r.current_is_optimal else "can be improved"
        print_(f"Current ring {ring_text(r.current_order)} {verdict}; method: {r.method}.")
        print_(f"[bold]Recommended ring: {r.order_arg}[/]")
        if not r.current_is_optimal:
            print_(f"[bold]{escape(headline_text(headline(r, prediction)))}[/]")
    if r.hops and len(r.hops) <= MAX_HOP_ROWS and not r.all_equivalent:
        table = Table(title="hops (ring position p sends to p+1)")
        table.add_column("p", justify="right")
        table.add_column("current")
        table.add_column("recommended")
        for current, new in zip(r.current_hops, r.hops, strict=True):
            table.add_row(str(new.position), _hop_cell(current), _hop_cell(new))
        print_(table)
    elif r.hops and not r.all_equivalent:
        print_(f"Hop classes, current:     {_counts(r.hop_class_counts(current=True))}")
        print_(f"Hop classes, recommended: {_counts(r.hop_class_counts())}")
    if r.hops and r.all_equivalent:
        print_(
            f"Every hop: {styled(r.worst_hop_class)}, {r.worst_hop_us:,.0f} us per {r.message_bytes / 2**20:g} MiB message."
        )
    elif r.hops:
        shared = any(hop.share > 1 for hop in (*r.hops, *r.current_hops))
        sharing = ", NET hops sharing a host pair's link" if shared else ""
        print_(
            f"Communication per ring step (slowest hop{sharing}; communication only): current {r.current_step_us:,.0f} "
            f"us -> recommended {r.step_us:,.0f} us, ×{r.predicted_speedup:.2f} ({r.predicted_step_change_pct:+.0f}%), "
            f"at {r.message_bytes / 2**20:g} MiB per hop."
        )
        print_(
            f"Worst hop alone: current {styled(r.current_worst_hop_class)} ({r.current_worst_hop_us:,.0f} us) -> "
            f"recommended {styled(r.worst_hop_class)} ({r.worst_hop_us:,.0f} us)."
        )
        if r.total_us < r.current_total_us * (1 - 1e-9):
            print_(
                f"Total over hops: {r.current_total_us:,.0f} -> {r.total_us:,.0f} us "
                f"({(r.total_us / r.current_total_us - 1) * 100:+.0f}%; hop classes {_counts(r.hop_class_counts(current=True))}"
                f" -> {_counts(r.hop_class_counts())})" + _why_total(r)
            )
        print_(f"[dim]Model: {r.model}.[/]")
    if prediction is not None:
        for line in prediction_lines(prediction):
            print_(line)
    print_(f"Launch: ringbench run --order {r.order_arg} ...")
    visible = "; ".join(f"{host}: CUDA_VISIBLE_DEVICES={devices}" for host, devices in r.cuda_visible_devices)
    note = "" if r.cuda_visible_devices_exact else " (not equivalent alone: the ring interleaves hosts; use --order)"
    print_(f"    or, keeping the identity order, with CUDA_DEVICE_ORDER=PCI_BUS_ID, {visible}{note}")


def _resolve(run_dir, topology, order, message_mib, gpu, detect):
    """The topology priced for the GPU, the recommended order, and (for a run) the predicted step of both orders."""
    from ringbench.errors import bad_value
    from ringbench.simulate import find_hardware, gpu_prior
    from ringbench.topology import recommend as recommend_order
    from ringbench.topology import resolve_topology

    prediction = None
    priced_for = None
    loaded = resolve_topology(topology, run_dir)
    hardware = find_hardware(gpu, detect=detect)
    if hardware is not None:
        prior = gpu_prior(hardware, "bfloat16")
        priced_for = prior.for_topology(loaded)  # link lines: GIVEN where the file states a class
        loaded = priced_for.price_links(loaded)
    measured = _measured_run(run_dir) if run_dir is not None else None
    if order is None and run_dir is not None:
        ring = _run_ring(run_dir)
        order = ring if ring is not None and len(ring.split("-")) == loaded.world else None
    if message_mib is not None:
        if not message_mib > 0:
            raise bad_value("message_mib", message_mib, "a number > 0")
        loaded = loaded.with_message_bytes(max(1, round(message_mib * 1024 * 1024)))
    elif measured is not None:
        nbytes = _kv_bytes(measured, loaded.world)  # the run's own K/V block, not the reference message
        loaded = loaded.with_message_bytes(nbytes) if nbytes else loaded
    result = recommend_order(loaded, order)
    if measured is not None and not result.all_equivalent and _kv_bytes(measured, loaded.world):
        from ringbench.advise.order_steps import predict_orders

        prediction = predict_orders(measured, loaded, [result.current_order, result.order])
    return loaded, result, prediction, priced_for


def recommend(
    run_dir: Annotated[
        Optional[Path], typer.Argument(help="A results run directory whose meta.json records the topology.")
    ] = None,
    topology: TopologyOption = None,
    order: Annotated[
        Optional[str],
        typer.Option(
            "--order",
            "-o",
            metavar="ORDER",
            help="The ring order to compare with (as run --order takes it): identity, reverse, "
            "stride:K, random:SEED or 0-3-1-2. Default: the run's ring, when a RUN_DIR is given.",
        ),
    ] = None,
    message_mib: Annotated[
        Optional[float], typer.Option(help="Reference message per hop in MiB (default: the topology's, 32).")
    ] = None,
    gpu: Annotated[
        Optional[str],
        typer.Option(
            help="The GPU (NVML name or alias; ringbench plan --list-gpus): price the link classes as "
            "NCCL moves data on it (PRIOR figures; default: what NVML finds here)."
        ),
    ] = None,
    detect: Annotated[
        bool, typer.Option("--detect/--no-detect", help="Ask NVML which GPUs this machine has (fills --gpu).")
    ] = True,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    with cli_errors():
        loaded, result, prediction, priced_for = _resolve(run_dir, topology, order, message_mib, gpu, detect)
    out = Output(json=json_output, quiet=quiet, document="recommend")
    render(result, loaded, out, prediction)
    if priced_for is not None:
        for source in priced_for.sources:
            if source.cost.startswith("link."):
                out.print(f"{source.cost}: {source.how}")
    document = ({"run_dir": str(run_dir)} if run_dir is not None else {}) | result.to_dict()
    document["gpu"] = priced_for.gpu.key if priced_for is not None else None
    document["topology"] = loaded.describe()
    if prediction is not None:
        speedup = prediction.speedup(ring_text(result.current_order), result.order_arg)
        document["predicted_step"] = prediction.to_dict() | {"speedup": speedup}
    document["headline"] = headline(result, prediction)
    out.emit(document)


def register(app: typer.Typer) -> None:
    app.command(
        "recommend",
        help="Recommend a ring order that minimises the worst hop (then the total) for a topology or a run.",
    )(recommend)
