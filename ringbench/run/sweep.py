"""The parent side of a run: expand the scenario into cases, launch the ranks, store each case as it finishes.

``execute(scenario, out=..., resume=...)`` is the library call behind ``ringbench run``; the CLI adds nothing to
it. One pipeline serves every way a run starts:

  local     this process spawns the ranks (ringbench.run.launch), one process group per (repeat, world size);
  launched  this process *is* a rank (torchrun / SLURM): it runs its cases and rank 0 stores them;
  resumed   ``resume=RUN_DIR`` reopens a folder, takes its recorded scenario unless one is given, leaves out the
            one-shot faults (crash, hang: they ended the first attempt on purpose) and runs only what is missing.

Whichever way, the folder, its meta.json and each case's row are written by ringbench.run.results.ResultsFolder.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from ringbench.errors import RunFailure, UsageError
from ringbench.rank.metadata import collect_metadata
from ringbench.rank.runner import RunSettings, rank_worker
from ringbench.rank.scenario import Case, Scenario
from ringbench.run.launch import launch_local
from ringbench.run.results import ResultsFolder

ONE_SHOT_FAULTS = ("crash:", "hang:")


def recorded_scenario(run_dir: str | Path) -> Scenario:
    """The scenario a run recorded in its meta.json (what ``--resume RUN_DIR`` runs when given no other)."""
    from ringbench.record.meta import read_meta

    meta = read_meta(run_dir)
    recorded = meta.scenario
    if recorded is None:
        raise UsageError(f"{run_dir}/meta.json: no scenario recorded; give the scenario file with --resume")
    fields = {key: tuple(value) if isinstance(value, list) else value for key, value in recorded.items()}
    try:
        return Scenario(**fields, source=str(meta.get("scenario_source", run_dir)))
    except TypeError as exc:
        raise UsageError(f"{run_dir}/meta.json: the recorded scenario is not readable ({exc})") from None


def resumable_scenario(folder: ResultsFolder, scenario: Scenario | None) -> Scenario:
    """The scenario a resume runs: the given one, or the folder's own; never its one-shot faults again."""
    if scenario is None:
        scenario = recorded_scenario(folder.run_dir)
    lasting = tuple(spec for spec in scenario.faults if not spec.startswith(ONE_SHOT_FAULTS))
    if lasting != scenario.faults:
        folder.notes.append("resume: crash/hang faults of the original run are not applied again")
        scenario = dataclasses.replace(scenario, faults=lasting)
    return scenario


def execute(
    scenario: Scenario | None = None,
    *,
    out: str | Path = "results",
    resume: str | Path | None = None,
    trace: bool = True,
    command: str = "",
    on_case: Callable[[dict, int, int], None] | None = None,
    device: str | None = None,
    profile: bool = False,
    loopback: bool = False,
) -> ResultsFolder | None:
    """Run every (case, repeat) not yet on disk; returns the results folder (None on a launched rank other than 0).

    ``scenario`` may be None only with ``resume`` (the run's recorded scenario is used). ``profile``: capture the
    last timed iteration of every case on every rank with the PyTorch profiler, under results/<run-id>/profile/
    (an independent witness of the recorder: ``ringbench check-timeline``). ``loopback``: a 1-rank ring exchanges
    its blocks with itself (the one-device test of the transfer path).
    """
    from ringbench.rank.dist import launched_env

    folder = ResultsFolder.reopen(resume) if resume is not None else None
    if folder is not None:
        scenario = resumable_scenario(folder, scenario)
    if scenario is None:
        raise UsageError("scenario=None is not allowed without resume; expected a Scenario (or resume=RUN_DIR)")
    launched = launched_env()
    if launched is not None:
        if folder is not None:
            raise UsageError("resume is not supported under torchrun/SLURM yet; start a new run (or resume locally)")
        if launched[1] not in scenario.world:  # the launcher decides the ring size
            scenario = dataclasses.replace(scenario, world=(launched[1],))
    settings = preflight(scenario, device=device, loopback=loopback, trace=trace, launched=launched)
    cases = [case for case in scenario.cases() if launched is None or case.world == launched[1]]
    cases, skipped = _runnable(cases, device, launched)
    if launched is not None:
        return _execute_launched(scenario, cases, settings, out=out, command=command, on_case=on_case,
                                 device=device, profile=profile)  # fmt: skip
    if folder is None:
        folder = ResultsFolder.create(out, scenario.name, collect_metadata(scenario, command=command, trace=trace))
    if skipped:
        folder.meta.setdefault("skipped", {}).update(skipped)
        by_reason = collections.Counter(skipped.values())  # one line per reason; the case ids are in meta.json
        folder.notes += [f"skipped {count} case(s): {reason}" for reason, count in by_reason.items()]
        if not cases:
            folder.finish()
            return folder
    settings = _with_profile(settings, folder, profile, cases)
    settings = _with_auto_rate(settings, folder, scenario, cases, device)
    _execute_local(scenario, cases, settings, folder, on_case=on_case, device=device)
    return folder


