"""The phase ring: one phase of a simulated ring, vectorised over iterations and positions, looping over ring steps.

It follows ringbench/engine/ring.py step by step. For ring position p at ring step s (T = the step's start on p):

  fwd double  post K/V at T; compute [T + pre, + c]; wait for the K/V exchange; next step at its end + post
  fwd sync    (s >= 1) post K/V at T and wait; compute [wait end + pre, + c]; next step at compute end + post
  bwd double  post K/V at T; compute; wait for the dK/dV exchange of step s-1; post dK/dV at that + mid;
              wait for the K/V exchange; next step + post; after the last step wait for the last dK/dV exchange
  bwd sync    (s >= 1) post K/V at T and wait; compute; post dK/dV at compute end + mid and wait; next + post

An exchange posted at P[p] on every rank moves a block from p-1 to p. It cannot start before both ends posted (the
receiver's post makes the buffer available), so with X the link's transfer time

  start[p] = max(P[p-1], P[p])          D[p] = start[p] + X[p-1 -> p]         (the block lands on p)

and the exchange is complete for p when its receive and its own send (the successor's landing) are both done:

  in_hand[p] = max(recv[p], D[p+1])      recv[p] = max(last_recv[p], D[p]) + delay[p-1 -> p]

``delay`` is what a run injects after a completed transfer (``--emulate-links``, ``slow-link``, ``jitter``): one
watcher thread per direction stamps arrivals in posting order, hence ``last_recv``. Each line is one vector
operation over positions; the max with the predecessor or successor is a shifted slice. The same code runs on
the whole ring (neighbours wrap) and on a window of positions (the edges are wrong and ignored: a step can move
information by one position per exchange), which is how the critical path is recomputed (walk.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ringbench.simulate.pair_classes import EQUAL


@dataclass(kw_only=True, slots=True)
class Lane:
    """One exchange kind (K/V, or the backward's dK/dV) on every link, indexed by receiving position."""

    name: str
    """kv | dkv."""
    nbytes: int
    """Bytes of one message."""
    transfer_ms: np.ndarray
    """(N,) the transfer into position p from p-1, ms."""
    delay_ms: np.ndarray | None = None
    """(N,) injected delay after the transfer into p (emulated links, slow-link), or None."""
    jitter_ms: float = 0.0
    """Each transfer is delayed by a uniform [0, jitter_ms) draw (the ``jitter`` fault)."""

    uniform_ms: float | None = field(init=False, default=None)
    """The transfer time when every link has the same (a scalar saves a vector operation per exchange)."""

    def __post_init__(self) -> None:
        first = float(self.transfer_ms[0]) if len(self.transfer_ms) else 0.0
        self.uniform_ms = first if bool((self.transfer_ms == first).all()) else None

    @property
    def delayed(self) -> bool:
        return self.delay_ms is not None or self.jitter_ms > 0


@dataclass(kw_only=True, slots=True)
class Noise:
    """Seeded multiplicative noise without drawing N numbers per step: each step reads a pool at an offset."""

    compute_cv: float = 0.0
    link_cv: float = 0.0
    pools: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, rng: np.random.Generator, cells: int, steps: int, compute_cv: float, link_cv: float,
              jitter_ms: float = 0.0, quantiles: dict[str, tuple[float, ...]] | None = None) -> Noise:  # fmt: skip
        """Pools of ``cells`` + 65,536 values, and one offset per (phase, stream) and step. ``jitter_ms``: the
        ``jitter`` fault's pool holds uniform [0, jitter_ms) delays. ``quantiles``: per pool, measured quantiles
        of value / median to draw from (inverse CDF) instead of a lognormal."""
        size = cells + (1 << 16)
        noise = cls(compute_cv=compute_cv, link_cv=link_cv)
        quantiles = quantiles or {}
        for name, cv in (("compute", compute_cv), ("link", link_cv)):
            measured = quantiles.get(name) or ()
            if len(measured) >= 2:
                noise.pools[name] = np.interp(rng.random(size), np.linspace(0, 1, len(measured)), measured)
            elif cv > 0:
                sigma = np.sqrt(np.log1p(cv * cv))  # lognormal with mean 1 and the given coefficient of variation
                noise.pools[name] = rng.lognormal(-sigma * sigma / 2, sigma, size=size)
        if jitter_ms > 0:
            noise.pools["jitter"] = rng.random(size) * jitter_ms
        for phase in ("fwd", "bwd"):
            for stream in ("compute", "kv", "dkv", "jitter-kv", "jitter-dkv"):
                noise.offsets[(phase, stream)] = rng.integers(0, 1 << 16, size=max(steps, 1))
        return noise

    def draw(self, pool: str, phase: str, stream: str, step: int, window: Window) -> np.ndarray | None:
        """(G, W) values for the window at this step, or None when the pool is off."""
        values = self.pools.get(pool)
        if values is None:
            return None
        offset = int(self.offsets[(phase, stream)][step])
        if window.full:
            return values[offset : offset + window.cells].reshape(window.shape)  # a view: no copy
        return values[offset + window.cell_index]


