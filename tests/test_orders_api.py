"""Orderings and the public API's argument checking."""

import pytest
import torch

from ringbench import parse_order, ring_attention
from ringbench.errors import UsageError
from ringbench.run.launch import launch_local


@pytest.mark.parametrize(
    ("spec", "world", "ring"),
    [
        ("identity", 4, [0, 1, 2, 3]),
        ("reverse", 4, [0, 3, 2, 1]),
        ("stride:2", 8, [0, 2, 4, 6, 1, 3, 5, 7]),
        ("stride:3", 5, [0, 3, 1, 4, 2]),
        ("0-3-1-2", 4, [0, 3, 1, 2]),
    ],
)
def test_order_specs(spec, world, ring):
    assert parse_order(spec, world) == ring


def test_random_order_is_a_seeded_permutation():
    ring = parse_order("random:5", 8)
    assert sorted(ring) == list(range(8)) and ring == parse_order("random:5", 8)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0-1-1-2", "not a permutation"),
        ("0-1-2", "not a permutation"),
        ("spiral", "identity, reverse, random:SEED, stride:K"),
        ("stride:0", "stride:K with an integer K >= 1"),
        ("random:x", "random:SEED"),
    ],
)
def test_bad_orders(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_order(spec, 4)


def _qkv(shape=(1, 2, 8, 8), dtype=torch.float32):
    return [torch.randn(shape, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mask": "sliding"}, "mask='sliding' is not allowed; expected one of: none, causal, causal-naive"),
        ({"layout": "ring"}, "layout='ring' is not allowed; expected one of: contiguous, zigzag, striped"),
        ({"buffer": "triple"}, "buffer='triple' is not allowed; expected one of: sync, double, allgather"),
        ({"order": "1-0-2"}, "order='1-0-2' is not a permutation of ranks 0..0"),
        ({"kernel": "cudnn"}, "kernel='cudnn' is not allowed"),
        ({"kernel": "emulated:-3"}, "expected emulated:GFLOPS with a finite number GFLOPS > 0"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ring_attention(q, k, v, **kwargs)


def test_bad_shapes_and_dtypes():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k.shape=\(1, 2, 4, 8\) is not allowed"):
        ring_attention(q, k[:, :, :4], v[:, :, :4])
    with pytest.raises(ValueError, match=r"v.shape=.* is not allowed"):
        ring_attention(q, k, v[:, :1])
    with pytest.raises(ValueError, match=r"k.dtype/v.dtype=.* is not allowed"):
        ring_attention(q, k.double(), v.double())
    with pytest.raises(ValueError, match=r"q.shape=\(2, 8, 8\) is not allowed; expected a 4-D tensor"):
        ring_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="zigzag"):
        ring_attention(*_qkv((1, 1, 3, 4)), layout="zigzag")  # S=3 on 1 rank needs a multiple of 2
    with pytest.raises(ValueError, match="not initialized"):
        ring_attention(q, k, v, group=object())


def _orders_worker(ctx, orders):
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    return {
        order: ring_attention(q, k, v, mask="causal", layout="zigzag", buffer="double", order=order) for order in orders
    }


def test_every_ordering_gives_the_same_output():
    # Same local tensors on every rank (their roles differ by ring position only): outputs agree to float64
    # rounding, merged in a different order.
    orders = ["identity", "reverse", "stride:2", "random:11", "0-2-1-3"]
    per_rank = launch_local(4, _orders_worker, (orders,), timeout_s=30)
    for outputs in per_rank:
        for order in orders[1:]:
            torch.testing.assert_close(outputs[order], outputs["identity"], rtol=0, atol=1e-14)


def test_a_stride_that_is_identity_or_reverse_is_refused_naming_the_allowed_strides():
    with pytest.raises(UsageError, match=r"order='stride:4' is not allowed on 4 ranks: it is the identity ring; "
                                         r"expected K in 2, 3"):  # fmt: skip
        parse_order("stride:4", 4)
    with pytest.raises(UsageError, match=r"stride:2' is not allowed on 3 ranks: it is the reverse ring"):
        parse_order("stride:2", 3)


def test_world_below_one_is_a_usage_error():
    with pytest.raises(UsageError, match="world=0"):
        launch_local(0, _orders_worker, ([],))
