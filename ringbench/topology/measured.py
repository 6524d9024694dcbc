"""Topology from a measured matrix: what `ringbench probe` will produce (one-way latency and bandwidth per pair).

A measured link keeps its class when the caller knows it (e.g. from nvidia-smi on the same machine), so reports can
still say "SYS"; otherwise its class is ``measured`` and only the numbers drive the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ringbench.errors import UsageError, bad_value
from ringbench.topology.cost import CostModel
from ringbench.topology.links import Link
from ringbench.topology.model import Device, Topology


def _square(matrix: object, field: str) -> np.ndarray:
    try:
        array = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError):
        raise bad_value(field, matrix, "a square matrix of numbers") from None
    if array.ndim != 2 or array.shape[0] != array.shape[1] or array.shape[0] == 0:
        raise bad_value(field, f"shape {array.shape}", "a non-empty square matrix (one row and column per rank)")
    return array


def from_probe_matrix(
    latency_us: object,
    bandwidth_gbps: object,
    *,
    hosts: Sequence[str] | None = None,
    local_indices: Sequence[int] | None = None,
    classes: Sequence[Sequence[str | None]] | None = None,
    cost_model: CostModel | None = None,
    source: str = "probe",
) -> Topology:
    """A topology whose links carry measured costs: ``latency_us[i][j]`` and ``bandwidth_gbps[i][j]`` for i -> j.

    Diagonal entries are ignored. ``hosts``/``local_indices`` place each rank (default: one host, index = rank);
    ``classes`` optionally names each pair's class (None entries stay ``measured``).
    """
    latency = _square(latency_us, "latency_us")
    bandwidth = _square(bandwidth_gbps, "bandwidth_gbps")
    world = latency.shape[0]
    if bandwidth.shape != latency.shape:
        raise UsageError(f"bandwidth_gbps: shape {bandwidth.shape} differs from latency_us's {latency.shape}")
    hosts = list(hosts) if hosts is not None else ["localhost"] * world
    if len(hosts) != world:
        raise bad_value("hosts", f"{len(hosts)} entries", f"{world} (one host name per rank)")
    if local_indices is None:
        counters: dict[str, int] = {}
        local_indices = []
        for host in hosts:
            local_indices.append(counters.get(host, 0))
            counters[host] = counters.get(host, 0) + 1
    if len(local_indices) != world:
        raise bad_value("local_indices", f"{len(local_indices)} entries", f"{world} (one per rank)")
    if classes is not None and (len(classes) != world or any(len(row) != world for row in classes)):
        raise bad_value("classes", "a ragged or wrongly sized matrix", f"a {world}x{world} matrix of class labels")
    devices = tuple(
        Device(rank=rank, host=str(hosts[rank]), local_index=int(local_indices[rank])) for rank in range(world)
    )
    links = []
    for i in range(world):
        row: list[Link | None] = []
        for j in range(world):
            if i == j:
                row.append(None)
                continue
            if not math.isfinite(latency[i, j]) or latency[i, j] < 0:
                raise bad_value(f"latency_us[{i}][{j}]", float(latency[i, j]), "a finite number >= 0")
            if not math.isfinite(bandwidth[i, j]) or bandwidth[i, j] <= 0:
                raise bad_value(f"bandwidth_gbps[{i}][{j}]", float(bandwidth[i, j]), "a finite number > 0")
            costs = {"latency_us": float(latency[i, j]), "bandwidth_gbps": float(bandwidth[i, j])}
            label = classes[i][j] if classes is not None else None
            row.append(Link(**costs) if label is None else Link.of(label, f"classes[{i}][{j}]", **costs))
        links.append(tuple(row))
    return Topology(devices=devices, links=tuple(links), cost_model=cost_model or CostModel(), source=source)
