"""emulated:auto's rule: MARGIN x the arithmetic plus the CPU scheduler's slack, from the 2nd fastest of the rounds;
the rate from the calls that carry the work, a floor for the calls too small to pace at it."""

from __future__ import annotations

import itertools

import pytest
import torch

from ringbench.engine.api import build_context
from ringbench.engine.spec import AttentionSpec
from ringbench.kernels.base import block_flops
from ringbench.rank import autorate


def _context(seq: int = 64):
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, seq, 16, generator=generator) for _ in range(3))
    return build_context(q, k, v, AttentionSpec(mask="causal", layout="contiguous", buffer="sync")), q, k, v


def test_rate_keeps_margin_times_the_arithmetic_plus_the_cpu_slack(monkeypatch):
    # Every round takes 1 ms except a few slow ones (a rank that waited for a core): the 2nd fastest is 1 ms.
    timings = itertools.cycle([5e-3, 1e-3, 1e-3, 9e-3, 1e-3, 1e-3, 4e-3])
    monkeypatch.setattr(autorate, "_device_time", lambda device, call: next(timings))
    ctx, q, k, v = _context()
    rate = autorate.rank_rate(autorate.rank_needs(ctx, q, k, v, backward=False))
    flops = block_flops(1, 2, 64, 64, 16, 0.5, False)  # the one causal block of a 1-rank ring
    assert rate == pytest.approx(flops / (autorate.MARGIN * 1e-3 + autorate.CPU_SLACK_S) / 1e9)


def test_tiny_blocks_get_at_least_the_slack_on_a_cpu():
    ctx, q, k, v = _context(seq=32)
    rate = autorate.rank_rate(autorate.rank_needs(ctx, q, k, v, backward=True))
    forward_flops = block_flops(1, 2, 32, 32, 16, 0.5, False)
    assert 0 < rate <= forward_flops / autorate.CPU_SLACK_S / 1e9


@pytest.mark.parametrize(("rate", "expected"), [(2.37, 2.3), (0.768, 0.76), (137.0, 130.0), (9.99, 9.9)])
def test_rates_round_down_to_two_significant_digits(rate, expected):
    assert autorate.round_down(rate) == pytest.approx(expected)


class _OneRank:
    """The collectives of a group of one rank."""

    @staticmethod
    def min_float(value: float) -> float:
        return value


def _issue_needs(seconds_per_call: float = 1e-4, seconds_per_gflop: float = 0.05) -> list[autorate.CallNeed]:
    """Every call of issue 30's pack (5 ranks, 960 tokens, documents down to one token beside a window of 198),
    with a CPU's real time: a fixed cost per call plus the arithmetic."""
    from ringbench.engine.plan import plan_table

    needs = []
    plans = plan_table("causal-document+window:198", "contiguous", 960, 5, "lengths:383,142,110,109,30,62,124")
    for block in (b for row in plans for plan in row for b in plan.blocks):
        for backward in (False, True):
            shape = (block.q_hi - block.q_lo, block.k_hi - block.k_lo, 16, block.mask.work_fraction)
            flops = block_flops(1, 2, *shape, backward)
            real = seconds_per_call + flops / 1e9 * seconds_per_gflop
            needs.append(autorate.CallNeed(flops, block.work_pairs(), autorate.MARGIN * real + autorate.CPU_SLACK_S))
    return needs


def test_tiny_documents_get_a_floor_not_a_collapsed_rate():
    needs = _issue_needs()
    assert min(n.entries for n in needs) == 0.5  # a document one token long: a 1 x 1 CAUSAL call
    model = autorate.agree(needs, _OneRank())
    kernel_s = [max(n.flops / (model.gflops * 1e9), model.floor_ms / 1e3) for n in needs]
    assert all(s >= n.need_s for s, n in zip(kernel_s, needs, strict=True))  # every call honoured
    assert model.floor_ms >= autorate.CPU_SLACK_S * 1e3
    # The rate every call could honour alone (the rule before the floor) models the largest call at a minute.
    alone = autorate.rank_rate(needs)
    assert max(n.flops for n in needs) / (alone * 1e9) > 30
    assert max(kernel_s) < 0.1


def test_calls_that_are_all_alike_need_no_floor():
    needs = [autorate.CallNeed(4e6 * (1 + i % 3), 16384 * (1 + i % 3), 3e-3 * (1 + i % 3)) for i in range(9)]
    model = autorate.agree(needs, _OneRank())
    assert model.floor_ms == 0 and model.gflops == autorate.round_down(4e6 / 3e-3 / 1e9)


def test_models_combine_to_the_lowest_rate_and_the_highest_floor():
    models = [autorate.AutoModel(2.0, 0.0), autorate.AutoModel(0.5, 2.4), autorate.AutoModel(1.0, 3.1)]
    assert autorate.AutoModel.combine(models) == autorate.AutoModel(0.5, 3.1)
    assert autorate.AutoModel.combine([]) is None
    assert autorate.round_up_ms(2.31) == 2.4 and autorate.round_up_ms(2.4) == 2.4 and autorate.round_up_ms(0) == 0
