"""The topology model: devices (one per rank) and a directed link for every ordered pair of them.

Every source (NVML, `nvidia-smi topo -m` text, a YAML description, a measured probe matrix) builds a `Topology`;
the optimizer and the commands read nothing else. `to_dict`/`from_dict` give the JSON form stored under the
``"topology"`` key of a run's meta.json.

Topology document versions:
  1 -- first version (this file). Earlier versions: none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ringbench.errors import UsageError, bad_value
from ringbench.topology.cost import CostModel
from ringbench.topology.links import Link

TOPOLOGY_FORMAT = "ringbench-topology"
TOPOLOGY_VERSION = 1


_DERIVED: dict[int, tuple[object, dict]] = {}
_DERIVED_KEEP = 16  # topologies whose derived views are kept (a plan reads a few sub-topologies many times)


def _derived(topology, name: str, build):
    """A view derived from a (frozen) topology, computed once per topology object."""
    entry = _DERIVED.get(id(topology))
    if entry is None or entry[0] is not topology:
        if len(_DERIVED) >= _DERIVED_KEEP:
            _DERIVED.pop(next(iter(_DERIVED)))
        entry = _DERIVED[id(topology)] = (topology, {})
    views = entry[1]
    if name not in views:
        views[name] = build()
    return views[name]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One accelerator, i.e. one rank of the ring."""

    rank: int
    """Global rank; equals the device's index in `Topology.devices`."""
    host: str
    """Host name; devices on different hosts are joined by NET."""
    local_index: int
    """Index on its host as nvidia-smi/NVML number it (what CUDA_VISIBLE_DEVICES lists with PCI_BUS_ID order)."""
    numa_node: int | None = None
    """NUMA node of the CPUs closest to the device; None when unknown."""
    name: str = ""
    """Free-form label, e.g. ``GPU3`` or the product name."""
    nic: int | None = None
    """The NIC (index on its host) that carries the device's traffic to other hosts; GPUs with the same index share
    it. None: not stated, the default: one NIC per host, shared by all its GPUs (NIC 0)."""

    def __post_init__(self) -> None:
        if not _is_int(self.rank) or self.rank < 0:
            raise bad_value("rank", self.rank, "an integer >= 0")
        if not isinstance(self.host, str) or not self.host:
            raise bad_value("host", self.host, "a non-empty host name")
        if not _is_int(self.local_index) or self.local_index < 0:
            raise bad_value("local_index", self.local_index, "an integer >= 0")
        if self.numa_node is not None and (not _is_int(self.numa_node) or self.numa_node < 0):
            raise bad_value("numa_node", self.numa_node, "an integer >= 0 or None")
        if self.nic is not None and (not _is_int(self.nic) or self.nic < 0):
            raise bad_value("nic", self.nic, "an integer >= 0 (the NIC's index on its host) or None")


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """Devices and the directed link matrix between them, with the cost model that prices a hop."""

    devices: tuple[Device, ...]
    """One device per rank, in rank order."""
    links: tuple[tuple[Link | None, ...], ...]
    """links[i][j]: the link from rank i to rank j; None on the diagonal only."""
    cost_model: CostModel = field(default_factory=CostModel)
    """Prices a hop (reference message size and per-class costs)."""
    source: str = ""
    """Where this came from, e.g. ``nvidia-smi:dgx.txt``, ``nvml``, ``yaml:cluster.yaml``, ``probe``."""

    def __post_init__(self) -> None:
        if not isinstance(self.devices, tuple) or not self.devices:
            raise bad_value("devices", self.devices, "a non-empty tuple of Device")
        seen_slots: set[tuple[str, int]] = set()
        for index, device in enumerate(self.devices):
            if not isinstance(device, Device):
                raise bad_value(f"devices[{index}]", device, "a Device")
            if device.rank != index:
                raise bad_value(f"devices[{index}].rank", device.rank, f"{index} (devices are listed in rank order)")
            slot = (device.host, device.local_index)
            if slot in seen_slots:
                raise UsageError(
                    f"devices[{index}]: host {device.host!r} local_index {device.local_index} is listed twice"
                )
            seen_slots.add(slot)
        stated: dict[str, set[bool]] = {}
        for device in self.devices:
            stated.setdefault(device.host, set()).add(device.nic is not None)
        mixed = next((host for host, kinds in stated.items() if len(kinds) > 1), None)
        if mixed is not None:
            raise bad_value(f"nics of host {mixed!r}", "stated for some GPUs only",
                            "a NIC for every GPU of the host, or for none (the default: one NIC per host)")  # fmt: skip
        world = len(self.devices)
        if not isinstance(self.links, tuple) or len(self.links) != world:
            raise UsageError(f"links: expected a {world}x{world} matrix (one row per device), got {_shape(self.links)}")
        for i, row in enumerate(self.links):
            if not isinstance(row, tuple) or len(row) != world:
                raise UsageError(f"links[{i}]: expected {world} entries (one per device), got {_shape(row)}")
            if row[i] is not None:
                raise bad_value(f"links[{i}][{i}]", getattr(row[i], "label", row[i]), "None (a device has no link to "
                                "itself)")  # fmt: skip
            types = list(map(type, row))  # compared as types (identity), not as Links: C loops at 1,024 ranks
            if set(types) - {Link, type(None)} or types.count(type(None)) != 1:  # the culprit if any
                j = next(j for j, link in enumerate(row) if j != i and not isinstance(link, Link))
                raise bad_value(f"links[{i}][{j}]", row[j], "a Link")
        if not isinstance(self.cost_model, CostModel):
            raise bad_value("cost_model", self.cost_model, "a CostModel")

    # -- views -------------------------------------------------------------------------------------------------------

    @property
    def world(self) -> int:
        return len(self.devices)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Host names in order of first appearance (rank order)."""
        return tuple(dict.fromkeys(device.host for device in self.devices))

    def link(self, src: int, dst: int) -> Link:
        link = self.links[src][dst]
        if link is None:
            raise UsageError(f"link {src}->{dst}: a device has no link to itself")
        return link

    def host_ids(self) -> np.ndarray:
        """(N,) the index of each device's host (hosts in first-appearance order; computed once; read-only)."""
        return _derived(self, "host_ids", self._host_ids)

    def _host_ids(self) -> np.ndarray:
        names: dict[str, int] = {}
        out = np.array([names.setdefault(d.host, len(names)) for d in self.devices], dtype=np.int64)
        out.setflags(write=False)
        return out

    def nic_ids(self) -> np.ndarray:
        """(N,) a NIC number per device, unique across hosts: devices with the same number share that NIC's
        bandwidth to other hosts (computed once per topology; read-only)."""
        return _derived(self, "nic_ids", self._nic_ids)

    def _nic_ids(self) -> np.ndarray:
        ids: dict[tuple[str, int], int] = {}
        out = np.array([ids.setdefault((d.host, d.nic or 0), len(ids)) for d in self.devices], dtype=np.int64)
        out.setflags(write=False)
        return out

    def nic_layout(self) -> list[dict]:
        """Per host: its GPUs (local indices) per NIC and whether the topology stated them (else the default)."""
        out: dict[str, dict] = {}
        for device in self.devices:
            entry = out.setdefault(device.host, {"host": device.host, "stated": device.nic is not None, "nics": {}})
            entry["nics"].setdefault(device.nic or 0, []).append(device.local_index)
        return [{"host": e["host"], "stated": e["stated"], "nics": [e["nics"][k] for k in sorted(e["nics"])]}
                for e in out.values()]  # fmt: skip

    def describe_nics(self) -> str:
        """One line: the NICs per host and which GPUs share each (the default said so where not stated)."""
        layout = self.nic_layout()
        if len(layout) < 2:
            return "one host: no NIC carries its traffic"
        shapes = Counter((e["stated"], tuple(map(tuple, e["nics"]))) for e in layout)
        parts = []
        for (stated, nics), count in shapes.items():
            hosts = f"{count} host{'s' * (count != 1)}"
            if not stated:
                parts.append(f"{hosts}: 1 NIC each, shared by its {len(nics[0])} GPUs (not stated: the default)")
            elif all(len(gpus) == 1 for gpus in nics):
                parts.append(f"{hosts}: {len(nics)} NICs each, one per GPU (rail-optimised)")
            else:
                groups = " | ".join(",".join(map(str, gpus)) for gpus in nics)
                parts.append(f"{hosts}: {len(nics)} NICs each, shared by GPUs {groups}")
        return "NICs: " + "; ".join(parts) + "; the NET class's bandwidth is per NIC"

    def label_matrix(self) -> list[list[str]]:
        """Class labels as `nvidia-smi topo -m` prints them (``X`` on the diagonal)."""
        return [["X" if link is None else link.label for link in row] for row in self.links]

    def cost_matrix(self) -> np.ndarray:
        """(world, world) float64: microseconds per hop for the reference message; 0 on the diagonal (computed
        once per topology; read-only)."""
        return _derived(self, "cost_matrix", self._cost_matrix)

    def _cost_matrix(self) -> np.ndarray:
        objects, codes = self.link_codes()
        prices = np.array([0.0 if link is None else self.cost_model.hop_us(link) for link in objects])
        costs = prices[codes]
        costs.setflags(write=False)
        return costs

    def link_codes(self) -> tuple[list, np.ndarray]:
        """(the distinct Link objects, (N, N) the index of each pair's object): sources share one Link object among
        many pairs, so a view of every pair prices each object once (None: the diagonal). Computed once."""
        return _derived(self, "link_codes", self._link_codes)

    def _link_codes(self) -> tuple[list, np.ndarray]:
        world = self.world
        ids = np.array([list(map(id, row)) for row in self.links], dtype=np.int64)
        _, first, inverse = np.unique(ids.ravel(), return_index=True, return_inverse=True)
        objects = [self.links[index // world][index % world] for index in first]
        codes = inverse.reshape(world, world)
        codes.setflags(write=False)
        return objects, codes

    def class_counts(self) -> dict[str, int]:
        """How many ordered pairs have each class label (computed once per topology)."""
        return dict(_derived(self, "class_counts", self._class_counts))

    def _class_counts(self) -> dict[str, int]:
        objects, codes = self.link_codes()
        counts = np.bincount(codes.ravel(), minlength=len(objects))
        out: Counter = Counter()
        for link, count in zip(objects, counts, strict=True):
            if link is not None:
                out[link.label] += int(count)
        return dict(out)

    @property
    def has_measured_links(self) -> bool:
        """Some link carries a measured cost."""
        return any(link is not None and link.measured for link in self.link_codes()[0])

    def device_label(self, rank: int) -> str:
        device = self.devices[rank]
        return f"{device.host}:{device.local_index}" if len(self.hosts) > 1 else f"GPU{device.local_index}"

    def describe(self) -> str:
        hosts = len(self.hosts)
        where = f" ({self.source})" if self.source else ""
        return f"{self.world} device{'s' * (self.world != 1)} on {hosts} host{'s' * (hosts != 1)}{where}"

    def with_message_bytes(self, message_bytes: int) -> Topology:
        return replace(self, cost_model=replace(self.cost_model, message_bytes=message_bytes))

    # -- JSON form ---------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """A JSON-ready document (what a run's meta.json keeps under ``"topology"``)."""
        return {
            "format": TOPOLOGY_FORMAT,
            "format_version": TOPOLOGY_VERSION,
            "source": self.source,
            "message_bytes": self.cost_model.message_bytes,
            "class_costs": self.cost_model.stated(),
            "devices": [
                {
                    "rank": device.rank,
                    "host": device.host,
                    "local_index": device.local_index,
                    "numa_node": device.numa_node,
                    "name": device.name,
                    **({"nic": device.nic} if device.nic is not None else {}),
                }
                for device in self.devices
            ],
            "links": [[None if link is None else link.to_json() for link in row] for row in self.links],
        }

    @classmethod
    def from_dict(cls, document: object, field_name: str = "topology") -> Topology:
        """Inverse of `to_dict`; a malformed document raises UsageError naming the field."""
        if not isinstance(document, Mapping):
            raise bad_value(field_name, type(document).__name__, "a mapping with devices and links")
        # "version" is how records written before the common JSON envelope named it
        version = document.get("format_version", document.get("version", TOPOLOGY_VERSION))
        if version != TOPOLOGY_VERSION:
            raise bad_value(f"{field_name}.format_version", version, str(TOPOLOGY_VERSION))
        devices_doc = document.get("devices")
        links_doc = document.get("links")
        if not isinstance(devices_doc, list) or not devices_doc:
            raise bad_value(f"{field_name}.devices", devices_doc, "a non-empty list of devices")
        if not isinstance(links_doc, list):
            raise bad_value(f"{field_name}.links", type(links_doc).__name__, "a list of rows (a square matrix)")
        devices = []
        for index, entry in enumerate(devices_doc):
            where = f"{field_name}.devices[{index}]"
            if not isinstance(entry, Mapping):
                raise bad_value(where, entry, "a mapping with rank, host, local_index")
            try:
                devices.append(
                    Device(
                        rank=entry.get("rank", index),
                        host=entry.get("host", "localhost"),
                        local_index=entry.get("local_index", index),
                        numa_node=entry.get("numa_node"),
                        name=str(entry.get("name") or ""),
                        nic=entry.get("nic"),
                    )
                )
            except UsageError as exc:
                raise UsageError(f"{where}.{exc}") from None
        rows = []
        shared: dict[object, Link] = {}  # one Link object per distinct cell: cheap to build and to price
        for i, row in enumerate(links_doc):
            if not isinstance(row, list):
                raise bad_value(f"{field_name}.links[{i}]", type(row).__name__, "a list (one entry per device)")
            cells = []
            for j, cell in enumerate(row):
                if i == j and (cell is None or (isinstance(cell, str) and cell.strip().upper() == "X")):
                    cells.append(None)
                    continue
                key = cell if isinstance(cell, str) else None
                if key is None and isinstance(cell, Mapping):
                    key = tuple(sorted((str(name), repr(value)) for name, value in cell.items()))
                link = shared.get(key) if key is not None else None
                if link is None:
                    link = Link.from_json(cell, f"{field_name}.links[{i}][{j}]")
                    if key is not None:
                        shared[key] = link
                cells.append(link)
            rows.append(tuple(cells))
        cost_model = CostModel()
        if "message_bytes" in document:
            try:
                cost_model = CostModel(message_bytes=document["message_bytes"])
            except UsageError as exc:
                raise UsageError(f"{field_name}.{exc}") from None
        cost_model = cost_model.with_overrides(document.get("class_costs") or {}, f"{field_name}.class_costs")
        try:
            return cls(
                devices=tuple(devices),
                links=tuple(rows),
                cost_model=cost_model,
                source=str(document.get("source") or ""),
            )
        except UsageError as exc:
            raise UsageError(f"{field_name}.{exc}") from None


def _shape(value: object) -> str:
    return f"{len(value)} entries" if isinstance(value, (tuple, list)) else type(value).__name__