@dataclass(kw_only=True, slots=True)
class Window:
    """The ring positions being advanced: the whole ring (neighbours wrap) or a window of it."""

    positions: np.ndarray
    """(W,) ring positions, consecutive modulo N."""
    iterations: np.ndarray
    """(G,) iteration indices."""
    world: int
    full: bool

    @classmethod
    def ring(cls, world: int, iterations: int) -> Window:
        return cls(positions=np.arange(world), iterations=np.arange(iterations), world=world, full=True)

    @classmethod
    def around(cls, world: int, centre: int, radius: int, iterations: np.ndarray) -> Window:
        if 2 * radius + 1 >= world:
            return cls(positions=np.arange(world), iterations=iterations, world=world, full=False)
        positions = (centre + np.arange(-radius, radius + 1)) % world
        return cls(positions=positions, iterations=iterations, world=world, full=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.iterations), len(self.positions))

    @property
    def cells(self) -> int:
        return len(self.iterations) * len(self.positions)

    @property
    def cell_index(self) -> np.ndarray:
        return self.iterations[:, None] * self.world + self.positions[None, :]  # (G, W) index into a pool


@dataclass(kw_only=True, slots=True)
class PhaseModel:
    """Everything one phase of one case costs, per ring position: the engine's input."""

    phase: str
    """fwd | bwd."""
    buffer: str
    """sync | double."""
    ring: np.ndarray
    """(N,) ranks in ring order."""
    compute_ms: np.ndarray
    """(3,) one step's compute per pair class (LESS, EQUAL, GREATER), call overheads included; 0 for skip. With
    ``pairs``: (K,), one entry per class of the pair table."""
    work_ms: np.ndarray
    """(3,) or (K,): the part of compute_ms a slow rank stretches (the kernel's arithmetic)."""
    slow: np.ndarray | None
    """(N,) compute factor per position (slow-rank, slow-host), or None when every rank is healthy."""
    lanes: dict[str, Lane]
    """kv (and dkv for the backward)."""
    enter_ms: float = 0.0
    """From the phase's start to the first post (entering the ring call)."""
    pre_ms: float = 0.0
    """Step start (double: the K/V post; sync: the end of the wait) to the compute's start."""
    mid_ms: float = 0.0
    """Backward: compute end (double: the dK/dV wait's end) to the dK/dV post."""
    post_ms: float = 0.0
    """The step's last event to the next step's start."""
    noise: Noise = field(default_factory=Noise)
    pairs: np.ndarray | None = None
    """(N, N) pair class [query rank, key rank] of a document or window mask (simulate/pair_table.py); None: the
    three classes of the sign of k - q."""
    steps: int | None = None
    """Ring steps of the phase (None: N; the short ring: D + 1)."""
    reverse_blocks: bool = False
    """The short ring's backward: at step s a position handles the block D - s behind it."""
    direction: int = 1
    """Exchanges move blocks from position p - direction to p (the short ring's backward: -1, to the predecessor)."""
    receiving: dict | None = None
    """lane -> (labels, N) bool: the exchange posted with that step label reaches position p (None: all do)."""
    dkv_posts: int | None = None
    """Backward: steps that post a dK/dV exchange (None: every step)."""
    overlap_penalty: float = 0.0
    """Double buffers: the compute beside a K/V transfer takes this share of the transfer's time longer (0: the
    transfer and the kernel overlap perfectly)."""
    gathered_ms: np.ndarray | None = None
    """The all-gather baseline on a GPU kernel's model: (N,) each position's attention as one call over every key
    it sees (what TransformerEngine's all-gather does), instead of the ring's N blocks; None: the ring's steps."""
    _ring2: np.ndarray = field(init=False, repr=False)
    _identity: bool = field(init=False, repr=False)
    _memo: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.ring = np.asarray(self.ring, dtype=np.int64)
        self._ring2 = np.concatenate([self.ring, self.ring])  # owner of position p at step s: ring2[N + p - s]
        self._identity = bool(np.array_equal(self.ring, np.arange(len(self.ring))))

    @property
    def world(self) -> int:
        return len(self.ring)

    @property
    def n_steps(self) -> int:
        return self.world if self.steps is None else self.steps

    @property
    def hops(self) -> int:
        return self.n_steps - 1

    @property
    def two_exchanges(self) -> bool:
        """The backward's second exchange (the dK/dV accumulator) runs (every backward of a ring of 2 or more)."""
        return self.phase == "bwd" and self.hops > 0

    @property
    def kv_moves(self) -> bool:
        """K/V blocks travel in this phase (the short ring's backward moves only dK/dV)."""
        return "kv" in self.lanes

    def distance(self, step: int) -> int:
        """How many positions behind the block in hand at ``step`` was made."""
        return self.n_steps - 1 - step if self.reverse_blocks else step

    def receives(self, lane: str, label: int, window: Window) -> np.ndarray | None:
        """(W,) bool: the ``lane`` exchange posted with step ``label`` reaches each position (None: all)."""
        masks = (self.receiving or {}).get(lane)
        if masks is None:
            return None
        row = masks[label]
        return row if window.full else row[window.positions]

    def pair_classes(self, step: int, window: Window) -> np.ndarray:
        """(W,) the pair-table class of the block each position holds at ``step`` (``pairs`` models)."""
        by_distance = self._memo.get("by_distance")
        if by_distance is None:
            by_distance = self._memo["by_distance"] = pair_diagonals(self.pairs, self.ring, self.n_steps)
        row = by_distance[self.distance(step)]
        return row if window.full else row[window.positions]

    def classes(self, step: int, window: Window) -> np.ndarray | None:
        """(W,) bool: the block in hand belongs to a higher rank (class GREATER, else LESS); None at step 0.
        With ``pairs``: (W,) int, the pair-table class."""
        if self.pairs is not None:
            return self.pair_classes(step, window)
        if step == 0:
            return None
        if self._identity:
            return window.positions < step  # owner (p - s) mod N exceeds p exactly when p < s
        n = self.world
        owner = self._ring2[n - step : 2 * n - step] if window.full else self.ring[(window.positions - step) % n]
        return owner > (self.ring if window.full else self.ring[window.positions])

    def compute(self, step: int, window: Window, out: np.ndarray | None = None) -> np.ndarray | float:
        """Compute ms of the step on the window: a scalar when every position costs the same, else an array that
        broadcasts to (G, W), written into ``out`` (G, W) when given (no allocation on the large-ring pass)."""
        c, w = self.compute_ms, self.work_ms
        noise = self.noise.draw("compute", self.phase, "compute", step, window)
        if self.pairs is not None:
            cls = self.pair_classes(step, window)
            result = c[cls][None, :]  # (1, W)
            if self.slow is not None:
                factor = self.slow if window.full else self.slow[window.positions]
                result = result + (w[cls] * (factor - 1.0))[None, :]
            return result if noise is None else np.multiply(result, noise, out=out)
        uniform = step == 0 or (c[0] == c[2] and w[0] == w[2])
        if uniform and self.slow is None:
            cls = EQUAL if step == 0 else 0
            return float(c[cls]) if noise is None else np.multiply(noise, c[cls], out=out)
        if uniform:
            cls = EQUAL if step == 0 else 0
            result = self._memo.get(cls) if window.full else None
            if result is None:  # the same every step on the whole ring: computed once
                factor = self.slow if window.full else self.slow[window.positions]
                result = np.add(np.multiply(factor - 1.0, w[cls]), c[cls])[None, :]  # (1, W)
                if window.full:
                    self._memo[cls] = result
        else:
            greater = self.classes(step, window)
            if self._identity and window.full and self.slow is None:  # greater exactly where p < s: two fills
                result = np.empty((1, len(window.positions)))
                result[0, :step], result[0, step:] = c[2], c[0]
            else:
                result = (c[0] + greater * (c[2] - c[0]))[None, :]  # (1, W)
            if self.slow is not None:
                factor = self.slow if window.full else self.slow[window.positions]
                result = result + ((w[0] + greater * (w[2] - w[0])) * (factor - 1.0))[None, :]
        if noise is None:
            return result
        return np.multiply(result, noise, out=out)


