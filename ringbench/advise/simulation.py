"""``ringbench simulate`` as a library call: a sweep (the axes of ``ringbench run``), costs (calibrated or given),
a cluster, optionally the scale view -> a stored SIMULATED record.

    request = SimRequest(scenario=Scenario(world=(64,), seq=(1 << 20,)), calibrate_from=Path("results/r1"))
    outcome = run_simulation(request)          # outcome.run_dir, outcome.run (RunData), outcome.calibration
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ringbench.advise.scale_view import scale_view
from ringbench.calibration import Calibration, cases_like, fit, run_cores
from ringbench.errors import UsageError, bad_value
from ringbench.record.store import RunData, load_run
from ringbench.scenario.scenario import Scenario
from ringbench.simulate import (
    DEFAULTS,
    MAX_EVENTS,
    CaseResult,
    Cluster,
    Costs,
    SimCase,
    run_data,
    simulate_case,
    write_run,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class SimRequest:
    """What to simulate, with which costs, on which cluster, and where to write it."""

    scenario: Scenario = field(default_factory=Scenario)
    """The sweep: the axes of ``ringbench run`` (its kernel axis is ignored), faults, seed."""
    iterations: int = 1
    """Timed iterations per case."""
    calibrate_from: Path | None = None
    """A measured run whose costs to use (``--from``)."""
    like: Path | None = None
    """A measured run whose cases to predict: same axes, faults, topology and emulated rates (``--like``)."""
    compute_tflops: float | None = None
    """Nominal compute rate, TFLOP/s (replaces the calibrated or default one; efficiencies are kept)."""
    link_gbps: float | None = None
    """Bandwidth of links between ranks without a topology (and of the transport under emulated links), GB/s."""
    topology: Path | None = None
    """Topology file (nvidia-smi text or YAML, the format ``recommend`` reads)."""
    emulate_links: bool = False
    """The topology's links are emulated, as ``ringbench run --topology FILE --emulate-links`` does."""
    gpus_per_host: int = 8
    """Ranks per host without a topology (what ``slow-host`` counts)."""
    scale: tuple[int, ...] = ()
    """World sizes of the scale view (none: no view)."""
    fixed_seq: bool = False
    """Scale view: keep S fixed (strong scaling) instead of tokens per rank (weak scaling)."""
    max_events: int = MAX_EVENTS
    """Events of one case above which its record is bounded."""
    gpu: str | None = None
    """The GPU of the hardware catalogue to price compute and links for (PRIOR figures); None: what NVML finds here
    (``detect``), else the calibration or the documented defaults."""
    attention: str | None = None
    """The attention kernel family (fa2, fa3, cudnn); None: the GPU's default."""
    detect: bool = True
    out: Path = Path("results")
    command: str = "ringbench simulate"

    def __post_init__(self) -> None:
        for name, value in (("compute_tflops", self.compute_tflops), ("link_gbps", self.link_gbps)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise bad_value(name, value, "a finite number > 0")
        for name, value, low in (("iterations", self.iterations, 1), ("gpus_per_host", self.gpus_per_host, 1),
                                 ("max_events", self.max_events, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise bad_value(name, value, f"an integer >= {low}")
        for world in self.scale:
            if isinstance(world, bool) or not isinstance(world, int) or world < 1:
                raise bad_value("scale", world, "world sizes >= 1, e.g. 8,64,512,4096")
        if self.emulate_links and self.topology is None and self.like is None:
            raise bad_value("emulate_links", True, "only together with --topology FILE")


@dataclass(kw_only=True)
class SimOutcome:
    run_dir: Path
    run: RunData
    costs: Costs
    results: list[CaseResult]
    calibration: Calibration | None = None
    scale: dict | None = None
    assumptions: list = field(default_factory=list)
    """ringbench.calibration.coverage.Extrapolation per aspect: what the prediction takes from the calibration."""
    notes: list[str] = field(default_factory=list)


def cases_from_scenario(scenario: Scenario, iterations: int) -> list[SimCase]:
    """One SimCase per point of the sweep (the kernel axis collapses: the simulator has one)."""
    cases, seen = [], set()
    for case in scenario.cases():
        if case.layers != "1":
            raise bad_value("layers", case.layers, "1 for the simulator (it runs one attention layer: simulate each "
                            "layer's mask as a case of its own)")  # fmt: skip
        sim = SimCase(workload=case.workload, backward=scenario.backward, iterations=iterations,
                      faults=tuple(scenario.faults), seed=scenario.seed)  # fmt: skip
        if sim.case_id not in seen:
            seen.add(sim.case_id)
            cases.append(sim)
    return cases


def _cluster(request: SimRequest, like: RunData | None, prior=None) -> Cluster:
    from ringbench.topology import Topology, load_topology

    topology, emulate = None, request.emulate_links
    if request.topology is not None:
        topology = load_topology(request.topology)
    elif like is not None and like.meta.get("topology"):
        topology = Topology.from_dict(like.meta["topology"], "meta.json:topology")
        emulate = emulate or bool(like.meta.get("emulated_links"))
    if prior is not None and topology is not None and not emulate:
        topology = prior.price_links(topology)
    return Cluster(topology=topology, emulate_links=emulate and topology is not None,
                   gpus_per_host=request.gpus_per_host, cpu_cores=run_cores(like) if like is not None else None)  # fmt: skip


def resolve_costs(request: SimRequest, prior=None) -> tuple[Costs, Calibration | None]:
    """The costs to simulate with: a GPU's priors (``prior``) with what a calibration determined in their place,
    else the calibration's, else the documented defaults; an explicit rate replaces the compute rate."""
    calibration = fit(load_run(request.calibrate_from)) if request.calibrate_from is not None else None
    if prior is not None:
        costs, _ = prior.with_calibration(calibration)
        return _with_rates(costs, request), calibration
    costs = calibration.costs if calibration is not None else DEFAULTS
    return _with_rates(costs, request), calibration


def hardware_prior(request: SimRequest, dtype: str):
    """The GpuPrior of ``request.gpu`` (or the GPU NVML finds), or None."""
    from ringbench.simulate import find_hardware, gpu_prior

    gpu = find_hardware(request.gpu, detect=request.detect)
    if gpu is None:
        return None
    if request.emulate_links:
        raise UsageError(f"gpu={gpu.key!r} is not allowed with emulated links: they price a CPU run's transport; "
                         "drop --emulate-links or --gpu")  # fmt: skip
    try:
        return gpu_prior(gpu, dtype, request.attention)
    except UsageError:
        if request.gpu is not None:
            raise
        return None  # a GPU found here but a dtype its kernels do not run: the calibration or the defaults


def _with_rates(costs: Costs, request: SimRequest) -> Costs:
    gflops = request.compute_tflops * 1e3 if request.compute_tflops is not None else None
    return costs.with_rate(gflops=gflops, link_gbps=request.link_gbps)


def costs_by_case(cases: list[SimCase], costs: Costs, calibration: Calibration | None,
                  request: SimRequest) -> tuple[list[tuple[SimCase, Costs]], list[str]]:  # fmt: skip
    """Each case with the costs of its compute model: a measured case's kernel family (real or emulated) picks
    the calibration's costs of that family; a case whose family the calibration did not measure is not predicted
    with another's (a note says so). Without a calibration every case takes ``costs``."""
    if calibration is None or request.compute_tflops is not None or costs.kernel is not None:
        return [(case, costs) for case in cases], []
    out, skipped = [], {}
    for case in cases:
        family = case.family or calibration.family
        chosen = calibration.costs_for(family)
        if chosen is None:
            skipped.setdefault(family, []).append(case)
            continue
        out.append((case, costs if family == calibration.family else _with_rates(chosen, request)))
    notes = [
        f"{len(items)} case(s) with {family} kernels ({', '.join(sorted({c.kernel for c in items if c.kernel}))}) "
        f"not predicted: the calibration run measured only {calibration.family} compute (calibrate on a run with "
        f"{family} kernels to predict them)"
        for family, items in skipped.items()
    ]
    if not out:
        raise UsageError(notes[0].replace(" not predicted:", " cannot be predicted:"))
    return out, notes


def run_simulation(request: SimRequest, on_case: Callable[[CaseResult, int, int], None] | None = None) -> SimOutcome:
    """Simulate the request's cases, write results/<run-id>/, and compute the scale view when asked."""
    from ringbench.calibration import extrapolation
    from ringbench.record.folder import new_run_dir

    prior = None
    if request.gpu is not None or request.detect:
        like_run = load_run(request.like) if request.like is not None else None
        dtypes = sorted({str(d) for d in like_run.cases["dtype"]} if like_run is not None
                        else {case.dtype for case in request.scenario.cases()})  # fmt: skip
        if len(dtypes) > 1 and request.gpu is not None:
            raise bad_value("dtype", ",".join(dtypes), "one dtype when --gpu prices the attention kernel")
        prior = hardware_prior(request, dtypes[0]) if len(dtypes) == 1 else None
    costs, calibration = resolve_costs(request, prior)
    like = load_run(request.like) if request.like is not None else None
    cluster = _cluster(request, like, prior)
    if like is not None:
        cases = cases_like(like, request.iterations)
        if request.compute_tflops is not None:  # an explicit rate replaces the run's emulated ones
            cases = [dataclasses.replace(case, gflops=None) for case in cases]
    else:
        cases = cases_from_scenario(request.scenario, request.iterations)
    for case in cases:
        cluster.check(case)
    pairs, notes = costs_by_case(cases, costs, calibration, request)
    results = []
    for index, (case, case_costs) in enumerate(pairs):
        results.append(simulate_case(case, case_costs, cluster, max_events=request.max_events))
        if on_case is not None:
            on_case(results[-1], index + 1, len(pairs))
    assumptions = []
    if calibration is not None:
        for family in dict.fromkeys(case.family or calibration.family for case, _ in pairs):
            group = [case for case, _ in pairs if (case.family or calibration.family) == family]
            chosen = next(c for case, c in pairs if (case.family or calibration.family) == family)
            assumptions.extend(extrapolation(calibration, group, cluster, chosen))
    view = None
    if request.scale:
        view = scale_view(pairs[0][0], pairs[0][1], cluster, worlds=request.scale, fixed_seq=request.fixed_seq)
    run_dir = new_run_dir(request.out, "simulate")
    extra = {"calibration": calibration.to_dict() if calibration is not None else None,
             "extrapolation": [a.to_dict() for a in assumptions], "notes": notes,
             "like": str(request.like) if request.like is not None else None, "scale": view}  # fmt: skip
    run = run_data(results, costs, run_id=run_dir.name, path=run_dir, command=request.command, cluster=cluster,
                   extra=extra)  # fmt: skip
    if like is None:
        run.meta["scenario"] = request.scenario.to_dict()
        run.meta["scenario_source"] = request.scenario.source
    write_run(run_dir, run)
    if prior is not None:
        notes = (
            [f"PRIOR figures of the hardware catalogue for {prior.gpu.key} (ringbench plan --list-gpus):"]
            + [f"  {source.cost}: {source.how}" for source in prior.with_calibration(calibration)[1]]
            + notes
        )
    return SimOutcome(run_dir=run_dir, run=run, costs=costs, results=results, calibration=calibration, scale=view,
                      assumptions=assumptions, notes=notes)  # fmt: skip
