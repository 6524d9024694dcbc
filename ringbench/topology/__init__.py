"""Topology: which links join the ranks, what a hop costs, and which ring order avoids the slow ones.

Sources build a `Topology` (NVML, `nvidia-smi topo -m` text, YAML, a measured matrix); `recommend` finds the ring order
that minimises the worst hop, then the total; `ring_links` prices a ring's step with the one link model (NIC sharing
included) that emulated links, the simulator and recommend share. See docs/topology.md.
"""

from __future__ import annotations

from ringbench.topology.cost import DEFAULT_CLASS_COSTS, DEFAULT_MESSAGE_BYTES, CostModel, LinkCost
from ringbench.topology.linkmodel import RingLinks, ring_links
from ringbench.topology.links import Link, LinkKind, parse_link_class
from ringbench.topology.load import load_topology, read_topology_text, resolve_topology, topology_from_run
from ringbench.topology.measured import from_probe_matrix
from ringbench.topology.model import Device, Topology
from ringbench.topology.nvml import (
    DeviceRecord,
    collect_local_records,
    collect_nvml_topology,
    merge_device_records,
)
from ringbench.topology.nvsmi import looks_like_nvidia_smi, parse_nvidia_smi
from ringbench.topology.optimize import Hop, Recommendation, every_order_equivalent, recommend
from ringbench.topology.yaml_source import parse_yaml_topology, topology_from_spec

__all__ = [
    "DEFAULT_CLASS_COSTS",
    "DEFAULT_MESSAGE_BYTES",
    "CostModel",
    "Device",
    "DeviceRecord",
    "Hop",
    "Link",
    "LinkCost",
    "LinkKind",
    "Recommendation",
    "RingLinks",
    "Topology",
    "collect_local_records",
    "collect_nvml_topology",
    "every_order_equivalent",
    "from_probe_matrix",
    "load_topology",
    "looks_like_nvidia_smi",
    "merge_device_records",
    "parse_link_class",
    "parse_nvidia_smi",
    "parse_yaml_topology",
    "read_topology_text",
    "recommend",
    "resolve_topology",
    "ring_links",
    "topology_from_run",
    "topology_from_spec",
]
