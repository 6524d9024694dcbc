"""``emulated:auto``: the highest emulated rate this machine can honour for a case.

An emulated block takes max(real arithmetic, modelled time); when the real arithmetic shows through (a *saturated*
block) every figure built on the model degrades. ``auto`` measures, before timing, the real arithmetic of each
block this rank will compute -- on the case's shapes, step by step with every rank computing the same ring step at
once (a barrier per step), so the contention of ranks per core is in the measurement -- and picks the rate at which
each block's real arithmetic stays under 1/MARGIN of its modelled time, with room on a CPU for the scheduler:

    modelled(block) = flops(block) / R   and   MARGIN real(block) + SLACK <= modelled(block)
    =>   R <= flops / (MARGIN real + SLACK)

real(block) is the 2nd fastest of ROUNDS timings: the arithmetic with the contention every round had, without the
rounds where the rank also waited for a core. That wait is what SLACK covers on a CPU: with more ranks than cores a
rank is preempted now and then for a scheduler time slice or two (measured here: 1 to 4 ms, most under 2 ms), and a
block modelled shorter than that would show the wait as saturation. On a GPU the block's arithmetic is queued on its
stream and nothing preempts it, so SLACK is 0 there.

R is the minimum over blocks and ranks (all ranks must model the same machine), rounded down to two significant
digits. It is printed, recorded in meta.json and in the case rows; the case id keeps ``emulated:auto``.
"""

from __future__ import annotations

import math
import time

import torch

from ringbench.kernels.base import block_flops
from ringbench.kernels.torch_sdpa import TorchSdpaKernel

MARGIN = 3.0  # real arithmetic stays under 1/MARGIN of the modelled time
CPU_SLACK_S = 2e-3  # room for a scheduler preemption on a CPU (none on a GPU): see the module docstring
ROUNDS = 7  # timings per block, each round in step with the other ranks
QUANTILE_INDEX = 1  # the 2nd fastest of 7: the contention every round had, not a round's wait for a core


def _device_time(device: torch.device, call) -> float:
    """Seconds ``call()`` takes on ``device`` (synchronises: calibration runs before any timed iteration)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def rank_rate(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool, barrier=None) -> float:
    """The highest rate (GFLOP/s) at which every block of this rank's ring has MARGIN x its arithmetic, plus SLACK.

    Each of ROUNDS rounds walks the ring's steps as the run does: ``barrier()`` (every rank's), then this rank's
    blocks of that step, each timed. All ranks compute step s at the same moment, so every timing carries the
    contention the timed run will see at that step (ranks with less work wait at the next barrier, as in a ring).
    """
    kernel = TorchSdpaKernel()  # the emulated kernel's own arithmetic
    batch, heads, _, head_dim = q.shape
    out = torch.zeros_like(q)
    lse = torch.zeros(q.shape[:-1], dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    steps = []  # per ring step: (flops, call) of each block, forward then backward
    for step in range(ctx.world):
        calls = []
        for block in ctx.plan(ctx.owner_at(step)).blocks:
            rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
            args = (q[:, :, rows], k[:, :, cols], v[:, :, cols])
            shape = (block.q_hi - block.q_lo, block.k_hi - block.k_lo, head_dim, block.mask.work_fraction)
            calls.append(
                (
                    block_flops(batch, heads, *shape, False),
                    lambda a=args, b=block: kernel.forward(*a, b.mask, ctx.scale),
                )
            )
            if backward:
                back = (out[:, :, rows], *args, out[:, :, rows], lse[:, :, rows])
                calls.append(
                    (
                        block_flops(batch, heads, *shape, True),
                        lambda a=back, b=block: kernel.backward(*a, b.mask, ctx.scale),
                    )
                )
        steps.append(calls)
    for calls in steps:  # warm-up (allocations, first-call costs)
        for _, call in calls:
            call()
    seconds = [[[] for _ in calls] for calls in steps]
    for _ in range(ROUNDS):
        for step, calls in enumerate(steps):
            if barrier is not None:
                barrier()
            for index, (_, call) in enumerate(calls):
                seconds[step][index].append(_device_time(q.device, call))
    slack_s = 0.0 if q.device.type == "cuda" else CPU_SLACK_S
    rate = math.inf
    for step, calls in enumerate(steps):
        for (flops, _), timings in zip(calls, seconds[step], strict=True):
            seconds_ = sorted(timings)[QUANTILE_INDEX]
            rate = min(rate, flops / (MARGIN * max(seconds_, 1e-7) + slack_s) / 1e9)
    return rate


def round_down(rate: float) -> float:
    """Two significant digits, rounded down (never above what was measured)."""
    if not math.isfinite(rate) or rate <= 0:
        return rate
    scale = 10 ** (math.floor(math.log10(rate)) - 1)
    return math.floor(rate / scale) * scale
