"""The simulated timeline of one case: every iteration, every phase, every ring step, and the critical paths.

Iterations are simulated together, each on its own clock from its start (every rank starts an iteration after a
barrier, at the spread of barrier exits the costs carry), then laid end to end with the barrier's gap.

What is kept depends on the size (docs/simulate.md, "Events at scale"):
  full     every step's cells (small rings): the events table holds every span, the walk reads them directly
  bounded  the cells of a few positions (``keep``) on some steps, and a checkpoint of the whole ring's state
           every ``every`` steps, from which the walk re-runs a window around the critical path
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ringbench.simulate.case import Cluster, SimCase, phase_models, start_skew
from ringbench.simulate.costs import Costs
from ringbench.simulate.fastring import lean_advance
from ringbench.simulate.phase_ring import Exchange, PhaseEngine, PhaseModel, State, StepCells, Window
from ringbench.simulate.walk import FullSource, PathResult, RecomputeSource, walk

PROFILE_POINTS = 256  # per-step aggregates kept per phase (every k-th step)


@dataclass(kw_only=True, slots=True)
class Collective:
    """The all-gather baseline's collective of one phase: post and end per (iteration, position)."""

    phase: str
    step: int
    post: np.ndarray
    end: np.ndarray
    nbytes: int


@dataclass(kw_only=True)
class Timeline:
    """What the simulation of one case produced (times in ms from each iteration's first start)."""

    case: SimCase
    models: dict[str, PhaseModel]
    phase_start: dict[str, np.ndarray]
    """(G, N) per phase."""
    phase_end: dict[str, np.ndarray]
    full: dict[str, list[StepCells]] | None = None
    """Every step's cells per phase (the backward's final dK/dV wait as an extra step), or None (bounded)."""
    kept: dict[str, list[tuple[np.ndarray, StepCells]]] = field(default_factory=dict)
    """Bounded: per phase, (window positions, cells) of the kept positions and their successors."""
    keep: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Positions whose spans the bounded record keeps."""
    collectives: list[Collective] = field(default_factory=list)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1))
    """(G,) start of each iteration on the run's clock, ms."""
    paths: list[PathResult] = field(default_factory=list)
    path_rows: list[list[tuple]] = field(default_factory=list)
    """Bounded: per iteration, the critical path's spans (walk.walk's rows)."""
    profile: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    """Per phase: step, and min / mean / max over ranks of the step's end (ms), on sampled steps."""

    @property
    def iteration_ms(self) -> np.ndarray:
        """(G,) last end - first start of each iteration (the record's step time)."""
        last = self.phase_end[self.case.phases[-1]]
        return last.max(axis=1) - self.phase_start[self.case.phases[0]].min(axis=1)


def _steps_per_phase(model: PhaseModel) -> int:
    """Ring steps, plus one pseudo-step for the backward's final dK/dV wait with double buffering."""
    final = model.two_exchanges and model.buffer == "double" and model.dkv_posts is None
    return model.n_steps + int(final)


def _final_cells(step: int, end: np.ndarray, last: Exchange) -> StepCells:
    zero = np.zeros_like(end)
    return StepCells(step, end, end, zero, [last], last.wait_end, None)


def _profile(profile: dict[str, list[float]], step: int, start: np.ndarray, end: np.ndarray) -> None:
    spent = end - start  # (G, N): the step's length on each rank
    profile["step"].append(step)
    for name, reduce in (("min_ms", np.min), ("mean_ms", np.mean), ("max_ms", np.max)):
        profile[name].append(float(reduce(spent)))


def _slowest_hop_ms(lane) -> float:
    return float((lane.transfer_ms + (0 if lane.delay_ms is None else lane.delay_ms)).max())


def _collective(phase: str, step: int, post: np.ndarray, ms: float, nbytes: int) -> Collective:
    """A collective ends for everyone ``ms`` after its last rank joined."""
    end = np.broadcast_to(post.max(axis=1, keepdims=True) + ms, post.shape).copy()  # (G, N)
    return Collective(phase=phase, step=step, post=post, end=end, nbytes=nbytes)


