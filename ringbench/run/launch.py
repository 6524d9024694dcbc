"""Local launch: N plain worker processes on 127.0.0.1 that report through a queue, watched by the parent.

Ranks start from a fork server that has imported torch and the rank runner once (``forkserver`` with preloaded
modules): a fresh interpreter per rank would import torch again, about 0.7 s per rank on 2 cores, at every launch.
The server starts clean (no CUDA context, no thread pools in use), so a forked rank is as fresh as a spawned one;
each rank takes the parent's environment and working directory as they are at launch, not as they were when the
server started.

``mp.spawn`` kills the survivors on the first failure and loses the reason; here each worker sends its result or
its one-line error through a queue, and writes where it is (case, phase, iteration, ring step) into shared
memory. When a rank dies or stalls, the parent waits briefly for the others' reports, names the culprit rank and
the ring step it stopped at, terminates every process and raises RunFailure. Nothing can hang: the workers bound
every wait by the timeout, and the parent kills whatever is left after that timeout plus a grace period.

Each rank leads its own process group (so a terminal's Ctrl-C reaches the parent alone, which stops the ranks in
order) and is bound to the parent (ringbench.run.interrupt.bind_to_parent): a parent that dies, even by SIGKILL,
takes its ranks with it. Stopping is always the same bounded sequence (``stop_processes``): SIGTERM, a short wait,
SIGKILL to each rank's group. A stop signal to the parent (``StopRequested``) leaves ``launch_local`` with where
the slowest rank was.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ringbench.errors import RunFailure, UsageError
from ringbench.rank.dist import DistEnv, init_local
from ringbench.run.interrupt import StopRequested, bind_to_parent, stop_processes

PHASE_CODES = {"setup": 0, "fwd": 1, "bwd": 2, "done": 3, "check": 4}
PHASE_NAMES = {code: name for name, code in PHASE_CODES.items()}
_SLOTS = 4  # case index, phase code, iteration, ring step
_STARTUP_S = 120.0  # extra allowance before the first progress mark (spawning and importing torch)
_ABORT_CODES = (-6, 134)  # SIGABRT: how NCCL's watchdog ends a process whose collective timed out


class Progress:
    """Where a rank is: written by the worker (cheap shared-memory stores), read by the parent on failure."""

    def __init__(self, array, rank: int) -> None:
        self._array = array
        self._base = rank * _SLOTS

    def set_case(self, case_index: int) -> None:
        self._array[self._base] = case_index
        self._array[self._base + 1] = 0

    def set_iteration(self, iteration: int) -> None:
        self._array[self._base + 2] = iteration

    def set_step(self, phase: str, step: int) -> None:
        self._array[self._base + 1] = PHASE_CODES.get(phase, 0)
        self._array[self._base + 3] = step


@dataclass(frozen=True, slots=True)
class WorkerContext:
    env: DistEnv
    progress: Progress
    send: Callable[[Any], None]  # stream an item (e.g. a finished case) to the parent
    stored: Any = None  # shared counter: items the parent has finished handling (see wait_stored)
    timeout_s: float = 60.0
    abort: Callable[[str], None] | None = None  # report one line as this rank's error and end the process now

    def wait_stored(self, count: int) -> None:
        """Block until the parent has handled ``count`` items, so its storing never overlaps our timing."""
        deadline = time.monotonic() + self.timeout_s
        while self.stored is not None and self.stored.value < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the parent did not store result {count} within {self.timeout_s:g} s")
            time.sleep(0.005)


def _by_value(obj) -> bytes:
    # Plain pickle copies tensors by value; the queue's own pickler would share their memory through file
    # descriptors, which break once this process exits. (Internal IPC only: result files never unpickle.)
    return pickle.dumps(obj)


def _worker(rank, world, store_path, fn, args, messages, progress_array, stored, timeout_s, device, parent_pid,
            parent_env, parent_cwd):  # fmt: skip
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # its own group: the parent kills it with whatever it started, and Ctrl-C goes to the parent
    bind_to_parent(parent_pid)
    os.environ.clear()  # the parent's environment now, not the fork server's at its start
    os.environ.update(parent_env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        os.chdir(parent_cwd)
        import torch

        torch.set_num_threads(int(os.environ.get("RINGBENCH_THREADS", "1")))
        env = init_local(rank, world, store_path, timeout_s, device)

        def abort(line: str) -> None:  # from a watchdog thread while the main thread is stuck in the backend
            messages.put(("error", rank, line, "", False))
            messages.close()
            messages.join_thread()
            os._exit(1)

        ctx = WorkerContext(
            env=env,
            progress=Progress(progress_array, rank),
            send=lambda item: messages.put(("item", rank, _by_value(item))),
            stored=stored,
            timeout_s=timeout_s,
            abort=abort,
        )
        result = fn(ctx, *args)
        messages.put(("result", rank, _by_value(result)))
    except BaseException as exc:  # sent to the parent as one line (plus the traceback for debugging)
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        messages.put(("error", rank, line, traceback.format_exc(), isinstance(exc, UsageError)))
    finally:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:
            pass
        messages.close()
        messages.join_thread()  # flush the queue's feeder thread before the hard exit
    os._exit(0)  # skip interpreter teardown: gloo threads of a broken group must not keep us alive


def phase_of(progress_array, rank: int) -> str:
    """The phase a rank last reported (setup, fwd, bwd, done, check), "" when unknown."""
    return PHASE_NAMES.get(progress_array[rank * _SLOTS + 1], "")


def where_text(progress_array, rank: int, case_names: list[str] | None) -> str:
    base = rank * _SLOTS
    case_index, phase, iteration, step = (progress_array[base + i] for i in range(_SLOTS))
    phase_name = PHASE_NAMES.get(phase, "?")
    case = case_names[case_index] if case_names and 0 <= case_index < len(case_names) else f"#{case_index}"
    if phase_name in ("fwd", "bwd"):
        return f"{phase_name} ring step {step} (iteration {iteration}) of case {case}"
    if phase_name == "check":
        return f"the float64 check of case {case}"
    return f"{phase_name} of case {case}"


# What the fork server imports once: the caller's main module (as spawn would, so that functions defined there can
# be run), torch and the runner, whose imports cover what a rank needs, and what torch.autograd.grad imports on its
# first call with grad_outputs (sympy, through torch.fx's symbolic shapes: about a second per rank otherwise).
_PRELOAD = ["__main__", "torch", "torch.distributed", "ringbench.rank.runner", "torch.fx.experimental.symbolic_shapes"]


def _context():
    """The start method for ranks: a fork server with torch preloaded (module doc); spawn where there is none."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


