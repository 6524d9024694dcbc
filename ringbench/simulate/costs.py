"""What things cost in the simulator: compute per FLOP and per call, links, host overheads, noise.

``Costs`` is what calibration (calibrate.py) measures on a run and what the defaults stand in for without one.
Compute: a block of ``work`` computed FLOPs (masked entries of a partial block included, as the kernels do them)
takes ``call_ms + work / gflops * efficiency[kind]``; a rank slowed k times stretches the second term. Links:
``latency + bytes / bandwidth`` per link class (``local`` without a topology). Host: fixed times between a ring
step's events (entering the ring, before compute, between compute and the dK/dV post, after the step). Noise:
lognormal compute and transfer times (coefficients of variation), and each rank's start of an iteration drawn
from the measured spread of barrier exits.

DEFAULTS are round figures of a current accelerator (not a measurement of any machine): 400 TFLOP/s of attention
arithmetic, 10 us kernel calls, 100 GB/s and 5 us links between ranks without a topology, no noise.

A GPU of the hardware catalogue (simulate/priors.py) replaces the rate with its attention kernel's model
(``kernel``: the time of a call from its shape, ringbench/hardware/kernel.py) and states the costs a real ring pays
beside the kernels, each its own term so that a calibration can identify it: the online-softmax merge of every
block (``merge_ms_per_melem``), the launch and stream gaps of a ring step (``host_ms``), the layout copies of an
all-to-all (``transpose_ms_per_mib``, with its fixed gap in ``strategy_ms``) and the imperfect overlap of a transfer
with the kernel beside it (``overlap_penalty``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ringbench.errors import bad_value
from ringbench.topology.cost import LinkCost  # the one link-cost type (re-exported here)

PHASES = ("fwd", "bwd")
KINDS = ("full", "causal", "partial")
HOST_STEPS = ("enter_ms", "pre_ms", "mid_ms", "post_ms")


def _finite(name: str, value: object, *, positive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        raise bad_value(name, value, "a finite number > 0" if positive else "a finite number >= 0")
    return float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class CostSource:
    """Where one cost of the model came from (what a prediction must say it calibrated or assumed)."""

    cost: str
    """Dotted name: ``compute.fwd.call_ms``, ``compute.bwd.efficiency.causal``, ``link.local``, ``host.fwd.sync``."""
    determined: bool
    """True: the calibration run measured it; False: a stated prior."""
    how: str
    """One line: how it was measured, or which prior and why."""
    hint: str = ""
    """For a prior: what calibration run would determine it."""
    given: bool = False
    """True: the user's topology file states it (a class cost): neither measured nor a catalogue prior."""

    def to_dict(self) -> dict:
        out = {"cost": self.cost, "determined": self.determined, "how": self.how, "hint": self.hint}
        return out | ({"given": True} if self.given else {})

    @classmethod
    def from_dict(cls, document: dict) -> CostSource:
        return cls(cost=str(document["cost"]), determined=bool(document["determined"]), how=str(document["how"]),
                   hint=str(document.get("hint", "")), given=bool(document.get("given", False)))  # fmt: skip


