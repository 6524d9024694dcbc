"""Every ring variant against float64 single-device attention, forward and backward, on local gloo ranks.

Every mask x layout x buffer x ordering, in float64 and float32, at world sizes 1, 2, 3, 4 and one 8-rank set;
every strategy (ulysses, hybrid:U, double-ring:W; strategy_cases in tests/support/selfcheck.py) in every mask and
layout in the same worlds (the whole product, worlds 1-8, in tests/test_strategies.py under slow).
The document and window masks (mask_cases in tests/support/selfcheck.py: random document packs with documents shorter
than a chunk, windows shorter than a rank's block and longer than S, the short ring) ride in the same launches:
every combination at 1 rank, a covering set at 2 and 3 ranks; every combination at 2, 4, 5 and 8 ranks is the
slow tier; the strategies take them too (strategy_mask_cases). Tolerances per dtype live in ringbench.vocab.TOLERANCE
(fp32: 1e-5 forward, 5e-5 on gradients).
"""

import pytest
from support.selfcheck import (
    CheckCase,
    all_cases,
    mask_cases,
    run_selfcheck,
    strategy_cases,
    strategy_mask_cases,
    within_tolerance,
)

from ringbench.vocab import TOLERANCE


def _assert_exact(cases, results):
    failures = [(c.name, results[c.name]) for c in cases if not within_tolerance(c, results[c.name])]
    assert not failures, failures[:10]


@pytest.mark.parametrize("world", [1, 2, 3, pytest.param(4, marks=pytest.mark.slow)])
def test_every_variant_is_exact(world):
    # One launch per world size: the original masks, every strategy, and the document and window masks beside them.
    extra = mask_cases(world, full=world == 1) if world in (1, 2, 3) else []
    cases = all_cases(world) + strategy_cases(world) + extra + strategy_mask_cases(world)
    _assert_exact(cases, run_selfcheck(world, cases))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4, 5, 8])
def test_every_document_and_window_variant_is_exact(world):
    cases = mask_cases(world, full=True) + strategy_mask_cases(world, full=True)
    _assert_exact(cases, run_selfcheck(world, cases))


@pytest.mark.slow
def test_eight_ranks():
    # float64 at 8 ranks (every mask, layout, buffer, and three orders for causal); float32's tolerance is held at
    # 1 to 4 ranks above and on the odd shapes below.
    cases = [
        CheckCase.of(8, mask=m, layout=lay, buffer=b, order=o, dtype="float64", seq_per_rank=4)
        for m in ("causal", "causal-naive", "none")
        for lay in ("contiguous", "zigzag", "striped")
        for b in ("sync", "double", "allgather")
        for o in ("identity", "stride:3", "random:1")
        if not (m != "causal" and o != "identity")
    ]
    _assert_exact(cases, run_selfcheck(8, cases))


def test_uneven_shapes_and_odd_head_dim():
    cases = [
        CheckCase.of(3, mask="causal", layout=lay, buffer=b, batch=2, heads=3, head_dim=5, seq_per_rank=6, dtype=d)
        for lay in ("contiguous", "zigzag", "striped")
        for b in ("sync", "double")
        for d in ("float64", "float32")
    ]
    _assert_exact(cases, run_selfcheck(3, cases))


def test_tolerances_are_explicit_per_dtype():
    assert TOLERANCE["float32"] == (1e-5, 5e-5)
    assert TOLERANCE["float64"][0] <= 1e-10
