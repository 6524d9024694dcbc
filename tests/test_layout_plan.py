"""Layouts, the mask plan and the merge: pure functions, no processes."""

import pytest
import torch

from ringbench import shard, token_positions, unshard
from ringbench.engine.merge import merge
from ringbench.engine.plan import plan_table
from ringbench.errors import UsageError

LAYOUTS = ("contiguous", "zigzag", "striped")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_positions_partition_the_sequence(layout, world):
    seq = 8 * world
    owned = torch.cat([token_positions(layout, seq, world, r) for r in range(world)])
    assert sorted(owned.tolist()) == list(range(seq))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shard_unshard_round_trip(layout):
    x = torch.randn(2, 3, 24, 4)
    parts = [shard(x, layout, 3, r) for r in range(3)]
    assert all(p.shape == (2, 3, 8, 4) for p in parts)
    assert torch.equal(unshard(parts, layout), x)


def test_zigzag_owns_chunks_i_and_2n_minus_1_minus_i():
    assert token_positions("zigzag", 16, 4, 1).tolist() == [2, 3, 12, 13]
    assert token_positions("striped", 12, 4, 1).tolist() == [1, 5, 9]


def _work(plan_row):
    return sum(block.work_pairs() for plan in plan_row for block in plan.blocks)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_causal_contiguous_skips_the_upper_triangle(world):
    table = plan_table("causal", "contiguous", 8 * world, world)
    kinds = [[p.kind for p in row] for row in table]
    for q in range(world):
        for k in range(world):
            assert kinds[q][k] == ("full" if k < q else "causal" if k == q else "skip")


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_balances_work_and_skips_half(world):
    seq = 16 * world
    zig = [_work(row) for row in plan_table("causal", "zigzag", seq, world)]
    naive = [_work(row) for row in plan_table("causal-naive", "contiguous", seq, world)]
    contiguous = [_work(row) for row in plan_table("causal", "contiguous", seq, world)]
    assert max(zig) == pytest.approx(min(zig))  # every rank does the same work
    assert max(contiguous) > 1.5 * min(contiguous)  # contiguous is unbalanced
    assert sum(zig) / sum(naive) <= 0.5 + 1.0 / world  # about half of the naive work


def test_every_causal_plan_covers_exactly_the_visible_pairs():
    seq, world = 24, 3
    for layout in LAYOUTS:
        table = plan_table("causal", layout, seq, world)
        for q_rank in range(world):
            q_pos = token_positions(layout, seq, world, q_rank)
            for k_rank in range(world):
                k_pos = token_positions(layout, seq, world, k_rank)
                covered = torch.zeros(len(q_pos), len(k_pos), dtype=torch.bool)
                for b in table[q_rank][k_rank].blocks:
                    sub = covered[b.q_lo : b.q_hi, b.k_lo : b.k_hi]
                    if b.mask.kind.value == "full":
                        sub |= True
                    elif b.mask.kind.value == "causal":
                        sub |= torch.ones_like(sub).tril()
                    else:
                        sub |= b.mask.allowed
                assert torch.equal(covered, k_pos[None, :] <= q_pos[:, None]), (layout, q_rank, k_rank)


def test_merge_identity_and_exactness():
    torch.manual_seed(0)
    scores = torch.randn(1, 1, 3, 10, dtype=torch.float64)
    values = torch.randn(1, 1, 10, 4, dtype=torch.float64)

    def partial(cols):
        s = scores[..., cols]
        lse = torch.logsumexp(s, -1)
        return torch.softmax(s, -1) @ values[:, :, cols], lse

    full_out, full_lse = partial(slice(0, 10))
    out_a, lse_a = partial(slice(0, 4))
    out_b, lse_b = partial(slice(4, 10))
    out, lse = merge(out_a, lse_a, out_b, lse_b)
    assert torch.allclose(out, full_out, atol=1e-14) and torch.allclose(lse, full_lse, atol=1e-14)
    identity = (torch.zeros_like(out_a), torch.full_like(lse_a, float("-inf")))
    out_i, lse_i = merge(*identity, out_a, lse_a)
    assert torch.equal(out_i, out_a) and torch.equal(lse_i, lse_a)
    out_e, lse_e = merge(*identity, *identity)  # both empty: stays the identity, no NaN
    assert torch.equal(out_e, identity[0]) and torch.isneginf(lse_e).all()


@pytest.mark.parametrize(
    ("layout", "seq", "world"),
    [("contiguous", 10, 3), ("zigzag", 12, 4), ("striped", 9, 2)],
)
def test_indivisible_sequence_is_a_usage_error(layout, seq, world):
    with pytest.raises(UsageError, match=rf"seq={seq} is not allowed for layout='{layout}'"):
        token_positions(layout, seq, world, 0)
