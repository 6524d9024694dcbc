"""Where a run is, as its parent knows it: the tracker, the record and the line of an interruption, and the
scenario and command that resume a run (every way of running a sweep shares them: ringbench.run.sweep for local
runs, ringbench.run.launched for torchrun / SLURM).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ringbench.errors import Interrupted, UsageError
from ringbench.run.interrupt import StopRequested, signal_name
from ringbench.run.results import ResultsFolder
from ringbench.scenario.scenario import Scenario

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
    from ringbench.scenario.scenario import DEFAULT_SCENARIO

    launched = launched_env()
    if launched is not None and launched[0] != 0 and not (Path(resume) / "meta.json").is_file():
        return DEFAULT_SCENARIO
    return recorded_scenario(resume)
