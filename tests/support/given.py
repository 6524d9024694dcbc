"""``SimConfig``: a ring at given compute and link times (ms), on the simulator's one model. SIMULATED, not measured.

For tests and experiments that need a ring with exactly these costs: a healthy full (query block, key block) pair
computes in ``compute_ms`` (the backward ``bwd_compute_factor`` times that), a K/V block crosses a link in
``link_ms`` (per hop: ``link_ms_by_hop``). It is stated as a `Workload` and `Costs` (and, for per-hop times, a
measured-matrix topology) and simulated by `simulate_case`, exactly as ``ringbench simulate`` does: the engine's
backward with its separate dK/dV exchange (fp32 accumulators: their transfer takes ``link_ms`` times their bytes
over the K/V block's), no host overheads, every rank starting an iteration at once. A slow rank and a slow link
are the run's faults (``slow-rank:R:F`` stretches the arithmetic, ``slow-link:S:D:MS`` delays each arrival).

``synthetic_errors`` fills the error columns with typical values for the dtype: made up, so the record says so
itself (``check_note`` of every such row, meta.json ``synthetic_errors: true``); NaN otherwise (not checked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError, bad_value
from ringbench.kernels.base import block_flops
from ringbench.record.schema import CASE_COLUMNS
from ringbench.record.store import RunData
from ringbench.scenario.workload import Workload, reads_workload
from ringbench.simulate.case import DTYPE_BYTES, Cluster, SimCase
from ringbench.simulate.costs import Costs, LinkCost
from ringbench.simulate.simulated_record import run_data, simulate_case, write_run

SYNTHETIC_NOTE = "synthetic errors: typical values for the dtype, made up for a test (not measured)"
BUFFERS = ("sync", "double")
MASKS = ("none", "causal", "causal-naive")
LAYOUTS = ("contiguous", "zigzag", "striped")
# Typical max-abs errors of the real ring against the float64 reference (DESIGN.md), for synthetic_errors only.
_TYPICAL_ERROR = {"float64": 1e-15, "float32": 3e-7, "bfloat16": 8e-3, "float16": 1e-3}


@reads_workload
@dataclass(kw_only=True, slots=True, frozen=True)
class SimConfig:
    """One simulated case at the timing level: a workload (it reads the workload's axes as its own) and the times of
    a healthy rank and link, in milliseconds. ``SimConfig.of(world=4, buffer="sync", ...)`` builds it from flat axes."""

    workload: Workload
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

    @classmethod
    def of(cls, *, world: int = 4, order: Sequence[int] | None = None, seq: int = 8192, heads: int = 8,
           head_dim: int = 64, batch: int = 1, dtype: str = "float32", mask: str = "none", layout: str = "contiguous",
           buffer: str = "double", **timing) -> SimConfig:  # fmt: skip
        """A config from flat axes: ``order`` the ranks in ring order (None: identity); ``mask`` none | causal (skip
        fully masked pairs) | causal-naive (compute every pair); ``seq`` rounded down to what the layout divides
        (only bytes and FLOPs use it)."""
        if world < 1:
            raise bad_value("world", world, "an integer >= 1")
        for name, value, allowed in (("buffer", buffer, BUFFERS), ("mask", mask, MASKS), ("layout", layout, LAYOUTS),
                                     ("dtype", dtype, tuple(DTYPE_BYTES))):  # fmt: skip
            if value not in allowed:
                raise bad_value(name, value, f"one of: {', '.join(allowed)}")
        if order is not None and sorted(order) != list(range(world)):
            raise UsageError(f"order={tuple(order)!r} is not a permutation of ranks 0..{world - 1}")
        parts = 2 * world if layout == "zigzag" else world
        workload = Workload(world=world, seq=max(parts, seq // parts * parts), heads=heads, head_dim=head_dim,
                            batch=batch, dtype=dtype, mask=mask, layout=layout, buffer=buffer,
                            order="-".join(map(str, order if order is not None else range(world))))  # fmt: skip
        return cls(workload=workload, **timing)

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.repeats < 1:
            raise bad_value("iterations", (self.iterations, self.repeats), "iterations >= 1 and repeats >= 1")
        if self.slow_rank is not None and not 0 <= self.slow_rank < self.world:
            raise bad_value("slow_rank", self.slow_rank, f"a rank in 0..{self.world - 1}")
        if self.slow_link is not None and tuple(self.slow_link) not in set(self.hops()):
            raise bad_value("slow_link", self.slow_link, f"a ring hop (src, dst), one of {self.hops()}")
        if self.compute_ms < 0 or self.link_ms < 0 or self.jitter < 0 or self.slow_factor <= 0:
            raise bad_value("compute_ms/link_ms/jitter/slow_factor", self, "non-negative times, positive factor")

    def hops(self) -> list[tuple[int, int]]:
        """The ring's links (src, dst) in ring order."""
        ring = self.ring
        return [(ring[p - 1], ring[p]) for p in range(1, self.world)] + (
            [(ring[-1], ring[0])] if self.world > 1 else []
        )

    def faults(self) -> list[str]:
        """Injected faults as canonical specs (ringbench.scenario.faults), the ``faults`` column of the cases table."""
        specs = []
        if self.slow_rank is not None and self.slow_factor != 1.0:
            specs.append(f"slow-rank:{self.slow_rank}:{self.slow_factor:g}")
        if self.slow_link is not None and self.slow_link_extra_ms > 0:
            src, dst = self.slow_link
            specs.append(f"slow-link:{src}:{dst}:{self.slow_link_extra_ms:g}")
        return specs

    @property
    def name(self) -> str:
        return self.case_id or f"sim-w{self.world}-{self.buffer}-{self.mask}-{self.layout}"

    def sim_case(self, repeat: int = 0) -> SimCase:
        """The case on the simulator's model."""
        return SimCase(workload=self.workload, backward=self.backward, iterations=self.iterations,
                       seed=self.seed * 7919 + repeat, faults=tuple(self.faults()))  # fmt: skip

    def costs(self) -> Costs:
        """Costs whose full pair computes in compute_ms (forward) and bwd_compute_factor x that (backward), and
        whose K/V block crosses a link in link_ms."""
        local = self.seq // self.world
        pair_gflop = block_flops(self.batch, self.heads, local, local, self.head_dim, 1.0, False) / 1e9
        gflops = pair_gflop * 1e3 / self.compute_ms if self.compute_ms > 0 else 1e18
        bwd = self.bwd_compute_factor / 2.5  # block_flops prices the backward at 2.5x the forward
        zero = {phase: {buffer: dict.fromkeys(("enter_ms", "pre_ms", "mid_ms", "post_ms"), 0.0)
                        for buffer in BUFFERS} for phase in ("fwd", "bwd")}  # fmt: skip
        kv = self.sim_case().block_bytes("kv")
        bandwidth = kv / (self.link_ms * 1e6) if self.link_ms > 0 else 1e12  # GB/s that move one block in link_ms
        return Costs(
            gflops=gflops, call_ms={"fwd": 0.0, "bwd": 0.0}, host_ms=zero, gap_ms=self.gap_ms,
            efficiency={"fwd": dict.fromkeys(("full", "causal", "partial"), 1.0),
                        "bwd": dict.fromkeys(("full", "causal", "partial"), bwd if bwd > 0 else 1e-12)},
            compute_cv=self.jitter, link_cv=self.jitter,
            links={"local": LinkCost(latency_us=0.0, bandwidth_gbps=bandwidth)}, source="SimConfig",
        )  # fmt: skip

    def plain(self) -> dict:
        """The config as JSON-ready values (meta.json's ``simulation.configs``): the workload's axes flat."""
        timing = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "workload"}
        return {key: ([[*list(k), v] for k, v in value.items()] if isinstance(value, Mapping) else
                      list(value) if isinstance(value, tuple) else value)
                for key, value in (self.workload.axes() | timing).items()}  # fmt: skip