DEFAULT_LINKS = {"local": LinkCost(latency_us=5.0, bandwidth_gbps=100.0)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Costs:
    """The simulator's price list (calibrated on a run, or the documented defaults)."""

    gflops: float = 400_000.0
    """Nominal compute rate, GFLOP/s of computed attention FLOPs (emulated runs: the emulated kernel's rate)."""
    efficiency: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: {phase: dict.fromkeys(KINDS, 1.0) for phase in PHASES}
    )
    """Measured / nominal time per FLOP, per phase and mask kind (1.0: exactly the nominal rate)."""
    call_ms: Mapping[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.01))
    """Fixed time per kernel call (launch, merge, accumulation), per phase."""
    host_ms: Mapping[str, Mapping[str, Mapping[str, float]]] = field(
        default_factory=lambda: {
            phase: {buffer: dict.fromkeys(HOST_STEPS, 0.005) for buffer in ("sync", "double")} for phase in PHASES
        }
    )
    """Per phase and buffer: enter_ms, pre_ms, mid_ms, post_ms (see phase_ring.PhaseModel)."""
    links: Mapping[str, LinkCost] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    """Per link class (``local``: ranks without a topology, or the transport under emulated links)."""
    compute_cv: float = 0.0
    """Coefficient of variation of compute times."""
    link_cv: float = 0.0
    """Coefficient of variation of transfer times."""
    compute_noise: tuple[float, ...] = ()
    """Measured quantiles (evenly spaced, 0 to 1) of compute time / its median; when given, compute noise is
    drawn from them instead of a lognormal of ``compute_cv`` (heavy tails stay heavy)."""
    link_noise: tuple[float, ...] = ()
    """The same for transfer times."""
    start_skew_ms: tuple[float, ...] = (0.0,)
    """Measured starts of ranks after an iteration's first one, ms: each rank draws from these."""
    gap_ms: float = 0.05
    """From an iteration's last end to the next one's first start (the barrier)."""
    strategy_ms: Mapping[str, float] = field(default_factory=dict)
    """Per strategy kind (ulysses, hybrid, double-ring): the fixed host time of one of its events beyond the ring's
    (an all-to-all's copies; a double-ring rotation's outer merge), fitted on a run's cases of that strategy
    (calibration/strategy_fit.py); absent: none."""
    kernel: object = None
    """A hardware.KernelRates: blocks cost what that attention kernel takes for their shape (a catalogue PRIOR);
    None: ``call_ms`` plus computed FLOPs at ``gflops`` x ``efficiency``."""
    merge_ms_per_melem: float = 0.0
    """The online-softmax merge of one block's partial result into the accumulator: ms per million output elements
    (rows x heads x head dim x batch) it merges."""
    transpose_ms_per_mib: float = 0.0
    """An all-to-all's layout copies (before and after the exchange): ms per MiB of the tensors it exchanges."""
    overlap_penalty: float = 0.0
    """Double buffers: a transfer beside a kernel slows it by this share of the transfer's time (NCCL's SMs and
    memory traffic); 0: perfect overlap."""
    host_floor_ms: Mapping[str, float] = field(default_factory=dict)
    """An implementation family's host time (simulate/host_floor.py): ``call`` per attention call, ``step`` per ring
    step, ``alltoall`` per all-to-all or collective, ms; a phase takes at least their sum. Empty: no floor."""
    source: str = "defaults"
    """Where the costs come from: ``defaults``, a catalogue GPU (``prior:<gpu>``) or the calibrating run."""

    def __post_init__(self) -> None:
        _finite("gflops", self.gflops, positive=True)
        for name in (
            "compute_cv",
            "link_cv",
            "gap_ms",
            "merge_ms_per_melem",
            "transpose_ms_per_mib",
            "overlap_penalty",
        ):
            _finite(name, getattr(self, name))
        for name in ("compute_noise", "link_noise"):
            for value in getattr(self, name):
                _finite(name, value)
        for name, value in self.host_floor_ms.items():
            _finite(f"host_floor_ms.{name}", value)
        for phase in PHASES:
            _finite(f"call_ms.{phase}", self.call_ms.get(phase, 0.0))
            for kind in KINDS:
                _finite(f"efficiency.{phase}.{kind}", self.efficiency[phase][kind], positive=True)
        if "local" not in self.links:
            raise bad_value("links", sorted(self.links), "a mapping with at least the 'local' class")
        if not self.start_skew_ms:
            raise bad_value("start_skew_ms", self.start_skew_ms, "at least one value (0.0: no skew)")

    def ms_per_gflop(self, phase: str, kind: str, gflops: float | None = None) -> float:
        """Time of one computed GFLOP of ``kind`` in ``phase``; ``gflops`` replaces the nominal rate."""
        return self.efficiency[phase][kind] * 1e3 / (gflops or self.gflops)

    def host(self, phase: str, buffer: str) -> dict[str, float]:
        values = self.host_ms.get(phase, {}).get(buffer) or next(iter(self.host_ms.get(phase, {}).values()), {})
        return {name: float(values.get(name, 0.0)) for name in HOST_STEPS}

    def link(self, kind: str) -> LinkCost | None:
        return self.links.get(kind)

    def with_rate(self, gflops: float | None = None, link_gbps: float | None = None) -> Costs:
        """The same costs at another nominal compute rate and/or local link bandwidth."""
        costs = self
        if gflops is not None:
            costs = replace(costs, gflops=_finite("compute rate", gflops, positive=True))
        if link_gbps is not None:
            local = costs.links["local"]
            links = dict(costs.links)
            links["local"] = LinkCost(latency_us=local.latency_us, bandwidth_gbps=link_gbps)
            costs = replace(costs, links=links)
        return costs

    def to_dict(self) -> dict:
        """JSON-ready (what meta.json keeps under ``simulation.costs``)."""
        return {
            "gflops": self.gflops,
            "efficiency": {phase: dict(kinds) for phase, kinds in self.efficiency.items()},
            "call_ms": dict(self.call_ms),
            "host_ms": {p: {b: dict(v) for b, v in bufs.items()} for p, bufs in self.host_ms.items()},
            "links": {
                name: {"latency_us": c.latency_us, "bandwidth_gbps": c.bandwidth_gbps} for name, c in self.links.items()
            },
            "compute_cv": self.compute_cv,
            "link_cv": self.link_cv,
            "compute_noise": list(self.compute_noise),
            "link_noise": list(self.link_noise),
            "start_skew_ms": list(self.start_skew_ms),
            "gap_ms": self.gap_ms,
            "strategy_ms": dict(self.strategy_ms),
            "kernel": None
            if self.kernel is None
            else {"gpu": self.kernel.gpu, "attention": self.kernel.kernel, "dtype": self.kernel.dtype},
            "merge_ms_per_melem": self.merge_ms_per_melem,
            "transpose_ms_per_mib": self.transpose_ms_per_mib,
            "overlap_penalty": self.overlap_penalty,
            "host_floor_ms": dict(self.host_floor_ms),
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, document: Mapping) -> Costs:
        """Inverse of ``to_dict`` (a stored calibration)."""
        if not isinstance(document, Mapping):
            raise bad_value("costs", type(document).__name__, "a mapping (a stored calibration)")
        data = dict(document)
        links_doc = data.pop("links", {})
        skew = tuple(data.pop("start_skew_ms", (0.0,))) or (0.0,)
        for name in ("compute_noise", "link_noise"):
            data[name] = tuple(float(v) for v in data.get(name, ()))
        kernel = data.pop("kernel", None)
        if kernel:
            from ringbench.hardware import find_gpu

            data["kernel"] = find_gpu(str(kernel["gpu"]), "costs.kernel.gpu").kernel_rates(
                str(kernel["dtype"]), str(kernel["attention"])
            )
        try:
            links = {name: LinkCost(**value) for name, value in dict(links_doc).items()}
            return cls(**data, links=links or dict(DEFAULT_LINKS), start_skew_ms=skew)
        except TypeError as exc:
            raise bad_value("costs", str(exc), "the fields of a stored calibration") from None


DEFAULTS = Costs()
