"""A run: expand the scenario into cases, launch ranks, summarise and store each case as it finishes.

``execute(scenario, out=..., resume=...)`` is the library call behind ``ringbench run``. Cases with the same world
size share a process group; every repeat gets fresh process groups. Each finished case is appended to
``events.parquet`` and ``cases.parquet``/``cases.csv`` atomically, so an interrupted sweep loses nothing and
``--resume`` runs only what is missing.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench import store
from ringbench.errors import RunFailure, UsageError
from ringbench.kernels import get_kernel
from ringbench.launch import launch_local
from ringbench.metadata import collect_metadata
from ringbench.runner import rank_worker
from ringbench.scenario import Case, Scenario
from ringbench.schema import CASE_COLUMNS, EVENT_COLUMNS, SCHEMA_VERSION
from ringbench.selfcheck import TOLERANCE


@dataclass(slots=True)
class RunState:
    """What is on disk for this run, kept in memory so each case is one atomic rewrite."""

    run_dir: Path
    meta: dict
    events: list[pd.DataFrame] = field(default_factory=list)
    cases: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(CASE_COLUMNS)))

    def done(self) -> set[tuple[str, int]]:
        ok = self.cases[self.cases["status"] == "ok"] if len(self.cases) else self.cases
        return {(row.case_id, int(row.repeat)) for row in ok.itertuples()}

    def add(self, events: pd.DataFrame, case_row: dict) -> None:
        self.events.append(events)
        if len(self.cases):
            self.cases = self.cases[
                ~((self.cases["case_id"] == case_row["case_id"]) & (self.cases["repeat"] == case_row["repeat"]))
            ]
        self.cases = (
            pd.concat([self.cases, pd.DataFrame([case_row])], ignore_index=True)
            if len(self.cases)
            else (pd.DataFrame([case_row], columns=list(CASE_COLUMNS)))
        )
        all_events = pd.concat(self.events, ignore_index=True)
        store.write_events(self.run_dir, all_events)
        store.write_cases(self.run_dir, self.cases)


def new_run_id(scenario: Scenario) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in scenario.name)[:40] or "run"
    return f"{stamp}-{safe}"


def new_run_dir(out: str | Path, scenario: Scenario) -> Path:
    """Create results/<run-id>/ (a suffix keeps two runs started within one second apart)."""
    base_id = run_id = new_run_id(scenario)
    suffix = 1
    while True:
        run_dir = Path(out) / run_id
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            suffix += 1
            run_id = f"{base_id}-{suffix}"
        except OSError as exc:
            raise UsageError(f"out={str(out)!r} is not writable ({exc.strerror})") from None


def _percentile(values, q) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def summarize_case(case: Case, per_rank: list[dict], scenario: Scenario, repeat: int) -> tuple[pd.DataFrame, dict]:
    """This case's events table and its summary row: the figures of ringbench/metrics.py (medians over timed
    iterations, with p10/p90), the numerical check, peak memory and the emulation's saturated kernel calls."""
    from ringbench.analysis.stragglers import clock_tolerance_ns
    from ringbench.metrics import CASE_FIGURES, case_figures

    rows = [row for result in per_rank for row in result["rows"]]
    events = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    residual = max(int(r.get("clock_residual_ns") or 0) for r in per_rank)
    tol_ns = clock_tolerance_ns({"ranks": {str(case.world): {"clock_residual_ns": residual}}})
    sizes = pd.DataFrame([{"case_id": case.case_id, "batch": case.batch, "seq": case.seq}])
    figures = case_figures(events, sizes, tol_ns=tol_ns)  # the definitions every consumer shares
    figures = figures.iloc[0] if len(figures) else pd.Series(dtype=float)
    peaks = [float(r["peak_mem_mb"]) for r in per_rank if r.get("peak_mem_mb") is not None]
    fwd_err = float(np.max([r["fwd_err"] for r in per_rank]))  # np.max: a NaN on any rank stays NaN
    bwd_err = float(np.max([r["bwd_err"] for r in per_rank]))
    fwd_tol, bwd_tol = TOLERANCE[case.dtype]
    passed = True
    if scenario.check:
        passed = bool(fwd_err <= fwd_tol and (not case.backward or bwd_err <= bwd_tol))  # False for NaN
    row = {
        "case_id": case.case_id,
        "repeat": repeat,
        **{key: value for key, value in case.axes().items() if key in CASE_COLUMNS},
        "emulated": case.emulated or scenario.emulate_links,
        "faults": ";".join(scenario.faults),
        "iters": scenario.iters,
        "warmup": scenario.warmup,
        **{name: float(figures.get(name, math.nan)) for name in CASE_FIGURES},
        "fwd_max_abs_err": fwd_err,
        "bwd_max_abs_err": bwd_err,
        "passed": passed,
        "status": "ok",
        "peak_mem_mb": float(np.nanmax(peaks)) if peaks and not np.isnan(peaks).all() else math.nan,
        "emulated_gflops": _emulated_rate(per_rank),
        "check_note": "; ".join(sorted({r["check_note"] for r in per_rank if r.get("check_note")})),
        "saturated_blocks": int(sum(int(r.get("saturated_blocks") or 0) for r in per_rank)),
    }
    return events, row