def preflight(scenario: Scenario, *, device: str | None = None, loopback: bool = False, trace: bool = True,
              launched=None) -> RunSettings:  # fmt: skip
    """Every check a run makes before it starts anything (UsageError, one line): the scenario, the device, the
    loopback's world, GPUs enough for the ranks, the faults a run can inject. The CLI calls it before it prints
    anything, and ``execute`` again (a library caller may not have)."""
    from ringbench.errors import bad_value
    from ringbench.rank.dist import gpu_shortage, local_gpu_count

    scenario.validate()
    if device not in (None, "cpu", "cuda"):
        raise bad_value("device", device, "cpu or cuda")
    if loopback and any(world != 1 for world in scenario.world):
        raise UsageError(f"loopback=True is not allowed with world={list(scenario.world)}; expected world 1")
    if launched is None and device == "cuda" and local_gpu_count() < max(scenario.world):
        raise gpu_shortage(max(scenario.world), local_gpu_count())  # before spawning anything
    return RunSettings.of(scenario, trace=trace, loopback=loopback)


def _runnable(cases: list[Case], device: str | None, launched) -> tuple[list[Case], dict[str, str]]:
    """Cases another implementation cannot run here (not installed, CUDA only, a layout it does not take) are
    skipped with their reason, not failed: a sweep of implementations runs what this machine can."""
    from ringbench.errors import UsageError
    from ringbench.rank.dist import local_gpu_count
    from ringbench.rank.impls import get_adapter

    keep, skipped = [], {}
    for case in cases:
        if case.impl == "ringbench":
            keep.append(case)
            continue
        on_gpu = device == "cuda" or (device is None and local_gpu_count() >= (launched[1] if launched else case.world))
        try:
            get_adapter(case.impl).check(case, "cuda" if on_gpu else "cpu")
        except UsageError as exc:
            skipped[case.case_id] = str(exc)
            continue
        keep.append(case)
    return keep, skipped


def _with_profile(settings: RunSettings, folder: ResultsFolder, profile: bool, cases: list[Case]) -> RunSettings:
    """Profiler captures: every case with --profile; another implementation's cases whenever tracing (their
    per-step spans come from the capture)."""
    others = settings.trace and any(case.impl != "ringbench" for case in cases)
    if not (profile or others):
        return settings
    folder.meta["profile"] = {"dir": "profile", "iteration": settings.iters - 1}  # ringbench's: the last timed one
    return dataclasses.replace(settings, profile_dir=str(folder.run_dir / "profile"), profile=profile)


def _with_auto_rate(settings: RunSettings, folder: ResultsFolder, scenario, cases, device) -> RunSettings:
    """emulated:auto: one rate for the whole run, measured before any case is timed (kept on resume)."""
    from ringbench.kernels import get_kernel
    from ringbench.rank.runner import calibration_worker

    auto = [case for case in cases if getattr(get_kernel(case.kernel), "auto", False) and case.impl == "ringbench"]
    if not auto:
        return settings
    rate = folder.meta.get("emulated_auto_gflops")
    if rate is None and len({case.world for case in auto}) == 1:
        return dataclasses.replace(settings, calibrate_auto=True)  # in the one launch, before its first case
    if rate is None:
        rates = []
        for world in sorted({case.world for case in auto}):
            group = [case for case in auto if case.world == world]
            per_rank = launch_local(world, calibration_worker, (group, settings), timeout_s=scenario.timeout,
                                    device=device, case_names=[c.case_id for c in group])  # fmt: skip
            rates += [r for r in per_rank if r is not None]
        rate = min(rates)
        folder.meta["emulated_auto_gflops"] = rate
        folder.save_meta()
    folder.notes.append(f"emulated:auto runs every emulated case of this run at {rate:g} GFLOP/s (measured here)")
    return dataclasses.replace(settings, emulated_auto_gflops=rate)