def _cluster(cfg: SimConfig, case: SimCase) -> Cluster:
    """Per-hop link times as a measured-matrix topology (no NET: nothing shares a link); else the local link."""
    if not cfg.link_ms_by_hop:
        return Cluster()
    from ringbench.topology import from_probe_matrix

    kv = case.block_bytes("kv")
    ms = np.full((cfg.world, cfg.world), cfg.link_ms, dtype=float)
    for (src, dst), value in cfg.link_ms_by_hop.items():
        ms[src, dst] = value
    bandwidth = kv / (np.clip(ms, 1e-9, None) * 1e6)
    np.fill_diagonal(bandwidth, 1.0)
    return Cluster(topology=from_probe_matrix(np.zeros_like(ms), bandwidth))


def _simulate_repeat(cfg: SimConfig, repeat: int) -> tuple[pd.DataFrame, dict]:
    case = cfg.sim_case(repeat)
    result = simulate_case(case, cfg.costs(), _cluster(cfg, case), repeat=repeat, max_events=1 << 62,
                           case_id=cfg.name)  # fmt: skip
    row = result.row | {"order": "-".join(map(str, cfg.ring)), "faults": ";".join(cfg.faults()),
                        "emulated_gflops": math.nan}  # fmt: skip
    if cfg.synthetic_errors:
        rng = np.random.default_rng([cfg.seed, repeat, 1])
        err = _TYPICAL_ERROR[cfg.dtype] * np.sqrt(cfg.world)
        row |= {"fwd_max_abs_err": err * rng.uniform(0.5, 1.5), "bwd_max_abs_err": 2 * err * rng.uniform(0.5, 1.5),
                "check_note": SYNTHETIC_NOTE}  # fmt: skip
    return result.events, row