def _allgather_phase(model: PhaseModel, origin: np.ndarray, out: Timeline) -> tuple[np.ndarray, list[StepCells]]:
    """The all-gather baseline: gather every K/V block, compute the ring's steps locally, (backward) all-reduce.

    Ring algorithms: an all-gather moves N - 1 blocks over the slowest hop, an all-reduce 2 (N - 1) shares.
    """
    world = model.world
    window = Window.ring(world, origin.shape[0])
    kv = model.lanes["kv"]
    gather = _collective(model.phase, 0, origin + model.enter_ms, (world - 1) * _slowest_hop_ms(kv),
                         kv.nbytes * (world - 1))  # fmt: skip
    out.collectives.append(gather)
    t = gather.end
    cells = []
    if model.gathered_ms is not None:  # one call per rank over the gathered keys
        start = t + model.pre_ms
        compute = np.broadcast_to(model.gathered_ms[None, :], t.shape)
        cells.append(StepCells(0, t, start, compute, [], start + compute, None))
        t = start + compute
    for step in range(world if model.gathered_ms is None else 0):
        compute = np.broadcast_to(model.compute(step, window), t.shape)
        start = t + model.pre_ms
        cells.append(StepCells(step, t, start, compute, [], start + compute, model.classes(step, window)))
        t = start + compute
    if model.phase == "bwd" and world > 1:
        dkv = model.lanes.get("dkv", kv)
        reduce = _collective("bwd", world - 1, t + model.mid_ms, 2 * (world - 1) * _slowest_hop_ms(dkv),
                             dkv.nbytes * world)  # fmt: skip
        out.collectives.append(reduce)
        t = reduce.end
    return t + model.post_ms, cells


@dataclass(frozen=True, kw_only=True, slots=True)
class _Kept:
    """What a bounded simulation keeps: the cells of a few positions on some steps."""

    keep: np.ndarray
    """Positions whose spans are kept."""
    take: np.ndarray
    """``keep`` and their neighbours on the ring (the cells stored with them)."""
    window: Window
    """The positions advanced beside the lean whole-ring pass to give ``take``'s cells."""
    columns: np.ndarray
    """``take``'s columns in ``window``."""
    wanted: np.ndarray
    """(N + 1,) bool per step (the last: the backward's final dK/dV wait): whether its cells are kept."""

    @classmethod
    def of(cls, world: int, iterations: int, keep: np.ndarray | None, keep_steps: np.ndarray | None) -> _Kept:
        keep = np.unique(np.asarray(keep if keep is not None else [], dtype=np.int64) % world)
        take = np.unique(np.concatenate([keep, (keep + 1) % world, (keep - 1) % world]))
        # The kept positions' cells come from a small window around them (3 positions each side: exact for
        # one step of up to two exchanges, and the successor's landing), run beside the lean whole-ring pass.
        around = np.unique((take[:, None] + np.arange(-3, 4)[None, :]).ravel() % world)
        window = Window(positions=around, iterations=np.arange(iterations), world=world, full=False)
        wanted = np.zeros(world + 1, bool)
        wanted[np.asarray(keep_steps if keep_steps is not None else np.arange(world + 1))] = True
        return cls(keep=keep, take=take, window=window, columns=np.searchsorted(around, take), wanted=wanted)


def simulate_timeline(case: SimCase, costs: Costs, cluster: Cluster | None = None, *, bounded: bool = False,
                      keep: np.ndarray | None = None, keep_steps: np.ndarray | None = None,
                      every: int | None = None, models: dict[str, PhaseModel] | None = None) -> Timeline:  # fmt: skip
    """Simulate ``case``; ``bounded`` keeps the cells of ``keep`` positions on ``keep_steps`` steps only.
    ``models``: the engine's input when already built (otherwise from the case, costs and cluster)."""
    cluster = cluster or Cluster()
    rng = np.random.default_rng([case.seed, 7])
    models = models or phase_models(case, costs, cluster, rng)
    origin = start_skew(case, costs, rng)
    out = Timeline(case=case, models=models, phase_start={}, phase_end={}, full=None if bounded else {})
    window = Window.ring(case.world, case.iterations)
    every = every or max(16, math.ceil(case.world / 256))
    kept = _Kept.of(case.world, case.iterations, keep, keep_steps) if bounded else None
    if kept is not None:
        out.keep = kept.keep
    checkpoints: dict[str, dict[int, State]] = {}
    finals: dict[str, StepCells | None] = {}
    engines = {phase: PhaseEngine(model) for phase, model in models.items()}
    for phase, model in models.items():
        out.phase_start[phase] = origin
        if case.buffer == "allgather":
            end, cells = _allgather_phase(model, origin, out)
            if kept is not None:
                cells = [(kept.take, _take_cells(c, kept.take)) for c in cells if kept.wanted[c.step]]
            _record_phase(out, phase, np.broadcast_to(end, origin.shape).copy(), cells, _new_profile())
        else:
            end, cells, profile, checkpoints[phase], finals[phase] = _ring_phase(engines[phase], origin, window,
                                                                                 kept, every)  # fmt: skip
            _record_phase(out, phase, end, cells, profile)
        origin = out.phase_end[phase]
    out.offsets = np.concatenate([[0.0], np.cumsum(out.iteration_ms + costs.gap_ms)[:-1]])
    if case.buffer == "allgather":
        out.paths = [_allgather_path(out, g) for g in range(case.iterations)]
        out.path_rows = [[] for _ in range(case.iterations)]
    else:
        source = RecomputeSource(engines, checkpoints, finals, case.world, every) if bounded else FullSource(
            out.full, case.world)  # fmt: skip
        _walk_paths(out, source, bounded)
    return out