# Seconds the float64 check of one case may take on one rank; beyond it the check samples rows and says so.
CHECK_BUDGET_S = 60.0


def _emulated_rate(per_rank: list[dict]) -> float:
    """The emulated kernel's rate (every rank runs the same; emulated:auto's choice), NaN when not emulated."""
    rates = [r.get("emulated_gflops") for r in per_rank if r.get("emulated_gflops") is not None]
    return float(rates[0]) if rates else math.nan


def run_settings(scenario: Scenario, trace: bool, *, profile_dir: Path | None = None, loopback: bool = False) -> dict:
    """What every rank needs besides its cases (plain data: it crosses process boundaries)."""
    return {
        "iters": scenario.iters,
        "warmup": scenario.warmup,
        "check": scenario.check,
        "timeout": float(scenario.timeout),
        "faults": list(scenario.faults),
        "seed": scenario.seed,
        "trace": trace,
        "link_model": scenario.link_model(),
        "profile_dir": str(profile_dir) if profile_dir is not None else None,
        "loopback": loopback,
        "check_budget_s": CHECK_BUDGET_S,
    }


def rank_summary(per_rank: list[dict]) -> dict:
    """What the ranks of one process group reported about where and how they ran (meta["ranks"][world])."""
    return {
        "hosts": sorted({r["host"] for r in per_rank}),
        "devices": sorted({r["device"] for r in per_rank}),
        "timeline": per_rank[0].get("timeline", "host"),
        "clock": per_rank[0]["clock_method"],
        "clock_residual_ns": max(r["clock_residual_ns"] for r in per_rank),
        "clock_offsets_ns": [r["clock_offset_ns"] for r in per_rank],
        "emulation_saturated_blocks": sum(r["saturated_blocks"] for r in per_rank),
        "emulation_paced_blocks": sum(r.get("paced_blocks", 0) for r in per_rank),
        "peak_mem_mb": max(r.get("peak_mem_mb", math.nan) for r in per_rank),
        "memory_method": per_rank[0].get("memory_method"),
    }


def device_meta(per_rank: list[dict]) -> dict:
    """The backend and devices the ranks actually ran on (a GPU run is labelled one, whatever the parent sees)."""
    infos = [r.get("device_info") or {"type": "cpu"} for r in per_rank]
    if infos[0].get("type") == "cuda":
        return {"backend": "nccl", "device_kind": infos[0]["name"], "devices": [i["name"] for i in infos],
                "gpus": infos}  # fmt: skip
    return {"backend": "gloo", "device_kind": "cpu"}


