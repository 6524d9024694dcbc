"""The parent side of a run: expand the scenario into cases, launch the ranks, store each case as it finishes.

``execute(scenario, out=..., resume=...)`` is the library call behind ``ringbench run``; the CLI adds nothing to
it. One pipeline serves every way a run starts:

  local     this process spawns the ranks (ringbench.run.launch), one process group per (repeat, world size);
  launched  this process *is* a rank (torchrun / SLURM): it runs its cases and rank 0 stores them
            (ringbench.run.launched);
  resumed   ``resume=RUN_DIR`` reopens a folder, takes its recorded scenario unless one is given, leaves out the
            one-shot faults (crash, hang: they ended the first attempt on purpose) and runs only what is missing.

Whichever way, the folder, its meta.json and each case's row are written by ringbench.run.results.ResultsFolder.
A stop signal (SIGTERM, SIGINT, SIGHUP) ends any of them the same way: the ranks stop, the finished cases stay,
meta.json records ``interrupted`` (the signal, the case in flight, what was kept, the resume command) and
``Interrupted`` carries the one line that says so (ringbench.run.interrupt).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ringbench.errors import Interrupted, RunFailure, UsageError
from ringbench.rank.metadata import collect_metadata
from ringbench.rank.runner import RunSettings, rank_worker
from ringbench.rank.scenario import Case, Scenario
from ringbench.run.interrupt import StopRequested, StopSignals, signal_name
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

    SIGTERM, SIGINT or SIGHUP stops the ranks within seconds, keeps every finished case, writes ``interrupted``
    into meta.json and raises ``Interrupted`` (one line: what was kept, the case in flight, the resume command).
    """
    from ringbench.rank.dist import launched_env

    flags = resume_flags(device=device, loopback=loopback, trace=trace, profile=profile)
    if launched_env() is not None:
        from ringbench.run.launched import execute_launched

        return execute_launched(scenario, resume=resume, out=out, trace=trace, command=command, on_case=on_case,
                                device=device, profile=profile, loopback=loopback, flags=flags)  # fmt: skip
    tracker = Tracker(flags=flags)
    with StopSignals():
        try:
            return _execute(scenario, tracker, out=out, resume=resume, trace=trace, command=command,
                            on_case=on_case, device=device, profile=profile, loopback=loopback)  # fmt: skip
        except StopRequested as stop:
            raise interrupted(stop, tracker) from None


def _execute(scenario, tracker: Tracker, *, out, resume, trace, command, on_case, device, profile, loopback):
    folder = ResultsFolder.reopen(resume) if resume is not None else None
    if folder is not None:
        tracker.folder = folder  # a signal from here on keeps what the folder already holds
        scenario = resumable_scenario(folder, scenario)
    if scenario is None:
        raise UsageError("scenario=None is not allowed without resume; expected a Scenario (or resume=RUN_DIR)")
    settings = preflight(scenario, device=device, loopback=loopback, trace=trace)
    cases, skipped = _runnable(scenario.cases(), device, None)
    if folder is None:
        folder = ResultsFolder.create(out, scenario.name, collect_metadata(scenario, command=command, trace=trace))
    tracker.folder, tracker.total = folder, len(cases) * scenario.repeat
    if skipped:
        folder.meta.setdefault("skipped", {}).update(skipped)
        by_reason = collections.Counter(skipped.values())  # one line per reason; the case ids are in meta.json
        folder.notes += [f"skipped {count} case(s): {reason}" for reason, count in by_reason.items()]
        if not cases:
            folder.finish()
            return folder
    settings = _with_profile(settings, folder, profile, cases)
    settings = _with_auto_rate(settings, folder, scenario, cases, device, tracker)
    _execute_local(scenario, cases, settings, folder, on_case=on_case, device=device, tracker=tracker)
    return folder


@dataclass(kw_only=True, slots=True)
class Tracker:
    """What the parent knows of a run in progress, for the line and the record of an interruption."""

    flags: list[str]
    folder: ResultsFolder | None = None
    total: int = 0
    in_flight: str | None = None  # the case the ranks are running
    activity: str | None = None  # something else the ranks are doing (the emulated:auto calibration)
    launcher: str = "local"
    rank: int | None = None  # launched runs: the rank that was signalled


def resume_flags(*, device: str | None, loopback: bool, trace: bool, profile: bool) -> list[str]:
    """The ``run`` options a resume must repeat (the scenario itself is in meta.json)."""
    flags = ["--device", device] if device else []
    return flags + (["--loopback"] if loopback else []) + ([] if trace else ["--no-trace"]) + (
        ["--profile"] if profile else [])  # fmt: skip


def resume_command(run_dir: str | Path, flags: list[str], launcher: str = "local") -> str:
    """The exact command that resumes ``run_dir`` (launched runs: under the same launcher, on every node)."""
    import shlex

    from ringbench.rank.dist import launch_shape

    args = ["run", "--resume", str(run_dir), *flags]
    if launcher == "local":
        return shlex.join(["ringbench", *args])
    nodes, per_node = launch_shape()
    if launcher == "slurm":
        return shlex.join(["srun", "--nodes", str(nodes), "--ntasks-per-node", str(per_node), "python", "-m",
                           "ringbench", *args])  # fmt: skip
    return shlex.join(["torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(per_node), "-m", "ringbench",
                       *args])  # fmt: skip


