"""The YAML topology format: machines and emulated clusters described by hand (read with yaml.safe_load only).

    name: two-node-pcie            # optional
    message_bytes: 33554432        # optional: reference message of the cost model (default 32 MiB)
    class_costs:                   # optional: override rows of the nominal class table
      NET: {latency_us: 5.0, bandwidth_gbps: 50.0}
    intra: PXB                     # default class between GPUs of one host
    cross_numa: SYS                # class between GPUs on different NUMA nodes of one host (default SYS)
    inter: NET                     # class between hosts (default NET)
    nics: per-gpu                  # optional: the NICs of every host (a host's own `nics` wins), see below
    hosts:
      - name: node                 # with count > 1 the hosts are node0, node1, ..
        count: 2
        gpus: 8
        numa: [0, 0, 0, 0, 1, 1, 1, 1]
      - name: big
        matrix:                    # a full class matrix, as nvidia-smi prints it (gpus inferred)
          - [X, NV4, NV4]
          - [NV4, X, NV4]
          - [NV4, NV4, X]
    links:                         # explicit overrides, applied last (both directions unless one_way: true)
      - {from: "node0:0", to: "node0:1", class: PIX}
      - {from: 3, to: 4, latency_us: 9.5, bandwidth_gbps: 11.0}   # measured cost; the class stays

Bandwidths take units (``400Gbps``, ``100 Gb/s``, ``12.5GB/s``, ``400Gbit``; ringbench/topology/units.py); a bare
number is GB/s. The NET class's bandwidth is one NIC's. ``nics`` says which GPUs share a NIC: a count (GPUs split
into that many consecutive groups, e.g. ``nics: 8`` on 8 GPUs: one NIC per GPU, rail-optimised), ``per-gpu``,
``per-host`` (one NIC), or the GPUs of each NIC (``nics: [[0, 1, 2, 3], [4, 5, 6, 7]]``, every GPU once). Not
stated: one NIC per host, shared by all its GPUs (the default; `ringbench topo` says so).

Ranks follow the hosts in order, GPUs in local order. A device is named by its rank or as ``"host:local"``.
Also accepted: a measured matrix (``latency_us`` and ``bandwidth_gbps``, optional per-rank ``hosts`` names and
``classes``) and the JSON/YAML form of `Topology.to_dict` (with ``devices`` and ``links``).
"""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from ringbench.errors import UsageError, bad_value
from ringbench.topology.cost import CostModel
from ringbench.topology.links import Link
from ringbench.topology.measured import from_probe_matrix
from ringbench.topology.model import Device, Topology
from ringbench.topology.units import parse_bandwidth

_TOP_KEYS = {"name", "message_bytes", "class_costs", "intra", "inter", "cross_numa", "hosts", "links", "description",
             "nics"}  # fmt: skip
_HOST_KEYS = {"name", "count", "gpus", "intra", "numa", "cross_numa", "matrix", "nics"}
NICS_FORMS = ("a NIC count from 1 to the host's GPUs, per-gpu, per-host, or the GPUs of each NIC as a list of "
              "lists naming every GPU of the host once (e.g. [[0, 1, 2, 3], [4, 5, 6, 7]])")  # fmt: skip
_LINK_KEYS = {"from", "to", "class", "latency_us", "bandwidth_gbps", "one_way"}
_MEASURED_KEYS = {
    "name",
    "message_bytes",
    "class_costs",
    "latency_us",
    "bandwidth_gbps",
    "hosts",
    "classes",
    "description",
}
_Matrix = list[list[Link | None]]
"""Links by (rank, rank): None on the diagonal."""


def _check_keys(mapping: Mapping, allowed: set[str], where: str) -> None:
    unknown = sorted(str(key) for key in mapping if key not in allowed)
    if unknown:
        raise bad_value(f"{where}{unknown[0]}", mapping[unknown[0]], f"one of the keys {', '.join(sorted(allowed))}")


def _cost_model(spec: Mapping, source: str) -> CostModel:
    model = CostModel()
    if "message_bytes" in spec:
        try:
            model = CostModel(message_bytes=spec["message_bytes"])
        except UsageError as exc:
            raise UsageError(f"{source}: {exc}") from None
    return model.with_overrides(spec.get("class_costs") or {}, f"{source}: class_costs")


