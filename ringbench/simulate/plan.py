"""``ringbench plan``: which strategy, degrees, placement and ring orders to use for a workload on a topology.

    plan = make_plan(PlanRequest(topology=Path("cluster.yaml"), world=64, seq=1 << 20, heads=32))
    plan.candidates[0]         # the first choice: strategy, placement, rings, predicted step / exposed / memory
    plan.lines()               # the table, one line per loser saying why, the command, the confidence line

Every candidate the degrees allow is simulated (PREDICTED, never measured): the ring on recommend's order, the
all-gather baseline, Ulysses, hybrid:U and double-ring:W for every U, W dividing N (and the heads, KV heads),
each grouped one on the topology's placements (simulate/placement.py: groups inside hosts, or interleaved), with
recommend's optimizer for every ring inside it. Costs: a calibration run (``--from``), else the documented defaults;
links: the topology's (its nominal class figures unless it carries measured costs), emulated when the topology is
a run that emulated them. Candidates are ranked by predicted step time; one over ``memory_per_rank_gb`` is refused.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ringbench.errors import UsageError, bad_value
from ringbench.fmt import number, ring_text
from ringbench.vocab import Strategy

TOP = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    """A workload and where it runs."""

    topology: Path
    """A topology file (nvidia-smi text or YAML) or a results run directory that recorded one."""
    world: int
    seq: int
    heads: int
    kv_heads: int = 0
    """Key/value heads (grouped-query attention); 0: as many as heads."""
    head_dim: int = 128
    batch: int = 1
    dtype: str = "bfloat16"
    mask: str = "causal"
    layout: str = "zigzag"
    memory_per_rank_gb: float | None = None
    """Refuse candidates whose predicted attention memory per rank exceeds this (GB = 2**30 bytes)."""
    calibrate_from: Path | tuple[Path, ...] | None = None
    """Measured runs whose costs to use (several: calibrated as one record, simulate/strategy_fit.merge_runs)."""
    emulate_links: bool | None = None
    """Price links as a run with --emulate-links injects them; None: as the topology's run did (False for a file)."""
    backward: bool = True
    top: int = TOP
    """Candidates the measuring command runs."""

    def __post_init__(self) -> None:
        for name in ("world", "seq", "heads", "head_dim", "batch", "top"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_value(name, value, "an integer >= 1")
        if self.kv_heads and (self.kv_heads < 0 or self.heads % self.kv_heads):
            raise bad_value("kv_heads", self.kv_heads, f"an integer >= 1 dividing heads={self.heads}")
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
    buffer: str = "double"
    step_ms: float = math.nan
    fwd_ms: float = math.nan
    bwd_ms: float = math.nan
    exposed_ms: float = math.nan
    memory_mb: float = math.nan
    net_mb: float = 0.0
    """Bytes per iteration and rank that cross hosts, MiB (predicted)."""
    rings: list[dict] = field(default_factory=list)
    refused: str = ""
    why: str = ""

    @property
    def label(self) -> str:
        return self.strategy + (f" @{self.placement_name}" if self.placement_name else "")

    @property
    def exposed_frac(self) -> float:
        return self.exposed_ms / self.step_ms if self.step_ms and self.step_ms > 0 else math.nan

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "placement_name": self.placement_name,
                "placement": ring_text(self.placement) if self.placement else None,
                "order": ring_text(self.order) if self.order else None, "buffer": self.buffer,
                "step_ms": self.step_ms, "fwd_ms": self.fwd_ms, "bwd_ms": self.bwd_ms, "exposed_ms": self.exposed_ms,
                "exposed_frac": self.exposed_frac, "memory_mb": self.memory_mb, "net_mb_per_rank": self.net_mb,
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

    def to_dict(self) -> dict:
        return {"predicted": True, "topology": self.topology_text, "world": self.request.world,
                "seq": self.request.seq, "heads": self.request.heads, "kv_heads": self.request.kv_heads or
                self.request.heads, "head_dim": self.request.head_dim, "candidates": [c.to_dict() for c in
                self.candidates], "refused": [c.to_dict() for c in self.refused], "command": self.command,
                "confidence": self.confidence, "elapsed_s": self.elapsed_s, "notes": self.notes}  # fmt: skip


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


def _load(request: PlanRequest):
    from ringbench.topology import load_topology

    path = Path(request.topology)
    topology = load_topology(path)
    if topology.world < request.world:
        raise UsageError(f"world={request.world} is not allowed with topology {path}: it has {topology.world} "
                         f"devices; expected a world of at most {topology.world}")  # fmt: skip
    if topology.world > request.world:
        from ringbench.simulate.placement import sub_topology

        topology = sub_topology(topology, list(range(request.world)))  # the first N devices, as a launch takes them
    emulate = request.emulate_links
    if emulate is None:
        emulate = False
        if path.is_dir():
            import json

            try:
                emulate = bool(json.loads((path / "meta.json").read_text()).get("emulated_links"))
            except (OSError, ValueError):
                emulate = False
    return topology, emulate


def _costs(request: PlanRequest):
    from ringbench.simulate.costs import DEFAULTS

    if request.calibrate_from is None:
        return DEFAULTS, None
    from ringbench.simulate.calibrate import calibrate
    from ringbench.simulate.strategy_fit import merge_runs

    paths = request.calibrate_from if isinstance(request.calibrate_from, tuple) else (request.calibrate_from,)
    calibration = calibrate(merge_runs(paths))
    return calibration.costs, calibration


def _sim_case(request: PlanRequest, candidate: Candidate):
    from ringbench.simulate.case import SimCase

    return SimCase(world=request.world, seq=request.seq, heads=request.heads, head_dim=request.head_dim,
                   batch=request.batch, dtype=request.dtype, mask=request.mask, layout=request.layout,
                   buffer="allgather" if candidate.strategy == "allgather" else candidate.buffer,
                   order=ring_text(candidate.order) if candidate.order else "identity",
                   backward=request.backward, strategy=candidate.strategy,
                   placement=ring_text(candidate.placement) if candidate.placement else "",
                   kv_heads=request.kv_heads)  # fmt: skip


def _ring_prediction(case, costs, cluster) -> tuple[dict, np.ndarray]:
    """The ring (or all-gather) case on the ring engine, without the walk: phase times and each rank's compute."""
    from ringbench.simulate.case import phase_models, start_skew
    from ringbench.simulate.engine import PhaseEngine, Window
    from ringbench.simulate.timeline import simulate_timeline

    if case.buffer == "allgather":
        timeline = simulate_timeline(case, costs, cluster)
        times = {ph: timeline.phase_end[ph].max(axis=1) - timeline.phase_start[ph].min(axis=1) for ph in case.phases}
        spent = sum(np.asarray(c.compute_ms, float) for cells in (timeline.full or {}).values() for c in cells)
        return {"step": timeline.iteration_ms, **times}, np.asarray(spent).reshape(case.iterations, -1).max(axis=1)
    rng = np.random.default_rng([case.seed, 7])
    models = phase_models(case, costs, cluster, rng)
    origin = start_skew(case, costs, rng)
    start, times, spent = origin, {}, np.zeros(origin.shape)
    for phase, model in models.items():
        engine = PhaseEngine(model)
        window = Window.ring(case.world, case.iterations)
        state = engine.begin(start)
        for step in range(case.world):
            spent = spent + np.broadcast_to(model.compute(step, window), spent.shape)
            engine.advance(state, step, window, record=False)
        end, _ = engine.finish(state)
        times[phase] = end.max(axis=1) - start.min(axis=1)
        start = end
    return {"step": start.max(axis=1) - origin.min(axis=1), **times}, spent.max(axis=1)


def _ring_net_mb(case, topology, order: list[int]) -> float:
    """Bytes per iteration and rank the ring's messages carry across hosts (MiB, averaged over ranks)."""
    from ringbench.topology import LinkKind

    if topology is None or case.world < 2:
        return 0.0
    crossing = sum(topology.link(order[p], order[(p + 1) % case.world]).kind is LinkKind.NET
                   for p in range(case.world))  # fmt: skip
    kv, dkv = case.block_bytes("kv"), case.block_bytes("dkv") if case.backward else 0
    per_hop = (case.world - 1) * kv * (2 if case.backward else 1) + case.world * dkv
    if case.buffer == "allgather":
        per_hop = (case.world - 1) * kv + (2 * (case.world - 1) * dkv if case.backward else 0)
    return crossing * per_hop / case.world / 2**20


def _predict(request: PlanRequest, candidate: Candidate, costs, cluster) -> None:
    from ringbench.simulate.strategies import predicted_memory_mb, simulate_strategy

    case = _sim_case(request, candidate)
    candidate.memory_mb = predicted_memory_mb(case)
    if candidate.strategy in ("ring", "allgather"):
        times, compute = _ring_prediction(case, costs, cluster)
        candidate.net_mb = _ring_net_mb(case, cluster.topology, candidate.order or list(range(request.world)))
        step = times["step"]
    else:
        timeline = simulate_strategy(case, costs, cluster)
        step = timeline.iteration_ms
        times = {ph: timeline.phase_end[ph].max(axis=1) - timeline.phase_start[ph].min(axis=1) for ph in case.phases}
        compute = timeline.compute_ms.max(axis=1)
        candidate.net_mb = timeline.bytes_by_class.get("NET", 0.0) / request.world / 2**20
    candidate.step_ms = float(np.median(step))
    candidate.fwd_ms = float(np.median(times["fwd"]))
    candidate.bwd_ms = float(np.median(times["bwd"])) if "bwd" in times else math.nan
    candidate.exposed_ms = float(np.median(np.clip(step - compute, 0.0, None)))


def _candidates(request: PlanRequest, topology) -> tuple[list[Candidate], list[Candidate]]:
    from ringbench.simulate.placement import placements, rings
    from ringbench.topology import recommend

    world, heads = request.world, request.heads
    kv_heads = request.kv_heads or heads
    ring_order = list(recommend(topology, time_budget_s=2.0).order)
    ok = [Candidate(strategy="ring", order=ring_order), Candidate(strategy="allgather", order=ring_order)]
    refused = []
    ulysses = [("ulysses", world)] + [(f"hybrid:{u}", u) for u in _divisors(world)]
    for spec, degree in ulysses:
        if heads % degree or kv_heads % degree:
            what = f"{heads} heads" if heads % degree else f"{kv_heads} KV heads"
            where = f"{world} ranks" if spec == "ulysses" else f"its Ulysses degree {degree}"
            refused.append(Candidate(strategy=spec, refused=f"{what} do not divide {where}"))
            continue
        named = placements(topology, degree) if spec != "ulysses" else {"hosts": placements(topology, world)["hosts"]}
        for name, ranks in named.items():
            ok.append(Candidate(strategy=spec, placement_name=name if spec != "ulysses" else "", placement=ranks))
    for width in _divisors(world):
        for name, ranks in placements(topology, width).items():
            ok.append(Candidate(strategy=f"double-ring:{width}", placement_name=name, placement=ranks))
    for candidate in ok:
        strategy = Strategy.parse(candidate.strategy)
        candidate.rings = rings(topology, strategy, candidate.placement, world, candidate.order)
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
    return f"{loser.label}: " + "; ".join(parts)


def _command(request: PlanRequest, top: list[Candidate], emulate: bool) -> str:
    words = ["ringbench", "run", "--world", str(request.world), "--seq", str(request.seq), "--heads",
             str(request.heads), "--head-dim", str(request.head_dim), "--batch", str(request.batch), "--dtype",
             request.dtype, "--mask", request.mask, "--layout", request.layout, "--buffer", "double"]  # fmt: skip
    for candidate in top:
        words += ["--strategy", candidate.strategy]
    placements = list(dict.fromkeys(ring_text(c.placement) for c in top if c.placement_name))
    for placement in placements:
        words += ["--placement", placement]
    orders = list(dict.fromkeys(ring_text(c.order) for c in top if c.strategy in ("ring", "allgather") and c.order))
    for order in orders:
        words += ["--order", order]
    words += ["--topology", str(request.topology)] + (["--emulate-links"] if emulate else [])
    return " ".join(words)


def _confidence(request: PlanRequest, calibration, topology, emulate: bool, top: list[Candidate]) -> str:
    from ringbench.simulate.accuracy import accuracy_line

    if calibration is not None:
        fit = calibration.compute_fit.get("fwd", {})
        links = ", ".join(sorted(calibration.link_fit)) or "none"
        provenance = getattr(calibration, "provenance", None)
        determined = f"; the calibration determined: {provenance}" if provenance else ""
        source = request.calibrate_from
        runs = ", ".join(map(str, source)) if isinstance(source, tuple) else str(source)
        rests = (f"calibration run {runs} (compute {number(calibration.costs.gflops, ',.0f')} "
                 f"GFLOP/s nominal, fit residual {number(100 * fit.get('median_rel_residual', math.nan), '.1f')}%; "
                 f"links fitted: {links}{determined})")  # fmt: skip
    else:
        rests = "the documented default costs (400 TFLOP/s, 10 µs kernel calls, 5 µs host gaps), not a measurement"
    measured = any(link is not None and link.measured for row in topology.links for link in row)
    if emulate:
        network = "emulated links (the topology's costs injected as delays, as the run does)"
    elif measured:
        network = "the topology's measured link costs"
    else:
        network = "the topology's nominal link-class figures (not measured)"
    kinds = list(dict.fromkeys(Strategy.parse(c.strategy).kind for c in top))
    return f"PREDICTED from {rests} and {network}. Measured accuracy: " + "; ".join(accuracy_line(k) for k in kinds)


def make_plan(request: PlanRequest) -> Plan:
    """Simulate every candidate and rank them (see the module docstring)."""
    from ringbench.simulate.case import Cluster

    started = time.perf_counter()
    topology, emulate = _load(request)
    costs, calibration = _costs(request)
    from ringbench.engine.layout import check_divisible

    check_divisible(request.layout, request.seq, request.world)
    cluster = Cluster(topology=topology, emulate_links=emulate)
    ok, refused = _candidates(request, topology)
    limit_mb = request.memory_per_rank_gb * 1024 if request.memory_per_rank_gb is not None else math.inf
    for candidate in ok:
        _predict(request, candidate, costs, cluster)
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
    if request.kv_heads and request.kv_heads != request.heads:
        notes.append("the engine has no grouped-query attention: the measuring command runs with K, V of all heads")
    return Plan(request=request, topology_text=topology.describe(), candidates=kept, refused=refused,
                command=_command(request, top, emulate), confidence=_confidence(request, calibration, topology,
                emulate, top), elapsed_s=time.perf_counter() - started, notes=notes)  # fmt: skip


__all__ = ["Candidate", "Plan", "PlanRequest", "make_plan"]
