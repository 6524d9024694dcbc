"""``emulated:auto``: the highest emulated rate this machine can honour for a case.

An emulated block takes max(real arithmetic, modelled time); when the real arithmetic shows through (a *saturated*
block) every figure built on the model degrades. ``auto`` measures, before timing, the real arithmetic of each
block this rank will compute -- on the case's shapes, with every rank of the case computing at once, so the
contention of ranks per core is in the measurement -- and picks the rate at which each block's real arithmetic
stays under half its modelled time (the median of ROUNDS timings):

    modelled(block) = flops(block) / R   and   real(block) <= modelled(block) / 2   =>   R <= flops / (2 real)

R is the minimum over blocks and ranks (all ranks must model the same machine), rounded down to two significant
digits. It is printed, recorded in meta.json and in the case rows; the case id keeps ``emulated:auto``.
"""

from __future__ import annotations

import math
import time

import torch

from ringbench.kernels.base import block_flops
from ringbench.kernels.torch_sdpa import TorchSdpaKernel

MARGIN = 2.0  # real arithmetic stays under 1/MARGIN of the modelled time
ROUNDS = 7  # timings per block; the median counts (a descheduled outlier should not cost the whole run its rate;
# the factor MARGIN leaves room for the run's own jitter)


def _device_time(device: torch.device, call) -> float:
    """Seconds ``call()`` takes on ``device`` (synchronises: calibration runs before any timed iteration)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def rank_rate(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool) -> float:
    """The highest rate (GFLOP/s) that keeps every block of this rank's ring at most half saturated."""
    kernel = TorchSdpaKernel()  # the emulated kernel's own arithmetic
    batch, heads, _, head_dim = q.shape
    out = torch.zeros_like(q)
    lse = torch.zeros(q.shape[:-1], dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    rate = math.inf
    seen = set()
    for step in range(ctx.world):
        for block in ctx.plan(ctx.owner_at(step)).blocks:
            key = (block.q_hi - block.q_lo, block.k_hi - block.k_lo, block.mask.kind)
            if key in seen:
                continue
            seen.add(key)
            rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
            args = (q[:, :, rows], k[:, :, cols], v[:, :, cols])
            phases = [(False, lambda a=args, b=block: kernel.forward(*a, b.mask, ctx.scale))]
            if backward:
                back = (out[:, :, rows], *args, out[:, :, rows], lse[:, :, rows])
                phases.append((True, lambda a=back, b=block: kernel.backward(*a, b.mask, ctx.scale)))
            for is_backward, call in phases:
                call()  # warm-up (allocations, first-call costs)
                seconds = sorted(_device_time(q.device, call) for _ in range(ROUNDS))[ROUNDS // 2]
                flops = block_flops(batch, heads, *key[:2], head_dim, block.mask.work_fraction, is_backward)
                rate = min(rate, flops / (MARGIN * max(seconds, 1e-7)) / 1e9)
    return rate


def round_down(rate: float) -> float:
    """Two significant digits, rounded down (never above what was measured)."""
    if not math.isfinite(rate) or rate <= 0:
        return rate
    scale = 10 ** (math.floor(math.log10(rate)) - 1)
    return math.floor(rate / scale) * scale
