"""Strategies beyond one ring in the simulator: Ulysses, the hybrid and the double ring, step by step.

Each follows its engine module (ringbench/engine/ulysses.py, double_ring.py) with the simulator's own pieces: the
ring engine (phase_ring.PhaseEngine) runs every sub-ring -- the hybrid's rings across groups, each double-ring
rotation's inner rings -- as rows of one vectorised pass, with a block compute per (row, position, step) taken from
the pair classes of the mask plan (plans.py), and the all-to-alls and the double ring's outer exchanges are priced
here, pair by pair, with the same rules as the ring's exchanges:

  a pair's transfer starts when both ends posted, lands after the local transfer of its bytes (a rank's chunks of
  one all-to-all share its port), and is received after its link's delay (emulated links: what the run injects,
  ringbench.scenario.faults with the exchange's flows; real links: latency + bytes / (bandwidth / share));
  a rank's wait ends when every chunk it receives and every chunk it sends is done.

Compute of a block made of several ranks' shards: the sum over its (query member, key member) pairs of the pair's
kernel work at its class's rate (for H/U heads: 1/U of it) and one call per kernel call of ringbench.engine.groups
.block_plan (the pairs' count beyond 16 members). Host overheads: the ring's calibrated gaps, per sub-ring step;
an all-to-all costs one ``pre`` gap.

Predicted exposed communication: per iteration, the step time less the busiest rank's compute (the time it could
not have spent computing); the ring's walk of the critical path (walk.py) is not run for these strategies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ringbench.engine.groups import Groups, block_plan
from ringbench.orders import parse_placement
from ringbench.simulate.costs import Costs
from ringbench.simulate.flows import Prices
from ringbench.simulate.phase_ring import Lane, Noise, PhaseEngine, PhaseModel, Window
from ringbench.vocab import Layout, Mask, Strategy

STATS_BYTES = {"float64": 8}  # accumulators: fp64 for fp64 inputs, else fp32
EXACT_CALLS = 16  # members per group up to which kernel calls are counted from the block plan


@dataclass(kw_only=True, slots=True)
class BlockPhaseModel(PhaseModel):
    """A PhaseModel whose compute per (row, position) at each step comes from a table, not from three classes."""

    step_compute: object = None  # step -> (G, W) compute ms (call overheads included)
    step_work: object = None  # step -> (G, W) the arithmetic part (what a slow rank stretches)

    def compute(self, step, window, out=None):
        return self.step_compute(step)

    def classes(self, step, window):
        return None


@dataclass(kw_only=True)
class StrategyTimeline:
    """One simulated strategy case: per phase the start and end of every rank, per iteration (ms)."""

    phase_start: dict[str, np.ndarray]
    phase_end: dict[str, np.ndarray]
    compute_ms: np.ndarray  # (G, N) each rank's compute per iteration
    bytes_by_class: dict[str, float] = field(default_factory=dict)  # link class -> bytes per iteration, all ranks
    notes: list[str] = field(default_factory=list)

    @property
    def iteration_ms(self) -> np.ndarray:
        last = self.phase_end["bwd" if "bwd" in self.phase_end else "fwd"]
        return last.max(axis=1) - self.phase_start["fwd"].min(axis=1)

    @property
    def exposed_ms(self) -> np.ndarray:
        return np.clip(self.iteration_ms - self.compute_ms.max(axis=1), 0.0, None)


# -- compute of blocks --------------------------------------------------------------------------------------------
def _pair_costs(case, costs: Costs, phase: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute ms, work ms, kernel calls) of one (q rank, k rank) pair at full heads, per class LESS/EQUAL/GREATER."""
    from ringbench.simulate.case import class_compute

    total, work = class_compute(case, costs, phase)
    calls = np.array([len(c.blocks) for c in case.classes().classes], dtype=float)
    return total - calls * costs.call_ms.get(phase, 0.0), work, calls


