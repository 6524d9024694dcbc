"""A discrete-event model of a ring that writes the events record (ringbench/schema.py): SIMULATED, not measured.

The model follows ringbench/ring.py. For the rank at ring position p and ring step s (T = when the step begins):

  double  post the exchange at T (send the block in hand to the successor, receive the next one from the
          predecessor; steps 0..N-2), compute on the block in hand [T, T + C], then wait until the recv is done.
  sync    exchange first (steps 1..N-1: the exchange brings the block for this step), wait, then compute.

A transfer on link (p-1 -> p) cannot start before both ends posted it, so the block is in hand at

  R[p, s] = max(T[p, s], T[p-1, s]) + X[p-1 -> p, s]          (X: the link's transfer time, jittered)

and step s ends at max(T + C, R) (double) or R + C (sync); the next step begins there. Every rank starts an
iteration together (a barrier), and the backward starts on each rank when its forward ends. Simplification: the
backward rotates one message per step with twice the forward bytes (K, V with dK, dV) instead of the engine's
separate dK/dV exchange. Skip pairs of the causal mask plan have no compute row, exactly as in the real record.

Every output is labelled: meta ``simulated: true`` and ``emulated: true``, kernel ``simulated``.

  python -m ringbench.simulate results/sim --world 8 --slow-rank 3 --slow-factor 1.5 --jitter 0.03
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError, bad_value
from ringbench.metrics import CASE_FIGURES, case_figures
from ringbench.schema import CASE_COLUMNS, EVENT_COLUMNS, SCHEMA_VERSION
from ringbench.store import RunData, write_cases, write_events, write_json

BUFFERS = ("sync", "double")
MASKS = ("none", "causal", "causal-naive")
LAYOUTS = ("contiguous", "zigzag", "striped")
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
# Typical max-abs errors of the real ring against the float64 reference (DESIGN.md), for synthetic_errors only.
_TYPICAL_ERROR = {"float64": 1e-15, "float32": 3e-7, "bfloat16": 8e-3, "float16": 1e-3}


@dataclass(kw_only=True, slots=True, frozen=True)
class SimConfig:
    """One simulated case. Times are milliseconds of a healthy rank / link."""

    world: int = 4
    """Number of ranks N."""
    order: tuple[int, ...] | None = None
    """Ranks in ring order (ring position p -> rank); None: identity."""
    seq: int = 8192
    heads: int = 8
    head_dim: int = 64
    batch: int = 1
    dtype: str = "float32"
    mask: str = "none"
    """none | causal (skip fully masked pairs) | causal-naive (compute every pair)."""
    layout: str = "contiguous"
    buffer: str = "double"
    backward: bool = True
    iterations: int = 10
    repeats: int = 1
    compute_ms: float = 2.0
    """Forward time of one fully visible (query block, key block) pair."""
    bwd_compute_factor: float = 2.5
    """Backward compute relative to forward (the FLOP ratio of the kernels' block_flops)."""
    link_ms: float = 1.0
    """Forward transfer time of one KV block on a healthy link (the backward moves twice the bytes)."""
    link_ms_by_hop: Mapping[tuple[int, int], float] = field(default_factory=dict)
    """Per-hop overrides of link_ms, keyed by (src rank, dst rank)."""
    slow_rank: int | None = None
    slow_factor: float = 1.0
    """Compute time multiplier of slow_rank (an injected compute straggler)."""
    slow_link: tuple[int, int] | None = None
    slow_link_extra_ms: float = 0.0
    """Extra forward transfer time on slow_link (src, dst) (an injected link straggler)."""
    jitter: float = 0.0
    """Coefficient of variation of every duration (lognormal, mean 1)."""
    gap_ms: float = 0.05
    """Idle time of the barrier between iterations."""
    synthetic_errors: bool = False
    """Fill fwd/bwd_max_abs_err with typical values for the dtype (made up; otherwise NaN = not checked)."""
    seed: int = 0
    case_id: str | None = None

    def __post_init__(self) -> None:
        if self.world < 1:
            raise bad_value("world", self.world, "an integer >= 1")
        if self.buffer not in BUFFERS:
            raise bad_value("buffer", self.buffer, f"one of: {', '.join(BUFFERS)}")
        if self.mask not in MASKS:
            raise bad_value("mask", self.mask, f"one of: {', '.join(MASKS)}")
        if self.layout not in LAYOUTS:
            raise bad_value("layout", self.layout, f"one of: {', '.join(LAYOUTS)}")
        if self.dtype not in DTYPE_BYTES:
            raise bad_value("dtype", self.dtype, f"one of: {', '.join(DTYPE_BYTES)}")
        if self.order is not None and sorted(self.order) != list(range(self.world)):
            raise UsageError(f"order={self.order!r} is not a permutation of ranks 0..{self.world - 1}")
        if self.iterations < 1 or self.repeats < 1:
            raise bad_value("iterations", (self.iterations, self.repeats), "iterations >= 1 and repeats >= 1")
        if self.slow_rank is not None and not 0 <= self.slow_rank < self.world:
            raise bad_value("slow_rank", self.slow_rank, f"a rank in 0..{self.world - 1}")
        if self.slow_link is not None and tuple(self.slow_link) not in set(self.hops()):
            raise bad_value("slow_link", self.slow_link, f"a ring hop (src, dst), one of {self.hops()}")
        if self.compute_ms < 0 or self.link_ms < 0 or self.jitter < 0 or self.slow_factor <= 0:
            raise bad_value("compute_ms/link_ms/jitter/slow_factor", self, "non-negative times, positive factor")

    @property
    def ring(self) -> tuple[int, ...]:
        return tuple(self.order) if self.order is not None else tuple(range(self.world))

    def hops(self) -> list[tuple[int, int]]:
        """The ring's links (src, dst) in ring order."""
        ring = self.ring
        return [(ring[p - 1], ring[p]) for p in range(1, self.world)] + (
            [(ring[-1], ring[0])] if self.world > 1 else []
        )

    def faults(self) -> list[str]:
        """Injected fault specs (the `faults` column of the cases table)."""
        specs = []
        if self.slow_rank is not None and self.slow_factor != 1.0:
            specs.append(f"slow_rank:rank={self.slow_rank},factor={self.slow_factor:g}")
        if self.slow_link is not None and self.slow_link_extra_ms > 0:
            src, dst = self.slow_link
            specs.append(f"slow_link:src={src},dst={dst},extra_ms={self.slow_link_extra_ms:g}")
        return specs

    @property
    def name(self) -> str:
        return self.case_id or f"sim-w{self.world}-{self.buffer}-{self.mask}-{self.layout}"


def pair_work(world: int, mask: str, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """(kind[q, k], visible[q, k]) for query rank q against rank k's keys: the mask plan, as ringbench/plan.py.

    contiguous: k < q full, k == q causal, k > q skip. zigzag: k == q causal, otherwise full on half the rows.
    striped: every pair is a (shifted) triangle, causal. causal-naive computes every pair at full cost.
    """
    q, k = np.meshgrid(np.arange(world), np.arange(world), indexing="ij")
    if mask == "none":
        return np.full((world, world), "full", dtype=object), np.ones((world, world))
    if mask == "causal-naive":
        kind = np.where(k < q, "full", "partial").astype(object)
        return kind, np.ones((world, world))
    if layout == "contiguous":
        kind = np.select([k < q, k == q], ["full", "causal"], "skip").astype(object)
        visible = np.select([k < q, k == q], [1.0, 0.5], 0.0)
    elif layout == "zigzag":
        kind = np.where(k == q, "causal", "full").astype(object)
        visible = np.full((world, world), 0.5)
    else:  # striped
        kind = np.full((world, world), "causal", dtype=object)
        visible = np.full((world, world), 0.5)
    return kind, visible


def _noise(rng: np.random.Generator, shape: tuple[int, ...], cv: float) -> np.ndarray:
    if cv <= 0:
        return np.ones(shape)
    sigma = np.sqrt(np.log1p(cv * cv))  # lognormal with mean 1 and the given coefficient of variation
    return rng.lognormal(-sigma * sigma / 2, sigma, size=shape)


def _simulate_repeat(cfg: SimConfig, repeat: int) -> pd.DataFrame:
    """All events of one repeat, vectorised over iterations (G) and ranks (N); the loop runs over ring steps."""
    rng = np.random.default_rng([cfg.seed, repeat])
    n, g_count = cfg.world, cfg.iterations
    ring = np.asarray(cfg.ring)
    pos = np.arange(n)
    steps = np.arange(n)
    owner = ring[(pos[:, None] - steps[None, :]) % n]  # (N, S): rank whose block position p holds at step s
    kind_qk, visible_qk = pair_work(n, cfg.mask, cfg.layout)
    pair = kind_qk[ring[:, None], owner]  # (N, S)
    visible = visible_qk[ring[:, None], owner]
    slow = np.where(ring == cfg.slow_rank, cfg.slow_factor, 1.0)[:, None]
    base_compute = cfg.compute_ms * visible * slow  # (N, S)
    link_in = np.array(
        [cfg.link_ms_by_hop.get((int(ring[p - 1]), int(ring[p])), cfg.link_ms) for p in pos], dtype=float
    )  # (N,): link into position p
    if cfg.slow_link is not None:
        link_in = link_in + np.array(
            [cfg.slow_link_extra_ms * ((ring[p - 1], ring[p]) == tuple(cfg.slow_link)) for p in pos]
        )
    local = cfg.seq // n
    block_bytes = 2 * cfg.batch * cfg.heads * local * cfg.head_dim * DTYPE_BYTES[cfg.dtype]  # K and V
    pair_flops = 4.0 * cfg.batch * cfg.heads * local * local * cfg.head_dim  # QK^T and PV, fully visible

    frames: list[dict[str, np.ndarray]] = []
    phase_start = np.zeros((g_count, n))  # relative to the iteration's start
    phases = ("fwd", "bwd") if cfg.backward else ("fwd",)
    for phase in phases:
        scale = cfg.bwd_compute_factor if phase == "bwd" else 1.0
        data_scale = 2.0 if phase == "bwd" else 1.0
        compute = base_compute[None] * scale * _noise(rng, (g_count, n, n), cfg.jitter)  # (G, N, S)
        transfer = link_in[None, :, None] * data_scale * _noise(rng, (g_count, n, n), cfg.jitter)
        t = phase_start.copy()
        for s in range(n):
            has_x = (s < n - 1) if cfg.buffer == "double" else (s > 0)
            c = np.where(pair[:, s] == "skip", 0.0, compute[:, :, s])  # (G, N)
            row = {"phase": phase, "step": s, "t": t, "pair": pair[:, s], "owner": owner[:, s]}
            row["flops"] = np.where(pair[:, s] == "skip", 0.0, pair_flops * visible[:, s] * scale)
            if has_x:
                recv_end = np.maximum(t, np.roll(t, 1, axis=1)) + transfer[:, :, s]
                row |= {
                    "recv_end": recv_end,
                    "send_end": np.roll(recv_end, -1, axis=1),
                    "bytes": block_bytes * data_scale,
                }
                if cfg.buffer == "double":
                    c_start, wait_start = t, t + c
                    end = np.maximum(t + c, recv_end)
                else:
                    c_start, wait_start = recv_end, t
                    end = recv_end + c
                row |= {"wait_start": wait_start, "wait_end": np.maximum(wait_start, recv_end)}
            else:
                c_start, end = t, t + c
            row |= {"c_start": c_start, "c_end": c_start + c}
            frames.append(row)
            t = end
        frames.append({"phase": phase, "end": t})
        phase_start = t

    # Iterations run back to back, separated by a barrier: offset each by the slowest rank's previous end.
    iteration_ms = phase_start.max(axis=1) + cfg.gap_ms
    offset = np.concatenate([[0.0], np.cumsum(iteration_ms)[:-1]])[:, None]  # (G, 1)
    return _to_events(cfg, repeat, frames, offset)


def _to_events(cfg: SimConfig, repeat: int, frames: list, offset: np.ndarray) -> pd.DataFrame:
    """Flatten the per-step arrays into event rows (vectorised per step and kind)."""
    n, g_count = cfg.world, cfg.iterations
    ring = np.asarray(cfg.ring)
    gi, pi = np.meshgrid(np.arange(g_count), np.arange(n), indexing="ij")  # (G, N)
    rank, pred, succ = ring[pi], ring[(pi - 1) % n], ring[(pi + 1) % n]
    parts: list[dict[str, np.ndarray]] = []

    def add(keep, phase, step, kind, start, end, src, dst, nbytes=0, block=-1, pair="", flops=0.0):
        keep = np.broadcast_to(keep, (g_count, n))
        rows = {
            "iteration": gi[keep],
            "phase": np.full(keep.sum(), phase, dtype=object),
            "rank": rank[keep],
            "ring_position": pi[keep],
            "step": np.full(keep.sum(), step),
            "kind": np.full(keep.sum(), kind, dtype=object),
            "start_ns": np.round((np.broadcast_to(start, (g_count, n)) + offset)[keep] * 1e6),
            "end_ns": np.round((np.broadcast_to(end, (g_count, n)) + offset)[keep] * 1e6),
            "src": np.broadcast_to(src, (g_count, n))[keep],
            "dst": np.broadcast_to(dst, (g_count, n))[keep],
            "bytes": np.broadcast_to(nbytes, (g_count, n))[keep],
            "block": np.broadcast_to(block, (g_count, n))[keep],
            "pair": np.broadcast_to(np.asarray(pair, dtype=object), (g_count, n))[keep],
            "flops": np.broadcast_to(flops, (g_count, n))[keep],
        }
        parts.append(rows)

    phase_start = np.zeros((g_count, n))
    for row in frames:
        if "step" not in row:  # the end of a phase: its iteration row (the backward's starts where the forward ended)
            add(True, row["phase"], -1, "iteration", phase_start, row["end"], rank, rank)
            phase_start = row["end"]
            continue
        phase, step = row["phase"], row["step"]
        computed = (row["pair"] != "skip")[None, :]
        add(computed, phase, step, "compute", row["c_start"], row["c_end"], row["owner"][None, :], rank,
            block=row["owner"][None, :], pair=row["pair"][None, :], flops=row["flops"][None, :])  # fmt: skip
        if "recv_end" in row:
            add(True, phase, step, "send", row["t"], row["send_end"], rank, succ, row["bytes"], row["owner"][None, :])
            sent_block = np.roll(row["owner"], 1)[None, :]  # the predecessor's block in hand
            add(True, phase, step, "recv", row["t"], row["recv_end"], pred, rank, row["bytes"], sent_block)
            add(True, phase, step, "wait", row["wait_start"], row["wait_end"], pred, rank)
    events = pd.DataFrame({key: np.concatenate([p[key] for p in parts]) for key in parts[0]})
    events.insert(0, "case_id", cfg.name)
    events.insert(1, "repeat", repeat)
    return events.reindex(columns=list(EVENT_COLUMNS)).astype(
        {
            "repeat": "int32",
            "iteration": "int32",
            "rank": "int32",
            "ring_position": "int32",
            "step": "int32",
            "start_ns": "int64",
            "end_ns": "int64",
            "src": "int32",
            "dst": "int32",
            "bytes": "int64",
            "block": "int32",
            "flops": "float64",
        }
    )


def _summarize(cfg: SimConfig, events: pd.DataFrame, repeat: int, rng: np.random.Generator) -> dict:
    """The cases-table row of one simulated repeat: the figures of ringbench/metrics.py, as for a real run."""
    axes = {
        "case_id": cfg.name, "repeat": repeat, "world": cfg.world, "seq": cfg.seq, "heads": cfg.heads,
        "head_dim": cfg.head_dim, "batch": cfg.batch, "dtype": cfg.dtype, "mask": cfg.mask, "layout": cfg.layout,
        "buffer": cfg.buffer, "order": "-".join(map(str, cfg.ring)), "kernel": "simulated", "backward": cfg.backward,
        "ring": "-".join(map(str, cfg.ring)), "emulated": True, "faults": ";".join(cfg.faults()),
        "iters": cfg.iterations, "warmup": 0,
    }  # fmt: skip
    figures = case_figures(events, pd.DataFrame([axes]), by=("case_id", "repeat")).iloc[0]
    err = _TYPICAL_ERROR[cfg.dtype] * np.sqrt(cfg.world) if cfg.synthetic_errors else np.nan
    return axes | {name: float(figures[name]) for name in CASE_FIGURES} | {
        "fwd_max_abs_err": err * rng.uniform(0.5, 1.5), "bwd_max_abs_err": 2 * err * rng.uniform(0.5, 1.5),
        "passed": True, "status": "ok", "peak_mem_mb": np.nan, "saturated_blocks": 0,
    }  # fmt: skip


def simulate(configs: SimConfig | Sequence[SimConfig]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Events and cases tables of one or more simulated cases (each with its repeats)."""
    configs = [configs] if isinstance(configs, SimConfig) else list(configs)
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise UsageError(f"case_id values must be unique; got {names}")
    events, cases = [], []
    for cfg in configs:
        for repeat in range(cfg.repeats):
            ev = _simulate_repeat(cfg, repeat)
            cases.append(_summarize(cfg, ev, repeat, np.random.default_rng([cfg.seed, repeat, 1])))
            events.append(ev)
    cases_df = pd.DataFrame(cases, columns=list(CASE_COLUMNS))
    return pd.concat(events, ignore_index=True), cases_df


def simulate_run(
    configs: SimConfig | Sequence[SimConfig], *, run_id: str = "simulated", path: Path | None = None
) -> RunData:
    """A RunData of simulated cases (in memory; see write_simulated_run to store it)."""
    configs = [configs] if isinstance(configs, SimConfig) else list(configs)
    events, cases = simulate(configs)
    faults = sorted({spec for cfg in configs for spec in cfg.faults()})
    meta = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "emulated": True,
        "simulated": True,
        "faults": faults,
        "hosts": [socket.gethostname()],
        "command": "ringbench.simulate",
        "simulator": [
            {k: (list(v.items()) if isinstance(v, Mapping) else v) for k, v in asdict(c).items()} for c in configs
        ],
    }
    return RunData(path=Path(path) if path else Path(run_id), events=events, cases=cases, meta=meta)


def write_simulated_run(out_dir: str | Path, configs: SimConfig | Sequence[SimConfig]) -> Path:
    """Simulate and store `out_dir/` (events.parquet, cases.parquet/csv, meta.json) with the store's writers."""
    out_dir = Path(out_dir)
    run = simulate_run(configs, run_id=out_dir.name, path=out_dir)
    write_events(out_dir, run.events)
    write_cases(out_dir, run.cases)
    write_json(out_dir / "meta.json", run.meta)
    return out_dir


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m ringbench.simulate", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--buffer", default="double", choices=BUFFERS)
    parser.add_argument("--mask", default="none", choices=MASKS)
    parser.add_argument("--layout", default="contiguous", choices=LAYOUTS)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--compute-ms", type=float, default=2.0)
    parser.add_argument("--link-ms", type=float, default=1.0)
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--slow-link", help="SRC-DST")
    parser.add_argument("--slow-link-extra-ms", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    slow_link = tuple(int(x) for x in args.slow_link.split("-")) if args.slow_link else None
    cfg = SimConfig(
        world=args.world, buffer=args.buffer, mask=args.mask, layout=args.layout, iterations=args.iterations,
        compute_ms=args.compute_ms, link_ms=args.link_ms, slow_rank=args.slow_rank, slow_factor=args.slow_factor,
        slow_link=slow_link, slow_link_extra_ms=args.slow_link_extra_ms, jitter=args.jitter, seed=args.seed,
        synthetic_errors=True,
    )  # fmt: skip
    print(write_simulated_run(args.out_dir, cfg))


if __name__ == "__main__":
    _main()
