"""Inputs from (seed, token chunk) and the streaming float64 reference: exact, NaN-honest, bounded in memory."""

from __future__ import annotations

import math
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ringbench.engine import reference
from ringbench.engine.api import reference_attention
from ringbench.engine.inputs import ShardSpec, chunk_seed, rank_shards, token_block
from ringbench.engine.layout import token_positions, unshard
from ringbench.engine.reference import check_errors, rank_reference
from ringbench.errors import UsageError

SHAPE = dict(batch=2, heads=3, head_dim=5)  # odd on purpose
SEQ = 600  # not a multiple of CHUNK_TOKENS; divisible by 2N for N = 1..4 (zigzag)
SMALL = dict(sizes=(64, 128))  # several tiles and groups even at this size


def _shard(seed: int = 11, seq: int = SEQ, dtype="float32", **where) -> ShardSpec:
    return ShardSpec(seed=seed, seq=seq, dtype=dtype, **(SHAPE | where))


def _global(name: str, seq: int = SEQ, dtype="float32", seed: int = 11) -> torch.Tensor:
    return token_block(_shard(seed, seq, dtype), name, 0, seq)  # (B, H, S, D) float64


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_shards_reassemble_to_the_same_global_tensors_for_any_world(layout, dtype):
    want = [_global(name, dtype=dtype) for name in ("q", "k", "v", "dout")]
    for world in (1, 2, 3, 4):
        per_rank = [rank_shards(_shard(dtype=dtype, layout=layout, world=world, rank=rank)) for rank in range(world)]
        for index, expected in enumerate(want):
            shards = [tensors[index] for tensors in per_rank]
            assert shards[0].dtype == getattr(torch, dtype) and shards[0].shape == (2, 3, SEQ // world, 5)
            assert torch.equal(unshard(shards, layout).double(), expected), (world, index)
    # Values are exactly representable in the case dtype: widening to float64 and back changes nothing.
    assert torch.equal(want[0].to(getattr(torch, dtype)).double(), want[0])


def test_tokens_depend_on_seed_name_and_position_only():
    whole = _global("k", seq=SEQ)
    part = token_block(_shard(), "k", 250, 530)  # straddles two chunk edges
    assert torch.equal(part, whole[:, :, 250:530])
    assert not torch.equal(_global("q"), whole) and not torch.equal(_global("k", seed=12), whole)
    assert chunk_seed(1, "q", 0) == 8527110569793928754  # stable across processes and Python versions
    assert len({chunk_seed(1, n, c) for n in ("q", "k") for c in range(3)}) == 6


def test_bad_arguments_name_the_field():
    with pytest.raises(UsageError, match="dtype='int8'"):
        rank_shards(_shard(seed=0, seq=8, dtype="int8"))
    with pytest.raises(UsageError, match="rank=2"):
        rank_shards(_shard(seed=0, seq=8, world=2, rank=2))
    with pytest.raises(UsageError, match="lo, hi"):
        token_block(_shard(seed=0), "q", 5, 5)


def _textbook(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, S, S)
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("mask", ["causal", "none", "causal-naive"])
def test_streaming_reference_matches_full_float64_attention(mask):
    q, k, v, dout = (_global(name, dtype="bfloat16") for name in ("q", "k", "v", "dout"))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = reference_attention(q, k, v, mask="none" if mask == "none" else "causal")
    assert (out - _textbook(q, k, v, mask != "none")).abs().max() < 1e-13  # the oracle itself, independently
    grads = torch.autograd.grad(out, (q, k, v), dout)  # autograd: independent of the hand-derived backward
    for layout, world in (("contiguous", 3), ("zigzag", 2), ("striped", 3)):
        for rank in range(world):
            ref = rank_reference(_shard(dtype="bfloat16", layout=layout, world=world, rank=rank), mask, **SMALL)
            rows = token_positions(layout, SEQ, world, rank)
            for got, want in zip((ref.out, ref.dq, ref.dk, ref.dv), (out, *grads), strict=True):
                assert (got - want[:, :, rows]).abs().max().item() < 1e-12, (layout, world, rank)


def _ring_like(layout="zigzag", world=2, rank=1, mask="causal", seq=SEQ, **shape):
    """The exact answers in float32, as a perfect ring would return them."""
    shape = shape or SHAPE
    ref = rank_reference(ShardSpec(seed=5, seq=seq, dtype="float32", layout=layout, world=world, rank=rank, **shape),
                         mask, **SMALL)  # fmt: skip
    return ref.out.float(), [g.float() for g in (ref.dq, ref.dk, ref.dv)]


CASE = dict(shard=_shard(seed=5, layout="zigzag", world=2, rank=1), mask="causal", **SMALL)


def test_check_errors_measures_the_difference():
    out, grads = _ring_like()
    result = check_errors(out=out, grads=grads, **CASE)
    assert result.fwd_err < 1e-6 and result.bwd_err < 1e-6
    assert not result.sampled and result.grads == ("dq", "dk", "dv") and result.rows_checked == SEQ // 2
    grads[2][1, 2, 7, 3] += 0.25
    assert check_errors(out=out, grads=grads, **CASE).bwd_err == pytest.approx(0.25, abs=1e-6)
    assert math.isnan(check_errors(out=out, grads=None, **CASE).bwd_err)  # no backward: nothing to pass


@pytest.mark.parametrize("where", ["out", "dq", "dk", "dv"])
def test_nan_anywhere_makes_the_error_nan(where):
    out, grads = _ring_like()
    tensors = dict(zip(("out", "dq", "dk", "dv"), (out, *grads), strict=True))
    tensors[where][0, 1, 13, 2] = math.nan  # row 13: not in the 8-row sample of the tiny budget below
    for budget in (None, 1e-9):
        result = check_errors(out=tensors["out"], grads=[tensors[n] for n in ("dq", "dk", "dv")], budget_s=budget,
                              **CASE)  # fmt: skip
        assert math.isnan(result.fwd_err if where == "out" else result.bwd_err), (where, budget)


def test_budget_drops_dk_dv_then_samples_rows_and_says_so(monkeypatch):
    out, grads = _ring_like()
    monkeypatch.setattr(reference, "_unit_costs", lambda *args: (1e-3, 0.0))  # deterministic cost model
    full = check_errors(out=out, grads=grads, budget_s=1e9, **CASE)
    assert not full.sampled and full.estimated_s > 0
    units = reference.estimate_units(token_positions("zigzag", SEQ, 2, 1), seq=SEQ, causal=True, tile=64, group=128)
    rows_s = reference.SAFETY * 1e-3 * (units["fwd"] + units["dq"])
    no_kv = check_errors(out=out, grads=grads, budget_s=rows_s * 1.01, **CASE)
    assert no_kv.sampled and no_kv.grads == ("dq",) and no_kv.rows_checked == SEQ // 2
    assert "dk, dv not checked" in no_kv.note and no_kv.fwd_err < 1e-6 and no_kv.bwd_err < 1e-6
    tiny = check_errors(out=out, grads=grads, budget_s=1e-9, **CASE)
    assert tiny.sampled and tiny.rows_checked == reference.MIN_SAMPLE_ROWS and tiny.rows_total == SEQ // 2
    assert tiny.note.startswith(f"sampled: out, dq on 8 of {SEQ // 2} rows") and tiny.fwd_err < 1e-6
    out[0, 0, SEQ // 2 - 1, 0] += 0.5  # the last row is always in the sample
    assert check_errors(out=out, grads=grads, budget_s=1e-9, **CASE).fwd_err == pytest.approx(0.5, abs=1e-6)


class _TorchAllocations(TorchDispatchMode):
    """Live bytes of torch storages created while active (by storage, freed when no tensor object holds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.holders: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.current = self.peak = self.largest = 0

    def _release(self, key: int) -> None:
        self.holders[key] -= 1
        if self.holders[key] == 0:
            del self.holders[key]
            self.current -= self.sizes.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(result):
            if not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().data_ptr() == 0:
                continue
            key, size = tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes()
            if key not in self.holders:
                self.holders[key], self.sizes[key] = 0, size
                self.current += size
                self.peak, self.largest = max(self.peak, self.current), max(self.largest, size)
            self.holders[key] += 1
            weakref.finalize(tensor, self._release, key)
        return result


def test_reference_memory_is_o_of_rows_not_of_sequence():
    shape = dict(batch=1, heads=2, head_dim=16)
    peaks = {}
    for world, seq in ((2, 1024), (8, 4096)):  # the same 512 rows per rank, 4x the sequence
        out, grads = (torch.zeros(1, 2, 512, 16), [torch.zeros(1, 2, 512, 16)] * 3)
        with _TorchAllocations() as allocations:
            shard = ShardSpec(seed=1, seq=seq, dtype="float32", layout="striped", world=world, rank=world - 1, **shape)
            check_errors(out, grads, shard, "causal", **SMALL)
        peaks[seq] = allocations.peak
        # Nothing larger than one float64 tensor of the rank's rows, (B, H, S/N, D): no (S x D), no (S x S).
        assert allocations.largest <= 1 * 2 * 512 * 16 * 8, (seq, allocations.largest)
    assert peaks[4096] <= 1.1 * peaks[1024], peaks