def _new_profile() -> dict[str, list[float]]:
    return {"step": [], "min_ms": [], "mean_ms": [], "max_ms": []}


def _record_phase(out: Timeline, phase: str, end: np.ndarray, cells: list, profile: dict[str, list[float]]) -> None:
    """Store one phase's end, its cells (every step's, or the kept positions') and its step profile."""
    if out.full is not None:
        out.full[phase] = cells
    else:
        out.kept[phase] = cells
    out.phase_end[phase] = end
    out.profile[phase] = profile


def _ring_phase(engine: PhaseEngine, origin: np.ndarray, window: Window, kept: _Kept | None, every: int
                ) -> tuple[np.ndarray, list, dict[str, list[float]], dict[int, State], StepCells | None]:  # fmt: skip
    """Run one ring phase from ``origin`` over every step: the end, the cells (every step's; bounded: the kept
    positions' on the wanted steps), the step profile, the checkpoints (bounded: the ring's state every ``every``
    steps) and the backward's final dK/dV wait (None when there is none)."""
    model = engine.model
    stride = max(1, math.ceil(model.world / PROFILE_POINTS))
    profile = _new_profile()
    state = engine.begin(origin)
    lean = lean_advance(engine, window) if kept is not None else None  # the compiled whole-ring pass (fastring.py)
    cells_out: list = []  # every step's cells, or (kept.take, cells) of the kept positions
    checkpoints: dict[int, State] = {}
    for step in range(model.n_steps):
        if kept is not None and step % every == 0:
            checkpoints[step] = _copy_state(state)
        if kept is not None and kept.wanted[step]:
            cells = engine.advance(state.take(kept.window.positions), step, kept.window)
            cells_out.append((kept.take, _take_cells(cells, kept.columns)))
        before = state.start
        if lean is not None:
            cells = lean(state, step)
        else:
            cells = engine.advance(state, step, window, record=kept is None)
        if step % stride == 0:
            _profile(profile, step, before, state.start)
        if kept is None:
            cells_out.append(cells)
    end, last = engine.finish(state)
    final = _final_cells(model.n_steps, end, last) if last is not None else None
    if final is not None:
        if kept is None:
            cells_out.append(final)
        elif kept.wanted[model.n_steps]:
            cells_out.append((kept.take, _take_cells(final, kept.take)))
    return end, cells_out, profile, checkpoints, final


def _walk_paths(out: Timeline, source: FullSource | RecomputeSource, bounded: bool) -> None:
    """Every iteration's critical path (bounded: with its spans, re-run from the checkpoints)."""
    phases = list(out.case.phases)
    steps = {phase: _steps_per_phase(out.models[phase]) for phase in phases}
    directions = {phase: out.models[phase].direction for phase in phases}
    for g in range(out.case.iterations):
        rows: list[tuple] | None = [] if bounded else None
        out.paths.append(walk(source, phases, out.phase_end, out.phase_start[phases[0]], g, out.case.world, steps,
                              rows, directions=directions))  # fmt: skip
        out.path_rows.append(rows or [])


def _allgather_path(out: Timeline, g: int) -> PathResult:
    """Every collective ends when its last rank joined: the part after that is exposed."""
    exposed = sum(float(c.end[g].max() - c.post[g].max()) for c in out.collectives)
    return PathResult(path_ms=float(out.iteration_ms[g]), exposed_ms=exposed)


def _copy_state(state: State) -> State:
    pending = state.pending
    if pending is not None:
        pending = Exchange(pending.lane, pending.step, *(np.array(getattr(pending, name)) for name in
                           ("post", "start", "landed", "recv", "in_hand")))  # fmt: skip
    last = None if state.last_recv is None else np.array(state.last_recv)
    return State(start=np.array(state.start), last_recv=last, pending=pending)


def _take_cells(cells: StepCells, index: np.ndarray) -> StepCells:
    """The cells of positions ``index`` (columns of every (G, N) array)."""

    def pick(array):
        return None if array is None else np.asarray(array)[..., index]

    exchanges = []
    for ex in cells.exchanges:
        taken = Exchange(ex.lane, ex.step, *(pick(getattr(ex, name)) for name in
                         ("post", "start", "landed", "recv", "in_hand")))  # fmt: skip
        taken.wait_start, taken.wait_end = pick(ex.wait_start), pick(ex.wait_end)
        exchanges.append(taken)
    return StepCells(cells.step, pick(cells.start), pick(cells.compute_start), pick(cells.compute_ms), exchanges,
                     pick(cells.end), pick(cells.greater))  # fmt: skip
