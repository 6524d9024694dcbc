"""The hop cost model: time to move one reference message over one link.

    hop_us = latency_us + message_bytes / (bandwidth_gbps * 1e9) * 1e6

A ring step waits for its slowest hop (every rank sends to its successor at once, and the next step needs the block
in hand). The optimizer ranks rings by the worst hop priced alone, then the total; the ring step's time, with NET
hops between the same two hosts sharing that link, is topology/linkmodel.py's (the one link model).

The class table below holds NOMINAL defaults: round, order-of-magnitude figures chosen so that the classes rank in the
order of the `nvidia-smi topo -m` legend (NV# best, then PIX, PXB, PHB, NODE, SYS, then NET). They are not measurements
of any machine. NVLink: about 25 GB/s per link per direction for NVLink 2, 3 and 4, so NV12 (A100) gives 300 GB/s and
NV18 (H100) 450 GB/s. PCIe classes: a Gen4 x16 link peaks near 32 GB/s per direction before protocol overhead, and P2P
through more bridges, the host bridge or the inter-socket link is progressively slower. NET: one 100 Gb/s NIC
(per host, unless the topology's ``nics:`` says otherwise; a plan across hosts needs the network's own cost). Override any row from a YAML topology (``class_costs:``) or give a link its measured cost (``ringbench probe``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ringbench.errors import UsageError, bad_value
from ringbench.topology.links import CLASS_HELP, Link, LinkKind
from ringbench.topology.units import parse_bandwidth

# A typical ring-attention KV block: 8192 tokens x 8 KV heads x 128 dims x (K and V) x 2 bytes (bf16) = 32 MiB.
DEFAULT_MESSAGE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkCost:
    """Latency and bandwidth of one link or link class (for an NV class: per NVLink, multiplied by the link count).
    The one link-cost type: the topology's class costs and the simulator's (calibrated) links both use it."""

    latency_us: float
    """One-way latency of a small message, microseconds."""
    bandwidth_gbps: float
    """Sustained bandwidth in one direction, GB/s (1e9 bytes per second)."""
    alltoall_gbps: float | None = None
    """An all-to-all's flows over this class: the bandwidth per device they share, GB/s (NCCL's all-to-all moves
    data differently from a point-to-point exchange: faster over NVSwitch, far slower through a CPU); None: the
    point-to-point bandwidth, shared by the device's transfers."""

    def ms(self, nbytes: float, share: float = 1.0) -> float:
        """Transfer time of ``nbytes``, ms; ``share`` transfers divide the bandwidth."""
        return self.latency_us / 1e3 + nbytes * share / (self.bandwidth_gbps * 1e6)

    def __post_init__(self) -> None:
        for name, value, positive in (
            ("latency_us", self.latency_us, False),
            ("bandwidth_gbps", self.bandwidth_gbps, True),
            ("alltoall_gbps", 1.0 if self.alltoall_gbps is None else self.alltoall_gbps, True),
        ):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (positive and value == 0):
                raise bad_value(name, value, "a finite number > 0" if positive else "a finite number >= 0")


# NOMINAL defaults, best class first (see the module docstring for where the figures come from).
DEFAULT_CLASS_COSTS: Mapping[LinkKind, LinkCost] = MappingProxyType(
    {
        LinkKind.NV: LinkCost(latency_us=2.0, bandwidth_gbps=25.0),  # per NVLink
        LinkKind.PIX: LinkCost(latency_us=3.0, bandwidth_gbps=24.0),
        LinkKind.PXB: LinkCost(latency_us=3.5, bandwidth_gbps=22.0),
        LinkKind.PHB: LinkCost(latency_us=4.0, bandwidth_gbps=18.0),
        LinkKind.NODE: LinkCost(latency_us=5.0, bandwidth_gbps=16.0),
        LinkKind.SYS: LinkCost(latency_us=6.0, bandwidth_gbps=14.0),
        LinkKind.NET: LinkCost(latency_us=10.0, bandwidth_gbps=12.5),
    }
)


