"""The per-rank runner: for each case, build the shards, warm up, time iterations, record, check, report.

Runs inside every rank (local processes or a torchrun/SLURM job). Each finished case is sent to the parent (or
to rank 0 when launched externally) as a dict: this rank's event rows on the aligned clock plus its errors.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import socket
from dataclasses import dataclass
from pathlib import Path

import torch

from ringbench.engine.api import attention, build_context, close_context
from ringbench.engine.comm import RingStall
from ringbench.engine.inputs import ShardSpec, rank_shards
from ringbench.engine.layout import resolve_layout
from ringbench.engine.recorder import ListRecorder
from ringbench.engine.spec import AttentionSpec, Runtime
from ringbench.engine.timeline import timeline_for
from ringbench.engine.warm import compiles, warm
from ringbench.errors import UsageError
from ringbench.kernels import get_kernel, spin
from ringbench.kernels.emulated import EmulatedKernel
from ringbench.rank.autorate import AutoModel, check_pacing, measure_rate
from ringbench.rank.clock import ClockAlignment, align_clocks, fit_drift
from ringbench.rank.collectives import GroupOps
from ringbench.rank.injection import RankFaults
from ringbench.rank.layer_checks import check_layers, layer_rules, nonfinite_tensors
from ringbench.rank.memory import TensorPeak, peak_mb, reset_peak
from ringbench.rank.metadata import describe_device
from ringbench.rank.rank_report import RankReport
from ringbench.scenario.faults import parse_fault
from ringbench.scenario.scenario import Case, Scenario

# Seconds the float64 check of one case may take on one rank; beyond it the check samples rows and says so.
CHECK_BUDGET_S = 60.0
# Seconds a rank may spend compiling a JIT kernel's variants (a cold Triton cache) beyond the ring's own bound.
COMPILE_PATIENCE_S = 600.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSettings:
    """What every rank needs besides its cases. It crosses process boundaries (pickled to spawned ranks, JSON to
    network-namespace ranks), so it is plain data, frozen, and validated where it is built."""

    iters: int
    """Timed iterations per case."""
    warmup: int
    """Untimed iterations before them."""
    check: bool
    """Compare outputs and gradients with the float64 reference."""
    timeout: float
    """Seconds any distributed wait may take."""
    faults: tuple[str, ...] = ()
    """Injected faults as canonical specs (ringbench.scenario.faults)."""
    seed: int = 0
    """Inputs are a function of (seed, token chunk)."""
    trace: bool = True
    """Record per-step spans (False: iteration times only)."""
    link_model: dict | None = None
    """Emulated links of a topology (Scenario.link_model), or None."""
    profile_dir: str | None = None
    """Where profiler captures go (run --profile, or another implementation's traced cases), or None."""
    profile: bool = False
    """Capture ringbench's own cases too (run --profile)."""
    loopback: bool = False
    """A 1-rank ring exchanges with itself."""
    check_budget_s: float = CHECK_BUDGET_S
    """Seconds the check may take per case and rank before it samples rows."""
    emulated_auto_gflops: float | None = None
    """The one rate ``emulated:auto`` runs at in this run, calibrated before any case is timed."""
    emulated_auto_floor_ms: float = 0.0
    """The least time each of its kernel calls takes (ringbench.rank.autorate: the calls too small for the rate)."""
    calibrate_auto: bool = False
    """Calibrate that rate at the start of this launch (every emulated:auto case is in it) and report it."""

    def __post_init__(self) -> None:
        from ringbench.errors import bad_value

        for name, low in (("iters", 1), ("warmup", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise bad_value(name, value, f"an integer >= {low}")
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise bad_value("timeout", self.timeout, "a number of seconds > 0")
        if not isinstance(self.faults, tuple):
            object.__setattr__(self, "faults", tuple(self.faults))
        for spec in self.faults:
            if parse_fault(spec).kind == "slow-host":
                raise UsageError(
                    f"fault={spec!r} is not allowed in a run; expected slow-rank:R:F for each rank of that host "
                    "(slow-host is a fault of `ringbench simulate`, which knows the hosts)"
                )

    @classmethod
    def of(cls, scenario: Scenario, *, trace: bool = True, loopback: bool = False) -> RunSettings:
        return cls(iters=scenario.iters, warmup=scenario.warmup, check=scenario.check, timeout=float(scenario.timeout),
                   faults=tuple(scenario.faults), seed=scenario.seed, trace=trace, link_model=scenario.link_model(),
                   loopback=loopback)  # fmt: skip


class RunRecorder(ListRecorder):
    """Records spans (unless tracing is off), keeps the parent informed of the ring step, fires faults, and marks
    the ring steps for a profiler capture when one is running."""

    def __init__(self, rank, ring_position, progress, faults: RankFaults, trace: bool, timeline) -> None:
        super().__init__(rank, ring_position, timeline=timeline)
        self.enabled = trace
        self.progress = progress
        self.faults = faults
        self.capture = None  # a ProfileCapture during the profiled iteration

    def on_step(self, phase: str, step: int) -> None:
        if self.progress is not None:
            self.progress.set_step(phase, step)
        if self.capture is not None:
            self.capture.step(phase, step)
        self.faults.at_step(phase, step, self.iteration)

    def end_phase(self, phase: str) -> None:
        if self.capture is not None:
            self.capture.end_phase()

    def span(self, **fields) -> None:
        if self.enabled:
            super().span(**fields)


@dataclass(kw_only=True, slots=True)
class RankSession:
    """What a rank keeps across the cases of one process group: its collectives, timeline and aligned clock."""

    env: object  # ringbench.rank.dist.DistEnv
    ops: GroupOps
    timeline: object
    clock: ClockAlignment
    device_info: dict
    on_stall: object = None  # called by a comm watchdog when the host is stuck past a stall


def open_session(env, on_stall=None) -> RankSession:
    """Per process group: the collectives helper, the timeline of the rank's device, and the clock alignment."""
    ops = GroupOps(env.device)
    timeline = timeline_for(env.device)
    device_info = describe_device(env.device)
    if getattr(env, "group_options", ()):
        device_info["group_options"] = dict(env.group_options)  # e.g. NCCL's high-priority streams
    if getattr(env, "backend_note", ""):
        device_info["backend_note"] = env.backend_note
    if env.device.type == "cuda":  # the clock that paces modelled compute and injected delays, chosen once
        spin.calibrate(env.device)
        device_info.update(spin.status(env.device))
    return RankSession(env=env, ops=ops, timeline=timeline, clock=align_clocks(ops), device_info=device_info,
                       on_stall=on_stall)  # fmt: skip


@dataclass(slots=True)
class _CaseSetup:
    """One case made ready on this rank: its shards, layers, recorder, kernel and contexts."""

    faults: RankFaults
    rules: list
    shard: ShardSpec
    q0: torch.Tensor
    dout: torch.Tensor
    leaves: list
    recorder: RunRecorder
    kernel: object
    contexts: list
    emulated_gflops: float | None
    memory_method: str | None


def run_case(case: Case, *, session: RankSession, progress, settings: RunSettings, case_index: int, repeat: int,
             profile_path: Path | None = None) -> RankReport:  # fmt: skip
    """Run one case on this rank; returns its rows and figures for the parent.

    Per iteration: a barrier, the timeline's anchor, the forward (and backward) ring with every span marked on the
    timeline, then -- outside the loop -- a bounded settle of the iteration's transfers and marks and their
    resolution into nanoseconds. On a GPU nothing in between synchronises the host with the device.
    """
    if case.impl != "ringbench":
        return _run_impl_case(case, session=session, progress=progress, settings=settings, repeat=repeat,
                              profile_path=profile_path)  # fmt: skip
    if progress is not None:
        progress.set_case(case_index)
    setup = _set_up(case, session, settings, progress)
    tensors = TensorPeak(session.env.device, *setup.leaves[0], setup.dout)
    try:
        origin, outs, grads = _iterate(case, setup, session, settings, progress, profile_path, tensors)
    finally:
        for layer_ctx in setup.contexts:
            close_context(layer_ctx)
    return _report(case, setup, session, settings, progress, repeat, origin, outs, grads, tensors)


def _set_up(case: Case, session: RankSession, settings: RunSettings, progress) -> _CaseSetup:
    """The rank's shards, one context per layer, the kernel (compiled, or emulated:auto's) and its pacing check."""
    env, timeline = session.env, session.timeline
    rank, world, device = env.rank, env.world, env.device
    faults = RankFaults(rank=rank, faults=tuple(parse_fault(f) for f in settings.faults), seed=settings.seed,
                        link_model=settings.link_model, ring=tuple(case.ring))  # fmt: skip
    memory_method = reset_peak(device)
    # Every layer's mask as a rule on this sequence; one sharding for all layers (doc-balanced balances their sum).
    rules = layer_rules(case)
    layout = resolve_layout(case.layout, case.seq, world, tuple(rules))
    # This rank's shards only, made on its device from (seed, token chunk): O(S/N) memory, the same global
    # tensors whatever the world size or layout.
    shard = ShardSpec.of(case, seed=settings.seed, rank=rank, layout=layout)
    q0, k0, v0, dout = rank_shards(shard, device=device)  # (B, H, S/N, D) each; k0, v0: (B, KV, S/N, D)
    # Each layer attends over the same tokens through leaves of its own (views, no copies), so its gradients
    # stay apart for the check; autograd runs the layers' backward rings in reverse order.
    leaves = [tuple(t.detach().requires_grad_(case.backward) for t in (q0, k0, v0)) for _ in rules]
    ring = case.ring
    recorder = RunRecorder(rank, ring.index(rank), progress, faults, trace=settings.trace, timeline=timeline)
    kernel = faults.wrap_kernel(get_kernel(case.kernel))
    runtime = Runtime(timeout_s=settings.timeout, recorder=recorder, link_delay=faults.link_delay(), timeline=timeline,
                      loopback=settings.loopback, on_stall=session.on_stall)  # fmt: skip
    spec = AttentionSpec(strategy=case.strategy, placement=ring if case.placement else "heads-first", layout=layout,
                         buffer=case.buffer, order=ring, kernel=kernel)  # fmt: skip
    contexts = [build_context(*leaves[layer], dataclasses.replace(spec, mask=rule, layer=layer), runtime)
                for layer, rule in enumerate(rules)]  # fmt: skip
    if compiles(kernel):  # a JIT kernel compiles here, rank by rank, not inside the first (timed) iterations
        for layer_ctx in contexts:
            warm(layer_ctx, q0, k0)
        session.ops.min_int_after(0, settings.timeout + COMPILE_PATIENCE_S)  # ranks compile for different times
    emulated_gflops = getattr(kernel, "gflops", None)
    if getattr(get_kernel(case.kernel), "auto", False):
        model = auto_model(settings) or measure_rate(session, [case], settings)
        emulated_gflops = model.gflops
        kernel = faults.wrap_kernel(EmulatedKernel(model.gflops, floor_ms=model.floor_ms))
        for layer_ctx in contexts:
            layer_ctx.kernel = kernel
    check_pacing(kernel, contexts, leaves[0][0], settings.timeout, case.backward)
    return _CaseSetup(faults=faults, rules=rules, shard=shard, q0=q0, dout=dout, leaves=leaves, recorder=recorder,
                      kernel=kernel, contexts=contexts, emulated_gflops=emulated_gflops,
                      memory_method=memory_method)  # fmt: skip


def _iterate(case: Case, setup: _CaseSetup, session: RankSession, settings: RunSettings, progress,
             profile_path: Path | None, tensors: TensorPeak):  # fmt: skip
    """Warm-up and timed iterations: (the first timed iteration's origin, the last outputs and gradients). The
    attention's own tensors are counted in the last untimed iteration (ringbench.rank.memory.TensorPeak)."""
    timeline, recorder, kernel, leaves = session.timeline, setup.recorder, setup.kernel, setup.leaves
    rank, ring = session.env.rank, case.ring
    profiled = settings.iters - 1 if profile_path is not None else None
    origin = outs = grads = None
    counted = -1  # with --warmup 0 this one untimed iteration still runs: it counts
    for iteration in range(-max(settings.warmup, 1), settings.iters):
        recorder.iteration = iteration
        if iteration == 0 and hasattr(kernel, "pacer"):
            kernel.pacer.reset_counts()  # count only timed iterations (warm-up pays one-off allocations)
        if progress is not None:
            progress.set_iteration(iteration)
        with _maybe_profile(profile_path if iteration == profiled else None, session.env.device) as capture:
            # The profiler starts before the barrier, so its own start-up cost does not skew the ranks.
            session.ops.barrier()  # every iteration starts together (bounded by the group's timeout)
            recorder.capture = capture
            start = timeline.begin_iteration()
            with capture.iteration(iteration) if capture is not None else contextlib.nullcontext(), \
                    tensors.counting(iteration == counted):  # fmt: skip
                outs = [attention(*leaves[n], context=c) for n, c in enumerate(setup.contexts)]
                fwd_end = timeline.mark()
                if case.backward:
                    flat = torch.autograd.grad(outs, [t for layer in leaves for t in layer], [setup.dout] * len(outs))
                    grads = [flat[3 * n : 3 * n + 3] for n in range(len(outs))]
                end = timeline.mark()
            _settle(setup.contexts, timeline, settings.timeout, rank)
            recorder.capture = None
        if iteration >= 0:
            # Iteration rows are kept even with tracing off: they carry the step times.
            recorder.rows.append(_row(iteration, "fwd", rank, ring, start, fwd_end))
            if case.backward:
                recorder.rows.append(_row(iteration, "bwd", rank, ring, fwd_end, end))
        recorder.finish_iteration()
        if origin is None and iteration >= 0:
            origin = timeline.resolve(start)
        if hasattr(kernel, "settle"):
            kernel.settle()
    return origin, outs, grads


def _report(case: Case, setup: _CaseSetup, session: RankSession, settings: RunSettings, progress, repeat: int,
            origin, outs, grads, tensors: TensorPeak) -> RankReport:  # fmt: skip
    """The float64 check, the rows on the reference clock, and the rank's figures for the parent."""
    device = session.env.device
    peak = peak_mb(device)
    check = None
    if settings.check:
        tick = (lambda chunk: progress.set_step("check", chunk)) if progress is not None else None
        check = check_layers(setup.rules, outs, grads, setup.shard, device, settings.check_budget_s, tick)
    rows = setup.recorder.rows
    clock = _on_reference_clock(rows, session, origin, settings)
    for row in rows:
        row["repeat"] = repeat
        row["case_id"] = case.case_id
    pacer = getattr(setup.kernel, "pacer", None)
    if device.type == "cuda" and session.device_info is not None:  # a cycle rate corrected under load
        session.device_info.update(spin.status(device))
    return RankReport(
        case_id=case.case_id, rank=session.env.rank, rows=rows,
        fwd_err=check.fwd_err if check is not None else math.nan,
        bwd_err=check.bwd_err if check is not None else math.nan, check_note=check.note if check is not None else "",
        errors=check.errors() if check is not None else {},
        nonfinite=nonfinite_tensors(outs, grads) if outs is not None else "",
        **_clock_report(clock, origin), emulated_gflops=setup.emulated_gflops,
        saturated_blocks=pacer.saturated_blocks if pacer is not None else 0,
        paced_blocks=pacer.blocks if pacer is not None else 0, peak_mem_mb=peak, attn_mem_mb=tensors.peak_mb,
        memory_method=setup.memory_method, host=socket.gethostname(), device=str(device),
        device_info=session.device_info or {}, timeline=session.timeline.kind, layout=str(case.layout),
    )  # fmt: skip


def _run_impl_case(case: Case, *, session: RankSession, progress, settings: RunSettings, repeat: int,
                   profile_path: Path | None) -> RankReport:  # fmt: skip
    """Another implementation (ringbench.rank.impls): whole iterations timed on the host, per-step spans from its
    profiler capture (converted in the parent), outputs and gradients checked against float64 like the engine's."""
    from ringbench.rank.impls.rank import run_impl_case

    env = session.env
    if settings.faults:
        raise UsageError(f"impl={case.impl!r} cannot take faults; they act on ringbench's own engine")
    tick = (lambda iteration: progress.set_iteration(iteration)) if progress is not None else None
    result = run_impl_case(
        case.impl, case, rank=env.rank, world=env.world, device=env.device, iters=settings.iters,
        warmup=settings.warmup, seed=settings.seed, check=settings.check, check_budget_s=settings.check_budget_s,
        profile_path=profile_path, before_iteration=tick,
    )  # fmt: skip
    rows = result["rows"]
    origin = min((row["start_ns"] for row in rows), default=0)
    clock = _on_reference_clock(rows, session, origin, settings)
    for row in rows:
        row.update(repeat=repeat, case_id=case.case_id, nccl_ms=float("nan"))
    return RankReport.from_dict(result | {"case_id": case.case_id, **_clock_report(clock, origin),
                                          "host": socket.gethostname(), "device": str(env.device),
                                          "device_info": session.device_info or {}})  # fmt: skip


def _on_reference_clock(rows: list[dict], session: RankSession, origin: int, settings: RunSettings):
    """Put this rank's rows on one time base: rank 0's clock, from the earliest first-iteration start of any rank
    (each rank subtracting its own start would misalign the ranks by their barrier-exit skew). Across hosts the
    offset is measured again now and fitted with the one before the case (offset and drift). Runs after the
    float64 check, whose length differs by rank: its reductions use the patient gloo group, never the main one
    (on NCCL, the main group's timeout and NCCL's watchdog could abort the job while a rank still checks)."""
    patience_s = settings.timeout + 2 * settings.check_budget_s + 60.0
    clock = session.clock
    if clock.hosts > 1:
        session.ops.min_int_after(0, patience_s)  # every rank past its check: the ping-pong runs in step
        after = align_clocks(session.ops)
        clock, session.clock = fit_drift(clock, after), after
    base = session.ops.min_int_after(clock.to_reference(origin), patience_s)
    for row in rows:
        row["start_ns"] = clock.to_reference(row["start_ns"]) - base
        row["end_ns"] = clock.to_reference(row["end_ns"]) - base
    return clock


def _clock_report(clock, origin: int) -> dict:
    return {"clock_offset_ns": clock.offset_at(origin), "clock_residual_ns": clock.bound_ns,
            "clock_method": clock.method, "clock_drift_ppm": round(clock.drift * 1e6, 3)}  # fmt: skip


def auto_model(settings: RunSettings) -> AutoModel | None:
    """The run's emulated:auto model when it is already calibrated (None: calibrate)."""
    if settings.emulated_auto_gflops is None:
        return None
    return AutoModel(settings.emulated_auto_gflops, settings.emulated_auto_floor_ms)


def calibration_worker(worker_ctx, cases: list[Case], settings: RunSettings) -> AutoModel | None:
    """Entry point inside each local rank of the calibration launch (ringbench.run.sweep)."""
    return measure_rate(open_session(worker_ctx.env), cases, settings)


def _settle(contexts, timeline, timeout_s: float, rank: int) -> None:
    """After the loop: wait, bounded, for the iteration's transfers and marks; name what never completed."""
    for ctx in contexts if isinstance(contexts, list) else [contexts]:
        for comm in ctx.comms() if hasattr(ctx, "comms") else [ctx.comm]:  # a strategy's: its set of communicators
            comm.settle(timeout_s)
    if timeline.settle(timeout_s):
        raise RingStall(f"rank {rank}: the device did not finish the iteration within {timeout_s:g} s")


@contextlib.contextmanager
def _maybe_profile(path: Path | None, device):
    if path is None:
        yield None
        return
    from ringbench.rank.profiling import ProfileCapture

    with ProfileCapture(path, device) as capture:
        yield capture


def _row(iteration, phase, rank, ring, start, end) -> dict:
    return {
        "iteration": iteration, "phase": phase, "rank": rank, "ring_position": ring.index(rank), "step": -1,
        "kind": "iteration", "start_ns": start, "end_ns": end, "src": rank, "dst": rank, "bytes": 0,
        "block": -1, "pair": "", "flops": 0.0, "nccl_ms": None, "layer": 0,
    }  # fmt: skip


def rank_worker(worker_ctx, cases: list[tuple[int, Case]], settings: RunSettings, repeat: int) -> int:
    """Entry point inside each local rank: run the cases, streaming each result to the parent."""
    session = open_session(worker_ctx.env, on_stall=worker_ctx.abort)
    stored = 0
    if settings.calibrate_auto and settings.emulated_auto_gflops is None:
        model = measure_rate(session, [case for _, case in cases], settings)
        settings = with_auto_model(settings, model)
        worker_ctx.send({"emulated_auto_gflops": settings.emulated_auto_gflops,
                         "emulated_auto_floor_ms": settings.emulated_auto_floor_ms, "rank": session.env.rank})  # fmt: skip
        stored = 1
    for done, (index, case) in enumerate(cases, start=stored):
        worker_ctx.wait_stored(done)  # the parent stores the previous case before we time the next one
        result = run_case(case, session=session, progress=worker_ctx.progress, settings=settings,
                          case_index=index, repeat=repeat, profile_path=profile_path(settings, case, repeat,
                                                                                     session.env.rank))  # fmt: skip
        worker_ctx.send(result)
    return len(cases)


def with_auto_model(settings: RunSettings, model: AutoModel | None) -> RunSettings:
    """``settings`` running emulated:auto at ``model`` (unchanged without one)."""
    if model is None:
        return settings
    return dataclasses.replace(settings, emulated_auto_gflops=model.gflops, emulated_auto_floor_ms=model.floor_ms)


def profile_path(settings: RunSettings, case: Case, repeat: int, rank: int) -> Path | None:
    """Where this rank's profiler capture of the case goes (None when not profiling). Another implementation's
    case is always captured when tracing: its per-step spans come from the capture."""
    folder = settings.profile_dir
    if not folder or (case.impl == "ringbench" and not settings.profile):
        return None
    return Path(folder) / case.case_id / f"r{repeat}-rank{rank}.json.gz"


__all__ = ["RankSession", "RunRecorder", "RunSettings", "open_session", "rank_worker", "run_case"]