def launch_local(
    world: int,
    fn: Callable,
    args: tuple = (),
    *,
    timeout_s: float = 60.0,
    device: str | None = None,
    on_item: Callable[[int, Any], bool] | None = None,
    case_names: list[str] | None = None,
    grace_s: float = 3.0,
) -> list[Any]:
    """Run ``fn(WorkerContext, *args)`` on ``world`` local ranks; return their results in rank order.

    ``on_item(rank, item)`` handles streamed items in the parent; it returns True when an item is complete (e.g.
    every rank's part of a case has arrived and been stored), which workers can wait for with ``wait_stored``.
    """
    _check_launch(world)
    ranks = start_ranks(world, fn, args, timeout_s=timeout_s, device=device)
    procs, channels = ranks.procs, ranks.channels
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, str, bool]] = {}
    try:
        _collect(procs, channels, results, errors, on_item=on_item, timeout_s=timeout_s, grace_s=grace_s)
    except StopRequested as stop:
        live = [r for r, p in enumerate(procs) if p.pid is not None and r not in results]
        if live:  # the rank that got least far says where the interrupted work was
            slowest = min(live, key=lambda r: _progress_key(channels.progress, r))
            stop.where = where_text(channels.progress, slowest, case_names)
        raise
    finally:
        ranks.stop()
    if len(results) == world:
        return [results[r] for r in range(world)]
    raise _failure(procs, results, errors, channels.progress, case_names)


@dataclass(slots=True)
class _Channels:
    """What the ranks share with the parent: the message queue, each rank's progress slots, the stored count."""

    messages: Any
    progress: Any
    stored: Any  # items whose on_item call completed (counts complete items, see on_item)


@dataclass(slots=True)
class RankProcesses:
    """Started ranks: their processes, what they share with the parent, and their rendezvous folder."""

    procs: list
    channels: _Channels
    rendezvous: str

    def stop(self) -> None:
        """SIGTERM, a short wait, SIGKILL (ringbench.run.interrupt.stop_processes); the rendezvous goes too."""
        stop_processes(self.procs)
        shutil.rmtree(self.rendezvous, ignore_errors=True)


def start_ranks(world: int, fn: Callable, args: tuple = (), *, timeout_s: float = 60.0,
                device: str | None = None) -> RankProcesses:  # fmt: skip
    """Start ``world`` ranks running ``fn(WorkerContext, *args)`` (the module doc says how) and return them
    running; the caller reads ``channels.messages`` and calls ``stop()`` in the end, whatever happens."""
    _check_launch(world)
    spawn = _context()
    channels = _Channels(messages=spawn.Queue(), progress=spawn.Array("i", world * _SLOTS, lock=False),
                         stored=spawn.Value("i", 0))  # fmt: skip
    # Rendezvous through a file in a private folder: no listening socket at all (a TCP store would listen on
    # every interface); gloo's own connections are bound to loopback (see ringbench.rank.dist.init_local).
    rendezvous = tempfile.mkdtemp(prefix="ringbench-rdzv-")
    procs = [
        spawn.Process(target=_worker, args=(rank, world, os.path.join(rendezvous, "store"), fn, args,
                                            channels.messages, channels.progress, channels.stored, timeout_s, device,
                                            os.getpid(), dict(os.environ), os.getcwd()),
                      name=f"ringbench-rank{rank}", daemon=True)
        for rank in range(world)
    ]  # fmt: skip
    ranks = RankProcesses(procs=procs, channels=channels, rendezvous=rendezvous)
    try:
        for proc in procs:
            proc.start()
    except BaseException:
        ranks.stop()
        raise
    return ranks


