"""Topology from NVML (nvidia-ml-py, ``import pynvml``), and merging per-rank records from several hosts.

Per local GPU pair: NVLink count from each active link's remote PCI bus id (a link whose far end is another local GPU
counts for that pair; links into NVSwitches make every switch-attached pair NV<links>, as nvidia-smi prints it);
otherwise the PCIe class from `nvmlDeviceGetTopologyCommonAncestor`. Each GPU's NUMA node comes from
`nvmlDeviceGetNumaNodeId` where the driver has it.

A multi-host run gathers one `DeviceRecord` per rank (JSON-ready: `to_dict`, e.g. through all_gather_object) and
`merge_device_records` builds the cluster's topology: same host -> the class the records name, different hosts -> NET.

Numbering follows CUDA's, not NVML's: under ``CUDA_VISIBLE_DEVICES`` (a subset, a reordering, or one GPU bound per
task) the records are the visible GPUs only, in the order CUDA numbers them, so rank r of a run is the GPU that
``cuda:r`` names. Entries are NVML indices (NVML counts in PCI bus order, which is CUDA's with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and on boards of one GPU model) or UUIDs (``GPU-...``, a unique prefix), exact
whatever the order; as CUDA does, the list ends at the first entry that names no GPU or one named before.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType

from ringbench.errors import UsageError, bad_value
from ringbench.topology.links import Link, LinkKind
from ringbench.topology.model import Device, Topology

log = logging.getLogger(__name__)

# nvmlDeviceGetTopologyCommonAncestor levels -> nvidia-smi classes. INTERNAL (two GPUs on one board) is closest.
_ANCESTOR_CLASS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_NVLINK_DEVICE_TYPE_SWITCH = 2


def normalize_bus_id(bus_id: object) -> str:
    """``b"00000000:07:00.0"`` and ``"0000:07:00.0"`` -> ``"00000000:07:00.0"`` (NVML pads the domain to 8 digits)."""
    text = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    text = text.strip().lower().rstrip("\x00")
    domain, sep, rest = text.partition(":")
    if not sep or ":" not in rest:
        return text
    return f"{int(domain, 16):08x}:{rest}"


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceRecord:
    """What one rank knows about its own GPU and the other GPUs of its host."""

    rank: int
    host: str
    local_index: int
    bus_id: str
    """PCI bus id, normalized (the key other records' ``peers`` use)."""
    numa_node: int | None = None
    name: str = ""
    peers: Mapping[str, str] = field(default_factory=dict)
    """Bus id of each other GPU on the host -> class label (``NV12``, ``PIX``, .., ``SYS``)."""

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "host": self.host,
            "local_index": self.local_index,
            "bus_id": self.bus_id,
            "numa_node": self.numa_node,
            "name": self.name,
            "peers": dict(self.peers),
        }

    @classmethod
    def from_dict(cls, document: Mapping, field_name: str = "record") -> DeviceRecord:
        if not isinstance(document, Mapping):
            raise bad_value(field_name, document, "a mapping (DeviceRecord.to_dict)")
        try:
            return cls(
                rank=document["rank"],
                host=document["host"],
                local_index=document["local_index"],
                bus_id=normalize_bus_id(document["bus_id"]),
                numa_node=document.get("numa_node"),
                name=str(document.get("name") or ""),
                peers={normalize_bus_id(bus): label for bus, label in dict(document.get("peers") or {}).items()},
            )
        except KeyError as exc:
            raise UsageError(f"{field_name}.{exc.args[0]} is missing") from None


def _load_nvml(nvml: ModuleType | None) -> ModuleType | None:
    if nvml is not None:
        return nvml
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        log.info("NVML unavailable: nvidia-ml-py (pynvml) is not installed")
        return None


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def cuda_visible(spec: str | None, uuids: Sequence[str]) -> list[int] | None:
    """NVML indices in CUDA's numbering under CUDA_VISIBLE_DEVICES=``spec`` (None when unset: every GPU, NVML's
    order). ``uuids``: each NVML index's UUID ("" where unknown)."""
    if spec is None:
        return None
    visible: list[int] = []
    for entry in (part.strip() for part in spec.split(",")):
        if entry.lstrip("-").isdigit():
            index = int(entry)
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            index = matches[0] if len(matches) == 1 else -1
        if not 0 <= index < len(uuids) or index in visible:
            break  # CUDA ignores the rest of the list from an entry it cannot use
        visible.append(index)
    return visible


def _uuids(nvml: ModuleType, handles: list) -> list[str]:
    uuids = []
    for handle in handles:
        try:
            uuids.append(_text(nvml.nvmlDeviceGetUUID(handle)))
        except Exception:  # an older driver or a stand-in without UUIDs: indices still work
            uuids.append("")
    return uuids


def _visible_records(records: list[DeviceRecord], order: list[int] | None, rank_offset: int) -> list[DeviceRecord]:
    """The records of the GPUs CUDA shows, numbered as CUDA numbers them (ranks from ``rank_offset``)."""
    if order is None:
        return records
    shown = [records[index] for index in order]
    buses = {record.bus_id for record in shown}
    return [DeviceRecord(rank=rank_offset + cuda_index, host=record.host, local_index=cuda_index, bus_id=record.bus_id,
                         numa_node=record.numa_node, name=record.name,
                         peers={bus: label for bus, label in record.peers.items() if bus in buses})
            for cuda_index, record in enumerate(shown)]  # fmt: skip


