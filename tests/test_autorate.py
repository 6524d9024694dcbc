"""emulated:auto's rule: MARGIN x the arithmetic plus the CPU scheduler's slack, from the 2nd fastest of the rounds."""

from __future__ import annotations

import itertools

import pytest
import torch

from ringbench.engine.api import build_context
from ringbench.kernels.base import block_flops
from ringbench.rank import autorate


def _context(seq: int = 64):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, seq, 16, generator=generator) for _ in range(3))
    return build_context(q, k, v, mask="causal", layout="contiguous", buffer="sync"), q, k, v


def test_rate_keeps_margin_times_the_arithmetic_plus_the_cpu_slack(monkeypatch):
    # Every round takes 1 ms except a few slow ones (a rank that waited for a core): the 2nd fastest is 1 ms.
    timings = itertools.cycle([5e-3, 1e-3, 1e-3, 9e-3, 1e-3, 1e-3, 4e-3])
    monkeypatch.setattr(autorate, "_device_time", lambda device, call: next(timings))
    ctx, q, k, v = _context()
    rate = autorate.rank_rate(ctx, q, k, v, backward=False)
    flops = block_flops(1, 2, 64, 64, 16, 0.5, False)  # the one causal block of a 1-rank ring
    assert rate == pytest.approx(flops / (autorate.MARGIN * 1e-3 + autorate.CPU_SLACK_S) / 1e9)


def test_tiny_blocks_get_at_least_the_slack_on_a_cpu():
    ctx, q, k, v = _context(seq=32)
    rate = autorate.rank_rate(ctx, q, k, v, backward=True)
    forward_flops = block_flops(1, 2, 32, 32, 16, 0.5, False)
    assert 0 < rate <= forward_flops / autorate.CPU_SLACK_S / 1e9


@pytest.mark.parametrize(("rate", "expected"), [(2.37, 2.3), (0.768, 0.76), (137.0, 130.0), (9.99, 9.9)])
def test_rates_round_down_to_two_significant_digits(rate, expected):
    assert autorate.round_down(rate) == pytest.approx(expected)
