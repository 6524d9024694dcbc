"""The whole-ring pass of a bounded simulation, compiled: phase_ring.PhaseEngine.advance(record=False), step by step.

A bounded case (65,536 ranks) spends most of its time in the lean pass over the whole ring: some 20 vector
operations per ring step on arrays of N positions, each a trip through memory. Here each exchange and each step's
bookkeeping is one compiled loop over the positions (numba), so a step touches its arrays once, in cache. The
rules are phase_ring.py's, line for line (its module docstring): an exchange starts when both ends posted, lands after
the transfer (times the link noise), is received after the injected delay in the watcher's posting order, and is in
hand when the successor landed too; ``sync`` and ``double`` forward and backward as ``PhaseEngine.advance``. The
state it leaves (the step's start, the receive watcher's last stamp, the pending dK/dV exchange with all its
arrays) is a State of the engine's, so checkpoints, the kept windows and the walk read it unchanged.

``lean_advance(engine, window)`` is None when numba is not installed or the window is not the whole ring: the
numpy pass runs then. tests/test_simulate.py checks the two against each other.
"""

from __future__ import annotations

import numpy as np

from ringbench.simulate.phase_ring import Exchange, PhaseEngine, State, Window

try:  # an optional accelerator: without it, the numpy pass
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None

_EMPTY = np.zeros((1, 1))
_NO_EXCHANGE = (_EMPTY, 0.0, _EMPTY, _EMPTY, _EMPTY, _EMPTY, (False,) * 6, _EMPTY, _EMPTY, _EMPTY, _EMPTY)

if numba is not None:

    @numba.njit(cache=True)
    def _exchange(post, transfer, uniform, noise, delay, jitter, last, flags, start, landed, recv, in_hand):
        """One exchange on the whole ring (rows: iterations). flags: has transfer array, noise, delay, jitter,
        last stamp (delayed lanes only update ``recv``)."""
        rows, n = post.shape
        has_array, has_noise, has_delay, has_jitter, delayed, has_last = flags
        for g in range(rows):
            prev = post[g, n - 1]
            for p in range(n):
                here = post[g, p]
                start[g, p] = here if here > prev else prev
                prev = here
                x = transfer[0, p] if has_array else uniform
                if has_noise:
                    x = x * noise[g, p]
                landed[g, p] = start[g, p] + x
            for p in range(n):
                if delayed:
                    value = landed[g, p]
                    if has_last and last[g, p] > value:
                        value = last[g, p]
                    extra = 0.0
                    if has_delay:
                        extra = delay[0, p]
                    if has_jitter:
                        extra = jitter[g, p] + extra if has_delay else jitter[g, p]
                    recv[g, p] = value + extra
            first = landed[g, 0]
            for p in range(n):
                own = recv[g, p] if delayed else landed[g, p]
                succ = landed[g, p + 1] if p + 1 < n else first
                in_hand[g, p] = own if own > succ else succ

    @numba.njit(cache=True)
    def _double_step(t, comp, comp_scalar, comp_is_scalar, mid_ms, post_ms, has_kv, backward, pending_in_hand,
                     has_pending, kv, dkv, computed, waited, dkv_post, end):  # fmt: skip
        """One ``double`` step (phase_ring.PhaseEngine.advance): the K/V exchange posted at t, compute (``comp`` holds
        compute + pre), the dK/dV accumulator's wait and post, the K/V wait. ``kv`` / ``dkv``: the exchange
        arguments of _exchange (transfer, uniform, noise, delay, jitter, last, flags, start, landed, recv,
        in_hand); the dK/dV exchange reads the K/V one's receive stamps as its ``last`` when delayed."""
        if has_kv:
            _exchange(t, kv[0], kv[1], kv[2], kv[3], kv[4], kv[5], kv[6], kv[7], kv[8], kv[9], kv[10])
        rows, n = t.shape
        for g in range(rows):
            r = g if comp.shape[0] > 1 else 0
            for p in range(n):
                x = t[g, p] + (comp_scalar if comp_is_scalar else comp[r, p])
                computed[g, p] = x
        now = computed
        if backward:
            if has_pending:
                for g in range(rows):
                    for p in range(n):
                        x, y = now[g, p], pending_in_hand[g, p]
                        waited[g, p] = x if x > y else y
                now = waited
            for g in range(rows):
                for p in range(n):
                    dkv_post[g, p] = now[g, p] + mid_ms
            _exchange(dkv_post, dkv[0], dkv[1], dkv[2], dkv[3], dkv[4], dkv[5], dkv[6], dkv[7], dkv[8], dkv[9],
                      dkv[10])  # fmt: skip
            now = dkv_post
        for g in range(rows):
            for p in range(n):
                x = now[g, p]
                if has_kv:
                    y = kv[10][g, p]
                    x = x if x > y else y
                end[g, p] = x + post_ms

    @numba.njit(cache=True)
    def _add(a, b, b_scalar, use_scalar, out):
        """out = a + b (b a (1, N) or (G, N) array, or a scalar)."""
        rows, n = a.shape
        for g in range(rows):
            r = g if b.shape[0] > 1 else 0
            for p in range(n):
                out[g, p] = a[g, p] + (b_scalar if use_scalar else b[r, p])

    @numba.njit(cache=True)
    def _max_add(a, b, extra, out):
        """out = max(a, b) + extra."""
        rows, n = a.shape
        for g in range(rows):
            for p in range(n):
                x, y = a[g, p], b[g, p]
                out[g, p] = (x if x > y else y) + extra


