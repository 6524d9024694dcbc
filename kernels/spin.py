"""Busy-waits that act on a device's timeline: modelled compute, injected slowness and link delays on a GPU.

A host ``sleep`` after an asynchronous launch adds nothing to what the GPU does; a modelled duration must be
*enqueued* where the work runs. ``torch.cuda._sleep(cycles)`` is a one-thread kernel that spins for a number of
SM clock cycles; its rate (cycles per millisecond) is measured with events once per process (``calibrate``) and
recorded with the run, since it depends on the clock the GPU runs at.
"""

from __future__ import annotations

import torch

_CYCLES_PER_MS: dict[int, float] = {}  # device index -> measured rate


def calibrate(device: torch.device, cycles: int = 20_000_000, rounds: int = 3) -> float:
    """Measure ``torch.cuda._sleep``'s cycles per millisecond on ``device`` (synchronises: call outside timing)."""
    index = torch.device(device).index or 0
    rates = []
    with torch.cuda.device(index):
        for _ in range(rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / max(start.elapsed_time(end), 1e-6))
    _CYCLES_PER_MS[index] = sorted(rates)[len(rates) // 2]
    return _CYCLES_PER_MS[index]


def missing() -> str | None:
    """One line when this torch cannot busy-wait on a GPU (``torch.cuda._sleep`` is private), else None."""
    if callable(getattr(torch.cuda, "_sleep", None)):
        return None
    return (f"torch {torch.__version__} lacks torch.cuda._sleep (the busy-wait that paces emulated compute and link "
            "delays on a GPU)")  # fmt: skip


def cycles_per_ms(device: torch.device) -> float | None:
    """The measured rate for ``device``, or None before ``calibrate``."""
    return _CYCLES_PER_MS.get(torch.device(device).index or 0)


def spin(seconds: float, device: torch.device, stream=None) -> None:
    """Enqueue ``seconds`` of busy-wait on ``stream`` (the current stream when None); never blocks the host."""
    if seconds <= 0:
        return
    if missing():
        from ringbench.errors import UsageError

        raise UsageError(missing())
    rate = cycles_per_ms(device)
    if rate is None:
        rate = calibrate(device)
    cycles = max(1, int(seconds * 1e3 * rate))
    if stream is None:
        torch.cuda._sleep(cycles)
    else:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