def _records_from_nvml(nvml: ModuleType, host: str, rank_offset: int, visible: str | None = None) -> list[DeviceRecord]:
    nvml_error = getattr(nvml, "NVMLError", Exception)
    enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    switch_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", _NVLINK_DEVICE_TYPE_SWITCH)
    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    buses = [normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId) for handle in handles]
    index_of_bus = {bus: index for index, bus in enumerate(buses)}

    nvlinks = [[0] * count for _ in range(count)]
    switch_links = [0] * count
    for index, handle in enumerate(handles):
        for link in range(max_links):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != enabled:
                    continue
                remote = normalize_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except nvml_error:
                continue  # no such link on this GPU (PCIe-only boards answer NotSupported for every link)
            if remote in index_of_bus and index_of_bus[remote] != index:
                nvlinks[index][index_of_bus[remote]] += 1
                continue
            try:
                remote_type = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
            except (nvml_error, AttributeError):
                remote_type = switch_type  # older drivers: a non-GPU far end on a GPU board is an NVSwitch
            if remote_type == switch_type:
                switch_links[index] += 1

    records = []
    for index, handle in enumerate(handles):
        try:
            numa = nvml.nvmlDeviceGetNumaNodeId(handle)
            numa = int(numa) if int(numa) >= 0 else None
        except (nvml_error, AttributeError, TypeError, ValueError):
            numa = None
        try:
            name = _text(nvml.nvmlDeviceGetName(handle))
        except nvml_error:
            name = ""
        peers = {}
        for other in range(count):
            if other == index:
                continue
            if nvlinks[index][other]:
                peers[buses[other]] = f"NV{nvlinks[index][other]}"
            elif switch_links[index] and switch_links[other]:
                peers[buses[other]] = f"NV{min(switch_links[index], switch_links[other])}"
            else:
                level = int(nvml.nvmlDeviceGetTopologyCommonAncestor(handle, handles[other]))
                peers[buses[other]] = _ANCESTOR_CLASS.get(level, "SYS")
        records.append(
            DeviceRecord(
                rank=rank_offset + index,
                host=host,
                local_index=index,
                bus_id=buses[index],
                numa_node=numa,
                name=name,
                peers=peers,
            )
        )
    return _visible_records(records, cuda_visible(visible, _uuids(nvml, handles)), rank_offset)


def collect_local_records(
    nvml: ModuleType | None = None, *, host: str | None = None, rank_offset: int = 0, visible: str | None = ""
) -> list[DeviceRecord] | None:
    """One record per GPU CUDA shows (CUDA's numbering, module docstring), ranks from ``rank_offset``; None, with
    one logged line, without NVML.

    ``nvml``: the pynvml module, or a stand-in with the same functions (tests pass a fake). ``visible``: a
    CUDA_VISIBLE_DEVICES value, None for every GPU; by default the environment's.
    """
    if visible == "":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    nvml = _load_nvml(nvml)
    if nvml is None:
        return None
    nvml_error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except (nvml_error, OSError) as exc:
        log.info("NVML unavailable: %s", exc or type(exc).__name__)
        return None
    try:
        return _records_from_nvml(nvml, host or socket.gethostname(), rank_offset, visible)
    except nvml_error as exc:
        log.info("NVML unavailable: a query failed (%s)", exc or type(exc).__name__)
        return None
    finally:
        with contextlib.suppress(nvml_error):
            nvml.nvmlShutdown()


def local_gpu_names(nvml: ModuleType | None = None) -> list[str]:
    """Product names of this machine's GPUs, as NVML reports them ([] without NVML or GPUs; never raises)."""
    nvml = _load_nvml(nvml)
    if nvml is None:
        return []
    nvml_error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except (nvml_error, OSError):
        return []
    try:
        return [
            _text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(nvml.nvmlDeviceGetCount())
        ]
    except nvml_error:
        return []
    finally:
        with contextlib.suppress(nvml_error):
            nvml.nvmlShutdown()


def merge_device_records(records: Sequence[DeviceRecord | Mapping], *, source: str = "nvml") -> Topology:
    """The topology of all ranks from their records: hosts differ -> NET, same host -> the class the records name."""
    parsed = [
        record if isinstance(record, DeviceRecord) else DeviceRecord.from_dict(record, f"records[{index}]")
        for index, record in enumerate(records)
    ]
    if not parsed:
        raise bad_value("records", [], "at least one device record")
    parsed.sort(key=lambda record: record.rank)
    ranks = [record.rank for record in parsed]
    if ranks != list(range(len(parsed))):
        raise bad_value("records.rank", ranks, f"each rank 0..{len(parsed) - 1} exactly once")
    devices = tuple(
        Device(rank=r.rank, host=r.host, local_index=r.local_index, numa_node=r.numa_node, name=r.name) for r in parsed
    )
    links = []
    for a in parsed:
        row: list[Link | None] = []
        for b in parsed:
            if a.rank == b.rank:
                row.append(None)
            elif a.host != b.host:
                row.append(Link(kind=LinkKind.NET))
            else:
                label = a.peers.get(b.bus_id) or b.peers.get(a.bus_id)
                if label is None:
                    raise UsageError(
                        f"records: rank {a.rank} and rank {b.rank} share host {a.host!r} but neither record "
                        f"names the link between bus {a.bus_id} and bus {b.bus_id}"
                    )
                row.append(Link.of(label, f"records[{a.rank}].peers[{b.bus_id!r}]"))
        links.append(tuple(row))
    return Topology(devices=devices, links=tuple(links), source=source)


def collect_nvml_topology(nvml: ModuleType | None = None, *, host: str | None = None,
                          visible: str | None = "") -> Topology | None:  # fmt: skip
    """The topology of the GPUs CUDA shows (``visible``: as collect_local_records takes it), from NVML, or None
    (one logged line) when NVML is unavailable."""
    records = collect_local_records(nvml, host=host, visible=visible)
    if records is None:
        return None
    if not records:
        log.info("NVML unavailable: the driver reports no GPUs")
        return None
    return merge_device_records(records, source="nvml")