def _twin_table(case, costs: Costs, phase: str, count: int, heads_share: float) -> tuple[np.ndarray, np.ndarray]:
    """(R, R) compute and work ms of a ring of R = ``count`` groups on the whole sequence with 1/U of the heads:
    how USP runs the hybrid on a GPU (the group's all-to-all gathers its members' tokens; the ring across groups
    has the layout's own R-rank blocks, one kernel call each), priced by the catalogue's kernel (``costs.kernel``)."""
    from ringbench.simulate.case import block_ms

    twin = _ring_twin(case, count)
    classes = twin.classes()
    heads = case.heads * heads_share
    total = np.zeros(len(classes.classes))
    work = np.zeros(len(classes.classes))
    for index, pair in enumerate(classes.classes):
        for block in pair.blocks:
            total[index] += block_ms(twin, costs, phase, block, heads=heads)
            work[index] += block_ms(twin, costs, phase, block, arithmetic=True, heads=heads)
    q, k = np.meshgrid(np.arange(count), np.arange(count), indexing="ij")
    cls = classes.classify(q, k)
    return total[cls], work[cls]


def _ring_twin(case, count: int):
    """The case as a plain ring of ``count`` ranks (same sequence, mask, layout and documents)."""
    return case.replace(world=count, strategy="ring", placement="", order="identity", faults=(),
                   buffer="double" if case.buffer not in ("sync", "double") else case.buffer)  # fmt: skip


def _block_table(case, costs: Costs, phase: str, q_groups: list, k_groups: list, heads_share: float):
    """(G_q, G_k) compute ms and work ms of each query group's block against each key group's block."""
    if costs.kernel is not None and case.gflops is None and len(q_groups) == len(k_groups):
        return _twin_table(case, costs, phase, len(q_groups), heads_share)
    arithmetic, work, _ = _pair_costs(case, costs, phase)
    call_ms = costs.call_ms.get(phase, 0.0)
    q = np.array(q_groups)  # (Gq, M) ranks
    k = np.array(k_groups)  # (Gk, M)
    cls = (np.sign(k[None, :, None, :] - q[:, None, :, None]) + 1).astype(np.int64)  # (Gq, Gk, M, M)
    arith = arithmetic[cls].sum(axis=(2, 3)) * heads_share
    worked = work[cls].sum(axis=(2, 3)) * heads_share
    calls = np.zeros(arith.shape)
    if q.shape[1] <= EXACT_CALLS and len(q) * len(k) <= 1024:
        mask, layout = Mask.parse(case.mask), Layout.parse(case.layout)
        for a in range(len(q)):
            for b in range(len(k)):
                calls[a, b] = len(block_plan(mask, layout, case.seq, case.world, tuple(q[a].tolist()),
                                             tuple(k[b].tolist())).blocks)  # fmt: skip
    else:
        calls = _pair_costs(case, costs, phase)[2][cls].sum(axis=(2, 3))
    return arith + calls * call_ms, worked


# -- exchanges -------------------------------------------------------------------------------------------------
def _all_to_all(post: np.ndarray, groups: Groups, nbytes: float, prices: Prices, host_ms: float) -> np.ndarray:
    """Every group's all-to-all posted at ``post`` (G, N) per rank: when each rank's wait ends (G, N)."""
    if groups.size == 1:
        return post + host_ms
    flows = _alltoall_flows(groups)
    src, dst = flows
    transfer, delay = prices.price(flows, nbytes, flows, port=groups.size - 1, alltoall=True)
    prices.count(flows, nbytes)
    # the layout copies before and after the exchange: the rank's whole tensor (its chunk to every member)
    host_ms = host_ms + prices.costs.transpose_ms_per_mib * nbytes * groups.size / 2**20
    landed = np.maximum(post[:, src], post[:, dst]) + host_ms + transfer  # (G, F)
    done = post + host_ms
    _max_into(done, dst, landed + delay)  # every chunk received ...
    _max_into(done, src, landed)  # ... and every chunk sent
    return done


_FLOWS: dict[int, tuple] = {}


