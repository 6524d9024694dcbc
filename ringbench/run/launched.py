"""A launched run (torchrun, srun): this process is one rank, and rank 0 owns the results folder.

    torchrun --nproc-per-node 8 -m ringbench run scenarios/orderings.yaml
    srun --ntasks-per-node 8 python -m ringbench run scenarios/scaling.yaml
    torchrun --nproc-per-node 8 -m ringbench run --resume results/<run-id>   # the folder on rank 0's disk only

Rank 0 creates the folder (or reopens it, to resume) and tells every rank the scenario, the settings and the cases
already done. After each case, every rank's rows are gathered to rank 0 over the CPU side group; a rank on another
host ships its profiler capture with them (``run --impl``: another implementation's per-step spans come from the
capture), since rank 0 cannot read another host's disk.

Stopping. Every rank hears SIGTERM, SIGINT and SIGHUP on a thread (ringbench.run.interrupt.RankSignals: the main
thread may sit in a collective), and a rank whose launcher died gets SIGTERM (its parent-death signal). The
signalled rank announces itself in the group's store (which rank, which signal, which case, where) and ends with
128 + the signal. Rank 0 -- signalled itself, stopped by the launcher once a peer ended, or left by a peer whose
connection closed under a collective -- writes the interrupted state into meta.json under the folder's lock, so the
record on disk agrees with itself, and prints the verdict: which rank got which signal during which case, what was
kept, and the command that resumes. A peer that ends without a signal is a failure, recorded as one (exit 1).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from ringbench.errors import RunFailure, UsageError
from ringbench.rank.metadata import collect_metadata
from ringbench.rank.rank_report import RankReport
from ringbench.run.cases import preflight, reported, runnable, with_profile
from ringbench.run.interrupt import RankSignals, bind_to_parent, signal_name
from ringbench.run.launch import Progress, where_text
from ringbench.run.results import ResultsFolder
from ringbench.run.state import Tracker, interrupted_line, interrupted_state, resumable_scenario

ANNOUNCE_COUNT = "ringbench/interrupt/count"
ANNOUNCE_FIRST = "ringbench/interrupt/first"
MAX_SHIPPED_BYTES = 512 << 20  # a profiler capture larger than this stays on its host (the case keeps its times)
VERDICT_LOCK_S = 5.0  # how long rank 0 waits for a case being stored before it records the interruption anyway


class RankStop:
    """This rank's part in an interruption: where it is, its announcement, and (rank 0) the verdict."""

    def __init__(self, tracker: Tracker, rank: int) -> None:
        self.tracker = tracker
        self.rank = rank
        self.slots = [0, 0, 0, 0]  # case index, phase, iteration, ring step (ringbench.run.launch.Progress)
        self.progress = Progress(self.slots, 0)
        self.case_names: list[str] = []
        self.store = None
        self._verdict = threading.Lock()

    def where(self) -> str | None:
        """Where this rank is in the case in flight (ring step and iteration, or the float64 check)."""
        case = self.tracker.in_flight
        if case is None:
            return None
        text = where_text(self.slots, 0, self.case_names)
        return text.removesuffix(f" of case {case}") if text.endswith(f" of case {case}") else "setting up"

    def announce(self, signum: int) -> dict:
        """Tell the other ranks (the first announcement is kept: it is the cause) and return ours."""
        mine = {"rank": self.rank, "signal": signal_name(signum), "signum": int(signum),
                "case": None if self.tracker.activity else self.tracker.in_flight,
                "where": self.where() if not self.tracker.activity else self.tracker.activity}  # fmt: skip
        if self.store is not None:
            try:
                if self.store.add(ANNOUNCE_COUNT, 1) == 1:
                    self.store.set(ANNOUNCE_FIRST, json.dumps(mine))
            except Exception:  # the store's host is gone: nobody is left to tell
                pass
        return mine

    def announced(self, wait_s: float = 0.0) -> dict | None:
        """The first rank's announcement, waiting up to ``wait_s`` for one; None when no rank was signalled."""
        if self.store is None:
            return None
        deadline = time.monotonic() + wait_s
        while True:
            try:
                if self.store.check([ANNOUNCE_FIRST]):
                    return json.loads(self.store.get(ANNOUNCE_FIRST))
            except Exception:
                return None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def on_signal(self, signum: int) -> None:
        """On the signal thread: announce, let rank 0 record the verdict, end the process."""
        mine = self.announce(signum)
        cause = self.announced() or mine
        if self.rank == 0:
            self.verdict(cause)
        os._exit(128 + int(cause["signum"]))

    def verdict(self, cause: dict) -> None:
        """Rank 0: record the interruption in meta.json and print the one line (once, whichever thread is first)."""
        if not self._verdict.acquire(blocking=False):
            time.sleep(VERDICT_LOCK_S + 5.0)  # the other thread is writing it and ends the process
            return
        tracker, folder = self.tracker, self.tracker.folder
        if folder is not None:
            folder.lock.acquire(timeout=VERDICT_LOCK_S)  # a case being stored is stored whole; never released
        state = interrupted_state(tracker, int(cause["signum"]), cause.get("where"), rank=int(cause["rank"]))
        state["case"] = cause.get("case")
        if state["case"] is None:
            state["where"] = cause.get("where")
        if folder is not None:
            if state["total"] and state["kept"] >= state["total"]:
                folder.finish()
            else:
                folder.interrupt(state)
        line = interrupted_line(state, folder.run_dir if folder is not None else None)
        print(f"ringbench: {line}", file=sys.stderr, flush=True)


