"""One simulated case: its axes and faults, the cluster it runs on, and the engine's input built from them.

``SimCase`` wraps the workload a case of ``ringbench run`` computes (ringbench/scenario/workload.py), with the
backward switch and the injected faults in their canonical specs (ringbench/scenario/faults.py). ``Cluster`` says where the ranks live: a topology (link classes, hosts, NIC sharing)
and whether its links are real or emulated (a run with ``--emulate-links`` moves blocks over the local
transport and then holds them for the topology's cost: the simulator does the same).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ringbench.engine.layout import check_divisible
from ringbench.errors import UsageError, bad_value
from ringbench.kernels.base import block_flops
from ringbench.orders import format_ring
from ringbench.scenario.faults import Fault, check_fault_hops, check_faults, parse_fault
from ringbench.scenario.scenario import Case
from ringbench.scenario.workload import WORKLOAD_FIELDS, Workload, reads_workload
from ringbench.simulate.costs import Costs
from ringbench.simulate.pair_classes import pair_classes
from ringbench.simulate.phase_ring import Lane, Noise, PhaseModel
from ringbench.topology.linkmodel import ring_links
from ringbench.vocab import Buffer, MaskSpec

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
SIMULATED_KERNEL = "simulated"
SIMULATED_FAULTS = ("slow-rank", "slow-host", "slow-link", "jitter")
MAX_PAIR_TABLE = 16384  # ranks: document and window masks, and the short ring, keep a table of every rank pair


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise bad_value(name, value, "an integer >= 1")
    return int(value)


@reads_workload
@dataclass(frozen=True, kw_only=True, slots=True)
class SimCase:
    """One simulated case: a workload (it reads the workload's axes as its own) with faults and the simulation's
    own settings."""

    workload: Workload
    """The computation (ringbench.scenario.workload); one layer (the plan prices a model's layers one by one)."""
    backward: bool = True
    iterations: int = 1
    """Timed iterations."""
    faults: tuple[str, ...] = ()
    """Canonical fault specs: slow-rank:R:F, slow-host:H:F, slow-link:S:D:MS, jitter:MS."""
    gflops: float | None = None
    """Nominal compute rate for this case (e.g. the rate an emulated run chose); None: the costs' rate."""
    floor_ms: float = 0.0
    """The least time a kernel call takes (the floor an emulated:auto run gave its smallest calls); 0: none."""
    kernel: str = ""
    """The measured kernel this case predicts (``--like``: ``torch``, ``emulated:1``), which picks the compute
    model (real or emulated) of a calibration; empty: the costs' own compute model."""
    seed: int = 0

    def __post_init__(self) -> None:
        workload = self.workload.checked()
        check_divisible(workload.layout, workload.seq, workload.world)
        object.__setattr__(self, "workload", workload)
        if workload.layers != "1":
            raise bad_value("layers", workload.layers, "1 (a simulated case is one layer; the plan prices a model's "
                            "layers one by one)")  # fmt: skip
        _positive_int("iterations", self.iterations)
        spec = MaskSpec.parse(self.mask)
        if (not spec.legacy or Buffer.parse(self.buffer).short) and self.world > MAX_PAIR_TABLE:
            raise bad_value("world", self.world, f"at most {MAX_PAIR_TABLE:,} ranks for mask {self.mask!r} with buffer "
                            f"{self.buffer!r}: their plan is a table of every rank pair (the masks none, causal, "
                            "causal-naive on a full ring simulate at any size)")  # fmt: skip
        from ringbench.engine.layout import resolve_layout
        from ringbench.engine.masks import mask_rule

        resolve_layout(self.layout, self.seq, self.world, mask_rule(self.mask, self.docs, self.seq))
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

    def replace(self, **changes) -> SimCase:
        """This case with some axes (the workload's or its own) changed."""
        axes = {name: changes.pop(name) for name in WORKLOAD_FIELDS if name in changes}
        return dataclasses.replace(self, workload=self.workload.replace(**axes), **changes)

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
    def case(self) -> Case:
        """The measured case of the same axes, with kernel ``simulated`` (its record row and its id)."""
        return Case(workload=self.workload, kernel=SIMULATED_KERNEL, backward=self.backward)

    @property
    def case_id(self) -> str:
        """The id ``ringbench run`` gives the same axes, with kernel ``simulated``."""
        return self.case.case_id

    def parsed_faults(self) -> list[Fault]:
        return [parse_fault(spec) for spec in self.faults]

    @property
    def phases(self) -> tuple[str, ...]:
        return ("fwd", "bwd") if self.backward else ("fwd",)

    def block_bytes(self, lane: str) -> int:
        """Bytes of one K/V block (``kv``) or one dK/dV accumulator (``dkv``, fp32; fp64 for fp64 inputs)."""
        local = self.seq // self.world
        size = DTYPE_BYTES[self.dtype] if lane == "kv" else (8 if self.dtype == "float64" else 4)
        return 2 * self.batch * self.key_value_heads * local * self.head_dim * size

    @property
    def legacy_mask(self) -> bool:
        """none, causal or causal-naive: three pair classes by the sign of k - q (plans.py)."""
        return MaskSpec.parse(self.mask).legacy

    def classes(self):
        """The pair classes: PairClasses (three, legacy masks) or a PairTable (documents, windows)."""
        if self.legacy_mask:
            return pair_classes(self.mask, self.layout, self.seq, self.world)
        from ringbench.simulate.pair_table import pair_table

        return pair_table(self.mask, self.layout, self.seq, self.world, self.docs)

    def route(self):
        """The short ring's route (sync-short / double-short), or None for the full ring."""
        if not Buffer.parse(self.buffer).short:
            return None
        from ringbench.engine.short_ring import route_of

        return route_of(self.visibility(), self.ring)

    def visibility(self) -> np.ndarray:
        """(N, N) visible score entries per (query rank, key rank)."""
        classes = self.classes()
        if hasattr(classes, "visible"):
            return classes.visible()
        q, k = np.meshgrid(np.arange(self.world), np.arange(self.world), indexing="ij")
        index = classes.classify(q, k)
        entries = np.array([sum(b.visible_pairs for b in c.blocks) for c in classes.classes])
        return entries[index]

    def per_rank(self, values: np.ndarray) -> np.ndarray:
        """(N,) the sum over key ranks of a per-class figure (``values`` (K,)) for every query rank, without an
        (N, N) table for the three sign classes."""
        classes = self.classes()
        matrix = getattr(classes, "matrix", None)
        values = np.asarray(values, dtype=float)
        if matrix is not None:
            return values[matrix].sum(axis=1)
        ranks = np.arange(self.world, dtype=float)  # rank q: q keys below, itself, N - 1 - q above
        return ranks * values[0] + values[1] + (self.world - 1 - ranks) * values[2]


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


def _lanes(case: SimCase, costs: Costs, cluster: Cluster, ring: np.ndarray, direction: int = 1,
           names: tuple[str, ...] | None = None) -> dict[str, Lane]:  # fmt: skip
    """Per exchange kind: transfer and injected delay into each ring position (from p - direction)."""
    world = case.world
    src, dst = np.roll(ring, direction), ring  # the hop into position p
    faults = case.parsed_faults()
    jitter = sum(f.ms for f in faults if f.kind == "jitter")
    slow_links = {(f.src, f.dst): f.ms for f in faults if f.kind == "slow-link"}
    names = names or (("kv", "dkv") if case.backward else ("kv",))
    lanes = {}
    local = costs.links["local"]
    links = None
    if cluster.topology is not None and world > 1:
        # Real links: the calibrated cost of a class where the calibration measured it, else the topology's own;
        # emulated links: the topology's cost as a delay after the local transfer (what RankFaults injects).
        calibrated = None if cluster.emulate_links else {
            name: (cost.latency_us, cost.bandwidth_gbps) for name, cost in costs.links.items() if name != "local"
        }  # fmt: skip
        # the hops the exchange takes: p - 1 -> p, or p + 1 -> p for the short ring's backward (direction -1)
        links = ring_links(cluster.topology, ring if direction == 1 else ring[::-1], calibrated,
                           collective=case.buffer == "allgather")  # fmt: skip
    for name in names:
        nbytes = case.block_bytes(name)
        transfer = np.full(world, local.ms(nbytes))
        delay = np.zeros(world)
        if links is not None:
            cost_ms = links.into(links.transfer_us(nbytes)) / 1e3
            cost_ms = cost_ms if direction == 1 else cost_ms[::-1]  # back to the ring's positions
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
    classes = case.classes().classes
    total, work = np.zeros(len(classes)), np.zeros(len(classes))
    if costs.kernel is not None and case.gflops is None:
        for index, pair in enumerate(classes):
            for block in pair.blocks:
                total[index] += block_ms(case, costs, phase, block)
                work[index] += block_ms(case, costs, phase, block, arithmetic=True)
        return total, work
    for index, pair in enumerate(classes):
        for block in pair.blocks:
            gflop = block_flops(case.batch, case.heads, 1, 1, case.head_dim, 1.0, backward) * block.work_pairs / 1e9
            ms = max(gflop * costs.ms_per_gflop(phase, block.kind, case.gflops), case.floor_ms)
            work[index] += ms
            total[index] += ms + costs.call_ms.get(phase, 0.0)
    return total, work


def block_ms(case: SimCase, costs: Costs, phase: str, block, *, arithmetic: bool = False, heads: float | None = None,
             q_len: float | None = None, k_len: float | None = None) -> float:  # fmt: skip
    """One kernel call of the mask plan on the catalogue's attention kernel (``costs.kernel``), with its merge into
    the accumulator; ``arithmetic``: only the kernel's arithmetic (what a slower rank stretches). ``heads``,
    ``q_len``, ``k_len`` replace the block's (a Ulysses group's call on its heads and rows)."""
    heads = case.heads if heads is None else heads
    q = block.q_len if q_len is None else q_len
    k = block.k_len if k_len is None else k_len
    if not q or not k:  # a block without its shape (an old plan): square of its computed entries
        q = k = math.sqrt(max(block.work_pairs, 1.0))
    kind = "full" if block.kind == "full" else "causal"
    visible = None if kind == "full" else block.visible_pairs
    rates = costs.kernel
    if arithmetic:
        return rates.arithmetic_ms(phase, kind, q, k, case.batch * heads, case.head_dim, visible)
    merge = costs.merge_ms_per_melem * case.batch * heads * q * case.head_dim / 1e6
    return rates.call_ms(phase, kind, q, k, case.batch * heads, case.head_dim, visible) + merge


def gathered_compute(case: SimCase, costs: Costs, phase: str) -> np.ndarray:
    """(N,) per rank: its attention over the gathered K, V as one call of the catalogue's kernel (its queries
    against every key it sees), with one merge; the all-gather baseline as TransformerEngine runs it."""
    classes = case.classes()
    visible = case.per_rank(np.array([sum(b.visible_pairs for b in c.blocks) for c in classes.classes]))
    local = case.seq // case.world
    # full: every query sees every key (a document mask's blocks are full sub-blocks, yet most pairs are unseen)
    full = all(b.kind == "full" for c in classes.classes for b in c.blocks) and bool(
        np.all(visible >= local * case.seq)
    )
    heads = case.batch * case.heads
    merge = costs.merge_ms_per_melem * heads * local * case.head_dim / 1e6
    return np.array([costs.kernel.call_ms(phase, "full" if full else "causal", local, case.seq, heads,
                                          case.head_dim, None if full else float(v)) + merge for v in visible])  # fmt: skip


def class_flops(case: SimCase, phase: str) -> np.ndarray:
    """(K,) useful FLOPs per pair class (the record's ``flops`` column)."""
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
    buffer = Buffer.parse(case.buffer)
    classes = case.classes()
    pairs = getattr(classes, "matrix", None)
    route = case.route()
    models = {}
    for phase in case.phases:
        compute, work = class_compute(case, costs, phase)
        compute, work = compute * share, work * share
        base = "sync" if buffer.sync else "double"
        host = costs.host(phase, base)
        extra = {}
        phase_lanes = {name: lanes[name] for name in (("kv", "dkv") if phase == "bwd" else ("kv",))}
        if route is not None:
            extra = _short_phase(case, costs, cluster, ring, route, phase, base)
            phase_lanes = extra.pop("lanes", phase_lanes)
        if buffer.value == "allgather" and costs.kernel is not None and case.gflops is None:
            extra["gathered_ms"] = gathered_compute(case, costs, phase)[ring] * share
        models[phase] = PhaseModel(
            phase=phase, buffer=base, ring=ring, compute_ms=compute, work_ms=work, slow=slow, lanes=phase_lanes,
            enter_ms=host["enter_ms"], pre_ms=host["pre_ms"], mid_ms=host["mid_ms"], post_ms=host["post_ms"],
            noise=noise, pairs=pairs, overlap_penalty=costs.overlap_penalty, **extra,
        )  # fmt: skip
    return models


def _short_phase(case: SimCase, costs: Costs, cluster: Cluster, ring: np.ndarray, route, phase: str,
                 base: str) -> dict:  # fmt: skip
    """The short ring (ringbench/engine/short_ring.py) as the engine's input: D + 1 steps, one-way exchanges, and
    a backward that moves only dK/dV, to the predecessor, handling the block D - s behind at step s."""
    world, depth = case.world, route.depth
    positions = np.arange(world)
    travel = np.asarray(route.travel)
    extra: dict = {"steps": depth + 1}
    if phase == "fwd":
        # The exchange labelled s brings step s's block (sync) or step s + 1's (double): into p iff t_{p-k} >= k.
        labels = []
        for label in range(depth + 1):
            k = label if base == "sync" else label + 1
            labels.append(travel[(positions - k) % world] >= k if k >= 1 else np.zeros(world, bool))
        extra["receiving"] = {"kv": np.array(labels)}
        return extra
    # Backward: after step s the successor sends the accumulator of the block D - s - 1 behind p: iff
    # t_{p - (D - s) + 1} >= D - s.
    labels = []
    for label in range(depth + 1):
        distance = depth - label
        labels.append(travel[(positions - distance + 1) % world] >= distance if distance >= 1 else
                      np.zeros(world, bool))  # fmt: skip
    extra.update(reverse_blocks=True, direction=-1, receiving={"dkv": np.array(labels)}, dkv_posts=depth,
                 lanes=_lanes(case, costs, cluster, ring, direction=-1, names=("dkv",)))  # fmt: skip
    return extra


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