def _alltoall_flows(groups: Groups) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) arrays of every ordered pair inside every group (kept for the groups of one case)."""
    found = _FLOWS.get(id(groups))
    if found is not None and found[0] is groups:
        return found[1]
    members = np.array(groups.all_groups(), dtype=np.int64)  # (R, U)
    size = members.shape[1]
    a, b = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    keep = a != b
    flows = (members[:, a[keep]].ravel(), members[:, b[keep]].ravel())
    _FLOWS.clear()
    _FLOWS[id(groups)] = (groups, flows)
    return flows


def _max_into(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """target[:, index[f]] = max(target[:, index[f]], values[:, f]) over every f (np.maximum.at, sorted)."""
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    starts = np.flatnonzero(np.r_[True, sorted_index[1:] != sorted_index[:-1]])
    best = np.maximum.reduceat(values[:, order], starts, axis=1)
    columns = sorted_index[starts]
    target[:, columns] = np.maximum(target[:, columns], best)


class RingExchange:
    """One exchange on a set of rings (each rank to its ring successor), priced once: ``__call__(post)`` gives
    every rank's in-hand time for an exchange posted at ``post`` (G, N), and counts its bytes.

    ``hops``: a (G, N) array shared by the exchanges over the same hops (the double ring's outer K/V and dK/dV):
    when each rank's incoming hop is next free. Blocks over one hop take turns, as on a real link and as emulated
    links hold them (ringbench.engine.comm.LinkClock): the dK/dV of one rotation and the K/V posted for a later one
    do not cross one hop in the time of one."""

    def __init__(self, rings: list[list[int]], nbytes: float, prices: Prices, flows, hops=None) -> None:
        self.hops = hops
        hops = [(ring[p - 1], ring[p], ring[(p + 1) % len(ring)]) for ring in rings if len(ring) > 1
                for p in range(len(ring))]  # fmt: skip
        self.prices, self.nbytes = prices, nbytes
        self.empty = not hops
        if self.empty:
            return
        self.prev, self.rank, self.succ = (np.array(column) for column in zip(*hops, strict=True))
        self.t_in, self.d_in = prices.price((self.prev, self.rank), nbytes, flows)
        self.t_out, _ = prices.price((self.rank, self.succ), nbytes, flows)
        self.pairs = (self.prev, self.rank)

    def __call__(self, post: np.ndarray) -> np.ndarray:
        in_hand = post.copy()
        if self.empty:
            return in_hand
        self.prices.count(self.pairs, self.nbytes)
        start = np.maximum(post[:, self.prev], post[:, self.rank])
        if self.hops is None:
            recv = start + self.t_in + self.d_in
        elif self.d_in.any():  # emulated: the local transfer lands, then the hop's delay in its turn
            recv = np.maximum(start + self.t_in, self.hops[:, self.rank]) + self.d_in
        else:
            recv = np.maximum(start, self.hops[:, self.rank]) + self.t_in
        if self.hops is not None:
            self.hops[:, self.rank] = recv
        sent = np.maximum(post[:, self.rank], post[:, self.succ]) + self.t_out
        in_hand[:, self.rank] = np.maximum(recv, sent)
        return in_hand


# -- sub-rings on the ring engine ---------------------------------------------------------------------------------
def _ring_lanes(case, rings: list[list[int]], lanes: dict[str, float], prices: Prices, flows, iterations: int):
    """Lanes of a set of equally long rings as rows: (G * rows, W) transfer and delay per receiving position."""
    width = len(rings[0])
    pairs = [(ring[p - 1], ring[p]) for ring in rings for p in range(width)]
    out = {}
    for name, nbytes in lanes.items():
        if width > 1:
            transfer, delay = (v.reshape(len(rings), width) for v in prices.price(pairs, nbytes, flows))
        else:
            transfer = delay = np.zeros((len(rings), width))
        lane = Lane(name=name, nbytes=int(nbytes), transfer_ms=np.zeros(width))
        lane.transfer_ms = np.tile(transfer, (iterations, 1))  # rows: iteration-major
        lane.uniform_ms = None
        lane.delay_ms = np.tile(delay, (iterations, 1)) if delay.any() else None
        out[name] = lane
    return out


def _count_ring(prices: Prices, rings: list[list[int]], lanes: dict, times: int = 1) -> None:
    """``times`` passes of the ring loops: W - 1 K/V messages per hop, and in the backward W dK/dV ones."""
    width = len(rings[0])
    if width < 2:
        return
    hops = [(ring[p - 1], ring[p]) for ring in rings for p in range(width)]
    for name, lane in lanes.items():
        prices.count(hops, lane.nbytes, times * (width - 1 if name == "kv" else width))


class RingLoops:
    """The ring loops of one phase on rows of ``width`` positions, built once and run for every rotation (the
    double ring runs N / W of them per phase: the model, its engine and their buffers are reused)."""

    def __init__(self, case, costs: Costs, phase: str, lanes, width: int) -> None:
        host = costs.host(phase, "sync" if case.buffer == "sync" else "double")
        self.model = BlockPhaseModel(phase=phase, buffer="sync" if case.buffer == "sync" else "double",
                                     ring=np.arange(width), compute_ms=np.zeros(3), work_ms=np.zeros(3), slow=None,
                                     lanes=lanes, enter_ms=host["enter_ms"], pre_ms=host["pre_ms"],
                                     mid_ms=host["mid_ms"], post_ms=host["post_ms"],
                                     overlap_penalty=costs.overlap_penalty)  # fmt: skip
        self.engine = PhaseEngine(self.model)
        self.width = width
        self._windows: dict[int, Window] = {}

    def run(self, origin: np.ndarray, step_compute, noise: Noise) -> tuple[np.ndarray, np.ndarray]:
        """Every step from ``origin`` (rows, W): (end, compute spent per cell)."""
        model, engine = self.model, self.engine
        model.step_compute, model.noise = step_compute, noise
        window = self._windows.get(origin.shape[0])
        if window is None:
            window = self._windows[origin.shape[0]] = Window.ring(self.width, origin.shape[0])
        state = engine.begin(origin)
        spent = np.zeros(origin.shape)
        for step in range(self.width):
            spent += model.compute(step, window)
            engine.advance(state, step, window, record=False)
        end, _ = engine.finish(state)
        return end, spent


def _run_rings(case, costs: Costs, phase: str, origin: np.ndarray, step_compute, step_work, lanes, width: int,
               noise: Noise) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Run one phase of the ring loops on rows of ``width`` positions from ``origin`` (rows, W): (end, compute)."""
    return RingLoops(case, costs, phase, lanes, width).run(origin, step_compute, noise)


def _bytes(case, degree: int = 1) -> dict[str, float]:
    """Per rank: its Q shard, its K+V shard (kv heads; repeated up to a Ulysses ``degree`` above their count), and
    an accumulator's bytes per element."""
    from ringbench.simulate.case import DTYPE_BYTES

    local = case.seq // case.world
    size = DTYPE_BYTES[case.dtype]
    kv_heads = max(getattr(case, "kv_heads", 0) or case.heads, degree)
    per_head = case.batch * local * case.head_dim
    return {"q": per_head * case.heads * size, "kv": 2 * per_head * kv_heads * size,
            "acc": STATS_BYTES.get(case.dtype, 4) / size}  # fmt: skip


def simulate_strategy(case, costs: Costs, cluster) -> StrategyTimeline:
    """Simulate ``case`` (a SimCase whose ``strategy`` is ulysses, hybrid:U or double-ring:W)."""
    strategy = Strategy.parse(case.strategy)
    world = case.world
    size = strategy.group_size(world)
    groups = Groups(tuple(parse_placement(case.placement or "heads-first", world, size)), size)
    prices = Prices(costs, cluster)
    rng = np.random.default_rng([case.seed, 11])
    iterations = case.iterations
    origin = _start_skew(case, costs, rng)
    if strategy.kind == "double-ring":
        timeline = _double_ring(case, costs, groups, prices, origin, rng)
    else:
        timeline = _hybrid(case, costs, groups, prices, origin, rng)
    timeline.bytes_by_class = {k: v / max(iterations, 1) for k, v in prices.bytes_by_class.items()}
    return timeline


def _start_skew(case, costs: Costs, rng) -> np.ndarray:
    from ringbench.simulate.case import start_skew

    return start_skew(case, costs, rng)


def _noise(case, costs: Costs, rng, rows: int, width: int) -> Noise:
    if not (costs.compute_cv or costs.link_cv or costs.compute_noise or costs.link_noise):
        return _QUIET  # no pool to draw from: the engine reads none
    return Noise.build(rng, rows * width, width + 1, costs.compute_cv, costs.link_cv, 0.0,
                       {"compute": costs.compute_noise, "link": costs.link_noise})  # fmt: skip


_QUIET = Noise()


def _hybrid(case, costs: Costs, groups: Groups, prices: Prices, origin: np.ndarray, rng) -> StrategyTimeline:
    """Ulysses inside the groups, a ring across them; fwd and (with backward) bwd."""
    b = _bytes(case, groups.size)
    size, count, world = groups.size, groups.count, groups.world
    iterations = case.iterations
    members = groups.all_groups()
    rings = [[members[g][i] for g in range(count)] for i in range(size)]  # rows: ring i, positions: group g
    ranks = np.array(rings)  # (U, R)
    pre = {phase: costs.host(phase, "sync" if case.buffer == "sync" else "double")["pre_ms"] for phase in
           ("fwd", "bwd")}  # fmt: skip
    lanes_bytes = {"kv": b["kv"]}
    if case.backward:
        lanes_bytes["dkv"] = b["kv"] * b["acc"]
    lanes = _ring_lanes(case, rings, lanes_bytes, prices, groups.cross_flows(), iterations)
    starts, ends = {}, {}
    compute = np.zeros((iterations, world))
    t = origin
    for phase in case.phases:
        starts[phase] = t
        into = (b["q"] + b["kv"]) / size if phase == "fwd" else b["q"] / size  # qkv / dout per pair
        back = b["q"] / size if phase == "fwd" else (b["q"] + b["kv"]) / size  # out / dqkv per pair
        overhead = costs.strategy_ms.get("ulysses" if count == 1 else "hybrid", 0.0)  # per all-to-all (fitted)
        arrived = _all_to_all(t, groups, into, prices, pre[phase] + overhead)
        table, _ = _block_table(case, costs, phase, members, members, 1.0 / size)  # (R, R)

        def step_compute(step, table=table, positions=np.arange(count)):
            owner = (positions - step) % count
            return np.tile(table[positions, owner][None, :], (iterations * size, 1))  # (G*U, R)

        origin_rows = arrived[:, ranks].reshape(iterations * size, count)
        phase_lanes = {k: v for k, v in lanes.items() if k == "kv" or phase == "bwd"}
        _count_ring(prices, rings, phase_lanes)
        ring_end, spent = _run_rings(case, costs, phase, origin_rows, step_compute, None, phase_lanes, count,
                                     _noise(case, costs, rng, iterations * size, count))  # fmt: skip
        done = np.empty((iterations, world))
        done[:, ranks.ravel()] = ring_end.reshape(iterations, size * count)
        compute[:, ranks.ravel()] += spent.reshape(iterations, size * count)
        t = _all_to_all(done, groups, back, prices, pre[phase] + overhead)
        ends[phase] = t
    return StrategyTimeline(phase_start=starts, phase_end=ends, compute_ms=compute)


def _double_ring(case, costs: Costs, groups: Groups, prices: Prices, origin: np.ndarray, rng) -> StrategyTimeline:
    """Inner rotations on the ring engine (rows: groups), the outer ring's exchanges between them."""
    b = _bytes(case)
    width, count, world = groups.size, groups.count, groups.world
    iterations = case.iterations
    members = np.array(groups.all_groups())  # (R, W) rank of (group g, index j)
    sync = case.buffer == "sync"
    inner = [list(m) for m in members]
    outer_rings = [list(members[:, j]) for j in range(width)]
    inner_flows, outer_flows = groups.inner_flows(), groups.cross_flows()
    lanes_bytes = {"kv": b["kv"]}
    if case.backward:
        lanes_bytes["dkv"] = b["kv"] * b["acc"]
    lanes = _ring_lanes(case, inner, lanes_bytes, prices, inner_flows, iterations)
    outer_hops = np.full((iterations, world), -np.inf)  # when each rank's outer hop is next free (taken in turn)
    outer_kv = RingExchange(outer_rings, b["kv"], prices, outer_flows, outer_hops)
    outer_dkv = RingExchange(outer_rings, b["kv"] * b["acc"], prices, outer_flows, outer_hops)
    starts, ends = {}, {}
    compute = np.zeros((iterations, world))
    rows = iterations * count
    flat = members.ravel()

    def per_rank(cells: np.ndarray) -> np.ndarray:  # (G * R, W) -> (G, N)
        out = np.empty((iterations, world))
        out[:, flat] = cells.reshape(iterations, count * width)
        return out

    def cells_of(per: np.ndarray) -> np.ndarray:  # (G, N) -> (G * R, W)
        return per[:, flat].reshape(rows, width)

    t = origin
    for phase in case.phases:
        host = costs.host(phase, "sync" if sync else "double")
        starts[phase] = t
        arithmetic, _, calls = _pair_costs(case, costs, phase)
        per_pair = arithmetic + calls * costs.call_ms.get(phase, 0.0)
        _g_index, _j_index = np.meshgrid(np.arange(count), np.arange(width), indexing="ij")  # (R, W)
        phase_lanes = {k: v for k, v in lanes.items() if k == "kv" or phase == "bwd"}
        _count_ring(prices, inner, phase_lanes, times=count)  # one inner rotation per outer step
        loops = RingLoops(case, costs, phase, phase_lanes, width)
        columns = (np.arange(width)[None, :] - np.arange(width)[:, None]) % width  # [step, j] = j - step
        dkv_pending = None  # outer dK/dV: (landed into each rank, when its own send landed)
        for o in range(count):
            rolled = members[(np.arange(count) - o) % count]  # the rotation's blocks: group g holds group g - o's

            def step_compute(step, rolled=rolled, per_pair=per_pair, columns=columns):
                origin_rank = rolled[:, columns[step]]  # (R, W): position j holds position j - step's block
                cls = (origin_rank > members).view(np.int8) * 2 + (origin_rank == members)  # LESS, EQUAL, GREATER
                cells = per_pair[cls]
                return cells if iterations == 1 else np.tile(cells, (iterations, 1))  # (G * R, W)

            kv_in = None
            if count > 1 and (not sync and o < count - 1):
                kv_in = outer_kv(t)  # posted at the rotation start
            if count > 1 and sync and o >= 1:
                t = outer_kv(t)
            end, spent = loops.run(cells_of(t), step_compute, _noise(case, costs, rng, rows, width))
            t = per_rank(end)
            compute += per_rank(spent)
            if phase == "bwd" and count > 1:
                if dkv_pending is not None:
                    t = np.maximum(t, dkv_pending)
                post = t + host["mid_ms"]
                arrived = outer_dkv(post)
                if sync or o == count - 1:
                    t, dkv_pending = np.maximum(post, arrived), None
                else:
                    dkv_pending = arrived
            if kv_in is not None:
                t = np.maximum(t, kv_in) + host["post_ms"]
            t = t + costs.strategy_ms.get("double-ring", 0.0)  # the rotation's own host time (fitted)
        ends[phase] = t
    return StrategyTimeline(phase_start=starts, phase_end=ends, compute_ms=compute)


# -- memory per rank (predicted) ----------------------------------------------------------------------------------
# Peak of the attention's own tensors per rank, inputs included, in units of the rank's Q + K + V shards: fitted
# to the counted peaks (cases column attn_mem_mb) of 4- and 8-rank float32 runs, forward and backward
# (benchmarks/validate_strategies.py prints both), each at the largest peak counted for its kind (hybrid:4's, above
# hybrid:2's by 6 %; double-ring:2 interleaved's at S = 4096, whose buffers overlap by 0.5 MiB more in some runs), so that the prediction does not understate what --memory-per-rank refuses on. The ring holds its two K/V buffers and three dK/dV accumulators,
# the double ring its outer block and outer accumulators besides, Ulysses and the hybrid the all-to-all's copies
# and the head layout; the all-gather baseline every block and every block's accumulator (the N term).
SHARD_FACTORS = {"ring": 7.35, "double-ring": 13.05, "ulysses": 8.1, "hybrid": 9.9, "allgather": 2.67}
FORWARD_SHARE = 0.5  # forward only: about half (no dO, no gradients or accumulators)


def predicted_memory_mb(case) -> float:
    """The peak of the attention's own tensors per rank, inputs included, MiB (PREDICTED; runs count it). A
    Ulysses degree above the KV heads holds each KV head repeated (DeepSpeed's rule): its K/V count that many
    times over, in the all-to-all's copies and the head layout as in the exchange."""
    strategy = Strategy.parse(getattr(case, "strategy", "ring") or "ring")
    kind = "allgather" if case.buffer == "allgather" or strategy.kind == "allgather" else strategy.kind
    degree = strategy.ulysses_degree(case.world) if kind in ("ulysses", "hybrid") else 1
    b = _bytes(case, degree)
    shards = b["q"] + b["kv"]
    peak = SHARD_FACTORS[kind] * shards
    if kind == "allgather":
        peak += case.world * b["kv"] * (1 + b["acc"])  # every rank's K, V and their gradient accumulators
    return peak / 2**20 * (1.0 if case.backward else FORWARD_SHARE)


__all__ = ["StrategyTimeline", "predicted_memory_mb", "simulate_strategy"]
