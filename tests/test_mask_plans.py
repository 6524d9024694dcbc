"""Masks as data: the positional rule, the documents, the plan that cuts pairs at document boundaries and window
edges, the short ring's route and the doc-balanced layout. Pure functions, no processes."""

from __future__ import annotations

import json
import math
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ringbench.engine.documents import documents
from ringbench.engine.layout import resolve_layout, token_positions
from ringbench.engine.masks import mask_rule
from ringbench.engine.plan import CALL_ENTRIES, MAX_CALLS, band_items, pair_plan, pair_visibility, plan_table
from ringbench.engine.short_ring import short_route
from ringbench.errors import UsageError
from ringbench.kernels.base import MaskTensors
from ringbench.scenario.layers import canonical_layers, layer_masks
from ringbench.vocab import MaskSpec

DATA = Path(__file__).parent / "data" / "plans"
NEW_MASKS = ("causal-document", "full-document", "window:5", "causal-document+window:7")


def _random_docs(rng: random.Random, seq: int, most: int = 12) -> str:
    cuts = sorted(rng.sample(range(1, seq), min(seq - 1, rng.randint(0, most))))
    return "lengths:" + ",".join(str(b - a) for a, b in zip([0, *cuts], [*cuts, seq], strict=True))


def _covered(plan, q_len: int, k_len: int) -> torch.Tensor:
    """How often the plan's sub-blocks cover each (query row, key row) entry with a visible mark."""
    cover = torch.zeros(q_len, k_len, dtype=torch.int32)
    tensors = MaskTensors()
    for b in plan.blocks:
        part = cover[b.q_lo : b.q_hi, b.k_lo : b.k_hi]
        if b.mask.kind.value == "full":
            part += 1
        elif b.mask.kind.value == "causal":
            part += torch.ones_like(part).tril()
        else:
            part += tensors.allowed(b.mask, torch.device("cpu")).int()
    return cover


def test_the_three_original_masks_keep_every_pairs_plan():
    sys.path.insert(0, str(DATA))
    try:
        import snapshot
    finally:
        sys.path.remove(str(DATA))
    stored = json.loads((DATA / "legacy.json").read_text())
    assert snapshot.digests() == stored  # 216 (mask, layout, seq, world) tables, every pair of each


def test_every_new_plan_covers_exactly_the_visible_pairs_once():
    rng = random.Random(11)
    for trial in range(60):
        world = rng.choice([1, 2, 3, 5])
        seq = 2 * world * rng.choice([2, 3, 4, 8])  # documents shorter than one chunk happen often
        mask = rng.choice([*NEW_MASKS, f"window:{rng.randint(1, 3 * seq)}"])  # shorter than a block, longer than S
        docs = _random_docs(rng, seq) if "document" in mask else "none"
        layout = rng.choice(["contiguous", "zigzag", "striped"] + (["doc-balanced"] if "document" in mask else []))
        rule = mask_rule(mask, docs, seq)
        visibility = pair_visibility(rule, layout, seq, world)
        for q in range(world):
            q_pos = token_positions(layout, seq, world, q, rule)
            for k in range(world):
                k_pos = token_positions(layout, seq, world, k, rule)
                plan = pair_plan(rule, layout, seq, world, q, k)
                want = rule.visible(q_pos.numpy(), k_pos.numpy()).int()
                assert torch.equal(_covered(plan, len(q_pos), len(k_pos)), want), (trial, mask, docs, layout, q, k)
                assert plan.visible_pairs() == float(want.sum()) == visibility[q, k]
                assert plan.calls <= MAX_CALLS and plan.skip == (visibility[q, k] == 0)


@pytest.mark.parametrize("call_entries", [0, 1, 16, 1 << 14])
def test_band_decomposition_is_exact_at_any_call_cost(call_entries):
    rng = random.Random(call_entries)
    for _ in range(1500):
        lq, lk = rng.randint(1, 24), rng.randint(1, 24)
        lo = rng.randint(-30, 30)
        hi = lo + rng.randint(0, 40) if rng.random() < 0.8 else None
        i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
        want = ((i - j) >= lo) & (((i - j) <= hi) if hi is not None else True)
        cover = torch.zeros(lq, lk, dtype=torch.int32)
        for kind, i0, i1, j0, j1 in band_items(lq, lk, lo, hi, call_entries):
            assert 0 <= i0 < i1 <= lq and 0 <= j0 < j1 <= lk
            region = want[i0:i1, j0:j1]
            if kind == "full":
                assert region.all()
                cover[i0:i1, j0:j1] += 1
            elif kind == "causal":
                tri = torch.ones(i1 - i0, j1 - j0, dtype=torch.bool).tril()
                assert i1 - i0 == j1 - j0 and (region | ~tri).all()
                cover[i0:i1, j0:j1] += tri.int()
            else:
                cover[i0:i1, j0:j1] += region.int()
        assert torch.equal(cover, want.int()), (lq, lk, lo, hi)