def execute_launched(scenario, *, resume, out, trace, command, on_case, device, profile, loopback, flags):
    """The whole run on this rank (see the module doc); returns the folder on rank 0, None on the others."""
    import torch.distributed as dist

    from ringbench.rank.dist import init_launched, launch_store, launched_env
    from ringbench.rank.runner import open_session

    launched = launched_env()
    tracker = Tracker(flags=flags, launcher=launched[3])
    stop = RankStop(tracker, launched[0])
    RankSignals(stop.on_signal).start()
    if os.getppid() > 1:
        bind_to_parent(os.getppid(), signal.SIGTERM)  # the launcher is gone: stop as if it had said so
    env = init_launched(scenario.timeout if scenario is not None else 60.0, device)
    stop.store = launch_store()
    session = open_session(env)
    folder, plan = _plan(session, env, scenario, resume=resume, out=out, trace=trace, command=command,
                         device=device, profile=profile, loopback=loopback, launched=launched)  # fmt: skip
    tracker.folder, tracker.total = folder, len(plan["cases"]) * plan["scenario"].repeat
    stop.case_names = [case.case_id for case in plan["cases"]]
    try:
        _run_cases(session, env, plan, folder, tracker, stop, on_case)
    except UsageError:
        raise
    except Exception as exc:  # a collective failed: a peer was stopped by a signal, or it failed by itself
        cause = stop.announced(wait_s=2.0)  # a signalled peer announces before its connections close
        if cause is not None:
            if env.rank == 0:
                stop.verdict(cause)
            os._exit(128 + int(cause["signum"]))
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if folder is not None:
            folder.fail(f"rank {env.rank}: {line}")
            kept = f" [run {folder.run_dir}, {len(folder.done())}/{tracker.total} cases kept]"
            raise RunFailure(f"rank {env.rank}: {line}{kept}", run_dir=str(folder.run_dir)) from None
        raise RunFailure(f"rank {env.rank}: {line}") from None
    dist.destroy_process_group()
    return folder


def _plan(session, env, scenario, *, resume, out, trace, command, device, profile, loopback, launched):
    """Rank 0 decides what runs (its folder, its scenario, the cases done) and tells every rank; a usage error on
    rank 0 is every rank's."""
    folder, plan = None, None
    if env.rank == 0:
        try:
            folder = ResultsFolder.reopen(resume) if resume is not None else None
            if folder is not None:
                scenario = resumable_scenario(folder, scenario)
            if scenario is None:
                raise UsageError("scenario=None is not allowed without resume; expected a Scenario (or resume)")
            if env.world not in scenario.world:  # the launcher decides the ring size
                scenario = dataclasses.replace(scenario, world=(env.world,))
            settings = preflight(scenario, device=device, loopback=loopback, trace=trace, launched=launched)
            cases, skipped = runnable([c for c in scenario.cases() if c.world == env.world], device, launched)
            if folder is None:
                meta = collect_metadata(scenario, command=command, trace=settings.trace)
                folder = ResultsFolder.create(out, scenario.name, meta | {"launcher": env.launcher})
            folder.meta["launcher"] = env.launcher
            if skipped:
                folder.meta.setdefault("skipped", {}).update(skipped)
                by_reason = collections.Counter(skipped.values())  # one line per reason; the ids are in meta.json
                folder.notes += [f"skipped {count} case(s): {reason}" for reason, count in by_reason.items()]
            settings = with_profile(settings, folder, profile, cases)
            plan = {"scenario": scenario, "settings": settings, "cases": cases, "done": sorted(folder.done()),
                    "rate": folder.meta.get("emulated_auto_gflops"),
                    "floor_ms": folder.meta.get("emulated_auto_floor_ms") or 0.0}  # fmt: skip
        except UsageError as exc:
            plan = {"error": str(exc)}
    plan = session.ops.all_objects(plan)[0]
    if "error" in plan:
        raise UsageError(plan["error"])
    return folder, plan


