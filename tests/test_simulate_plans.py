"""The simulator's pair classes are ringbench.engine.plan.pair_plan: every pair, every mask and layout, at small N."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ringbench.engine.plan import pair_plan
from ringbench.simulate import plans
from ringbench.simulate.plans import pair_classes
from ringbench.vocab import Layout, Mask


def _shape(plan) -> list[tuple]:
    return sorted(
        (b.q_hi - b.q_lo, b.k_hi - b.k_lo, b.mask.kind.value, round(b.work_pairs(), 6), round(b.visible_pairs(), 6))
        for b in plan.blocks
    )


@pytest.mark.parametrize("mask", [m.value for m in Mask])
@pytest.mark.parametrize("layout", [lay.value for lay in Layout])
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_every_pair_has_the_plan_of_its_class(mask, layout, world):
    seq = 2 * world * 6
    classes = pair_classes(mask, layout, seq, world)
    q, k = np.meshgrid(np.arange(world), np.arange(world), indexing="ij")
    index = classes.classify(q, k)
    for q_rank, k_rank in itertools.product(range(world), repeat=2):
        plan = pair_plan(Mask(mask), Layout(layout), seq, world, q_rank, k_rank)
        cls = classes.classes[index[q_rank, k_rank]]
        assert plan.kind == cls.kind, (q_rank, k_rank)
        work = sorted((b.kind, round(b.work_pairs, 6), round(b.visible_pairs, 6)) for b in cls.blocks)
        assert work == sorted((kind, w, v) for _, _, kind, w, v in _shape(plan)), (q_rank, k_rank)


def test_naive_visible_share_counted_without_the_mask_matches_pair_plan(monkeypatch):
    plans.pair_classes.cache_clear()
    built = pair_classes("causal-naive", "striped", 96, 4)
    monkeypatch.setattr(plans, "NAIVE_MASK_LIMIT", 0)  # force the counting path
    plans.pair_classes.cache_clear()
    counted = pair_classes("causal-naive", "striped", 96, 4)
    plans.pair_classes.cache_clear()
    for mine, theirs in zip(counted.classes, built.classes, strict=True):
        assert mine.kind == theirs.kind and len(mine.blocks) == len(theirs.blocks) == 1
        # pair_plan's share is a float32 mean: equal to about 1e-7
        assert mine.blocks[0].visible_pairs == pytest.approx(theirs.blocks[0].visible_pairs, rel=1e-6)


def test_a_huge_ring_needs_three_plans():
    pair_plan.cache_clear()
    classes = pair_classes("causal", "zigzag", 1 << 20, 65536)
    assert pair_plan.cache_info().currsize == 3
    assert classes.kinds() == ("full", "causal", "full")
    flops = [c.flops(1, 8, 128, False, visible=True) for c in classes.classes]
    assert flops[0] == pytest.approx(flops[2]) and flops[1] == pytest.approx(flops[0])
