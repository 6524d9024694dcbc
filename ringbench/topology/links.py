"""Link classes between two devices: the `nvidia-smi topo -m` vocabulary, plus NET between hosts.

Best to worst: NV# (a bonded set of # NVLinks), PIX (at most one PCIe bridge), PXB (several PCIe bridges), PHB (through
a PCIe host bridge), NODE (between host bridges of one NUMA node), SYS (across the inter-socket interconnect, e.g.
UPI/xGMI), NET (between hosts). A link may instead, or in addition, carry a measured cost (latency, bandwidth).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from ringbench.errors import UsageError, bad_value
from ringbench.topology.units import parse_bandwidth


class LinkKind(str, Enum):
    """The class of a link, in the order of `nvidia-smi topo -m`'s legend (best first), then NET."""

    NV = "NV"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"
    NET = "NET"

    @property
    def rank(self) -> int:
        """0 for the best class (NVLink), 6 for the worst (NET)."""
        return _KIND_ORDER.index(self)


_KIND_ORDER = tuple(LinkKind)

# Older drivers print SOC for what is now SYS; "NV" alone is not valid (the link count is part of the class).
_ALIASES = {"SOC": LinkKind.SYS}
_NV_RE = re.compile(r"^NV(\d+)$")
CLASS_HELP = "one of NV# (e.g. NV12), PIX, PXB, PHB, NODE, SYS, NET"


def parse_link_class(text: object, field: str = "class") -> tuple[LinkKind, int]:
    """``"NV12"`` -> (NV, 12); ``"sys"`` -> (SYS, 0). Anything else raises UsageError naming ``field``."""
    if not isinstance(text, str):
        raise bad_value(field, text, CLASS_HELP)
    label = text.strip().upper()
    match = _NV_RE.match(label)
    if match:
        count = int(match.group(1))
        if count < 1:
            raise bad_value(field, text, "NV# with at least one link, e.g. NV4")
        return LinkKind.NV, count
    if label in _ALIASES:
        return _ALIASES[label], 0
    try:
        kind = LinkKind(label)
    except ValueError:
        raise bad_value(field, text, CLASS_HELP) from None
    if kind is LinkKind.NV:
        raise bad_value(field, text, "NV# with the link count, e.g. NV12")
    return kind, 0


def _check_cost(value: float | None, field: str, *, positive: bool) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_value(field, value, "a finite number")
    if (positive and value <= 0) or value < 0:
        raise bad_value(field, value, "a number > 0" if positive else "a number >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class Link:
    """One directed link from a device to another (the matrix may be asymmetric)."""

    kind: LinkKind | None = None
    """The class; None for a purely measured link (then both costs are required)."""
    nvlinks: int = 0
    """Number of bonded NVLinks (kind NV only)."""
    latency_us: float | None = None
    """Measured one-way latency in microseconds; None: the class default."""
    bandwidth_gbps: float | None = None
    """Measured bandwidth in GB/s (1e9 bytes per second), one direction; None: the class default."""

    def __post_init__(self) -> None:
        if self.kind is not None and not isinstance(self.kind, LinkKind):
            raise bad_value("kind", self.kind, CLASS_HELP)
        if self.kind is LinkKind.NV and (not isinstance(self.nvlinks, int) or self.nvlinks < 1):
            raise bad_value("nvlinks", self.nvlinks, "an integer >= 1 for an NVLink class")
        if self.kind is not LinkKind.NV and self.nvlinks != 0:
            raise bad_value("nvlinks", self.nvlinks, "0 unless kind is NV")
        _check_cost(self.latency_us, "latency_us", positive=False)
        _check_cost(self.bandwidth_gbps, "bandwidth_gbps", positive=True)
        if self.kind is None and (self.latency_us is None or self.bandwidth_gbps is None):
            raise UsageError("a link without a class needs both latency_us and bandwidth_gbps (a measured cost)")

    @classmethod
    def of(cls, label: str, field: str = "class", **costs: float | None) -> Link:
        """A link from a class label such as ``"NV12"`` or ``"SYS"``, with optional measured costs."""
        kind, count = parse_link_class(label, field)
        return cls(kind=kind, nvlinks=count, **costs)

    @property
    def label(self) -> str:
        """``NV12``, ``PIX``, .., ``NET``; ``measured`` for a link known only by its measured cost."""
        if self.kind is None:
            return "measured"
        return f"NV{self.nvlinks}" if self.kind is LinkKind.NV else self.kind.value

    @property
    def measured(self) -> bool:
        return self.latency_us is not None or self.bandwidth_gbps is not None

    @property
    def badness(self) -> tuple[int, int]:
        """Sort key, larger is worse: class rank, then fewer NVLinks is worse; measured-only links sort last."""
        if self.kind is None:
            return (len(_KIND_ORDER), 0)
        return (self.kind.rank, -self.nvlinks)

    def to_json(self) -> str | dict:
        """The label alone, or a mapping when the link carries a measured cost."""
        if not self.measured:
            return self.label
        document: dict = {"class": None if self.kind is None else self.label}
        if self.latency_us is not None:
            document["latency_us"] = self.latency_us
        if self.bandwidth_gbps is not None:
            document["bandwidth_gbps"] = self.bandwidth_gbps
        return document

    @classmethod
    def from_json(cls, value: object, field: str) -> Link:
        """Inverse of `to_json`: a label string, or a mapping with ``class`` and/or measured costs."""
        if isinstance(value, str):
            return cls.of(value, field)
        if not isinstance(value, dict):
            raise bad_value(
                field, value, f"a class label ({CLASS_HELP}) or a mapping with class/latency_us/bandwidth_gbps"
            )
        unknown = set(value) - {"class", "latency_us", "bandwidth_gbps"}
        if unknown:
            raise bad_value(
                f"{field}.{sorted(unknown)[0]}", value[sorted(unknown)[0]], "class, latency_us, bandwidth_gbps"
            )
        costs = {key: value.get(key) for key in ("latency_us", "bandwidth_gbps")}
        if costs["bandwidth_gbps"] is not None:
            costs["bandwidth_gbps"] = parse_bandwidth(costs["bandwidth_gbps"], f"{field}.bandwidth_gbps")
        label = value.get("class")
        try:
            if label is None:
                return cls(**costs)
            return cls.of(label, f"{field}.class", **costs)
        except UsageError as exc:
            message = str(exc)
            raise UsageError(message if message.startswith(field) else f"{field}: {message}") from None