def _run_cases(session, env, plan, folder, tracker: Tracker, stop: RankStop, on_case) -> None:
    from ringbench.rank.autorate import AutoModel, measure_rate
    from ringbench.rank.runner import profile_path, run_case, with_auto_model

    scenario, settings, cases = plan["scenario"], plan["settings"], plan["cases"]
    if plan["rate"] is not None:
        settings = with_auto_model(settings, AutoModel(plan["rate"], plan["floor_ms"]))
    else:
        tracker.activity = "the emulated:auto calibration"
        model = measure_rate(session, cases, settings)  # every rank calls it: it is collective
        tracker.activity = None
        if model is not None:
            settings = with_auto_model(settings, model)
            if folder is not None:
                folder.meta["emulated_auto_gflops"] = model.gflops
                folder.meta["emulated_auto_floor_ms"] = model.floor_ms
    hosts = session.ops.all_objects(socket.gethostname())
    remote = hosts[env.rank] != hosts[0]  # rank 0 cannot read this rank's disk
    if remote and settings.profile_dir:
        settings = dataclasses.replace(settings, profile_dir=tempfile.mkdtemp(prefix="ringbench-profile-"))
    done = {tuple(item) for item in plan["done"]}
    todo = [(i, c, r) for r in range(scenario.repeat) for i, c in enumerate(cases) if (c.case_id, r) not in done]
    finished = tracker.total - len(todo)
    for index, case, repeat in todo:
        tracker.in_flight = case.case_id
        result = run_case(case, session=session, progress=stop.progress, settings=settings, case_index=index,
                          repeat=repeat, profile_path=profile_path(settings, case, repeat, env.rank))  # fmt: skip
        gathered = session.ops.gather_objects(ship_capture(result) if remote else result)
        if folder is not None:
            gathered = [land_capture(item, folder, case.case_id, repeat) for item in gathered]
            row = folder.add_case(case, reported(case, gathered, repeat, folder), scenario, repeat)
            finished += 1
            if on_case is not None:
                on_case(row, finished, tracker.total)
    tracker.in_flight = None
    if folder is not None:
        folder.finish()
    session.ops.barrier()


def ship_capture(result: RankReport, limit: int = MAX_SHIPPED_BYTES) -> RankReport:
    """A rank's report with its profiler capture's bytes attached (it is on this host's disk only), or with a
    one-line note instead when the capture is larger than ``limit``."""
    path = result.profile
    if not path or not Path(path).is_file():
        return result
    size = Path(path).stat().st_size
    if size > limit:
        note = (f"rank {result.rank}'s profiler capture ({size / 2**20:.0f} MiB) exceeds {limit >> 20} MiB "
                "and stays on its host; the case keeps iteration times only")  # fmt: skip
        return result.replace(profile=None, profile_note=note)
    shipped = result.replace(profile_bytes=Path(path).read_bytes())
    Path(path).unlink(missing_ok=True)
    return shipped


def land_capture(result: RankReport, folder: ResultsFolder, case_id: str, repeat: int) -> RankReport:
    """On rank 0: a shipped capture written into this run's profile/ folder, where the importer reads it."""
    if result.profile_note:
        folder.notes.append(f"{case_id}: {result.profile_note}")
    data = result.profile_bytes
    if data is None:
        return result.replace(profile_note="")
    from ringbench.record.atomic import write_bytes

    path = folder.run_dir / "profile" / case_id / f"r{repeat}-rank{result.rank}.json.gz"
    write_bytes(path, data)
    return result.replace(profile_bytes=None, profile_note="", profile=str(path))


__all__ = ["RankStop", "execute_launched", "land_capture", "ship_capture"]