_DIAGONALS: dict = {}


def pair_diagonals(pairs: np.ndarray, ring: np.ndarray, steps: int) -> np.ndarray:
    """(steps, N): [d, p] the class of the pair (position p, the block d positions behind it), for d < steps: the
    table's diagonals on the ring, one strided copy (kept for the phases of one case)."""
    key = (id(pairs), ring.tobytes(), steps)
    found = _DIAGONALS.get(key)
    if found is not None and found[0] is pairs:
        return found[1]
    n = len(ring)
    at = pairs[np.ix_(ring, ring)]  # [query position, key position]
    wide = np.concatenate([at, at], axis=1)  # (N, 2N): key position k is at column k and k + N
    first = wide[:, n - steps + 1 :]
    skew = np.lib.stride_tricks.as_strided(first, shape=(n, steps), strides=(first.strides[0] + first.strides[1],
                                                                           first.strides[1]))  # fmt: skip
    out = np.ascontiguousarray(skew[:, ::-1].T)  # [d, p] = at[p, (p - d) mod N]
    _DIAGONALS.clear()
    _DIAGONALS[key] = (pairs, out)
    return out


def _max_prev(x: np.ndarray, out: np.ndarray, direction: int = 1) -> np.ndarray:
    """out[p] = max(x[p - direction], x[p]) along the last axis (wrapping): both ends of the exchange into p posted."""
    if direction == 1:
        np.maximum(x[..., 1:], x[..., :-1], out=out[..., 1:])
        np.maximum(x[..., :1], x[..., -1:], out=out[..., :1])
    else:
        np.maximum(x[..., :-1], x[..., 1:], out=out[..., :-1])
        np.maximum(x[..., -1:], x[..., :1], out=out[..., -1:])
    return out


