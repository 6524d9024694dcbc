"""Interrupted runs end cleanly: a stop signal to the parent stops every rank within seconds, keeps the finished
cases, records what was in flight, prints the resume command; a parent killed outright takes its ranks with it;
the resumed record equals an uninterrupted one case for case.

Default tier: SIGTERM inside a case (with the resume and the comparison) and SIGKILL (nothing left), plus the
pieces in-process. The 4 signals x 3 moments matrix and the torchrun case are ``slow``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from interrupt_helpers import ENV, ROOT, Launched, descendants, only_run_dir, record_summary, resume_args, ringbench
from stubborn_child import stubborn

from ringbench.errors import Interrupted
from ringbench.record.store import load_run
from ringbench.run.interrupt import RankSignals, StopRequested, StopSignals, shielded, stop_processes
from ringbench.run.state import Tracker, interrupted_line, interrupted_state, recorded_scenario

SWEEP = ["--world", "2", "--seq", "512", "--heads", "2", "--head-dim", "16", "--iters", "24", "--warmup", "1",
         "--kernel", "emulated:20", "--layout", "zigzag", "--buffer", "sync", "--buffer", "double"]  # fmt: skip
# A case whose float64 check outlasts its ring (about 0.5 s of ring, 1.5-2 s of check on 2 cores).
CHECKED = ["--world", "2", "--seq", "2048", "--heads", "4", "--head-dim", "32", "--iters", "3", "--warmup", "1",
           "--kernel", "emulated:20", "--layout", "zigzag", "--buffer", "sync", "--buffer", "double"]  # fmt: skip
EXIT = {signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGHUP: 129, signal.SIGKILL: -9}


def _reference(out: Path, sweep: list[str]) -> tuple[tuple[list[str], dict], float]:
    """An uninterrupted run of ``sweep``: its record summary, and how long its second case took (s)."""
    run = Launched(ringbench("run", *sweep, "--out", str(out)))
    assert run.proc.wait(timeout=300) == 0, run.text()[-2000:]
    first, second = run.wait_line("[1/2]"), run.wait_line("[2/2]")
    return record_summary(only_run_dir(out)), second - first


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cache = {}

    def get(sweep: list[str]) -> tuple[tuple[list[str], dict], float]:
        key = tuple(sweep)
        if key not in cache:
            cache[key] = _reference(tmp_path_factory.mktemp("reference"), sweep)
        return cache[key]

    return get


def _interrupt(tmp_path: Path, sweep: list[str], signum: int, *, after: str, delay_s: float) -> tuple[Launched, Path]:
    """Start the sweep, send ``signum`` ``delay_s`` after the line ``after``; check the ending; return the run."""
    run = Launched(ringbench("run", *sweep, "--out", str(tmp_path)))
    run.wait_line(after)
    time.sleep(delay_s)
    sent = run.signal(signum)
    code = run.proc.wait(timeout=30)
    exited = time.monotonic() - sent
    run.wait_gone(sent, limit_s=10.0)  # every rank gone within 10 s, whatever the signal
    assert code == EXIT[signum], run.text()[-2000:]
    run_dir = only_run_dir(tmp_path)
    data = load_run(run_dir)  # the record loads
    assert data.events["case_id"].isin(data.cases["case_id"]).all()
    if signum != signal.SIGKILL:
        assert exited < 5.0, f"the parent took {exited:.2f} s to exit"
        lines = [line for _, line in run.lines if line.startswith("interrupted by ")]
        assert len(lines) == 1, run.text()[-2000:]
        meta = json.loads((run_dir / "meta.json").read_text())
        if "interrupted" not in meta:  # the signal came after the last case was stored
            assert meta.get("finished") and "nothing to resume" in lines[0], lines[0]
            return run, run_dir
        state = meta["interrupted"]
        assert state["signal"] == signal.Signals(signum).name and state["kept"] == len(data.cases)
        assert f"resume with: ringbench run --resume {run_dir}" in lines[0]
    return run, run_dir


def _resume_and_compare(run: Launched, run_dir: Path, expected, signum: int) -> None:
    """Resume with the printed command (SIGKILL prints none: the plain one); the record must then equal
    ``expected`` (an uninterrupted run's ids and event counts), or, when None, hold every case of the sweep once."""
    printed = signum != signal.SIGKILL and "resume with: " in run.text()
    args = resume_args(run.text()) if printed else ringbench("run", "--resume", str(run_dir))
    done = subprocess.run(args, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads((run_dir / "meta.json").read_text())
    assert "interrupted" not in meta and meta.get("finished")
    if expected is not None:
        assert record_summary(run_dir) == expected  # case ids and event counts; timings aside
        return
    data = load_run(run_dir)
    assert sorted(data.cases["case_id"]) == sorted(case.case_id for case in recorded_scenario(run_dir).cases())
    iterations = data.events[data.events["kind"] == "iteration"].groupby("case_id").size()
    per_case = meta["scenario"]["iters"] * 2 * int(data.cases["world"].iloc[0])  # fwd and bwd rows per rank
    assert (iterations == per_case).all(), "a resumed case's spans are in the record twice"


def test_sigterm_inside_a_case_keeps_the_finished_ones_and_resumes(tmp_path):
    run, run_dir = _interrupt(tmp_path, SWEEP, signal.SIGTERM, after="[1/2]",
                              delay_s=random.Random(24).uniform(0.1, 0.4))  # fmt: skip
    state = json.loads((run_dir / "meta.json").read_text())["interrupted"]
    kept = set(load_run(run_dir).cases["case_id"])
    assert state["kept"] == len(kept) == 1 and state["total"] == 2 and state["case"] and state["case"] not in kept
    _say_interrupted_once_at_the_top(run_dir, tmp_path / "reports")
    _resume_and_compare(run, run_dir, None, signal.SIGTERM)


def _say_interrupted_once_at_the_top(run_dir: Path, reports: Path) -> None:
    """analyze and report of the interrupted run: "interrupted" once, first, and only the finished case."""
    from typer.testing import CliRunner

    from ringbench.cli.app import app

    cli = CliRunner()
    analyzed = cli.invoke(app, ["analyze", str(run_dir)])
    assert analyzed.exit_code == 0, analyzed.output
    lines = analyzed.stdout.splitlines()
    assert analyzed.stdout.lower().count("interrupted") == 1 and lines[1].startswith("INTERRUPTED by SIGTERM")
    assert "1 of 2 cases finished, and only those are analysed" in lines[1]
    reported = cli.invoke(app, ["report", str(run_dir), "--out", str(reports)])
    assert reported.exit_code == 0, reported.output
    (folder,) = reports.iterdir()
    markdown = (folder / "report.md").read_text()
    assert markdown.lower().count("interrupted") == 1 and markdown.index("INTERRUPTED") < markdown.index("Answers")
    assert (folder / "report.html").read_text().lower().count("interrupted") == 1


def test_sigkill_to_the_parent_takes_every_rank_with_it(tmp_path):
    one_rank = ["--world", "1", *SWEEP[2:]]
    _interrupt(tmp_path, one_rank, signal.SIGKILL, after="[1/2]", delay_s=0.2)


# Moments, as (sweep, share of the second case's duration in the uninterrupted run): as the first case is stored
# (the ranks between cases), early in the second case (its ring), late in a case whose float64 check outlasts its
# ring. Where each signal landed is in the run's meta.json (``interrupted.where``).
MOMENTS = {"between": (SWEEP, 0.0), "ring": (SWEEP, 0.2), "check": (CHECKED, 0.6)}


@pytest.mark.slow
@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)  # fmt: skip
def test_every_signal_at_every_moment(tmp_path, reference, signum, moment):
    sweep, share = MOMENTS[moment]
    expected, case_s = reference(sweep)
    run, run_dir = _interrupt(tmp_path, sweep, signum, after="[1/2]", delay_s=share * case_s)
    _resume_and_compare(run, run_dir, expected, signum)


# The torchrun case signals a rank 0.2 s after the first case ended: its second case must outlast that by far
# (SWEEP's takes about 0.3 s, so the signal could land after it, with no case in flight).
LONG_SWEEP = [*SWEEP[: SWEEP.index("--iters")], "--iters", "240", *SWEEP[SWEEP.index("--iters") + 2 :]]


@pytest.mark.slow
def test_sigterm_to_one_launched_rank_ends_the_job_with_a_verdict_and_resumes(tmp_path, reference):
    from ringbench.rank.dist import free_port

    expected, case_s = reference(LONG_SWEEP)
    assert case_s > 0.6, f"the second case takes {case_s:.2f} s: too short to be signalled inside"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    run = Launched([*torchrun, "--master-port", str(free_port()), "-m", "ringbench", "run", *LONG_SWEEP[2:], "--out",
                    str(tmp_path)], cwd=tmp_path)  # fmt: skip
    run.wait_line("[1/2]")
    time.sleep(0.2)
    run.snapshot()
    rank1 = [pid for pid, _ in run.tree if "LOCAL_RANK=1\0" in _environ(pid)]
    assert len(rank1) == 1
    sent = run.signal(signal.SIGTERM, pid=rank1[0])
    assert run.proc.wait(timeout=60) != 0
    run.wait_gone(sent, limit_s=10.0)
    (verdict,) = [line for _, line in run.lines if line.startswith("ringbench: interrupted by SIGTERM (to rank 1)")]
    run_dir = only_run_dir(tmp_path)
    state = json.loads((run_dir / "meta.json").read_text())["interrupted"]
    assert state["rank"] == 1 and state["case"] and state["case"] in verdict and state["kept"] == 1
    resume = resume_args(run.text())
    resume[resume.index("-m", 3) : resume.index("-m", 3)] = ["--master-addr", "127.0.0.1", "--master-port",
                                                             str(free_port())]  # fmt: skip
    done = subprocess.run(resume, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert record_summary(run_dir) == expected


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_text() + "\0"
    except OSError:
        return ""


# -- the pieces, in-process ---------------------------------------------------------------------------------------
def test_a_stop_signal_waits_for_a_shielded_store_and_then_stops():
    with StopSignals() as guard:
        with pytest.raises(StopRequested) as raised, shielded():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            stored = True  # reached: the signal did not cut the store short
        assert stored and raised.value.signum == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # the first signal decides; later ones are ignored
        time.sleep(0.05)
    assert guard.fired == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the previous handlers are back


def test_stop_processes_kills_a_rank_that_ignores_sigterm_and_its_children():
    import multiprocessing as mp

    context = mp.get_context("spawn")
    ready = context.Event()
    proc = context.Process(target=stubborn, args=(ready,), daemon=True)
    proc.start()
    assert ready.wait(60)  # its group made, SIGTERM ignored, its child started
    child = [pid for pid, _ in descendants(proc.pid) if pid != proc.pid]
    started = time.monotonic()
    stop_processes([proc], grace_s=0.5)
    assert time.monotonic() - started < 3.0 and proc.exitcode == -signal.SIGKILL
    time.sleep(0.2)
    assert child and all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in child)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_launched_rank_hears_a_signal_on_a_thread_whatever_its_main_thread_does():
    code = (
        "import os, sys, threading, time\n"
        "from ringbench.run.interrupt import RankSignals\n"
        "def stop(signum):\n"
        "    print('heard', signum, threading.current_thread().name, flush=True); os._exit(128 + signum)\n"
        "RankSignals(stop).start()\n"
        "print('ready', flush=True)\n"
        "threading.Event().wait(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=10) == 129
    assert proc.stdout.read().split() == ["heard", str(int(signal.SIGHUP)), "ringbench-signals"]


def test_rank_signals_in_a_worker_thread_installs_nothing():
    box = []
    thread = threading.Thread(target=lambda: box.append(RankSignals(lambda s: None).start().active))
    thread.start()
    thread.join()
    assert box == [False]


def test_the_interrupted_line_says_what_was_kept_and_how_to_resume(tmp_path):
    tracker = Tracker(flags=["--device", "cpu"], total=4, in_flight="case-b")
    state = interrupted_state(tracker, signal.SIGHUP, "the float64 check")
    assert state["case"] == "case-b" and state["kept"] == 0 and state["resume"] is None
    state.update(kept=2, resume="ringbench run --resume results/x --device cpu")
    line = interrupted_line(state, "results/x")
    assert line == ("interrupted by SIGHUP during case case-b (the float64 check): kept 2/4 cases in results/x; "
                    "resume with: ringbench run --resume results/x --device cpu")  # fmt: skip
    tracker.in_flight, tracker.activity = None, None
    assert "between cases" in interrupted_line(interrupted_state(tracker, signal.SIGTERM, None) | {"kept": 2},
                                               "results/x")  # fmt: skip
    assert "nothing was kept" in interrupted_line(interrupted_state(tracker, signal.SIGINT, None), None)
    assert Interrupted("x", signal.SIGINT).exit_code == 130


def test_events_of_a_case_without_its_row_are_left_out_and_not_doubled_on_resume(tmp_path):
    from ringbench.record import store
    from ringbench.run.results import ResultsFolder

    folder = ResultsFolder.create(tmp_path, "cut", {"command": "test", "scenario": {"name": "cut"}})  # a sweep's
    events = pd.DataFrame({"case_id": ["a", "a", "b"], "repeat": [0, 0, 0], "iteration": [0, 0, 0],
                           "phase": "fwd", "rank": 0, "ring_position": 0, "step": -1, "kind": "iteration",
                           "start_ns": 0, "end_ns": 1, "src": 0, "dst": 0, "bytes": 0, "block": -1, "pair": "",
                           "flops": 0.0, "nccl_ms": float("nan")})  # fmt: skip
    store.write_events(folder.run_dir, events)  # killed after b's events were written, before its row
    store.write_cases(folder.run_dir, pd.DataFrame([{"case_id": "a", "repeat": 0, "status": "ok"}]))
    assert set(load_run(folder.run_dir).events["case_id"]) == {"a"}
    reopened = ResultsFolder.reopen(folder.run_dir)
    assert reopened.done() == {("a", 0)} and set(pd.concat(reopened.events)["case_id"]) == {"a"}
