"""Parse `nvidia-smi topo -m` text into a Topology (GPUs only; NIC rows and columns are dropped).

Real outputs vary, and all of these are accepted: tab- or space-separated columns, a header with or without leading
indentation, ANSI underline codes around the header (nvidia-smi writes them to a terminal), comment lines, a shell
prompt line, NIC rows named ``NIC0`` or ``mlx5_0``, a NIC legend, ``CPU Affinity`` / ``NUMA Affinity`` / ``GPU NUMA
ID`` columns (or none of them), and the old ``SOC`` spelling of SYS.
"""

from __future__ import annotations

import re

from ringbench.errors import UsageError
from ringbench.topology.links import CLASS_HELP, Link, parse_link_class
from ringbench.topology.model import Device, Topology

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU = re.compile(r"^GPU(\d+)$")
# A column name in the header: GPU0, NIC3, mlx5_10, ... (ends in a digit); "CPU Affinity" and friends do not.
_COLUMN = re.compile(r"^[A-Za-z][\w.:-]*\d$")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|NET)$", re.IGNORECASE)


def _tokens(line: str) -> list[str]:
    return _ANSI.sub("", line).split()


def _header_index(lines: list[str]) -> int | None:
    """The header starts with GPU0.. and, unlike a GPU row, is not followed by a link cell."""
    for index, line in enumerate(lines):
        tokens = _tokens(line)
        if tokens and _GPU.match(tokens[0]) and (len(tokens) == 1 or not _CELL.match(tokens[1])):
            return index
    return None


def looks_like_nvidia_smi(text: str) -> bool:
    """True when ``text`` holds a `nvidia-smi topo -m` matrix (a header line and at least one GPU row)."""
    lines = text.splitlines()
    header = _header_index(lines)
    if header is None:
        return False
    for line in lines[header + 1 :]:
        tokens = _tokens(line)
        if len(tokens) >= 2 and _GPU.match(tokens[0]) and _CELL.match(tokens[1]):
            return True
    return False


def parse_nvidia_smi(text: str, *, host: str = "localhost", source: str = "nvidia-smi") -> Topology:
    """A Topology of the GPUs in a `nvidia-smi topo -m` matrix, ranks in the header's GPU order, all on ``host``."""
    lines = text.splitlines()
    header_at = _header_index(lines)
    if header_at is None:
        raise UsageError(f"{source}: not an `nvidia-smi topo -m` matrix (no header line starting with GPU0)")
    header_tokens = _tokens(lines[header_at])
    columns: list[str] = []
    for token in header_tokens:
        if not _COLUMN.match(token):
            break  # "CPU Affinity", "NUMA Affinity", "GPU NUMA ID" follow the device columns
        columns.append(token)
    gpu_columns = [
        (position, int(_GPU.match(name).group(1))) for position, name in enumerate(columns) if _GPU.match(name)
    ]
    has_numa = "NUMA Affinity" in " ".join(header_tokens)
    last_gpu_column = max(position for position, _ in gpu_columns)

    rows: dict[str, list[str]] = {}
    for line in lines[header_at + 1 :]:
        tokens = _tokens(line)
        if not tokens or tokens[0] not in columns:
            continue  # blank lines, the legend, prompts
        if not _GPU.match(tokens[0]):
            continue  # NIC rows: only GPUs take part in the ring
        if tokens[0] in rows:
            raise UsageError(f"{source}: the row {tokens[0]} appears twice")
        if len(tokens) <= last_gpu_column + 1:
            raise UsageError(
                f"{source}: row {tokens[0]} has {len(tokens) - 1} cells, expected at least {last_gpu_column + 1}"
            )
        rows[tokens[0]] = tokens[1:]

    devices = []
    links = []
    for rank, (row_position, gpu_index) in enumerate(gpu_columns):
        name = columns[row_position]
        cells = rows.get(name)
        if cells is None:
            raise UsageError(f"{source}: the header lists {name} but there is no {name} row")
        extras = cells[len(columns) :]  # CPU affinity, NUMA affinity, GPU NUMA ID (whitespace-free tokens)
        numa = extras[1] if has_numa and len(extras) >= 2 else ""
        devices.append(
            Device(
                rank=rank, host=host, local_index=gpu_index, numa_node=int(numa) if numa.isdigit() else None, name=name
            )
        )
        row = []
        for column_position, _ in gpu_columns:
            cell = cells[column_position]
            if column_position == row_position:
                if cell.upper() != "X":
                    raise UsageError(f"{source}: {name} -> {name} is {cell!r}; expected X on the diagonal")
                row.append(None)
                continue
            field = f"{source}: {name} -> {columns[column_position]}"
            if cell.upper() == "X":
                raise UsageError(f"{field} is 'X' off the diagonal; expected {CLASS_HELP}")
            kind, count = parse_link_class(cell, field)
            row.append(Link(kind=kind, nvlinks=count))
        links.append(tuple(row))
    return Topology(devices=tuple(devices), links=tuple(links), source=source)
