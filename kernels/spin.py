"""Busy-waits that act on a device's timeline: modelled compute, injected slowness and link delays on a GPU.

A host ``sleep`` after an asynchronous launch adds nothing to what the GPU does; a modelled duration must be
*enqueued* where the work runs, as a kernel that holds its stream that long. Two such kernels, by the clock they
count (``clock``):

* ``globaltimer``: a one-warp Triton kernel that spins until the device's nanosecond timer has advanced by the
  duration (ringbench.kernels.spin_timer). The SM clock does not enter, so a pad lasts what it was asked for at
  idle clocks and under a power-limited load alike. Used wherever it runs and measures right.
* ``sm-cycles``: ``torch.cuda._sleep(cycles)``, a one-thread kernel that spins for a number of SM clock cycles.
  Its rate (cycles per ms) is measured once at start-up, on a near-idle GPU; an H100 SXM runs at about 1.98 GHz
  there and drops to about 1.6-1.75 GHz under sustained tensor-core load, so pads enqueued after heavy kernels
  would run up to ~20% long. Whoever enqueues pads measures them with events and hands the measurements to
  ``correct`` after each iteration, which replaces the rate by the one the pads actually ran at: the clocks of
  the last iteration predict the next one's far better than the idle clocks of start-up.

``calibrate`` measures the cycle rate, then launches the nanosecond spin once and times it against CUDA events
(TIMER_PADS pads of TIMER_CHECK_MS must measure within TIMER_WINDOW of their duration); where it cannot run (no
Triton, Triton's CPU interpreter, a GPU that is not NVIDIA's, a failed compile) or measures wrong, the cycles are
used and ``status`` says why. Both are recorded with the run (ringbench.rank.runner).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from dataclasses import dataclass, field

import torch

GLOBALTIMER, SM_CYCLES = "globaltimer", "sm-cycles"
TIMER_CHECK_MS, TIMER_PADS = 5.0, 3
# A working nanosecond spin measures 1.000-1.002 of its duration: CUDA events resolve about 0.5 us, the timer ticks
# at most every microsecond and a kernel starts a few microseconds after the event before it on an idle stream.
TIMER_WINDOW = (0.98, 1.05)
MIN_PAD_MS = 0.5  # a shorter pad measures launch latency more than the SM clock: not used to correct the rate


@dataclass(slots=True)
class _Device:
    """What one device's busy-wait runs on, and how it was chosen."""

    clock: str = SM_CYCLES
    cycles_per_ms: float | None = None  # the cycle rate: measured at start-up, then corrected under load
    idle_cycles_per_ms: float | None = None  # as measured at start-up (kept for the record)
    timer_ratio: float | None = None  # measured / requested of the nanosecond spin's check
    why_not_timer: str = ""
    corrections: list[float] = field(default_factory=list)  # the rates ``correct`` set, in order


_DEVICES: dict[int, _Device] = {}


def _index(device) -> int:
    return torch.device(device).index or 0


def missing() -> str | None:
    """One line when this torch cannot busy-wait on a GPU (``torch.cuda._sleep`` is private), else None."""
    if callable(getattr(torch.cuda, "_sleep", None)):
        return None
    return (f"torch {torch.__version__} lacks torch.cuda._sleep (the busy-wait that paces emulated compute and link "
            "delays on a GPU)")  # fmt: skip


def timer_problem() -> str | None:
    """Why the nanosecond spin cannot be tried in this process (None: it can), from host facts only."""
    if torch.version.hip is not None:
        return "the GPU is not NVIDIA's (%globaltimer is PTX)"
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "Triton is interpreted here (TRITON_INTERPRET=1), and its interpreter runs no inline PTX"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    return None