def test_document_pairs_are_full_and_causal_pieces_not_one_masked_block():
    seq, world = 256, 4
    rule = mask_rule("causal-document", "lengths:20,50,3,90,1,60,32", seq)
    kinds = {b.mask.kind.value for row in plan_table(rule, "contiguous", seq, world) for p in row for b in p.blocks}
    assert kinds == {"full", "causal"}  # cut at the document boundaries: no PARTIAL block at all
    diagonal = pair_plan(rule, "contiguous", seq, world, 1, 1)  # rows 64..127: documents 50 | 3 | 90 cut it
    assert diagonal.calls == 3 and all(b.mask.kind.value == "causal" for b in diagonal.blocks)
    # A window of 256 tokens over blocks of 1024: CAUSAL squares along the diagonal, PARTIAL strips only along the
    # window's edge (a fifth of the block, not all of it), in a handful of calls.
    window = pair_plan(mask_rule("window:256", "none", 4096), "contiguous", 4096, 4, 1, 1)
    partial = sum(b.area for b in window.blocks if b.mask.kind.value == "partial")
    assert partial < 0.25 * 1024 * 1024 and window.calls <= 8
    assert {b.mask.kind.value for b in window.blocks} == {"causal", "partial"}


def test_a_window_of_one_block_leaves_no_sliver_call():
    # W = S/N on a contiguous layout: the pair with the previous block is one upper triangle. Its last strip used to
    # end in a FULL block one key wide (255 x 1), a whole kernel call for 255 entries (and the call that set
    # emulated:auto's rate, 39x below causal's).
    seq, world = 4096, 8
    plans = plan_table(f"window:{seq // world}", "contiguous", seq, world)
    blocks = [b for row in plans for plan in row for b in plan.blocks]
    assert min(b.area for b in blocks) >= CALL_ENTRIES
    assert max(plan.calls for row in plans for plan in row) == 3


def test_exact_visible_counts_and_flops_of_small_documents():
    rule = mask_rule("causal-document", "lengths:" + ",".join(["1"] * 16), 16)  # every token its own document
    plan = pair_plan(rule, "contiguous", 16, 1, 0, 0)
    assert plan.visible_pairs() == 16  # 16 CAUSAL pieces of one entry each (not 16 x 0.5)
    assert plan.calls <= MAX_CALLS


