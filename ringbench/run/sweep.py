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
from pathlib import Path

from ringbench.errors import RunFailure, UsageError
from ringbench.rank.autorate import AutoModel
from ringbench.rank.metadata import collect_metadata
from ringbench.rank.runner import RunSettings, calibration_worker, rank_worker, with_auto_model
from ringbench.run.cases import preflight, reported, runnable, with_profile
from ringbench.run.interrupt import StopRequested, StopSignals
from ringbench.run.launch import launch_local
from ringbench.run.results import ResultsFolder
from ringbench.run.state import Tracker, interrupted, resumable_scenario, resume_flags
from ringbench.scenario.scenario import Case, Scenario


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
    cases, skipped = runnable(scenario.cases(), device, None)
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
    settings = with_profile(settings, folder, profile, cases)
    settings = _with_auto_rate(settings, folder, scenario, cases, device, tracker)
    _execute_local(scenario, cases, settings, folder, on_case=on_case, device=device, tracker=tracker)
    return folder


def _with_auto_rate(settings: RunSettings, folder: ResultsFolder, scenario, cases, device,
                    tracker: Tracker | None = None) -> RunSettings:  # fmt: skip
    """emulated:auto: one model (rate and floor) for the whole run, measured before any case is timed (kept on
    resume)."""
    from ringbench.kernels import get_kernel

    auto = [case for case in cases if getattr(get_kernel(case.kernel), "auto", False) and case.impl == "ringbench"]
    if not auto:
        return settings
    rate = folder.meta.get("emulated_auto_gflops")
    if rate is None and len({case.world for case in auto}) == 1:
        return dataclasses.replace(settings, calibrate_auto=True)  # in the one launch, before its first case
    if rate is not None:
        model = AutoModel(rate, folder.meta.get("emulated_auto_floor_ms") or 0.0)
    else:
        models = []
        if tracker is not None:
            tracker.activity = "the emulated:auto calibration"
        for world in sorted({case.world for case in auto}):
            group = [case for case in auto if case.world == world]
            per_rank = launch_local(world, calibration_worker, (group, settings), timeout_s=scenario.timeout,
                                    device=device, case_names=[c.case_id for c in group])  # fmt: skip
            models += [m for m in per_rank if m is not None]
        model = AutoModel.combine(models)
        if tracker is not None:
            tracker.activity = None
        _note_auto(folder, model)
    folder.notes.append(auto_note(model))
    return with_auto_model(settings, model)


def _note_auto(folder: ResultsFolder, model) -> None:
    folder.meta["emulated_auto_gflops"] = model.gflops
    folder.meta["emulated_auto_floor_ms"] = model.floor_ms
    folder.save_meta()


def auto_note(model) -> str:
    """The line that says what emulated:auto runs at (printed with the run's notes)."""
    floor = f", every kernel call at least {model.floor_ms:g} ms (calls too small to pace)" if model.floor_ms else ""
    return f"emulated:auto runs every emulated case of this run at {model.gflops:g} GFLOP/s{floor} (measured here)"


def _execute_local(scenario, cases, settings, folder: ResultsFolder, *, on_case, device, tracker: Tracker) -> None:
    done = folder.done()
    todo = [(i, c, r) for r in range(scenario.repeat) for i, c in enumerate(cases) if (c.case_id, r) not in done]
    total = len(cases) * scenario.repeat
    finished = total - len(todo)
    by_group: dict[tuple[int, int], list[tuple[int, Case]]] = defaultdict(list)
    for index, case, repeat in todo:
        by_group[(repeat, case.world)].append((index, case))
    for (repeat, world), group_cases in sorted(by_group.items()):
        pending: dict[str, list] = defaultdict(list)
        by_id = {case.case_id: case for _, case in group_cases}
        queue = [case.case_id for _, case in group_cases]  # the ranks run them in this order
        tracker.in_flight = queue[0]
        tracker.activity = "the emulated:auto calibration" if settings.calibrate_auto else None

        def on_item(rank: int, result, repeat=repeat, world=world, pending=pending, by_id=by_id,
                    queue=queue) -> bool:  # fmt: skip
            nonlocal finished, settings
            if isinstance(result, dict):  # the launch calibrated emulated:auto: keep it for the rest
                if rank == 0:
                    model = AutoModel(result["emulated_auto_gflops"], result.get("emulated_auto_floor_ms") or 0.0)
                    settings = dataclasses.replace(with_auto_model(settings, model), calibrate_auto=False)
                    _note_auto(folder, model)
                    folder.notes.append(auto_note(model))
                    tracker.activity = None
                return rank == 0  # one calibration item per launch (rank 0's) counts as stored
            pending[result.case_id].append(result)  # a RankReport
            if len(pending[result.case_id]) < world:
                return False
            per_rank = sorted(pending.pop(result.case_id), key=lambda r: r.rank)
            case = by_id[result.case_id]
            row = folder.add_case(case, reported(case, per_rank, repeat, folder), scenario, repeat)
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