def simulate(configs: SimConfig | Sequence[SimConfig]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Events and cases tables of one or more simulated cases (each with its repeats)."""
    configs = [configs] if isinstance(configs, SimConfig) else list(configs)
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise UsageError(f"case_id values must be unique; got {names}")
    events, cases = [], []
    for cfg in configs:
        for repeat in range(cfg.repeats):
            frame, row = _simulate_repeat(cfg, repeat)
            events.append(frame)
            cases.append(row)
    return pd.concat(events, ignore_index=True), pd.DataFrame(cases, columns=list(CASE_COLUMNS))


def simulate_run(
    configs: SimConfig | Sequence[SimConfig], *, run_id: str = "simulated", path: Path | None = None
) -> RunData:
    """A RunData of simulated cases (in memory; see write_simulated_run to store it)."""
    configs = [configs] if isinstance(configs, SimConfig) else list(configs)
    events, cases = simulate(configs)
    first = configs[0]
    run = run_data([], first.costs(), run_id=run_id, path=path, command="ringbench.simulate (SimConfig)",
                   extra={"configs": [cfg.plain() for cfg in configs]})  # fmt: skip
    if any(cfg.synthetic_errors for cfg in configs):
        run.meta["simulation"]["synthetic_errors"] = True  # the error columns are made up: the record says so
    run.events, run.cases = events, cases
    run.meta["faults"] = sorted({spec for cfg in configs for spec in cfg.faults()})
    worlds = sorted({cfg.world for cfg in configs})
    run.meta["world"] = worlds[0] if len(worlds) == 1 else worlds
    return run


def write_simulated_run(out_dir: str | Path, configs: SimConfig | Sequence[SimConfig]) -> Path:
    """Simulate and store ``out_dir/`` (events.parquet, cases.parquet/csv, meta.json) with the store's writers."""
    out_dir = Path(out_dir)
    return write_run(out_dir, simulate_run(configs, run_id=out_dir.name, path=out_dir))
