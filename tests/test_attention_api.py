"""The one public call, ``ringbench.attention(q, k, v, spec=...)``: every strategy through one builder, exact against
float64; ``ring_attention`` as its ring alias with the first API's keywords; specs that name their bad field."""

import pytest
import torch

import ringbench
from ringbench import AttentionSpec, Runtime, attention, build_context, reference_attention, ring_attention
from ringbench.engine.api import close_context
from ringbench.engine.ring import RingContext
from ringbench.engine.strategy import StrategyContext
from ringbench.run.launch import launch_local

STRATEGIES = ("ring", "allgather", "ulysses", "hybrid:2", "double-ring:2")


def _global(seed: int = 7, heads: int = 4):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, heads, 16, 8, generator=generator, dtype=torch.float64) for _ in range(4)]


def _every_strategy(worker_ctx, strategies):
    """This rank's output and gradient errors against float64 attention, for each strategy through ``attention``."""
    world, rank = worker_ctx.env.world, worker_ctx.env.rank
    q, k, v, dout = _global()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    want = reference_attention(*leaves, mask="causal")
    want_grads = torch.autograd.grad(want, leaves, dout)
    errors = {}
    for strategy in strategies:
        spec = AttentionSpec(mask="causal", layout="zigzag", strategy=strategy)
        local = [ringbench.shard(t, "zigzag", world, rank).requires_grad_() for t in (q, k, v)]
        out = attention(*local, spec=spec)
        grads = torch.autograd.grad(out, local, ringbench.shard(dout, "zigzag", world, rank))
        fwd = (out - ringbench.shard(want.detach(), "zigzag", world, rank)).abs().max().item()
        bwd = max((g - ringbench.shard(w, "zigzag", world, rank)).abs().max().item()
                  for g, w in zip(grads, want_grads, strict=True))  # fmt: skip
        errors[strategy] = (fwd, bwd)
    return errors


def test_attention_runs_every_strategy_exactly_on_two_ranks():
    for errors in launch_local(2, _every_strategy, (STRATEGIES,), timeout_s=60):
        assert set(errors) == set(STRATEGIES)
        for strategy, (fwd, bwd) in errors.items():
            assert fwd < 1e-12 and bwd < 1e-12, (strategy, fwd, bwd)  # float64 inputs: float64 rounding only


@pytest.mark.parametrize("strategy", ["ulysses", "hybrid:1", "double-ring:1"])
def test_one_builder_gives_each_strategy_its_context(strategy):
    q, k, v, _ = _global()
    ring = build_context(q, k, v, AttentionSpec(buffer="allgather"))
    grouped = build_context(q, k, v, AttentionSpec(strategy=strategy), Runtime(timeout_s=5.0))
    assert isinstance(ring, RingContext) and isinstance(grouped, StrategyContext)
    assert grouped.timeout_s == 5.0 and torch.allclose(attention(q, k, v, context=grouped), attention(q, k, v))
    for ctx in (ring, grouped):
        close_context(ctx)


def test_ring_attention_keeps_the_first_apis_keywords():
    q, k, v, _ = _global()
    out, lse = ring_attention(q, k, v, mask="causal", layout="zigzag", buffer="sync", order="identity", group=None,
                              kernel="torch", scale=None, timeout_s=30.0, recorder=None, docs="none",
                              return_lse=True)  # fmt: skip
    assert torch.allclose(out, reference_attention(q, k, v, mask="causal")) and lse.shape == (1, 4, 16)
    with pytest.raises(TypeError, match="unexpected keyword argument 'strategy'"):
        ring_attention(q, k, v, strategy="ulysses")  # every strategy: ringbench.attention


@pytest.mark.parametrize(("fields", "named"), [
    (dict(strategy="hybrid"), "strategy='hybrid'"),
    (dict(buffer="triple"), "buffer='triple'"),
    (dict(layer=-1), "layer=-1"),
])  # fmt: skip
def test_a_bad_spec_names_its_field_in_one_line(fields, named):
    with pytest.raises(ValueError) as caught:
        AttentionSpec(**fields)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_the_spec_is_one_computation_and_the_runtime_its_machinery():
    assert AttentionSpec(strategy="allgather").buffer == "allgather"
    assert AttentionSpec(order=[0, 1]).order == (0, 1)  # ranks as given, kept immutable
    assert AttentionSpec(strategy="hybrid:2").grouped and not AttentionSpec(buffer="allgather").grouped
    assert {"AttentionSpec", "Runtime", "attention", "ring_attention"} <= set(ringbench.__all__)
