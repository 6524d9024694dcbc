"""`ringbench topo`: show the link matrix between GPUs, from a file or from NVML on this machine.

ringbench topo                               # this machine, through NVML
ringbench topo --topology dgx.txt            # saved `nvidia-smi topo -m` output
ringbench topo --topology cluster.yaml --json
"""

from __future__ import annotations

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ringbench.cli.common import JsonOption, Output, QuietOption, TopologyOption, cli_errors, fail

# Beyond this many devices a matrix stops being readable: show class counts per host pair instead.
MAX_MATRIX_COLUMNS = 32

CLASS_STYLES = {
    "NV": "bold green",
    "PIX": "cyan",
    "PXB": "cyan",
    "PHB": "yellow",
    "NODE": "yellow",
    "SYS": "red",
    "NET": "magenta",
    "measured": "blue",
}

NVML_HINT = (
    "NVML is unavailable here (no NVIDIA driver or GPU); pass --topology FILE "
    "(saved `nvidia-smi topo -m` output or a YAML topology, see docs/topology.md)"
)


def _style(label: str) -> str | None:
    return CLASS_STYLES.get("NV" if label.startswith("NV") else label)


def styled(label: str) -> str:
    """Rich markup for a console printed with markup on (recommend's lines)."""
    style = _style(label)
    return f"[{style}]{escape(label)}[/]" if style else escape(label)


def styled_cell(label: str) -> Text:
    """A table cell: styled text that prints the same with markup on or off."""
    return Text(label, style=_style(label) or "")


def link_table(topology) -> Table:
    """The class matrix as nvidia-smi lays it out (rows send to columns), or class counts when too large."""
    if topology.world > MAX_MATRIX_COLUMNS:
        table = Table(title=f"{topology.describe()}: link classes (ordered pairs; --json has the matrix)")
        table.add_column("class")
        table.add_column("pairs", justify="right")
        for label, count in sorted(topology.class_counts().items()):
            table.add_row(styled_cell(label), str(count))
        return table
    table = Table(title=topology.describe())
    table.add_column("")
    for rank in range(topology.world):
        table.add_column(topology.device_label(rank), justify="center")
    table.add_column("NUMA", justify="right")
    for rank, row in enumerate(topology.label_matrix()):
        numa = topology.devices[rank].numa_node
        cells = ["X" if label == "X" else styled_cell(label) for label in row]
        table.add_row(topology.device_label(rank), *cells, "-" if numa is None else str(numa))
    return table


def register(app: typer.Typer) -> None:
    @app.command("topo", help="Show the link class between every pair of GPUs (from --topology FILE, else NVML).")
    def topo(
        topology: TopologyOption = None,
        json_output: JsonOption = False,
        quiet: QuietOption = False,
    ) -> None:
        from ringbench.topology import collect_nvml_topology, load_topology

        with cli_errors():
            loaded = load_topology(topology) if topology is not None else collect_nvml_topology()
        if loaded is None:
            raise fail(NVML_HINT, 2)
        out = Output(json=json_output, quiet=quiet, document="topo")
        out.print(link_table(loaded))
        if len(loaded.hosts) > 1:
            out.print(loaded.describe_nics())
            out.print(loaded.cost_model.describe_net())
        out.emit({**loaded.to_dict(), "classes": loaded.label_matrix(), "nics": loaded.nic_layout()})