class LeanPass:
    """PhaseEngine.advance(state, step, window, record=False) for the whole ring, compiled."""

    def __init__(self, engine: PhaseEngine, window: Window) -> None:
        self.engine, self.window = engine, window
        self.model = engine.model
        self._buffers: dict[str, np.ndarray] = {}
        self._lanes: dict[str, tuple] = {}

    def _out(self, name: str, shape) -> np.ndarray:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.shape != shape:
            buffer = self._buffers[name] = np.empty(shape)
        return buffer

    def _args(self, lane, post: np.ndarray, step: int, last) -> tuple:
        """The arguments of _exchange for ``lane`` posted at ``post`` in ``step`` (buffers by tag, as the numpy
        pass alternates them: the dK/dV exchange lives into the next step)."""
        model, window = self.model, self.window
        shape = post.shape
        tag = f"{lane.name}{step % 2}"
        start, landed = self._out(tag + ".start", shape), self._out(tag + ".landed", shape)
        in_hand = self._out(tag + ".in_hand", shape)
        fixed = self._lanes.get(lane.name)
        if fixed is None:
            uniform = lane.uniform_ms is not None
            transfer = _EMPTY if uniform else _arr(np.broadcast_to(lane.transfer_ms, (1, shape[1])))
            delay = None
            if lane.delay_ms is not None:
                delay = _arr(np.broadcast_to(lane.delay_ms, (1, shape[1])))
            fixed = self._lanes[lane.name] = (uniform, transfer, delay)
        uniform, transfer, delay = fixed
        noise = model.noise.draw("link", model.phase, lane.name, step, window)
        delayed = lane.delayed
        jitter = model.noise.draw("jitter", model.phase, f"jitter-{lane.name}", step, window) if delayed else None
        recv = self._out(tag + ".recv", shape) if delayed else landed
        flags = (not uniform, noise is not None, delay is not None, jitter is not None, delayed,
                 delayed and last is not None)  # fmt: skip
        return (transfer, float(lane.uniform_ms or 0.0), _arr(noise), _arr(delay), _arr(jitter), _arr(last), flags,
                start, landed, recv, in_hand)  # fmt: skip

    def _exchange(self, lane, post: np.ndarray, step: int, state: State) -> Exchange:
        args = self._args(lane, post, step, state.last_recv)
        _exchange(post, *args)
        return self._done(lane, post, step, state, args)

    def _done(self, lane, post, step: int, state: State, args) -> Exchange:
        start, landed, recv, in_hand = args[7:]
        if lane.delayed:
            state.last_recv = recv
        return Exchange(lane.name, step, post, start, landed, recv, in_hand)

    def _plus(self, t: np.ndarray, compute, name: str, extra: float, out: np.ndarray) -> np.ndarray:
        value = self.engine._plus(compute, name, extra)  # the numpy pass's own sum (same rounding)
        if isinstance(value, float):
            _add(t, _EMPTY, value, True, out)
        else:
            _add(t, np.ascontiguousarray(np.atleast_2d(value)), 0.0, False, out)
        return out

    def __call__(self, state: State, step: int) -> None:
        engine, model, window = self.engine, self.model, self.window
        t = state.start
        shape = t.shape
        engine._shape, engine._reuse = shape, True
        compute = model.compute(step, window, engine._out("compute"))
        if not isinstance(compute, float):
            compute = np.asarray(compute)
        hops = model.hops
        kv = model.lanes["kv"]
        backward = model.two_exchanges
        end = self._out(f"start{(step + 1) % 2}", shape)
        if model.buffer == "sync":
            if step >= 1 and hops:
                t = self._exchange(kv, t, step, state).in_hand
            if backward:
                post = self._plus(t, compute, "pre+mid", model.pre_ms + model.mid_ms, self._out("dkv.post", shape))
                dkv = self._exchange(model.lanes["dkv"], post, step, state)
                _add(dkv.in_hand, _EMPTY, model.post_ms, True, end)
            else:
                self._plus(t, compute, "pre+post", model.pre_ms + model.post_ms, end)
        else:  # double: one compiled call for the whole step
            value = engine._plus(compute, "pre", model.pre_ms)
            scalar = isinstance(value, float)
            comp = _EMPTY if scalar else np.ascontiguousarray(np.atleast_2d(value))
            has_kv = step < hops
            kv_args = self._args(kv, t, step, state.last_recv) if has_kv else _NO_EXCHANGE
            pending = state.pending if backward else None
            dkv_post = self._out(f"dkv{step % 2}.post", shape)
            dkv_args = _NO_EXCHANGE
            if backward:
                last = kv_args[9] if has_kv and kv.delayed else state.last_recv
                dkv_args = self._args(model.lanes["dkv"], dkv_post, step, last)
            _double_step(t, comp, value if scalar else 0.0, scalar, model.mid_ms, model.post_ms, has_kv, backward,
                         pending.in_hand if pending is not None else _EMPTY, pending is not None, kv_args, dkv_args,
                         self._out("computed", shape), self._out("pending.wait", shape), dkv_post, end)  # fmt: skip
            if has_kv:
                self._done(kv, t, step, state, kv_args)
            if backward:
                state.pending = self._done(model.lanes["dkv"], dkv_post, step, state, dkv_args)
        state.start = end


def _wait(t: np.ndarray, in_hand: np.ndarray, out: np.ndarray) -> np.ndarray:
    _max_add(t, in_hand, 0.0, out)
    return out


def _arr(value) -> np.ndarray:
    if value is None:
        return _EMPTY
    return np.ascontiguousarray(np.atleast_2d(np.asarray(value, dtype=float)))


def lean_advance(engine: PhaseEngine, window: Window):
    """The compiled pass for ``engine`` on ``window``, or None (numba absent, a window of the ring, or an overlap
    penalty, which only the numpy pass prices)."""
    if numba is None or not window.full or engine.model.overlap_penalty > 0:
        return None
    return LeanPass(engine, window)


__all__ = ["LeanPass", "lean_advance"]