def interrupted_state(tracker: Tracker, signum: int, where: str | None, *, rank: int | None = None) -> dict:
    """The ``interrupted`` record of meta.json: what stopped the run, where it was, what was kept."""
    from datetime import datetime, timezone

    folder = tracker.folder
    case = None if tracker.activity else tracker.in_flight  # calibrating: no case has started
    state = {
        "signal": signal_name(signum),
        "case": case,
        "where": where if case is not None else tracker.activity,
        "kept": len(folder.done()) if folder is not None else 0,
        "total": tracker.total,
        "resume": resume_command(folder.run_dir, tracker.flags, tracker.launcher) if folder is not None else None,
        "at": datetime.now(timezone.utc).isoformat(),
    }
    if rank is not None:
        state["rank"] = rank
    return state


def interrupted_line(state: dict, run_dir: str | Path | None) -> str:
    """One line: the signal, the case in flight, what was kept and where, the resume command."""
    who = f" (to rank {state['rank']})" if state.get("rank") is not None else ""
    if state.get("case"):
        during = f" during case {state['case']}" + (f" ({state['where']})" if state.get("where") else "")
    elif state.get("where"):
        during = f" during {state['where']}"
    else:
        during = " between cases"
    head = f"interrupted by {state['signal']}{who}{during}"
    if run_dir is None:
        return f"{head}: the run had not started; nothing was kept"
    kept = f"kept {state['kept']}/{state['total']} cases" if state["total"] else f"kept {state['kept']} case(s)"
    kept += f" in {run_dir}"
    if state["total"] and state["kept"] >= state["total"]:
        return f"{head}: {kept} (every case finished; nothing to resume)"
    return f"{head}: {kept}; resume with: {state['resume']}"


def interrupted(stop: StopRequested, tracker: Tracker) -> Interrupted:
    """Record an interruption of a local run (meta.json ``interrupted``) and the one line that says it."""
    folder = tracker.folder
    where = stop.where
    if tracker.in_flight is not None and where is not None:
        suffix = f" of case {tracker.in_flight}"
        # The slowest rank's progress names the case it is in; if that is not the one in flight, the ranks had
        # finished the case before it and not yet started this one.
        where = where.removesuffix(suffix) if where.endswith(suffix) else "setting up"
    state = interrupted_state(tracker, stop.signum, where)
    if folder is None:
        return Interrupted(interrupted_line(state, None), stop.signum)
    if state["total"] and state["kept"] >= state["total"]:
        folder.finish()  # the record is whole: nothing was interrupted that it lacks
    else:
        folder.interrupt(state)
    return Interrupted(interrupted_line(state, folder.run_dir), stop.signum, run_dir=str(folder.run_dir))


def resume_base(resume: str | Path) -> Scenario:
    """The scenario ``run --resume DIR`` starts from: the folder's recorded one. A launched rank other than 0 may
    have no copy of the folder (no shared filesystem): it takes the default, and rank 0's scenario is what runs."""
    from ringbench.rank.dist import launched_env
    from ringbench.rank.scenario import DEFAULT_SCENARIO

    launched = launched_env()
    if launched is not None and launched[0] != 0 and not (Path(resume) / "meta.json").is_file():
        return DEFAULT_SCENARIO
    return recorded_scenario(resume)


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


def _with_auto_rate(settings: RunSettings, folder: ResultsFolder, scenario, cases, device,
                    tracker: Tracker | None = None) -> RunSettings:  # fmt: skip
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
        if tracker is not None:
            tracker.activity = "the emulated:auto calibration"
        for world in sorted({case.world for case in auto}):
            group = [case for case in auto if case.world == world]
            per_rank = launch_local(world, calibration_worker, (group, settings), timeout_s=scenario.timeout,
                                    device=device, case_names=[c.case_id for c in group])  # fmt: skip
            rates += [r for r in per_rank if r is not None]
        rate = min(rates)
        if tracker is not None:
            tracker.activity = None
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


def _execute_local(scenario, cases, settings, folder: ResultsFolder, *, on_case, device, tracker: Tracker) -> None:
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
        queue = [case.case_id for _, case in group_cases]  # the ranks run them in this order
        tracker.in_flight = queue[0]
        tracker.activity = "the emulated:auto calibration" if settings.calibrate_auto else None

        def on_item(rank: int, result: dict, repeat=repeat, world=world, pending=pending, by_id=by_id,
                    queue=queue) -> bool:  # fmt: skip
            nonlocal finished, settings
            if "emulated_auto_gflops" in result:  # the launch calibrated emulated:auto: keep it for the rest
                if rank == 0:
                    rate = result["emulated_auto_gflops"]
                    settings = dataclasses.replace(settings, emulated_auto_gflops=rate, calibrate_auto=False)
                    folder.meta["emulated_auto_gflops"] = rate
                    folder.notes.append(f"emulated:auto runs every emulated case at {rate:g} GFLOP/s (measured here)")
                    folder.save_meta()
                    tracker.activity = None
                return rank == 0  # one calibration item per launch (rank 0's) counts as stored
            pending[result["case_id"]].append(result)
            if len(pending[result["case_id"]]) < world:
                return False
            per_rank = sorted(pending.pop(result["case_id"]), key=lambda r: r["rank"])
            case = by_id[result["case_id"]]
            row = folder.add_case(case, _reported(case, per_rank, repeat, folder), scenario, repeat)
            finished += 1
            queue.remove(case.case_id)
            tracker.in_flight = queue[0] if queue else None
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
    tracker.in_flight = None
    folder.finish()
