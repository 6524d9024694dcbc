"""One simulated case: its axes and faults, the cluster it runs on, and the engine's input built from them.

``SimCase`` names a point of a sweep exactly as ``ringbench run`` does (world, seq, heads, head dim, batch,
dtype, mask, layout, buffer, order, backward) plus the injected faults in their canonical specs
(ringbench/rank/faults.py). ``Cluster`` says where the ranks live: a topology (link classes, hosts, NIC sharing)
and whether its links are real or emulated (a run with ``--emulate-links`` moves blocks over the local
transport and then holds them for the topology's cost: the simulator does the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ringbench.engine.layout import check_divisible
from ringbench.errors import UsageError, bad_value
from ringbench.kernels.base import block_flops
from ringbench.orders import format_ring, parse_order
from ringbench.rank.faults import Fault, check_fault_hops, check_faults, parse_fault
from ringbench.rank.scenario import Case
from ringbench.simulate.costs import Costs
from ringbench.simulate.engine import Lane, Noise, PhaseModel
from ringbench.simulate.plans import PairClasses, pair_classes
from ringbench.topology.linkmodel import ring_links
from ringbench.vocab import DTYPES, Buffer, Layout, Mask

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
SIMULATED_KERNEL = "simulated"
SIMULATED_FAULTS = ("slow-rank", "slow-host", "slow-link", "jitter")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise bad_value(name, value, "an integer >= 1")
    return int(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class SimCase:
    """One simulated case: the axes of ``ringbench run`` plus faults and the simulation's own settings."""

    world: int = 8
    """Ranks N."""
    seq: int = 8192
    """Total sequence length S."""
    heads: int = 8
    head_dim: int = 128
    batch: int = 1
    dtype: str = "bfloat16"
    mask: str = "causal"
    """none | causal | causal-naive."""
    layout: str = "zigzag"
    """contiguous | zigzag | striped."""
    buffer: str = "double"
    """sync | double | allgather."""
    order: str = "identity"
    """A ring order spec: identity, reverse, stride:K, random:SEED or 0-3-1-2."""
    backward: bool = True
    iterations: int = 1
    """Timed iterations."""
    faults: tuple[str, ...] = ()
    """Canonical fault specs: slow-rank:R:F, slow-host:H:F, slow-link:S:D:MS, jitter:MS."""
    gflops: float | None = None
    """Nominal compute rate for this case (e.g. the rate an emulated run chose); None: the costs' rate."""
    kernel: str = ""
    """The measured kernel this case predicts (``--like``: ``torch``, ``emulated:1``), which picks the compute
    model (real or emulated) of a calibration; empty: the costs' own compute model."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("world", "seq", "heads", "head_dim", "batch", "iterations"):
            _positive_int(name, getattr(self, name))
        if self.dtype not in DTYPES:
            raise bad_value("dtype", self.dtype, "one of: " + ", ".join(DTYPES))
        Mask.parse(self.mask, "mask")
        Layout.parse(self.layout, "layout")
        Buffer.parse(self.buffer, "buffer")
        check_divisible(self.layout, self.seq, self.world)
        if self.gflops is not None and not (math.isfinite(self.gflops) and self.gflops > 0):
            raise bad_value("gflops", self.gflops, "a finite rate > 0 (GFLOP/s)")
        if not isinstance(self.kernel, str):
            raise bad_value("kernel", self.kernel, "a kernel name (torch, emulated:1, ...) or empty")
        faults = [parse_fault(spec) for spec in self.faults]
        check_faults(faults, self.world)
        for fault in faults:
            if fault.kind not in SIMULATED_FAULTS:
                raise bad_value("fault", fault.spec, "one of " + ", ".join(SIMULATED_FAULTS) + " (simulated kinds)")
        check_fault_hops(faults, self.ring, self.order, buffer=self.buffer)

    @property
    def family(self) -> str | None:
        """The compute model this case predicts: ``emulated``, ``real``, or None (the costs' own)."""
        if self.gflops is not None:
            return "emulated"
        if self.kernel:
            from ringbench.kernels import get_kernel

            try:
                return "emulated" if get_kernel(self.kernel).emulated else "real"
            except UsageError:  # not one of ringbench's kernels (an imported program's): real arithmetic
                return "real"
        return None

    @property
    def ring(self) -> list[int]:
        return parse_order(self.order, self.world)

    @property
    def case_id(self) -> str:
        """The id ``ringbench run`` gives the same axes, with kernel ``simulated``."""
        return self.axes_case().case_id

    def axes_case(self) -> Case:
        return Case(world=self.world, seq=self.seq, heads=self.heads, head_dim=self.head_dim, batch=self.batch,
                    dtype=self.dtype, mask=self.mask, layout=self.layout, buffer=self.buffer, order=self.order,
                    kernel=SIMULATED_KERNEL, backward=self.backward)  # fmt: skip

    def parsed_faults(self) -> list[Fault]:
        return [parse_fault(spec) for spec in self.faults]

    @property
    def phases(self) -> tuple[str, ...]:
        return ("fwd", "bwd") if self.backward else ("fwd",)

    def block_bytes(self, lane: str) -> int:
        """Bytes of one K/V block (``kv``) or one dK/dV accumulator (``dkv``, fp32; fp64 for fp64 inputs)."""
        local = self.seq // self.world
        size = DTYPE_BYTES[self.dtype] if lane == "kv" else (8 if self.dtype == "float64" else 4)
        return 2 * self.batch * self.heads * local * self.head_dim * size

    def classes(self) -> PairClasses:
        return pair_classes(self.mask, self.layout, self.seq, self.world)


@dataclass(frozen=True, kw_only=True, slots=True)
class Cluster:
    """Where the ranks run: hosts and link classes (a topology), or a uniform ring of ``local`` links."""

    topology: object = None
    """A ringbench.topology.Topology with one device per rank, or None."""
    emulate_links: bool = False
    """The topology's links are emulated (local transport, then a delay of the topology's cost), as in
    ``ringbench run --topology FILE --emulate-links``."""
    gpus_per_host: int = 8
    """Without a topology: ranks per host, in rank order (what ``slow-host`` counts)."""
    cpu_cores: int | None = None
    """CPU cores the ranks share in all (a CPU run on one machine, what ``--like`` of such a run predicts): real
    compute then stretches by ranks / cores where ranks outnumber cores (they take turns); None: a device per rank."""

    def core_share(self, world: int) -> float:
        """How many ranks share one core while they compute (1.0 with a device per rank)."""
        return max(1.0, world / self.cpu_cores) if self.cpu_cores else 1.0

    def hosts(self, world: int) -> np.ndarray:
        """(N,) host index of each rank (hosts in order of first appearance)."""
        if self.topology is None:
            return np.arange(world) // self.gpus_per_host
        names = [device.host for device in self.topology.devices]
        order = {name: index for index, name in enumerate(dict.fromkeys(names))}
        return np.array([order[name] for name in names])

    def check(self, case: SimCase) -> None:
        if self.topology is not None and self.topology.world != case.world:
            raise bad_value("world", case.world, f"{self.topology.world}, the number of devices in the topology")
        if self.emulate_links and self.topology is None:
            raise UsageError("emulate_links=True is not allowed without a topology; pass --topology FILE")
        host_of = self.hosts(case.world)
        hosts = int(host_of.max()) + 1
        faults = case.parsed_faults()
        for fault in faults:
            if fault.kind == "slow-host" and fault.host >= hosts:
                raise bad_value("fault", fault.spec, f"a host in 0..{hosts - 1} ({hosts} hosts)")
        for fault in faults:  # a slow rank on a slow host: two factors on one rank, refused like two slow-ranks
            for other in faults:
                if fault.kind == "slow-rank" and other.kind == "slow-host" and host_of[fault.rank] == other.host:
                    raise UsageError(
                        f"fault={fault.spec!r} is not allowed together with {other.spec!r}: both slow rank "
                        f"{fault.rank} (on host {other.host}); give slow-rank faults for that host's ranks instead "
                        f"(slow-rank:{fault.rank}:{fault.factor * other.factor:g} for both factors)"
                    )


def _lanes(case: SimCase, costs: Costs, cluster: Cluster, ring: np.ndarray) -> dict[str, Lane]:
    """Per exchange kind: transfer and injected delay into each ring position (the hop from p - 1)."""
    world = case.world
    src, dst = np.roll(ring, 1), ring  # the hop into position p
    faults = case.parsed_faults()
    jitter = sum(f.ms for f in faults if f.kind == "jitter")
    slow_links = {(f.src, f.dst): f.ms for f in faults if f.kind == "slow-link"}
    names = ("kv", "dkv") if case.backward else ("kv",)
    local = costs.links["local"]
    links = None
    if cluster.topology is not None and world > 1:
        # Real links: the calibrated cost of a class where the calibration measured it, else the topology's own;
        # emulated links: the topology's cost as a delay after the local transfer (what RankFaults injects).
        calibrated = None if cluster.emulate_links else {
            name: (cost.latency_us, cost.bandwidth_gbps) for name, cost in costs.links.items() if name != "local"
        }  # fmt: skip
        links = ring_links(cluster.topology, ring, calibrated)
    lanes = {}
    for name in names:
        nbytes = case.block_bytes(name)
        transfer = np.full(world, local.ms(nbytes))
        delay = np.zeros(world)
        if links is not None:
            cost_ms = links.into(links.transfer_us(nbytes)) / 1e3
            if cluster.emulate_links:
                delay += cost_ms
            else:
                transfer = cost_ms
        for (a, b), ms in slow_links.items():
            delay[(src == a) & (dst == b)] += ms
        lanes[name] = Lane(name=name, nbytes=nbytes, transfer_ms=transfer,
                           delay_ms=delay if delay.any() else None, jitter_ms=jitter)  # fmt: skip
    return lanes


def _slowdown(case: SimCase, cluster: Cluster, ring: np.ndarray) -> np.ndarray | None:
    factor = np.ones(case.world)
    hosts = cluster.hosts(case.world)
    for fault in case.parsed_faults():
        if fault.kind == "slow-rank":
            factor[ring == fault.rank] *= fault.factor
        elif fault.kind == "slow-host":
            factor[hosts[ring] == fault.host] *= fault.factor
    return factor if (factor != 1.0).any() else None


def class_compute(case: SimCase, costs: Costs, phase: str) -> tuple[np.ndarray, np.ndarray]:
    """(compute ms, work ms) per pair class: call overheads plus each block's computed FLOPs at its kind's rate."""
    backward = phase == "bwd"
    total, work = np.zeros(3), np.zeros(3)
    for index, pair in enumerate(case.classes().classes):
        for block in pair.blocks:
            gflop = block_flops(case.batch, case.heads, 1, 1, case.head_dim, 1.0, backward) * block.work_pairs / 1e9
            ms = gflop * costs.ms_per_gflop(phase, block.kind, case.gflops)
            work[index] += ms
            total[index] += ms + costs.call_ms.get(phase, 0.0)
    return total, work


def class_flops(case: SimCase, phase: str) -> np.ndarray:
    """(3,) useful FLOPs per pair class (the record's ``flops`` column)."""
    backward = phase == "bwd"
    return np.array([c.flops(case.batch, case.heads, case.head_dim, backward, visible=True)
                     for c in case.classes().classes])  # fmt: skip


def phase_models(case: SimCase, costs: Costs, cluster: Cluster, rng: np.random.Generator) -> dict[str, PhaseModel]:
    """The engine's input for every phase of ``case``."""
    cluster.check(case)
    ring = np.asarray(case.ring)
    lanes = _lanes(case, costs, cluster, ring)
    jitter = max(lane.jitter_ms for lane in lanes.values())
    noise = Noise.build(
        rng,
        case.iterations * case.world,
        case.world + 1,
        costs.compute_cv,
        costs.link_cv,
        jitter,
        {"compute": costs.compute_noise, "link": costs.link_noise},
    )
    slow = _slowdown(case, cluster, ring)
    share = cluster.core_share(case.world) if case.family == "real" else 1.0  # emulated compute sleeps: no contention
    models = {}
    for phase in case.phases:
        compute, work = class_compute(case, costs, phase)
        compute, work = compute * share, work * share
        host = costs.host(phase, "sync" if case.buffer == "sync" else "double")
        models[phase] = PhaseModel(
            phase=phase, buffer=case.buffer, ring=ring, compute_ms=compute, work_ms=work, slow=slow,
            lanes={name: lanes[name] for name in (("kv", "dkv") if phase == "bwd" else ("kv",))},
            enter_ms=host["enter_ms"], pre_ms=host["pre_ms"], mid_ms=host["mid_ms"], post_ms=host["post_ms"],
            noise=noise,
        )  # fmt: skip
    return models


def start_skew(case: SimCase, costs: Costs, rng: np.random.Generator) -> np.ndarray:
    """(G, N) each rank's start of each iteration after the first rank's (drawn from the measured spread)."""
    values = np.asarray(costs.start_skew_ms, dtype=float)
    skew = (
        rng.choice(values, size=(case.iterations, case.world))
        if values.any()
        else np.zeros((case.iterations, case.world))
    )
    return skew - skew.min(axis=1, keepdims=True)


__all__ = [
    "SIMULATED_KERNEL",
    "Cluster",
    "SimCase",
    "class_compute",
    "class_flops",
    "format_ring",
    "phase_models",
    "start_skew",
]  # fmt: skip