@pytest.mark.parametrize(
    ("seq", "world", "window", "depth"),
    [
        (512, 8, 64, 1),
        (512, 8, 65, 1),
        (512, 8, 129, 2),
        (512, 8, 16, 1),
        (512, 8, 200, 4),
        (512, 8, 4096, 7),
        (96, 3, 1, 0),
    ],
)
def test_the_short_ring_stops_when_the_window_is_covered(seq, world, window, depth):
    rule = mask_rule(f"window:{window}", "none", seq)
    route = short_route(rule, "contiguous", seq, world, tuple(range(world)))
    assert route.depth == depth == min(world - 1, math.ceil((window - 1) / (seq // world)))
    # Blocks that would cross the ring's wrap are needed by nobody: the last rank's block never travels.
    assert route.travel[-1] == 0 and route.blocks_moved() < world * max(1, depth)
    # On a reversed ring a block needs N - 1 hops to reach its successor's queries: the route says so.
    assert short_route(rule, "contiguous", seq, world, tuple(reversed(range(world)))).depth == (
        world - 1 if depth else 0
    )


def test_doc_balanced_balances_a_lognormal_pack():
    seq, world = 4096, 8
    rule = mask_rule("causal-document", "lognormal:512:1.0:7:0.25", seq)
    work = {lay: pair_visibility(rule, lay, seq, world).sum(axis=1) for lay in ("contiguous", "zigzag",
                                                                                  "doc-balanced")}  # fmt: skip
    ratio = {lay: w.max() / w.mean() for lay, w in work.items()}
    assert ratio["doc-balanced"] < 1.05 < ratio["zigzag"] < ratio["contiguous"]
    layout = resolve_layout("doc-balanced", seq, world, rule)
    assert layout.predicted_imbalance == pytest.approx(ratio["doc-balanced"])
    owned = torch.cat([token_positions(layout, seq, world, r) for r in range(world)])
    assert sorted(owned.tolist()) == list(range(seq))  # equal shards that partition the sequence
    with pytest.raises(UsageError, match=r"layout='doc-balanced' is not allowed with mask='window:64'"):
        resolve_layout("doc-balanced", seq, world, mask_rule("window:64", "none", seq))


def test_mask_specs_parse_to_one_canonical_name():
    assert MaskSpec.parse("causal+window:64").text == "window:64"
    assert MaskSpec.parse("window:8+causal-document").text == "causal-document+window:8"
    assert [MaskSpec.parse(m).legacy for m in ("none", "causal", "causal-naive", "window:3")] == [1, 1, 1, 0]
    for bad, what in (("window:0", "W >= 1"), ("window:-4", "W >= 1"), ("full-document+window:4", "none, causal"),
                      ("causal-naive+window:2", "none, causal"), ("banded", "none, causal")):  # fmt: skip
        with pytest.raises(UsageError, match=rf"^mask='{re.escape(bad)}' is not allowed; expected .*{what}"):
            MaskSpec.parse(bad)
    with pytest.raises(UsageError, match=r"mask='causal-document' is not allowed without documents"):
        mask_rule("causal-document", "none", 64)


def test_documents_are_deterministic_and_fill_the_sequence(tmp_path):
    a, b = documents("lognormal:100:1.2:5:0.25", 10000), documents("lognormal:100:1.2:5:0.25", 10000)
    assert a.lengths == b.lengths and sum(a.lengths) == 10000 and a.max <= 2500
    assert documents("lognormal:100:1.2:6", 10000).lengths != a.lengths  # another seed, other documents
    uniform = documents("uniform:3:9:1", 500)
    assert sum(uniform.lengths) == 500 and max(uniform.lengths[:-1]) <= 9 and min(uniform.lengths[:-1]) >= 3
    assert documents("lengths:3,5,8", 16).ends == (3, 8, 16)
    (tmp_path / "docs.txt").write_text("# lengths\n10\n20\n\n40\n")
    assert documents(f"file:{tmp_path / 'docs.txt'}", 50).lengths == (10, 20, 20)  # the last one cut to fit
    import pandas as pd

    pd.DataFrame({"name": ["a", "b"], "tokens": [30, 70]}).to_csv(tmp_path / "docs.csv", index=False)
    assert documents(f"file:{tmp_path / 'docs.csv'}:tokens", 100).lengths == (30, 70)
    pd.DataFrame({"tokens": [60, 60]}).to_parquet(tmp_path / "docs.parquet")
    assert documents(f"file:{tmp_path / 'docs.parquet'}", 100).lengths == (60, 40)
    summary = a.summary()
    assert summary["count"] == a.count and summary["max"] == a.max and summary["lengths"] == list(a.lengths)


@pytest.mark.parametrize(("spec", "message"), [
    ("lengths:10,20", r"lengths summing to seq=64 \(they sum to 30\)"),
    ("lengths:10,x", r"integer lengths"),
    ("lognormal:0:1:3", r"MEAN >= 1"),
    ("lognormal:64:-1:3", r"0 <= SIGMA <= 10"),
    ("lognormal:64:1:3:1.5", r"0 < CAP <= 1"),
    ("uniform:9:3:1", r"1 <= MIN <= MAX"),
    ("uniform:1:3", r"uniform:MIN:MAX:SEED"),
    ("file:/no/such/file", r"naming an existing file"),
    ("poisson:3", r"none, lengths:"),
])  # fmt: skip
def test_bad_document_specs_name_the_field_the_value_and_what_is_allowed(spec, message):
    with pytest.raises(UsageError, match=rf"^docs='{spec}' is not allowed; expected .*{message}"):
        documents(spec, 64)


def test_layers_are_a_count_or_a_pattern_of_masks():
    assert canonical_layers("4") == "4" and canonical_layers(1) == "1"
    assert canonical_layers("window:4096x5,causal") == "window:4096 x5, causal x1"
    assert layer_masks("window:64 x2, mask x1", "causal-document") == ("window:64", "window:64", "causal-document")
    assert layer_masks("3", "window:8") == ("window:8",) * 3
    for bad in ("0", "x", "window:0 x2", "causal x0", ""):
        with pytest.raises(UsageError, match=r"^layers="):
            canonical_layers(bad)


def test_a_rule_is_one_interval_of_keys_per_query():
    rule = mask_rule("causal-document+window:4", "lengths:5,6,5", 16)
    lo, hi = rule.key_bounds(np.arange(16))
    assert lo.tolist() == [0, 0, 0, 0, 1, 5, 5, 5, 5, 6, 7, 11, 11, 11, 11, 12]
    assert hi.tolist() == list(range(16))
    assert rule.row_counts(np.arange(16), np.arange(16)).tolist() == (hi - lo + 1).tolist()