@dataclass(slots=True)
class Exchange:
    """One exchange on every position of a window: (G, W) arrays, ms."""

    lane: str
    step: int
    post: np.ndarray
    start: np.ndarray
    landed: np.ndarray
    """D: the block is in p's buffer (before any injected delay)."""
    recv: np.ndarray
    """The receive is stamped complete (landed + delay, in the watcher's order)."""
    in_hand: np.ndarray
    """Both directions complete: max(recv[p], landed[p+1])."""
    wait_start: np.ndarray | None = None
    wait_end: np.ndarray | None = None


@dataclass(kw_only=True, slots=True)
class State:
    """What a phase carries from one step to the next, per (iteration, position)."""

    start: np.ndarray
    """(G, W) the step's start."""
    last_recv: np.ndarray | None = None
    """(G, W) the receive watcher's last stamp (only when transfers are delayed)."""
    pending: Exchange | None = None
    """Backward, double: the dK/dV exchange posted in the previous step, waited for in this one."""

    def take(self, index: np.ndarray) -> State:
        """The state restricted to positions ``index`` (a window of a full-ring checkpoint)."""
        pick = lambda a: None if a is None else a[:, index]  # noqa: E731
        pending = self.pending
        if pending is not None:
            pending = Exchange(pending.lane, pending.step, *(pick(getattr(pending, name)) for name in
                               ("post", "start", "landed", "recv", "in_hand")))  # fmt: skip
        return State(start=self.start[:, index], last_recv=pick(self.last_recv), pending=pending)


