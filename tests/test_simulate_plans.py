"""The simulator's pair classes are ringbench.engine.plan.pair_plan: every pair, every mask and layout, at small N.

The three original masks through plans.py's three classes; documents and windows through the pair table
(simulate/pair_table.py), and the short ring's route as the engine takes it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ringbench.engine.plan import pair_plan
from ringbench.simulate import pair_classes as plans
from ringbench.simulate.pair_classes import pair_classes
from ringbench.vocab import Layout, Mask


def _shape(plan) -> list[tuple]:
    return sorted(
        (b.q_hi - b.q_lo, b.k_hi - b.k_lo, b.mask.kind.value, round(b.work_pairs(), 6), round(b.visible_pairs(), 6))
        for b in plan.blocks
    )


@pytest.mark.parametrize("mask", [m.value for m in Mask])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
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


def _docs(rng, seq: int) -> str:
    cuts = sorted(rng.sample(range(1, seq), min(seq - 1, rng.randint(1, 10))))
    return "lengths:" + ",".join(str(b - a) for a, b in zip([0, *cuts], [*cuts, seq], strict=True))


def test_the_pair_table_is_pair_plan_for_documents_and_windows():
    import random

    from ringbench.engine.masks import mask_rule
    from ringbench.simulate.pair_table import pair_table

    rng = random.Random(3)
    checked = 0
    for _ in range(40):
        world = rng.choice([1, 2, 3, 5, 8])
        seq = 2 * world * rng.choice([3, 4, 8])
        mask = rng.choice(["causal-document", "full-document", f"window:{rng.randint(1, 2 * seq)}",
                           f"causal-document+window:{rng.randint(1, seq)}"])  # fmt: skip
        docs = _docs(rng, seq) if "document" in mask else "none"
        layout = rng.choice(["contiguous", "zigzag", "striped"] + (["doc-balanced"] if "document" in mask else []))
        table = pair_table(mask, layout, seq, world, docs)
        rule = mask_rule(mask, docs, seq)
        for q_rank, k_rank in itertools.product(range(world), repeat=2):
            plan = pair_plan(rule, layout, seq, world, q_rank, k_rank)
            cls = table.classes[table.matrix[q_rank, k_rank]]
            assert cls.kind == plan.kind, (mask, layout, docs, q_rank, k_rank)
            work = sorted((b.kind, round(b.work_pairs, 6), round(b.visible_pairs, 6)) for b in cls.blocks)
            assert work == sorted((kind, w, v) for _, _, kind, w, v in _shape(plan)), (mask, layout, docs)
            checked += 1
    assert checked > 300


@pytest.mark.parametrize("buffer", ["double-short", "sync-short"])
def test_the_simulated_short_ring_moves_what_the_route_says(buffer):
    from ringbench.engine.masks import mask_rule
    from ringbench.engine.short_ring import short_route
    from ringbench.scenario.workload import Workload
    from ringbench.simulate import DEFAULTS, SimCase, simulate_case

    packed = Workload(world=8, seq=512, mask="causal-document", docs="lengths:40,100,20,200,52,100", buffer=buffer,
                      layout="contiguous")  # fmt: skip
    case = SimCase(workload=packed, iterations=2)
    route = short_route(mask_rule(case.mask, case.docs, case.seq), "contiguous", 512, 8, tuple(range(8)))
    assert case.route() == route
    result = simulate_case(case, DEFAULTS)
    sends = result.events[result.events["kind"] == "send"]
    per_phase = sends.groupby(["iteration", "phase"]).size().unstack()
    assert (per_phase["fwd"] == route.blocks_moved()).all() and (per_phase["bwd"] == route.blocks_moved()).all()
    assert result.row["ring_steps"] == route.depth + 1
    assert (result.events.loc[result.events["kind"] == "compute", "step"] <= route.depth).all()
    full = simulate_case(case.replace(buffer=buffer.split("-")[0]), DEFAULTS)
    assert result.row["bytes_moved"] < full.row["bytes_moved"]
    assert result.row["predicted_imbalance"] == pytest.approx(full.row["predicted_imbalance"])
