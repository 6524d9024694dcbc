"""The nanosecond busy-wait behind ringbench.kernels.spin's ``globaltimer`` clock.

A one-warp Triton kernel that holds its stream until the device's global timer (PTX ``%globaltimer``, read through
Triton's ``tl.extra.cuda.globaltimer``) has advanced by a duration. That timer counts nanoseconds whatever the SM
clock does, so a pad lasts what it was asked for at idle clocks and under a power-limited load alike; the kernel's
name contains ``spin_kernel``, as ``torch.cuda._sleep``'s does, so trace readers (ringbench.traces.ring_spans, the
GPU check's CUPTI analysis) take it for a busy-wait.

Imported only on an NVIDIA GPU with Triton, never under the CPU interpreter (which cannot run inline PTX): the
caller (spin.py) catches whatever importing, compiling or launching raises and falls back to SM cycles.
"""

from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.cuda  # (tl.extra.cuda.globaltimer)

# Durations are passed as an i32 and never specialised, so one compiled variant serves every pad (Triton would give
# an int equal to 1, or divisible by 16, or above 2**31 - 1, a variant of its own); longer pads are split.
MAX_LAUNCH_NS = 2**31 - 1


@triton.jit(do_not_specialize=["duration_ns"])
def _globaltimer_spin_kernel(duration_ns):
    # Never a hang: a pass of the loop (a special-register read, a subtraction, a compare, a branch) takes more
    # than a nanosecond on any GPU, so a running timer ends the loop first; a timer that does not advance ends it
    # after duration_ns passes, and the calibration's check against events then shows the pad was wrong.
    start = tl.extra.cuda.globaltimer()
    now = start
    passes = 0
    while (now - start < duration_ns) & (passes < duration_ns):
        now = tl.extra.cuda.globaltimer()
        passes += 1


def launch(duration_ns: int) -> None:
    """Enqueue ``duration_ns`` of busy-wait on the current stream of the current device; never blocks the host."""
    left = int(duration_ns)
    while left > 0:
        chunk = min(left, MAX_LAUNCH_NS)
        _globaltimer_spin_kernel[(1,)](chunk, num_warps=1)
        left -= chunk
