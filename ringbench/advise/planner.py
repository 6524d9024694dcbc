"""``ringbench plan``: which strategy, degrees, placement and ring orders to use for a workload on a topology.

    plan = make_plan(PlanRequest(workload=Workload(world=64, seq=1 << 20, heads=32), topology=Path("cluster.yaml")))
    plan.candidates[0]         # the first choice: strategy, placement, rings, predicted step / exposed / memory
    plan.lines()               # the table, one line per loser saying why, the command, the confidence line

Every candidate the degrees allow is simulated (PREDICTED, never measured): the ring on recommend's order, the
all-gather baseline, Ulysses, hybrid:U and double-ring:W for every U, W dividing N (and the heads, KV heads),
each grouped one on the topology's placements (advise/placements.py: groups inside hosts, or interleaved), with
recommend's optimizer for every ring inside it; for a window or document mask also the short ring (``double-short``,
when it stops before the full ring) and, for document masks, the doc-balanced layout. Each layer of the model
(``layers``) is priced with its own mask (advise/planner_predict.py).

Costs: a GPU of the hardware catalogue (``gpu``, or what NVML finds) gives the PRIOR of every cost and prices the
topology's links as NCCL moves data (simulate/priors.py); a calibration run (``--from``) replaces the priors it
measured; with neither, the documented defaults. Links: the topology's (a file's own class costs and measured
links win), emulated when the topology is a run that emulated them. Candidates are ranked by predicted step time;
one over ``memory_per_rank_gb`` is refused.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ringbench.errors import UsageError, bad_value
from ringbench.fmt import number, ring_text
from ringbench.scenario.workload import Workload, reads_workload
from ringbench.vocab import Strategy

TOP = 3


@reads_workload
@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    """A workload and where it runs (it reads the workload's axes as its own)."""

    workload: Workload
    """The computation to plan: its shape, mask, documents, layers and layout (the plan chooses the strategy,
    placement, buffer and order: the workload's own are not read)."""
    topology: Path
    """A topology file (nvidia-smi text or YAML) or a results run directory that recorded one (or a Topology)."""
    memory_per_rank_gb: float | None = None
    """Refuse candidates whose predicted attention memory per rank exceeds this (GB = 2**30 bytes)."""
    calibrate_from: Path | tuple[Path, ...] | None = None
    """Measured runs whose costs to use (several: calibrated as one record, calibration/strategy_fit.merge_runs)."""
    emulate_links: bool | None = None
    """Price links as a run with --emulate-links injects them; None: as the topology's run did (False for a file)."""
    backward: bool = True
    top: int = TOP
    """Candidates the measuring command runs."""
    gpu: str | None = None
    """The GPU of the hardware catalogue (key, alias or NVML name); None: what NVML finds here (``detect``), else
    the documented defaults."""
    attention: str | None = None
    """The attention kernel family of the catalogue (fa2, fa3, cudnn); None: the GPU's default."""
    detect: bool = True
    """Ask NVML which GPUs this machine has (fills ``gpu``; a ``gpu`` that contradicts them is refused)."""
    strategies: tuple[str, ...] = ()
    """Only these strategies (``ring``, ``ulysses``, ``hybrid:2``, ...); empty: every one the degrees allow."""
    framework: str | None = None
    """The implementation family that runs the plan (the catalogue's ``frameworks``: ringbench, ring-flash-attn,
    usp, te): its host time per ring step and per all-to-all are PRIORS; None: ringbench's engine."""
    settings_for: int = 1
    """The candidate (1-based rank) whose framework settings and launcher mapping the plan gives."""

    def __post_init__(self) -> None:
        self.workload.check_sizes()
        for name in ("top", "settings_for"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_value(name, value, "an integer >= 1")
        if self.framework is not None:
            from ringbench.hardware import find_framework

            object.__setattr__(self, "framework", find_framework(self.framework).key)
        from ringbench.vocab import Strategy

        object.__setattr__(self, "strategies", tuple(Strategy.parse(s, "strategy").spec for s in self.strategies))
        if self.memory_per_rank_gb is not None and not (
            isinstance(self.memory_per_rank_gb, (int, float)) and math.isfinite(self.memory_per_rank_gb)
            and self.memory_per_rank_gb > 0
        ):  # fmt: skip
            raise bad_value("memory_per_rank_gb", self.memory_per_rank_gb, "a number of GB > 0")


@dataclass(kw_only=True)
class Candidate:
    strategy: str
    placement_name: str = ""
    placement: list[int] | None = None
    order: list[int] | None = None
    layout: str = "zigzag"
    buffer: str = "double"
    step_ms: float = math.nan
    fwd_ms: float = math.nan
    bwd_ms: float = math.nan
    exposed_ms: float = math.nan
    memory_mb: float = math.nan
    net_mb: float = 0.0
    """Bytes per iteration and rank that cross hosts (the NET class), MiB (predicted)."""
    mib_by_class: dict[str, float] = field(default_factory=dict)
    """Link class -> MiB per iteration and rank over links of that class: the bytes its transfers were priced for."""
    rings: list[dict] = field(default_factory=list)
    kv_repeat: int = 1
    """A Ulysses degree above the KV heads: each KV head is held and moved this many times (priced)."""
    frameworks: dict = field(default_factory=dict)
    """Per framework (megatron, usp, torchtitan): the settings that run it, or why it cannot (advise/settings.py)."""
    refused: str = ""
    why: str = ""

    @property
    def label(self) -> str:
        extra = [f"@{self.placement_name}"] if self.placement_name else []
        extra += [f"[{self.buffer}]"] if self.buffer not in ("double", "sync") else []
        extra += [f"({self.layout})"] if self.layout == "doc-balanced" else []
        return " ".join([self.strategy, *extra])

    @property
    def exposed_frac(self) -> float:
        return self.exposed_ms / self.step_ms if self.step_ms and self.step_ms > 0 else math.nan

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "placement_name": self.placement_name,
                "placement": ring_text(self.placement) if self.placement else None,
                "order": ring_text(self.order) if self.order else None, "layout": self.layout, "buffer": self.buffer,
                "step_ms": self.step_ms, "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "exposed_ms": self.exposed_ms,
                "exposed_frac": self.exposed_frac, "memory_mb": self.memory_mb, "net_mb_per_rank": self.net_mb,
                "mib_per_rank_by_class": self.mib_by_class, "kv_repeat": self.kv_repeat,
                "frameworks": self.frameworks,
                "rings": self.rings, "refused": self.refused, "why": self.why}  # fmt: skip


@dataclass(kw_only=True)
class Plan:
    request: PlanRequest
    topology_text: str
    candidates: list[Candidate]
    refused: list[Candidate]
    command: str
    confidence: str
    elapsed_s: float
    notes: list[str] = field(default_factory=list)
    gpu: str | None = None
    """The catalogue GPU the priors came from (None: the documented defaults)."""
    priors: list = field(default_factory=list)
    """CostSource per PRIOR (what no run measured), each with its value and source."""
    measured: list = field(default_factory=list)
    """CostSource per cost a calibration run determined (replacing its prior)."""
    settings: dict = field(default_factory=dict)
    """The settings that run the first choice (or ``request.settings_for``) in each framework, with the launcher
    mapping; where one cannot, why, and its best expressible candidate (advise/settings.py)."""
    settings_for: int = 1
    """Which candidate (1-based rank) ``settings`` is for."""

    def to_dict(self) -> dict:
        return {"predicted": True, "topology": self.topology_text, "world": self.request.world,
                "seq": self.request.seq, "heads": self.request.heads, "kv_heads": self.request.key_value_heads, "head_dim": self.request.head_dim, "mask": self.request.mask,
                "docs": self.request.docs, "layers": self.request.layers, "gpu": self.gpu,
                "framework": self.request.framework or "ringbench",
                "candidates": [c.to_dict() for c in self.candidates], "refused": [c.to_dict() for c in self.refused],
                "command": self.command, "confidence": self.confidence, "elapsed_s": self.elapsed_s,
                "notes": self.notes, "priors": [p.to_dict() for p in self.priors],
                "measured": [m.to_dict() for m in self.measured], "settings_for": self.settings_for,
                "settings": self.settings}  # fmt: skip


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def _load(request: PlanRequest):
    from ringbench.topology import Topology, load_topology

    if isinstance(request.topology, Topology):  # built in Python (tests, sweeps over random clusters)
        path, topology = Path(request.topology.source or "topology"), request.topology
    else:
        path = Path(request.topology)
        topology = load_topology(path)
    if topology.world < request.world:
        raise UsageError(f"world={request.world} is not allowed with topology {path}: it has {topology.world} "
                         f"devices; expected a world of at most {topology.world}")  # fmt: skip
    if topology.world > request.world:
        from ringbench.advise.placements import sub_topology

        topology = sub_topology(topology, list(range(request.world)))  # the first N devices, as a launch takes them
    emulate = request.emulate_links
    if emulate is None:
        emulate = False
        if isinstance(request.topology, Path | str) and path.is_dir():
            import json

            try:
                emulate = bool(json.loads((path / "meta.json").read_text()).get("emulated_links"))
            except (OSError, ValueError):
                emulate = False
    return topology, emulate


def check_network(topology, costs, emulate: bool) -> None:
    """A plan across hosts needs the network's cost from the user: the topology's NET class cost, measured links
    between the hosts, or a calibration that measured NET (a catalogue prior of some NIC would price a network the
    user never described). Emulated links inject the topology's own figures, so they are known."""
    if emulate or len(topology.hosts) < 2 or "NET" in topology.cost_model.overrides() or "NET" in costs.links:
        return
    host = topology.host_ids()
    objects, codes = topology.link_codes()
    crossing = codes[host[:, None] != host[None, :]]
    if all(objects[code].bandwidth_gbps is not None for code in np.unique(crossing)):
        return  # every link between hosts carries its measured cost
    raise UsageError(
        f"topology: {len(topology.hosts)} hosts, but no cost for the network between them (class_costs.NET is "
        "missing); expected class_costs: {NET: {bandwidth_gbps: 400Gbps, latency_us: 5}} in the topology YAML "
        "(bandwidth per NIC, a unit such as Gbps or GB/s; nics: says which GPUs share a NIC), measured links "
        "between the hosts (ringbench probe), or a calibration run that measured NET (--from)"
    )


def resolve_gpu(request: PlanRequest, found: list[str] | None = None):
    """The catalogue GPU the plan is priced for (simulate/priors.py ``find_hardware``)."""
    from ringbench.simulate import find_hardware

    return find_hardware(request.gpu, detect=request.detect, found=found)


def _costs(request: PlanRequest, gpu, framework=None):
    """(costs, calibration, prior): the GPU's priors with what a calibration measured in their place.
    ``framework``: an implementation family (a Framework) replacing the request's (the fit of benchmarks/)."""
    from ringbench.hardware import find_framework
    from ringbench.simulate import DEFAULTS, framework_costs

    calibration = None
    if request.calibrate_from is not None:
        from ringbench.calibration import fit, merge_runs

        paths = request.calibrate_from if isinstance(request.calibrate_from, tuple) else (request.calibrate_from,)
        calibration = fit(merge_runs(paths))
    family = framework or find_framework(request.framework or "ringbench")
    if gpu is None:
        if calibration is not None:
            return calibration.costs, calibration, None
        explicit = framework is not None or request.framework is not None
        return (framework_costs(DEFAULTS, family) if explicit else DEFAULTS), None, None
    from ringbench.simulate import gpu_prior

    prior = gpu_prior(gpu, request.dtype, request.attention, family)
    costs, _ = prior.with_calibration(calibration)
    return costs, calibration, prior


def _masks(request: PlanRequest) -> tuple[str, ...]:
    from ringbench.scenario.layers import layer_masks

    return layer_masks(request.layers, request.mask)


def _layouts(request: PlanRequest, masks: tuple[str, ...]) -> list[str]:
    from ringbench.vocab import MaskSpec

    layouts = [request.layout]
    specs = [MaskSpec.parse(m) for m in masks]
    if request.layout != "contiguous" and any(s.window is not None and not s.documents for s in specs):
        layouts.append("contiguous")  # a window is balanced in place, and its short ring needs neighbours' blocks
    if request.layout != "doc-balanced" and any(s.documents for s in specs):
        try:
            from ringbench.engine.layout import resolve_layout
            from ringbench.engine.masks import mask_rule

            mask = next(m for m in masks if MaskSpec.parse(m).documents)
            resolve_layout("doc-balanced", request.seq, request.world, mask_rule(mask, request.docs, request.seq))
            layouts.append("doc-balanced")
        except UsageError:
            pass  # the pack cannot be balanced at this size: the candidate is not offered
    return layouts


def _short_ring_helps(request: PlanRequest, masks: tuple[str, ...], layout: str) -> bool:
    """The short ring stops before the full ring on some layer (a window or local documents)."""
    from ringbench.simulate import SimCase
    from ringbench.vocab import MaskSpec

    for mask in dict.fromkeys(masks):
        if MaskSpec.parse(mask).legacy:
            continue
        try:
            case = SimCase(workload=Workload(world=request.world, seq=request.seq, heads=request.heads,
                                             head_dim=request.head_dim, mask=mask, layout=layout,
                                             buffer="double-short", docs=request.docs))  # fmt: skip
        except UsageError:
            return False
        if case.route().depth < request.world - 1:
            return True
    return False


def _candidates(request: PlanRequest, topology, masks: tuple[str, ...]) -> tuple[list[Candidate], list[Candidate]]:
    from ringbench.advise.placements import placements, rings
    from ringbench.topology import recommend

    world, heads = request.world, request.heads
    kv_heads = request.key_value_heads
    ring_order = list(recommend(topology, time_budget_s=2.0 if world <= 64 else 0.3).order)
    per_host = max(Counter(device.host for device in topology.devices).values())
    wanted = set(request.strategies)

    def allowed(spec: str) -> bool:
        return not wanted or spec in wanted

    ok, refused = [], []
    for layout in _layouts(request, masks):
        base = [Candidate(strategy="ring", order=ring_order, layout=layout)]
        if _short_ring_helps(request, masks, layout):
            base.append(Candidate(strategy="ring", order=ring_order, layout=layout, buffer="double-short"))
        base.append(Candidate(strategy="allgather", order=ring_order, layout=layout))
        ok += [c for c in base if allowed(c.strategy)]
        ulysses = [("ulysses", world)] + [(f"hybrid:{u}", u) for u in _divisors(world)]
        for spec, degree in ulysses:
            if not allowed(spec):
                continue
            if heads % degree or (kv_heads % degree and degree % kv_heads):
                what = f"{heads} heads" if heads % degree else f"{kv_heads} KV heads"
                where = f"{world} ranks" if spec == "ulysses" else f"its Ulysses degree {degree}"
                if layout == request.layout:
                    refused.append(Candidate(strategy=spec, layout=layout, refused=f"{what} do not divide {where}"))
                continue
            named = (
                placements(topology, degree) if spec != "ulysses" else {"hosts": placements(topology, world)["hosts"]}
            )
            for name, ranks in named.items():
                ok.append(Candidate(strategy=spec, placement_name=name if spec != "ulysses" else "", placement=ranks,
                                    layout=layout))  # fmt: skip
        for width in _divisors(world):
            if not allowed(f"double-ring:{width}") or (width > per_host and not wanted):
                continue  # an inner ring longer than a host crosses the network every rotation: what the outer avoids
            for name, ranks in placements(topology, width).items():
                ok.append(Candidate(strategy=f"double-ring:{width}", placement_name=name, placement=ranks,
                                    layout=layout))  # fmt: skip
    if wanted and not ok:
        raise UsageError(
            "strategy: none of " + ", ".join(sorted(wanted)) + f" is possible at world={world} with "
            f"{heads} heads" + ("; " + "; ".join(c.refused for c in refused) if refused else "")
        )
    for candidate in ok:
        strategy = Strategy.parse(candidate.strategy)
        candidate.rings = rings(topology, strategy, candidate.placement, world, candidate.order)
        candidate.kv_repeat = max(1, strategy.ulysses_degree(world) // kv_heads)
    return ok, refused


def _why(loser: Candidate, winner: Candidate) -> str:
    ratio = loser.step_ms / winner.step_ms if winner.step_ms > 0 else math.nan
    parts = [f"{number(ratio, '.2f')}× the step of {winner.label} ({number(loser.step_ms, ',.1f')} vs "
             f"{number(winner.step_ms, ',.1f')} ms)"]  # fmt: skip
    parts.append(f"exposed {number(100 * loser.exposed_frac, '.0f')}% vs {number(100 * winner.exposed_frac, '.0f')}%")
    if max(loser.net_mb, winner.net_mb) > 0 and abs(loser.net_mb - winner.net_mb) > 0.05 * max(loser.net_mb, 1e-9):
        parts.append(f"{number(loser.net_mb, ',.1f')} MiB per rank cross hosts per iteration vs "
                     f"{number(winner.net_mb, ',.1f')}")  # fmt: skip
    if loser.memory_mb > 1.2 * winner.memory_mb:
        parts.append(f"{number(loser.memory_mb / winner.memory_mb, '.1f')}× the memory per rank")
    if loser.kv_repeat > 1:
        parts.append(f"K/V heads repeated ×{loser.kv_repeat} (priced: bytes and memory)")
    return f"{loser.label}: " + "; ".join(parts)


def _command(request: PlanRequest, top: list[Candidate], emulate: bool) -> str:
    words = ["ringbench", "run", "--world", str(request.world), "--seq", str(request.seq), "--heads",
             str(request.heads), "--head-dim", str(request.head_dim), "--batch", str(request.batch), "--dtype",
             request.dtype, "--mask", request.mask]  # fmt: skip
    if request.key_value_heads != request.heads:  # the engine runs grouped-query attention as priced
        words += ["--kv-heads", str(request.key_value_heads)]
    if request.docs != "none":
        words += ["--docs", request.docs]
    if request.layers != "1":
        words += ["--layers", repr(request.layers) if " " in request.layers else request.layers]
    for layout in dict.fromkeys(c.layout for c in top):
        words += ["--layout", layout]
    for buffer in dict.fromkeys(c.buffer for c in top if c.strategy != "allgather"):
        words += ["--buffer", buffer]
    for strategy in dict.fromkeys(c.strategy for c in top):
        words += ["--strategy", strategy]
    placements = list(dict.fromkeys(ring_text(c.placement) for c in top if c.placement_name))
    for placement in placements:
        words += ["--placement", placement]
    orders = list(dict.fromkeys(ring_text(c.order) for c in top if c.strategy in ("ring", "allgather") and c.order))
    for order in orders:
        words += ["--order", order]
    words += ["--topology", str(request.topology)] + (["--emulate-links"] if emulate else [])
    return " ".join(words)


def _confidence(
    request: PlanRequest, calibration, topology, emulate: bool, top: list[Candidate], gpu, stated: list[str]
) -> str:
    from ringbench.advise.accuracy import accuracy_line

    parts = []
    if calibration is not None:
        fit = calibration.compute_fit.get("fwd", {})
        links = ", ".join(sorted(calibration.link_fit)) or "none"
        provenance = getattr(calibration, "provenance", None)
        determined = f"; the calibration determined: {provenance}" if provenance else ""
        source = request.calibrate_from
        runs = ", ".join(map(str, source)) if isinstance(source, tuple) else str(source)
        parts.append(f"calibration run {runs} (compute {number(calibration.costs.gflops, ',.0f')} GFLOP/s nominal, "
                     f"fit residual {number(100 * fit.get('median_rel_residual', math.nan), '.1f')}%; links fitted: "
                     f"{links}{determined})")  # fmt: skip
    if gpu is not None:
        parts.append(
            f"the hardware catalogue's PRIOR figures for {gpu.key} (the lines above; none measured on this "
            "cluster" + (" except what the calibration determined" if calibration is not None else "") + ")"
        )
    if not parts:
        parts.append(
            "the documented default costs (400 TFLOP/s, 10 µs kernel calls, 5 µs host gaps), not a "
            "measurement; name the GPU with --gpu (ringbench plan --list-gpus) to price its hardware"
        )
    rests = " and ".join(parts)
    measured = topology.has_measured_links
    if emulate:
        network = "emulated links (the topology's costs injected as delays, as the run does)"
    elif measured:
        network = "the topology's measured link costs"
    elif gpu is not None:
        network = "the catalogue's link classes for it (PRIOR)" + (
            f", {', '.join(stated)} as the topology file states (GIVEN)" if stated else "")  # fmt: skip
    else:
        network = "the topology's nominal link-class figures (not measured)"
    kinds = list(dict.fromkeys(Strategy.parse(c.strategy).kind for c in top))
    return f"PREDICTED from {rests}; links: {network}. Measured accuracy: " + "; ".join(accuracy_line(k) for k in kinds)


def make_plan(request: PlanRequest, *, found_gpus: list[str] | None = None) -> Plan:
    """Simulate every candidate and rank them (see the module docstring). ``found_gpus``: the GPU names NVML
    reports (None: ask NVML when ``request.detect``)."""
    from ringbench.advise.planner_predict import predict
    from ringbench.simulate import Cluster

    started = time.perf_counter()
    topology, emulate = _load(request)
    gpu = resolve_gpu(request, found_gpus)
    if gpu is not None and emulate:
        raise UsageError(f"gpu={gpu.key!r} is not allowed with emulated links: they price a CPU run's transport; "
                         "plan with --real-links for the GPU's links, or drop --gpu")  # fmt: skip
    costs, calibration, prior = _costs(request, gpu)
    check_network(topology, costs, emulate)
    from ringbench.engine.layout import check_divisible

    check_divisible(request.layout, request.seq, request.world)
    stated = sorted(topology.cost_model.stated())  # the class figures the user's file gives
    if prior is not None:
        prior = prior.for_topology(topology)  # its link lines say which class figures the file states
        topology = prior.price_links(topology)
    cluster = Cluster(topology=topology, emulate_links=emulate)
    masks = _masks(request)
    ok, refused = _candidates(request, topology, masks)
    limit_mb = request.memory_per_rank_gb * 1024 if request.memory_per_rank_gb is not None else math.inf
    for candidate in ok:
        try:
            predict(request, candidate, costs, cluster, masks)
        except UsageError as exc:  # a layout or buffer this pack or world does not allow
            candidate.refused = str(exc)
            continue
        if candidate.memory_mb > limit_mb:
            candidate.refused = (f"{number(candidate.memory_mb / 1024, '.3g')} GB per rank exceeds "
                                 f"--memory-per-rank {request.memory_per_rank_gb:g}")  # fmt: skip
    kept = sorted((c for c in ok if not c.refused), key=lambda c: c.step_ms)
    refused += [c for c in ok if c.refused]
    if not kept:
        raise UsageError("no strategy fits: every candidate was refused (" + "; ".join(
            f"{c.label}: {c.refused}" for c in refused[:4]) + ")")  # fmt: skip
    for loser in kept[1:]:
        loser.why = _why(loser, kept[0])
    for candidate in refused:
        candidate.why = f"{candidate.label}: {candidate.refused}"
    top = kept[: request.top]
    notes = []
    if kept[0].kv_repeat > 1:
        notes.append(f"the first choice's Ulysses degree exceeds the {request.kv_heads} KV heads: each is repeated "
                     f"×{kept[0].kv_repeat} (DeepSpeed's rule), priced in its all-to-all bytes and its memory")  # fmt: skip
    from ringbench.advise.settings import plan_settings

    if request.settings_for > len(kept):
        raise bad_value("settings_for", request.settings_for, f"a candidate's rank, 1..{len(kept)}")
    chosen = kept[request.settings_for - 1]
    settings = plan_settings(kept, chosen, request.world, request.heads, request.kv_heads or request.heads,
                             request.mask, topology)  # fmt: skip
    priors, measured = [], []
    if prior is not None:
        _, priors = prior.with_calibration(calibration)
        if calibration is not None:
            measured = [s for s in calibration.sources if s.determined]
    return Plan(request=request, topology_text=topology.describe(), candidates=kept, refused=refused,
                command=_command(request, top, emulate), confidence=_confidence(request, calibration, topology,
                emulate, top, gpu, stated), elapsed_s=time.perf_counter() - started, notes=notes,
                gpu=gpu.key if gpu is not None else None, priors=priors, measured=measured, settings=settings,
                settings_for=request.settings_for)  # fmt: skip


def price_configurations(request: PlanRequest, configs: dict[str, dict], *, found_gpus: list[str] | None = None,
                         framework=None) -> dict[str, Candidate]:  # fmt: skip
    """Predict given configurations (label -> strategy, placement, layout, buffer, order specs) on the request's
    workload and hardware, priced as ``make_plan`` prices its candidates (what benchmarks/validate_published.py
    sets beside published measurements); ``framework``: a Framework whose figures replace the request's family's."""
    from ringbench.advise.planner_predict import predict
    from ringbench.orders import parse_order, parse_placement
    from ringbench.simulate import Cluster

    topology, emulate = _load(request)
    gpu = resolve_gpu(request, found_gpus)
    costs, _, prior = _costs(request, gpu, framework)
    check_network(topology, costs, emulate)
    if prior is not None:
        topology = prior.price_links(topology)
    cluster = Cluster(topology=topology, emulate_links=emulate)
    masks = _masks(request)
    out = {}
    for label, spec in configs.items():
        strategy = Strategy.parse(spec.get("strategy", "ring"), "strategy")
        candidate = Candidate(strategy=strategy.spec, layout=spec.get("layout", request.layout),
                              buffer=spec.get("buffer", "double"))  # fmt: skip
        if strategy.grouped:
            candidate.placement_name = spec.get("placement", "heads-first")
            candidate.placement = parse_placement(candidate.placement_name, request.world,
                                                  strategy.group_size(request.world))  # fmt: skip
        else:
            candidate.order = parse_order(spec.get("order", "identity"), request.world)
        predict(request, candidate, costs, cluster, masks)
        out[label] = candidate
    return out


__all__ = ["Candidate", "Plan", "PlanRequest", "make_plan", "price_configurations", "resolve_gpu"]