def execute(
    scenario: Scenario,
    *,
    out: str | Path = "results",
    resume: str | Path | None = None,
    trace: bool = True,
    command: str = "",
    on_case: Callable[[dict, int, int], None] | None = None,
    device: str | None = None,
    profile: bool = False,
    loopback: bool = False,
) -> RunState:
    """Run every (case, repeat) not yet on disk; returns the run's state (its directory, cases and metadata).

    ``profile``: capture the last timed iteration of every case on every rank with the PyTorch profiler, under
    results/<run-id>/profile/ (an independent witness of the recorder: ``ringbench check-timeline``).
    ``loopback``: a 1-rank ring exchanges its blocks with itself (the one-device test of the transfer path).
    """
    from ringbench.dist import gpu_shortage, launched_env, local_gpu_count

    launched = launched_env()
    if launched is not None:
        if resume is not None:
            raise UsageError("resume is not supported under torchrun/SLURM yet; start a new run (or resume locally)")
        world = launched[1]
        if world not in scenario.world:  # the launcher decides the ring size
            scenario = dataclasses.replace(scenario, world=(world,))
        scenario.validate()
        cases = [case for case in scenario.cases() if case.world == world]
        return _execute_launched(scenario, cases, out=out, trace=trace, command=command, on_case=on_case,
                                 device=device, profile=profile, loopback=loopback)  # fmt: skip
    scenario.validate()
    cases = scenario.cases()
    if loopback and any(case.world != 1 for case in cases):
        raise UsageError(f"loopback=True is not allowed with world={list(scenario.world)}; expected world 1")
    if device == "cuda" and local_gpu_count() < max(scenario.world):
        raise gpu_shortage(max(scenario.world), local_gpu_count())  # before spawning anything
    if resume is not None:
        run_dir = Path(resume)
        previous = store.load_run(run_dir)  # UsageError when it is not a run directory
        state = RunState(run_dir=run_dir, meta=previous.meta, cases=previous.cases)
        state.meta.pop("failure", None)  # this attempt may well finish; a new failure is recorded anew
        if len(previous.events):
            state.events.append(previous.events)
    else:
        run_dir = new_run_dir(out, scenario)
        run_id = run_dir.name
        meta = collect_metadata(scenario, run_id=run_id, command=command, trace=trace)
        meta["schema_version"] = SCHEMA_VERSION
        state = RunState(run_dir=run_dir, meta=meta)
        store.write_json(run_dir / store.META_FILE, meta)
    done = state.done()
    todo = [(i, c, r) for r in range(scenario.repeat) for i, c in enumerate(cases) if (c.case_id, r) not in done]
    total = len(cases) * scenario.repeat
    finished = total - len(todo)
    settings = run_settings(
        scenario, trace, profile_dir=_profile_dir(state, profile, scenario.iters), loopback=loopback
    )
    by_group: dict[tuple[int, int], list[tuple[int, Case]]] = defaultdict(list)
    for index, case, repeat in todo:
        by_group[(repeat, case.world)].append((index, case))
    for (repeat, world), group_cases in sorted(by_group.items()):
        pending: dict[str, list[dict]] = defaultdict(list)
        by_id = {case.case_id: case for _, case in group_cases}

        def on_item(rank: int, result: dict, repeat=repeat, world=world, pending=pending, by_id=by_id) -> bool:
            nonlocal finished
            pending[result["case_id"]].append(result)
            if len(pending[result["case_id"]]) < world:
                return False
            per_rank = sorted(pending.pop(result["case_id"]), key=lambda r: r["rank"])
            case = by_id[result["case_id"]]
            events, row = summarize_case(case, per_rank, scenario, repeat)
            state.add(events, row)
            _note_ranks(state.meta, world, per_rank)
            _note_case(state.meta, case, row)
            store.write_json(run_dir / store.META_FILE, state.meta)
            finished += 1
            if on_case is not None:
                on_case(row, finished, total)
            return True

        started = time.monotonic()
        try:
            launch_local(world, rank_worker, (group_cases, settings, repeat), timeout_s=scenario.timeout,
                         device=device, on_item=on_item, case_names=[c.case_id for c in cases])  # fmt: skip
        except RunFailure as exc:
            state.meta["failure"] = str(exc)
            store.write_json(run_dir / store.META_FILE, state.meta)
            raise RunFailure(f"{exc} [run {run_dir}, {finished}/{total} cases kept]") from None
        state.meta.setdefault("launch_seconds", []).append(round(time.monotonic() - started, 3))
    state.meta["finished"] = datetime.now(timezone.utc).isoformat()
    store.write_json(run_dir / store.META_FILE, state.meta)
    return state