@dataclass(slots=True)
class StepCells:
    """Everything one ring step did on a window: the spans of the record and the times the walk needs."""

    step: int
    start: np.ndarray
    compute_start: np.ndarray
    compute_ms: np.ndarray
    exchanges: list[Exchange]
    end: np.ndarray
    greater: np.ndarray | None


class PhaseEngine:
    """Advances one phase step by step; ``advance`` is the only place the ring's timing rules live.

    Every vector operation writes into an ``out`` array from ``_out``: fresh arrays when the step is recorded
    (they become the cells), reused ones on the lean pass over a large ring, where allocating a new 0.5 MB array
    per operation would cost more than the arithmetic.
    """

    def __init__(self, model: PhaseModel) -> None:
        self.model = model
        self._buffers: dict[str, np.ndarray] = {}
        self._shape: tuple[int, int] | None = None
        self._reuse = False

    def _out(self, name: str) -> np.ndarray:
        if not self._reuse:
            return np.empty(self._shape)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != self._shape:
            buffer = self._buffers[name] = np.empty(self._shape)
        return buffer

    def _exchange(self, lane: Lane, post: np.ndarray, step: int, state: State, window: Window) -> Exchange:
        model = self.model
        tag = f"{lane.name}{step % 2}"  # the dK/dV exchange lives into the next step: alternate buffers
        direction = model.direction
        start = _max_prev(post, self._out(tag + ".start"), direction)  # (G, W): both ends posted
        transfer = lane.uniform_ms
        if transfer is None:
            transfer = lane.transfer_ms if window.full else lane.transfer_ms[window.positions]
        noise = model.noise.draw("link", model.phase, lane.name, step, window)
        if noise is not None:
            transfer = np.multiply(transfer, noise, out=self._out(tag + ".transfer"))
        landed = np.add(start, transfer, out=self._out(tag + ".landed"))
        recv = landed
        if lane.delayed:
            extra = 0.0
            if lane.delay_ms is not None:
                extra = lane.delay_ms if window.full else lane.delay_ms[window.positions]
            jitter = model.noise.draw("jitter", model.phase, f"jitter-{lane.name}", step, window)
            if jitter is not None:  # already in ms
                extra = jitter if lane.delay_ms is None else np.add(jitter, extra, out=self._out(tag + ".jitter"))
            last = state.last_recv if state.last_recv is not None else landed
            recv = np.maximum(last, landed, out=self._out(tag + ".recv"))
            np.add(recv, extra, out=recv)  # the watcher stamps in posting order, then sleeps the delay
            state.last_recv = recv
        reaches = model.receives(lane.name, step, window)
        if reaches is not None:  # a one-way or absent exchange: nothing lands where nothing is received
            landed = np.where(reaches, landed, -np.inf)
            recv = np.where(reaches, recv, post)
        in_hand = self._out(tag + ".in_hand")
        if direction == 1:  # own send done = the receiver (successor) landed it
            np.maximum(recv[..., :-1], landed[..., 1:], out=in_hand[..., :-1])
            np.maximum(recv[..., -1:], landed[..., :1], out=in_hand[..., -1:])
        else:
            np.maximum(recv[..., 1:], landed[..., :-1], out=in_hand[..., 1:])
            np.maximum(recv[..., :1], landed[..., -1:], out=in_hand[..., :1])
        return Exchange(lane.name, step, post, start, landed, recv, in_hand)

    def begin(self, origin: np.ndarray) -> State:
        """The state at step 0: the phase starts at ``origin`` (G, N) on every rank."""
        return State(start=origin + self.model.enter_ms)

    def _plus(self, compute: np.ndarray | float, name: str, extra: float) -> np.ndarray | float:
        """compute + extra: a float, a cached array when compute is the model's per-ring constant, else one add."""
        if isinstance(compute, float):
            return compute + extra
        memo = self.model._memo
        if any(compute is value for value in memo.values()):  # the same every step: add once
            key = (id(compute), name)
            if key not in memo:
                memo[key] = compute + extra
            return memo[key]
        return np.add(compute, extra, out=self._out(name))

    def advance(self, state: State, step: int, window: Window, record: bool = True) -> StepCells | None:
        """Run ring step ``step`` on ``window``; ``state`` moves to the next step. ``record``: return the step's
        cells (the spans); without it only the state moves, in reused arrays (the large-ring pass)."""
        model = self.model
        self._shape, self._reuse = state.start.shape, not record
        out = self._out
        t = state.start
        compute = model.compute(step, window, out("compute"))
        exchanges: list[Exchange] = []
        hops = model.hops
        kv = model.lanes.get("kv")
        backward = model.two_exchanges
        posts_dkv = backward and (model.dkv_posts is None or step < model.dkv_posts)
        compute_start = np.add(t, model.pre_ms) if record else None
        if model.buffer == "sync":
            if step >= 1 and hops and kv is not None:
                ex = self._exchange(kv, t, step, state, window)
                # blocks from the post; the exchange cannot complete before it was posted: in_hand >= t
                ex.wait_start, ex.wait_end = t, ex.in_hand
                exchanges.append(ex)
                t = ex.in_hand
                if record:
                    compute_start = np.add(t, model.pre_ms)
            if posts_dkv:
                post = np.add(t, self._plus(compute, "pre+mid", model.pre_ms + model.mid_ms), out=out("dkv.post"))
                dkv = self._exchange(model.lanes["dkv"], post, step, state, window)
                dkv.wait_start, dkv.wait_end = post, dkv.in_hand
                exchanges.append(dkv)
                end = np.add(dkv.in_hand, model.post_ms, out=out(f"start{(step + 1) % 2}"))
            else:
                busy = self._plus(compute, "pre+post", model.pre_ms + model.post_ms)
                end = np.add(t, busy, out=out(f"start{(step + 1) % 2}"))
        else:
            ex = self._exchange(kv, t, step, state, window) if step < hops and kv is not None else None
            t = np.add(t, self._plus(compute, "pre", model.pre_ms), out=out("computed"))
            if ex is not None and model.overlap_penalty > 0:  # the kernel shares the GPU with the transfer
                beside = np.clip(np.subtract(ex.landed, ex.start), 0.0, None)  # 0 where nothing lands (short ring)
                beside = np.minimum(beside, compute)
                t = np.add(t, np.multiply(beside, model.overlap_penalty), out=out("computed+overlap"))
            if backward:
                pending = state.pending
                if pending is not None:  # the accumulator that travelled while this step computed
                    pending.wait_start = t
                    pending.wait_end = np.maximum(t, pending.in_hand, out=out("pending.wait"))
                    exchanges.append(pending)
                    t = pending.wait_end
                    state.pending = None
                if posts_dkv:
                    post = np.add(t, model.mid_ms, out=out(f"dkv{step % 2}.post"))
                    state.pending = self._exchange(model.lanes["dkv"], post, step, state, window)
                    t = post
            if ex is not None:
                ex.wait_start, ex.wait_end = t, np.maximum(t, ex.in_hand, out=out("kv.wait"))
                exchanges.append(ex)
                t = ex.wait_end
            end = np.add(t, model.post_ms, out=out(f"start{(step + 1) % 2}"))
        cells = None
        if record:
            compute_ms = np.broadcast_to(np.asarray(compute, dtype=float), end.shape)
            cells = StepCells(step, state.start, compute_start, compute_ms, exchanges, end,
                              model.classes(step, window))  # fmt: skip
        state.start = end
        return cells

    def finish(self, state: State) -> tuple[np.ndarray, Exchange | None]:
        """The phase's end per (iteration, position), and the last dK/dV exchange it waited for (double)."""
        pending = state.pending
        if pending is None:
            return state.start, None
        pending.wait_start, pending.wait_end = state.start, np.maximum(state.start, pending.in_hand)
        state.pending = None
        return pending.wait_end, pending