def _event_ms(launch, index: int) -> float:
    """Device time of what ``launch()`` enqueues, in ms (two events; synchronises: call outside timing)."""
    with torch.cuda.device(index):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def _check_timer(index: int) -> tuple[float | None, str]:
    """(measured / requested, why not) of the nanosecond spin on device ``index``; why-not '' when it may be used."""
    problem = timer_problem()
    if problem:
        return None, problem
    try:
        from ringbench.kernels import spin_timer

        with torch.cuda.device(index):
            spin_timer.launch(1_000)  # compiles (once per Triton cache) and loads the kernel, outside any timing
            torch.cuda.synchronize(index)
        ratios = [_event_ms(lambda: spin_timer.launch(round(TIMER_CHECK_MS * 1e6)), index) / TIMER_CHECK_MS
                  for _ in range(TIMER_PADS)]  # fmt: skip
    except Exception as exc:  # whatever the compiler or the driver said: the cycles stay, and the reason is kept
        text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        return None, f"the nanosecond spin did not run ({type(exc).__name__}{': ' + text if text else ''})"
    ratio = statistics.median(ratios)
    low, high = TIMER_WINDOW
    if not low <= ratio <= high:
        return ratio, (f"the nanosecond spin measured {ratio:.3f} times its duration by CUDA events (allowed "
                       f"{low:g}-{high:g})")  # fmt: skip
    return ratio, ""


def calibrate(device: torch.device, cycles: int = 20_000_000, rounds: int = 3) -> float | None:
    """Measure ``torch.cuda._sleep``'s cycles per ms on ``device`` and choose the clock pads count (module doc);
    returns the cycle rate (None where torch lacks ``_sleep``). Synchronises: call outside timing."""
    index = _index(device)
    state = _DEVICES[index] = _Device()
    if missing() is None:
        rates = [cycles / max(_event_ms(lambda: torch.cuda._sleep(cycles), index), 1e-6) for _ in range(rounds)]
        state.cycles_per_ms = state.idle_cycles_per_ms = statistics.median(rates)
    state.timer_ratio, state.why_not_timer = _check_timer(index)
    if not state.why_not_timer:
        state.clock = GLOBALTIMER
    return state.cycles_per_ms


def _state(device) -> _Device:
    index = _index(device)
    if index not in _DEVICES:
        calibrate(torch.device("cuda", index))
    return _DEVICES[index]


def clock(device: torch.device) -> str | None:
    """The clock ``device``'s pads count (GLOBALTIMER or SM_CYCLES), or None before ``calibrate``."""
    state = _DEVICES.get(_index(device))
    return state.clock if state is not None else None


def cycles_per_ms(device: torch.device) -> float | None:
    """The cycle rate ``device``'s cycle spins use now, or None before ``calibrate``."""
    state = _DEVICES.get(_index(device))
    return state.cycles_per_ms if state is not None else None


def status(device: torch.device) -> dict:
    """What the run records of ``device``'s busy-wait: its clock, the cycle rates and why not the timer."""
    state = _DEVICES.get(_index(device))
    if state is None:
        return {}
    found = {"spin_clock": state.clock, "spin_cycles_per_ms": _round(state.idle_cycles_per_ms)}
    if state.why_not_timer:
        found["spin_timer_unused"] = state.why_not_timer
    if state.corrections:
        found["spin_cycles_per_ms_corrected"] = _round(state.corrections[-1])
    return found


def _round(value: float | None) -> int | None:
    return None if value is None else round(value)


def correct(device: torch.device, samples: list[tuple[int, float]]) -> float | None:
    """After an iteration: ``samples`` are (cycles enqueued, device ms they took) of the cycle pads it ran; the rate
    becomes their median (pads shorter than MIN_PAD_MS are left out). Returns the new rate, or None if unchanged."""
    state = _DEVICES.get(_index(device))
    rates = [cycles / ms for cycles, ms in samples if cycles > 0 and ms >= MIN_PAD_MS]
    if state is None or not rates:
        return None
    state.cycles_per_ms = statistics.median(rates)
    state.corrections.append(state.cycles_per_ms)
    return state.cycles_per_ms


def spin(seconds: float, device: torch.device, stream=None) -> int:
    """Enqueue ``seconds`` of busy-wait on ``stream`` (the current stream when None); never blocks the host.
    Returns the SM cycles enqueued (0 when the nanosecond clock paces it, or nothing was enqueued), for ``correct``."""
    if seconds <= 0:
        return 0
    state = _state(device)
    if state.clock != GLOBALTIMER and missing():
        from ringbench.errors import UsageError

        raise UsageError(missing())
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        if state.clock == GLOBALTIMER:
            from ringbench.kernels import spin_timer

            spin_timer.launch(round(seconds * 1e9))
            return 0
        cycles = max(1, int(seconds * 1e3 * state.cycles_per_ms))
        torch.cuda._sleep(cycles)
        return cycles