def _note_ranks(meta: dict, world: int, per_rank: list[dict]) -> None:
    """Fold what the ranks reported into the metadata (kept over cases: counts add up, peaks take the max)."""
    summary = rank_summary(per_rank)
    previous = meta.setdefault("ranks", {}).get(str(world))
    if previous:
        for key in ("emulation_saturated_blocks", "emulation_paced_blocks"):
            summary[key] += previous.get(key, 0)
        summary["peak_mem_mb"] = max(summary["peak_mem_mb"], previous.get("peak_mem_mb", math.nan))
    meta["ranks"][str(world)] = summary
    meta.update(device_meta(per_rank))


def _note_case(meta: dict, case: Case, row: dict) -> None:
    """Per-case facts the metadata lists: the rate emulated:auto chose, what the check left out."""
    if getattr(get_kernel(case.kernel), "auto", False):
        meta.setdefault("emulated_auto", {})[case.case_id] = row["emulated_gflops"]
    if row.get("check_note"):
        meta.setdefault("check_notes", {})[case.case_id] = row["check_note"]


def _profile_dir(state: RunState, profile: bool, iters: int) -> Path | None:
    if not profile:
        return None
    state.meta["profile"] = {"dir": "profile", "iteration": iters - 1}  # the last timed iteration
    return state.run_dir / "profile"


def _execute_launched(scenario, cases, *, out, trace, command, on_case, device, profile, loopback) -> RunState | None:
    """torchrun / SLURM: this process is one rank; rank 0 gathers each case and writes the results."""
    import torch.distributed as dist

    from ringbench.dist import init_launched
    from ringbench.runner import open_session, profile_path, run_case

    env = init_launched(scenario.timeout, device)
    session = open_session(env)
    mine = list(enumerate(cases))
    state = None
    if env.rank == 0:
        run_dir = new_run_dir(out, scenario)
        meta = collect_metadata(scenario, run_id=run_dir.name, command=command, trace=trace)
        meta.update(schema_version=SCHEMA_VERSION, launcher=env.launcher, backend=env.backend)
        state = RunState(run_dir=run_dir, meta=meta)
        store.write_json(run_dir / store.META_FILE, meta)
    run_dir_name = session.ops.all_objects(str(state.run_dir) if state is not None else None)[0]
    profile_dir = Path(run_dir_name) / "profile" if profile else None
    if state is not None and profile:
        _profile_dir(state, profile, scenario.iters)
    settings = run_settings(scenario, trace, profile_dir=profile_dir, loopback=loopback)
    total = len(mine) * scenario.repeat
    finished = 0
    for repeat in range(scenario.repeat):
        for index, case in mine:
            result = run_case(case, session=session, progress=None, settings=settings, case_index=index,
                              repeat=repeat, profile_path=profile_path(settings, case, repeat, env.rank))  # fmt: skip
            gathered = session.ops.gather_objects(result)
            if env.rank == 0:
                events, row = summarize_case(case, gathered, scenario, repeat)
                state.add(events, row)
                _note_ranks(state.meta, env.world, gathered)
                _note_case(state.meta, case, row)
                store.write_json(state.run_dir / store.META_FILE, state.meta)
                finished += 1
                if on_case is not None:
                    on_case(row, finished, total)
    if env.rank == 0:
        state.meta["finished"] = datetime.now(timezone.utc).isoformat()
        store.write_json(state.run_dir / store.META_FILE, state.meta)
    session.ops.barrier()
    dist.destroy_process_group()
    return state
