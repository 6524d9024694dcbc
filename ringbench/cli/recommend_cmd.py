"""`ringbench recommend`: the ring order that avoids slow hops, with what it changes and how to launch it.

ringbench recommend --topology pcie8.txt                      # compare with the identity ring
ringbench recommend --topology cluster.yaml --order stride:2
ringbench recommend results/run-0412                           # the topology recorded in the run's meta.json
ringbench recommend --topology node.txt --json
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ringbench.cli.common import JsonOption, Output, QuietOption, TopologyOption, cli_errors
from ringbench.cli.topo_cmd import styled
from ringbench.fmt import ring_text

# Beyond this many hops, list class counts rather than every hop.
MAX_HOP_ROWS = 32


def _hop_cell(hop) -> str:
    return f"{hop.src}→{hop.dst} {styled(hop.link_class)} {hop.cost_us:,.0f} us"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{styled(label)}×{count}" for label, count in sorted(counts.items()))


def _run_ring(run_dir: Path) -> str | None:
    """The ring the run measured (its cases' one ring order), to compare with; None when it varied or is absent."""
    from ringbench.record.store import load_run

    cases = load_run(run_dir).cases
    rings = cases["ring"].dropna().astype(str).unique() if "ring" in cases else []
    return str(rings[0]) if len(rings) == 1 else None


def render(recommendation, topology, out) -> None:
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
        print_(
            f"Worst hop: current {styled(r.current_worst_hop_class)} ({r.current_worst_hop_us:,.0f} us) -> "
            f"recommended {styled(r.worst_hop_class)} ({r.worst_hop_us:,.0f} us); "
            f"predicted speedup of communication per ring step ×{r.predicted_speedup:.2f} "
            f"({r.predicted_step_change_pct:+.0f}%)."
        )
        if r.total_us < r.current_total_us * (1 - 1e-9):
            print_(
                f"Total over hops: {r.current_total_us:,.0f} -> {r.total_us:,.0f} us "
                f"({(r.total_us / r.current_total_us - 1) * 100:+.0f}%; hop classes {_counts(r.hop_class_counts(current=True))}"
                f" -> {_counts(r.hop_class_counts())})"
                + (
                    ": the worst hop stays, but fewer slow hops share links such as the inter-socket one."
                    if r.worst_hop_us >= r.current_worst_hop_us * (1 - 1e-9)
                    else "."
                )
            )
        print_(f"[dim]Model: {r.model}.[/]")
    print_(f"Launch: ringbench run --order {r.order_arg} ...")
    visible = "; ".join(f"{host}: CUDA_VISIBLE_DEVICES={devices}" for host, devices in r.cuda_visible_devices)
    note = "" if r.cuda_visible_devices_exact else " (not equivalent alone: the ring interleaves hosts; use --order)"
    print_(f"    or, keeping the identity order, with CUDA_DEVICE_ORDER=PCI_BUS_ID, {visible}{note}")


def register(app: typer.Typer) -> None:
    @app.command(
        "recommend",
        help="Recommend a ring order that minimises the worst hop (then the total) for a topology or a run.",
    )
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
        json_output: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.errors import bad_value
        from ringbench.topology import recommend as recommend_order
        from ringbench.topology import resolve_topology

        with cli_errors():
            loaded = resolve_topology(topology, run_dir)
            if order is None and run_dir is not None:
                ring = _run_ring(run_dir)
                order = ring if ring is not None and len(ring.split("-")) == loaded.world else None
            if message_mib is not None:
                if not message_mib > 0:
                    raise bad_value("message_mib", message_mib, "a number > 0")
                loaded = loaded.with_message_bytes(max(1, round(message_mib * 1024 * 1024)))
            result = recommend_order(loaded, order)
        out = Output(json=json_output, quiet=quiet, document="recommend")
        render(result, loaded, out)
        out.emit(
            ({"run_dir": str(run_dir)} if run_dir is not None else {})
            | result.to_dict()
            | {"topology": loaded.describe()}
        )