def _check_launch(world: int) -> None:
    if world < 1:
        raise UsageError(f"world={world!r} is not allowed; expected an integer >= 1")
    if mp.current_process().name.startswith("ringbench-rank"):
        raise UsageError(
            "a rank process is re-running the main script: guard the code that starts a run with "
            "`if __name__ == '__main__':` (ranks are spawned, and spawning imports the main module)"
        )


def _collect(procs, channels: _Channels, results: dict, errors: dict, *, on_item, timeout_s: float,
             grace_s: float) -> None:  # fmt: skip
    """Read the ranks' messages until every rank reported, or a failure's grace period passed, or nobody moved
    for longer than any bounded wait (every live rank is stuck)."""
    world = len(procs)
    first_failure: float | None = None
    snapshot, last_change = list(channels.progress), time.monotonic()
    while len(results) + len(errors) < world:
        try:
            message = channels.messages.get(timeout=0.1)
        except queue.Empty:
            message = None
        now = list(channels.progress)
        if message is not None or now != snapshot:
            snapshot, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > timeout_s + grace_s + (0 if any(now) else _STARTUP_S):
            return
        if message is not None:
            if _take(message, channels, results, errors, on_item):
                first_failure = first_failure or time.monotonic()
            continue
        dead = [r for r, p in enumerate(procs) if p.exitcode is not None and r not in results and r not in errors]
        if dead:
            first_failure = first_failure or time.monotonic()
        # After the first failure the others' reports (their stalls) follow within the grace period; a rank that
        # is still silent then has hung, and waiting longer would only delay the verdict.
        if first_failure is not None and time.monotonic() - first_failure > grace_s:
            return
        if first_failure is not None and dead and len(results) + len(errors) + len(dead) >= world:
            return


def _take(message, channels: _Channels, results: dict, errors: dict, on_item) -> bool:
    """Handle one message from a rank; True when it reports a failure."""
    kind, rank = message[0], message[1]
    if kind == "item" and on_item is not None:
        try:
            complete = on_item(rank, pickle.loads(message[2]))
        except OSError as exc:
            raise RunFailure(f"could not store a result: {exc}") from None
        if complete:
            with channels.stored.get_lock():
                channels.stored.value += 1
    elif kind == "result":
        results[rank] = pickle.loads(message[2])
    elif kind == "error":
        errors[rank] = (message[2], message[3], message[4])
        return True
    return False


def _is_stall(line: str) -> bool:
    """Whether an error line is a bounded wait that expired (a symptom, not a cause)."""
    return " stalled " in line or "timed out" in line.lower() or "timeout" in line.lower()


def _progress_key(progress_array, rank: int) -> tuple[int, int, int, int]:
    base = rank * _SLOTS
    case_index, phase, iteration, step = (progress_array[base + i] for i in range(_SLOTS))
    return case_index, iteration, phase, step


def _failure(procs, results, errors, progress_array, case_names) -> Exception:
    usage = [line for line, _, is_usage in errors.values() if is_usage]
    if usage:
        return UsageError(usage[0])
    if os.environ.get("RINGBENCH_DEBUG"):
        for rank, (_, trace, _) in sorted(errors.items()):
            print(f"--- rank {rank} ---\n{trace}")
    silent = [r for r in range(len(procs)) if r not in results and r not in errors]
    # A backend watchdog (NCCL's) aborts ranks *after* a peer went quiet: an abort is an effect, a silent rank
    # the likelier cause, so aborted ranks are named only when nothing else explains the failure.
    aborted = [r for r in silent if procs[r].exitcode in _ABORT_CODES]
    died = [r for r in silent if procs[r].exitcode not in (None, 0, -15, *_ABORT_CODES)]
    hung = [r for r in silent if procs[r].exitcode in (None, -15)]
    if died:
        rank = died[0]
        code = procs[rank].exitcode
        culprit = f"rank {rank} died (exit code {code}) at {where_text(progress_array, rank, case_names)}"
    elif own := [r for r in sorted(errors) if not _is_stall(errors[r][0])]:
        rank = own[0]  # a rank that failed by itself (not by waiting on another) is the cause
        culprit = f"rank {rank} failed at {where_text(progress_array, rank, case_names)}: {errors[rank][0]}"
    elif hung:
        rank = min(hung, key=lambda r: _progress_key(progress_array, r))  # the one that got least far
        culprit = f"rank {rank} stopped responding at {where_text(progress_array, rank, case_names)}"
    elif aborted:
        rank = min(aborted, key=lambda r: _progress_key(progress_array, r))
        culprit = f"rank {rank} was aborted by the backend at {where_text(progress_array, rank, case_names)}"
    else:
        rank = min(errors)
        culprit = f"rank {rank} failed at {where_text(progress_array, rank, case_names)}: {errors[rank][0]}"
    stalls = [f"rank {r}: {errors[r][0]}" for r in sorted(errors) if r != rank]
    detail = f"; then {stalls[0]}" if stalls else ""
    return RunFailure(culprit + detail)