def _positive_int(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_value(field, value, "an integer >= 1")
    return value


def _host_block(entry: Mapping, spec: Mapping, where: str) -> tuple[int, list[int | None], list[list[Link | None]]]:
    """(gpus, numa per GPU, intra-host link matrix) of one host entry."""
    matrix = entry.get("matrix")
    if matrix is not None:
        if not isinstance(matrix, list) or not all(isinstance(row, list) for row in matrix):
            raise bad_value(f"{where}.matrix", matrix, "a list of rows of class labels (X on the diagonal)")
        gpus = len(matrix)
        if "gpus" in entry and entry["gpus"] != gpus:
            raise bad_value(f"{where}.gpus", entry["gpus"], f"{gpus} (the matrix has {gpus} rows)")
    else:
        gpus = _positive_int(entry.get("gpus"), f"{where}.gpus")
    numa = entry.get("numa")
    if numa is None:
        numa = [None] * gpus
    elif not isinstance(numa, list) or len(numa) != gpus or not all(isinstance(n, int) and n >= 0 for n in numa):
        raise bad_value(f"{where}.numa", numa, f"a list of {gpus} NUMA node numbers (one per GPU)")
    if matrix is not None:
        block = []
        for i, row in enumerate(matrix):
            if len(row) != gpus:
                raise bad_value(f"{where}.matrix[{i}]", f"{len(row)} entries", f"{gpus} (a square matrix)")
            cells: list[Link | None] = []
            for j, cell in enumerate(row):
                if i == j:
                    cells.append(None)
                else:
                    cells.append(Link.of(cell, f"{where}.matrix[{i}][{j}]"))
            block.append(cells)
        return gpus, numa, block
    intra_label = entry.get("intra", spec.get("intra"))
    if intra_label is None and gpus > 1:
        raise UsageError(
            f"{where}.intra is missing: give the class between this host's GPUs (e.g. NV18, PXB), "
            "a top-level intra, or a matrix"
        )
    intra = Link.of(intra_label, f"{where}.intra") if gpus > 1 else None
    cross_label = entry.get("cross_numa", spec.get("cross_numa", "SYS"))
    cross = Link.of(cross_label, f"{where}.cross_numa")
    block = [
        [
            None if i == j else (cross if numa[i] is not None and numa[j] is not None and numa[i] != numa[j] else intra)
            for j in range(gpus)
        ]
        for i in range(gpus)
    ]
    return gpus, numa, block


def _resolve(reference: object, devices: list[Device], where: str) -> int:
    if isinstance(reference, int) and not isinstance(reference, bool):
        if 0 <= reference < len(devices):
            return reference
        raise bad_value(where, reference, f"a rank in 0..{len(devices) - 1} or 'host:local'")
    if isinstance(reference, str) and ":" in reference:
        host, _, local = reference.rpartition(":")
        for device in devices:
            if device.host == host and local.isdigit() and device.local_index == int(local):
                return device.rank
    raise bad_value(where, reference, "a rank or 'host:local' naming a listed GPU (quote it in YAML)")


def topology_from_spec(spec: object, *, source: str = "yaml") -> Topology:
    """Build a Topology from a parsed YAML/JSON document (any of the three accepted shapes)."""
    if not isinstance(spec, Mapping):
        raise UsageError(
            f"{source}: not a topology: expected a YAML mapping (hosts/intra/..), got {type(spec).__name__}"
        )
    if "devices" in spec:
        return Topology.from_dict(spec, source)
    if isinstance(spec.get("topology"), Mapping):  # a run's meta.json
        return Topology.from_dict(spec["topology"], f"{source}:topology")
    if "latency_us" in spec or "bandwidth_gbps" in spec:
        return _measured_topology(spec, source)
    _check_keys(spec, _TOP_KEYS, f"{source}: ")
    hosts = spec.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise bad_value(f"{source}: hosts", hosts, "a non-empty list of hosts (each with gpus, or a matrix)")
    inter = Link.of(spec.get("inter", "NET"), f"{source}: inter")
    devices, blocks = _devices(hosts, spec, source)
    world = len(devices)
    links: _Matrix = [[None if i == j else inter for j in range(world)] for i in range(world)]
    for ranks, block in blocks:
        for a, rank_a in enumerate(ranks):
            for b, rank_b in enumerate(ranks):
                links[rank_a][rank_b] = block[a][b]
    overrides = spec.get("links") or []
    if not isinstance(overrides, list):
        raise bad_value(f"{source}: links", overrides, "a list of {from, to, class | latency_us, bandwidth_gbps}")
    for index, entry in enumerate(overrides):
        _override(links, entry, devices, f"{source}: links[{index}]")
    return Topology(
        devices=tuple(devices),
        links=tuple(tuple(row) for row in links),
        cost_model=_cost_model(spec, source),
        source=source,
    )


def _measured_topology(spec: Mapping, source: str) -> Topology:
    """A measured matrix (latency_us and bandwidth_gbps, optional per-rank hosts and classes)."""
    _check_keys(spec, _MEASURED_KEYS, f"{source}: ")
    hosts = spec.get("hosts")
    if hosts is not None and not (isinstance(hosts, list) and all(isinstance(h, str) for h in hosts)):
        raise bad_value(f"{source}: hosts", hosts, "a list of host names, one per rank, for a measured matrix")
    bandwidth = spec.get("bandwidth_gbps")
    if isinstance(bandwidth, list) and all(isinstance(row, list) for row in bandwidth):
        bandwidth = [[cell if i == j or not isinstance(cell, str) else
                      parse_bandwidth(cell, f"{source}: bandwidth_gbps[{i}][{j}]") for j, cell in enumerate(row)]
                     for i, row in enumerate(bandwidth)]  # fmt: skip
    return from_probe_matrix(
        spec.get("latency_us"),
        bandwidth,
        hosts=hosts,
        classes=spec.get("classes"),
        cost_model=_cost_model(spec, source),
        source=source,
    )


def _devices(hosts: list, spec: Mapping, source: str) -> tuple[list[Device], list[tuple[list[int], _Matrix]]]:
    """Every device, ranks following the hosts in order (GPUs in local order), and per host its ranks with its
    intra-host link matrix."""
    devices: list[Device] = []
    blocks: list[tuple[list[int], _Matrix]] = []
    for index, entry in enumerate(hosts):
        where = f"{source}: hosts[{index}]"
        if not isinstance(entry, Mapping):
            raise bad_value(where, entry, "a mapping with name and gpus (or a matrix)")
        _check_keys(entry, _HOST_KEYS, f"{where}.")
        count = _positive_int(entry.get("count", 1), f"{where}.count")
        base = str(entry.get("name") or f"host{index}")
        gpus, numa, block = _host_block(entry, spec, where)
        nic_of = _nics(entry.get("nics", spec.get("nics")), gpus, f"{where}.nics")
        for copy in range(count):
            host = f"{base}{copy}" if count > 1 else base
            ranks = []
            for local in range(gpus):
                ranks.append(len(devices))
                devices.append(Device(rank=len(devices), host=host, local_index=local, numa_node=numa[local],
                                      nic=nic_of[local]))  # fmt: skip
            blocks.append((ranks, block))
    seen_hosts = [host for host in dict.fromkeys(device.host for device in devices)]
    if len(seen_hosts) != len(blocks):
        raise UsageError(f"{source}: hosts: two entries give the same host name; names must be unique")
    return devices, blocks


def _nics(value: object, gpus: int, field: str) -> list[int | None]:
    """The NIC of each of a host's ``gpus`` GPUs from its ``nics`` entry (None: not stated, the default)."""
    if value is None:
        return [None] * gpus
    if isinstance(value, str) and value.strip().lower() in ("per-gpu", "per-host"):
        value = gpus if value.strip().lower() == "per-gpu" else 1
    if isinstance(value, int) and not isinstance(value, bool):
        if not 1 <= value <= gpus:
            raise bad_value(field, value, NICS_FORMS.replace("the host's GPUs", f"the host's GPUs ({gpus})"))
        return [local * value // gpus for local in range(gpus)]
    if not isinstance(value, list) or not value or not all(isinstance(group, list) and group for group in value):
        raise bad_value(field, value, NICS_FORMS)
    nic_of: list[int | None] = [None] * gpus
    for nic, group in enumerate(value):
        for gpu in group:
            if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpus:
                raise bad_value(f"{field}[{nic}]", group, f"GPUs of the host, 0..{gpus - 1}")
            if nic_of[gpu] is not None:
                raise bad_value(field, value, f"every GPU under one NIC (GPU {gpu} is listed twice)")
            nic_of[gpu] = nic
    missing = [gpu for gpu, nic in enumerate(nic_of) if nic is None]
    if missing:
        raise bad_value(field, value, f"a NIC for every GPU of the host (GPU{'s' * (len(missing) > 1)} "
                        f"{', '.join(map(str, missing))} under none)")  # fmt: skip
    return nic_of


def _override(links: _Matrix, entry: object, devices: list[Device], where: str) -> None:
    """Apply one entry of ``links:`` to the link matrix (both directions unless one_way)."""
    if not isinstance(entry, Mapping):
        raise bad_value(where, entry, "a mapping with from, to and class and/or measured costs")
    _check_keys(entry, _LINK_KEYS, f"{where}.")
    src = _resolve(entry.get("from"), devices, f"{where}.from")
    dst = _resolve(entry.get("to"), devices, f"{where}.to")
    if src == dst:
        raise bad_value(f"{where}.to", entry.get("to"), "a different device than from")
    costs = {key: entry.get(key) for key in ("latency_us", "bandwidth_gbps")}
    if costs["bandwidth_gbps"] is not None:
        costs["bandwidth_gbps"] = parse_bandwidth(costs["bandwidth_gbps"], f"{where}.bandwidth_gbps")
    if "class" not in entry and costs == {"latency_us": None, "bandwidth_gbps": None}:
        raise UsageError(f"{where}: give a class and/or latency_us and bandwidth_gbps")
    pairs = [(src, dst)] if entry.get("one_way") else [(src, dst), (dst, src)]
    for a, b in pairs:
        try:
            if "class" in entry:
                links[a][b] = Link.of(entry["class"], f"{where}.class", **costs)
            else:
                existing = links[a][b]
                links[a][b] = Link(kind=existing.kind, nvlinks=existing.nvlinks, **costs)
        except UsageError as exc:
            message = str(exc)
            raise UsageError(message if message.startswith(where) else f"{where}.{message}") from None


def parse_yaml_topology(text: str, *, source: str = "yaml") -> Topology:
    """Parse YAML text (safe_load only) into a Topology."""
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{source}: not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    return topology_from_spec(spec, source=source)