def _reported(case: Case, per_rank: list[dict], repeat: int, folder: ResultsFolder) -> list[dict]:
    """The ranks' reports as the record takes them: another implementation's spans come from its captures. When
    its captures cannot be read as a ring, the case keeps the iteration times its ranks measured, with a note."""
    if case.impl == "ringbench":
        return per_rank
    from ringbench.errors import UsageError
    from ringbench.rank.impls import get_adapter
    from ringbench.traces.captures import with_profile_rows

    try:
        patterns = get_adapter(case.impl).compute_patterns
        return with_profile_rows(per_rank, case.case_id, repeat, compute_patterns=patterns)
    except UsageError as exc:
        folder.notes.append(f"{case.case_id}: no per-step spans (iteration times only): {exc}")
        return per_rank


def _execute_local(scenario, cases, settings, folder: ResultsFolder, *, on_case, device) -> None:
    done = folder.done()
    todo = [(i, c, r) for r in range(scenario.repeat) for i, c in enumerate(cases) if (c.case_id, r) not in done]
    total = len(cases) * scenario.repeat
    finished = total - len(todo)
    by_group: dict[tuple[int, int], list[tuple[int, Case]]] = defaultdict(list)
    for index, case, repeat in todo:
        by_group[(repeat, case.world)].append((index, case))
    for (repeat, world), group_cases in sorted(by_group.items()):
        pending: dict[str, list[dict]] = defaultdict(list)
        by_id = {case.case_id: case for _, case in group_cases}

        def on_item(rank: int, result: dict, repeat=repeat, world=world, pending=pending, by_id=by_id) -> bool:
            nonlocal finished, settings
            if "emulated_auto_gflops" in result:  # the launch calibrated emulated:auto: keep it for the rest
                if rank == 0:
                    rate = result["emulated_auto_gflops"]
                    settings = dataclasses.replace(settings, emulated_auto_gflops=rate, calibrate_auto=False)
                    folder.meta["emulated_auto_gflops"] = rate
                    folder.notes.append(f"emulated:auto runs every emulated case at {rate:g} GFLOP/s (measured here)")
                    folder.save_meta()
                return rank == 0  # one calibration item per launch (rank 0's) counts as stored
            pending[result["case_id"]].append(result)
            if len(pending[result["case_id"]]) < world:
                return False
            per_rank = sorted(pending.pop(result["case_id"]), key=lambda r: r["rank"])
            case = by_id[result["case_id"]]
            row = folder.add_case(case, _reported(case, per_rank, repeat, folder), scenario, repeat)
            finished += 1
            if on_case is not None:
                on_case(row, finished, total)
            return True

        started = time.monotonic()
        try:
            launch_local(world, rank_worker, (group_cases, settings, repeat), timeout_s=scenario.timeout,
                         device=device, on_item=on_item, case_names=[c.case_id for c in cases])  # fmt: skip
        except RunFailure as exc:
            folder.fail(str(exc))
            raise RunFailure(f"{exc} [run {folder.run_dir}, {finished}/{total} cases kept]",
                             run_dir=str(folder.run_dir)) from None  # fmt: skip
        folder.meta.setdefault("launch_seconds", []).append(round(time.monotonic() - started, 3))
    folder.finish()


def _execute_launched(scenario, cases, settings, *, out, command, on_case, device, profile) -> ResultsFolder | None:
    """torchrun / SLURM: this process is one rank; rank 0 gathers each case and writes the results."""
    import torch.distributed as dist

    from ringbench.rank.dist import init_launched
    from ringbench.rank.runner import open_session, profile_path, run_case

    env = init_launched(scenario.timeout, device)
    session = open_session(env)
    folder = None
    if env.rank == 0:
        meta = collect_metadata(scenario, command=command, trace=settings.trace) | {"launcher": env.launcher}
        folder = ResultsFolder.create(out, scenario.name, meta)
        settings = _with_profile(settings, folder, profile, cases)
    settings = session.ops.all_objects(settings)[0]
    from ringbench.rank.runner import calibrate_auto

    rate = calibrate_auto(session, cases, settings)  # every rank calls it: it is collective
    if rate is not None:
        settings = dataclasses.replace(settings, emulated_auto_gflops=rate)
        if folder is not None:
            folder.meta["emulated_auto_gflops"] = rate  # rank 0's, with its profile folder
    total = len(cases) * scenario.repeat
    finished = 0
    for repeat in range(scenario.repeat):
        for index, case in enumerate(cases):
            result = run_case(case, session=session, progress=None, settings=settings, case_index=index,
                              repeat=repeat, profile_path=profile_path(settings, case, repeat, env.rank))  # fmt: skip
            gathered = session.ops.gather_objects(result)
            if folder is not None:
                row = folder.add_case(case, _reported(case, gathered, repeat, folder), scenario, repeat)
                finished += 1
                if on_case is not None:
                    on_case(row, finished, total)
    if folder is not None:
        folder.finish()
    session.ops.barrier()
    dist.destroy_process_group()
    return folder