@dataclass(frozen=True, kw_only=True, slots=True)
class CostModel:
    """Prices a hop; part of a topology so that a YAML file can carry its own class costs."""

    message_bytes: int = DEFAULT_MESSAGE_BYTES
    """Reference message: the bytes one rank sends its successor per ring step (one KV block)."""
    class_costs: Mapping[LinkKind, LinkCost] = field(default_factory=lambda: DEFAULT_CLASS_COSTS)
    """Cost per class; the nominal DEFAULT_CLASS_COSTS unless overridden."""
    given: frozenset[str] = frozenset()
    """The classes whose costs were given (a file's ``class_costs``), even where they equal the nominal ones."""
    given_fields: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    """Per given class, the figures the file stated (latency_us, bandwidth_gbps, alltoall_gbps): the others are the
    nominal table's, which a GPU's priced classes replace with their cited priors (simulate/priors.py)."""

    def __post_init__(self) -> None:
        if isinstance(self.message_bytes, bool) or not isinstance(self.message_bytes, int) or self.message_bytes < 1:
            raise bad_value("message_bytes", self.message_bytes, "an integer >= 1")
        missing = [kind.value for kind in LinkKind if kind not in self.class_costs]
        if missing:
            raise bad_value("class_costs", missing, "a cost for every class (start from DEFAULT_CLASS_COSTS)")

    def with_overrides(
        self, overrides: Mapping[str, Mapping[str, float]], field_name: str = "class_costs"
    ) -> CostModel:
        """A model whose class costs are replaced, class by class, from ``{"NET": {"latency_us": .., ..}}``."""
        if not isinstance(overrides, Mapping):
            raise bad_value(
                field_name, overrides, "a mapping from class (NV, PIX, .., NET) to latency_us/bandwidth_gbps"
            )
        costs = dict(self.class_costs)
        for key, value in overrides.items():
            where = f"{field_name}.{key}"
            try:
                kind = LinkKind(str(key).strip().upper())
            except ValueError:
                raise bad_value(where, key, CLASS_HELP.replace("NV# (e.g. NV12)", "NV (per link)")) from None
            if not isinstance(value, Mapping) or set(value) - {"latency_us", "bandwidth_gbps", "alltoall_gbps"}:
                raise bad_value(where, value, "a mapping with latency_us, bandwidth_gbps and/or alltoall_gbps")
            base = costs[kind]
            given = {name: parse_bandwidth(value[name], f"{where}.{name}") for name in ("bandwidth_gbps",
                     "alltoall_gbps") if name in value}  # fmt: skip
            alltoall = given.get("alltoall_gbps", base.alltoall_gbps)
            if "bandwidth_gbps" in given and "alltoall_gbps" not in given and base.alltoall_gbps is not None:
                # the class's all-to-all keeps its ratio to the point-to-point bandwidth the file gave
                alltoall = base.alltoall_gbps * given["bandwidth_gbps"] / base.bandwidth_gbps
            try:
                costs[kind] = LinkCost(
                    latency_us=value.get("latency_us", base.latency_us),
                    bandwidth_gbps=given.get("bandwidth_gbps", base.bandwidth_gbps),
                    alltoall_gbps=alltoall,
                )
            except UsageError as exc:
                raise UsageError(f"{where}.{exc}") from None
        given = self.given | {LinkKind(str(key).strip().upper()).value for key in overrides}
        fields = dict(self.given_fields)
        for key, value in overrides.items():
            name = LinkKind(str(key).strip().upper()).value
            fields[name] = fields.get(name, frozenset()) | frozenset(value)
        return CostModel(message_bytes=self.message_bytes, class_costs=MappingProxyType(costs), given=given,
                         given_fields=MappingProxyType(fields))  # fmt: skip

    def overrides(self) -> dict[str, dict[str, float]]:
        """The rows that differ from the nominal table, in the YAML/JSON shape `with_overrides` reads."""
        out = {}
        for kind, cost in self.class_costs.items():
            if DEFAULT_CLASS_COSTS[kind] != cost or kind.value in self.given:
                row = {"latency_us": cost.latency_us, "bandwidth_gbps": cost.bandwidth_gbps}
                if cost.alltoall_gbps is not None:
                    row["alltoall_gbps"] = cost.alltoall_gbps
                out[kind.value] = row
        return out

    def stated(self) -> dict[str, dict[str, float]]:
        """What the topology itself states, per class: the figures a file's ``class_costs`` gave (only those), and
        every figure of a row that differs from the nominal table without being given (a model built in code)."""
        out = {}
        for name, row in self.overrides().items():
            fields = self.given_fields.get(name)
            out[name] = {key: value for key, value in row.items() if fields is None or key in fields}
        return {name: row for name, row in out.items() if row}

    def describe_net(self) -> str:
        """One line: the network's cost per NIC, and whether the topology stated it."""
        net = self.class_costs[LinkKind.NET]
        stated = "NET" in self.overrides()
        where = "stated by the topology" if stated else "not stated: the nominal default, a guess; give class_costs.NET"
        return (f"NET: {net.bandwidth_gbps:g} GB/s ({net.bandwidth_gbps * 8:g} Gb/s) per NIC, {net.latency_us:g} us "
                f"({where})")  # fmt: skip

    def latency_bandwidth(self, link: Link) -> tuple[float, float]:
        """(latency_us, bandwidth_gbps) of a link: its measured values where given, else its class's."""
        if link.kind is None:
            return float(link.latency_us), float(link.bandwidth_gbps)
        base = self.class_costs[link.kind]
        bandwidth = base.bandwidth_gbps * (link.nvlinks if link.kind is LinkKind.NV else 1)
        latency = base.latency_us if link.latency_us is None else link.latency_us
        return float(latency), float(bandwidth if link.bandwidth_gbps is None else link.bandwidth_gbps)

    def alltoall_bandwidth(self, link: Link) -> float | None:
        """GB/s per device that an all-to-all's flows over ``link``'s class share, or None (point-to-point)."""
        if link.kind is None:
            return None
        found = self.class_costs[link.kind].alltoall_gbps
        if found is None:
            return None
        return float(found) * (link.nvlinks if link.kind is LinkKind.NV else 1)

    def hop_us(self, link: Link) -> float:
        """Microseconds to move the reference message over ``link``."""
        latency, bandwidth = self.latency_bandwidth(link)
        return latency + self.message_bytes / (bandwidth * 1e3)  # bytes / (GB/s * 1e9) s = bytes / (GB/s * 1e3) us

    def describe(self, labels: set[str] | None = None) -> str:
        """One line stating the model, for reports and `--json`; ``labels``: the topology's link classes, so that
        the line speaks only of links it has (None: every class)."""
        source = "nominal class defaults" if not self.overrides() else "class costs overridden by the topology"
        kinds = {label.rstrip("0123456789") for label in labels} if labels is not None else {"NET", "SYS", "PXB"}
        sharing = (", share = the ring's NET hops between the same two hosts (they share that network link)"
                   if "NET" in kinds else "")  # fmt: skip
        shared = [text for kind, text in (("SYS", "several hops on one socket link"),
                                          ("PXB", "PCIe switches shared by several hops")) if kind in kinds]  # fmt: skip
        unpriced = f"; contention of {' or '.join(shared)} is not modelled" if shared else ""
        return (
            f"communication per ring step = the slowest hop's latency + M{' x share' if sharing else ''} / bandwidth, "
            f"M = {self.message_bytes} bytes{sharing}; {source}, measured link costs where given{unpriced}"
        )
