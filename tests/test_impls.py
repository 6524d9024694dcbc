"""Adapters: the registry, one-line refusals and skips, and every CPU adapter against float64 on 4 gloo ranks."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest
import torch

from ringbench.errors import UsageError
from ringbench.rank.impls import adapter_names, get_adapter
from ringbench.rank.impls.rank import run_impl_case
from ringbench.run.launch import launch_local
from ringbench.scenario.scenario import Case

SMALL = dict(world=4, seq=512, heads=2, head_dim=16, dtype="float64")


def _case(**axes) -> Case:
    """The scenario's case an adapter takes, with the axes these tests were written for."""
    defaults = dict(world=4, seq=4096, heads=4, head_dim=64, dtype="float32", mask="causal", layout="zigzag")
    return Case.from_axes(**(defaults | axes))


def test_registry_names_and_unknown_name():
    assert {"ringbench", "torch-ring", "torch-ring:alltoall", "torch-ring:allgather", "ring-attention-pytorch",
            "ring-flash-attn", "transformer-engine"} <= set(adapter_names())  # fmt: skip
    with pytest.raises(UsageError, match="impl='nope' is not known"):
        get_adapter("nope")


@pytest.mark.parametrize("name", ["ring-flash-attn", "transformer-engine"])
def test_cuda_only_peers_skip_in_one_line(name):
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine: these run there")
    with pytest.raises(UsageError) as info:
        get_adapter(name).check(_case(dtype="bfloat16"), "cpu")
    assert "\n" not in str(info.value) and "CUDA" in str(info.value)


def test_unsupported_workloads_are_refused_in_one_line():
    with pytest.raises(UsageError, match="layout='striped'"):
        get_adapter("torch-ring").check(_case(layout="striped"), "cpu")
    with pytest.raises(UsageError, match="order="):
        get_adapter("torch-ring").check(_case(order="reverse"), "cpu")


def test_torch_ring_on_cuda_takes_fp32_through_the_memory_efficient_op_and_refuses_fp64():
    from ringbench.rank.impls.torch_ring import cuda_op

    hopper = (9, 0)
    assert cuda_op(torch.float32, 64, hopper, flash_available=True) == "efficient"  # flash takes 16-bit only
    assert cuda_op(torch.bfloat16, 128, hopper, flash_available=True) == "flash"
    assert cuda_op(torch.float16, 128, hopper, flash_available=False) == "efficient"
    assert cuda_op(torch.float32, 64, hopper, flash_available=True, efficient_enabled=False) == "none"
    assert cuda_op(torch.float64, 64, hopper, flash_available=True) == "none"
    adapter = get_adapter("torch-ring")
    adapter.check(_case(dtype="float32"), "cuda")  # scenarios/implementations.yaml's case: runs on a GPU
    with pytest.raises(UsageError, match=r"dtype='float64' on CUDA") as info:
        adapter.check(_case(dtype="float64"), "cuda")
    assert "\n" not in str(info.value)
    adapter.check(_case(dtype="float64"), "cpu")


def test_ring_flash_attn_declares_what_upstream_runs():
    support = get_adapter("ring-flash-attn").support
    problems = support.problems(_case(mask="none", layout="zigzag", dtype="bfloat16"), "cuda")
    assert problems == ["layout='zigzag' with mask 'none' (supported: contiguous)"]  # upstream asserts causal
    assert support.problems(_case(mask="causal", layout="zigzag", dtype="bfloat16"), "cuda") == []
    assert "dtype='float16'" in support.problems(_case(dtype="float16"), "cuda")[0]  # dq rounded through bf16
    assert "bf16" in support.notes


def test_torch_ring_without_the_private_api_is_one_line(monkeypatch):
    from ringbench.rank.impls import torch_ring

    fake = types.ModuleType(torch_ring.MODULE)
    monkeypatch.setitem(sys.modules, torch_ring.MODULE, fake)
    with pytest.raises(UsageError) as info:
        get_adapter("torch-ring").check(_case(), "cpu")
    assert "lacks _templated_ring_attention" in str(info.value) and "\n" not in str(info.value)


def test_torch_ring_with_other_signatures_is_one_line_not_a_type_error(monkeypatch):
    """A torch whose private ring functions take other parameters (the names exist, the calls would fail with a
    TypeError inside the run) is refused up front; torch 2.11's and 2.13's signatures are the ones pinned."""
    from ringbench.rank.impls import torch_ring

    real = importlib.import_module(torch_ring.MODULE)
    fake = types.ModuleType(torch_ring.MODULE)
    for name in torch_ring.PINNED:
        setattr(fake, name, getattr(real, name))
    assert torch_ring._private()[1] is None  # this torch's signatures are the pinned ones

    def moved(group, op, query, key, value, *, seq_dim=2, **kwargs):  # seq_dim no longer second
        raise AssertionError("never called")

    fake._templated_ring_attention = moved
    monkeypatch.setitem(sys.modules, torch_ring.MODULE, fake)
    with pytest.raises(UsageError) as info:
        get_adapter("torch-ring").check(_case(), "cpu")
    message = str(info.value)
    assert "lacks the signatures ringbench calls" in message and "_templated_ring_attention(group, op" in message
    assert "\n" not in message


def user_ring(q, k, v, *, mask, layout, group):
    """A user's implementation (module:function): ringbench's engine under another name."""
    from ringbench.engine.api import ring_attention

    return ring_attention(q, k, v, mask=mask, layout=layout, group=group)


user_ring.ringbench_layouts = ("zigzag",)


def _errors(worker_ctx, impl, workload):
    result = run_impl_case(impl, workload, rank=worker_ctx.env.rank, world=worker_ctx.env.world, iters=1, warmup=0)
    return result["fwd_err"], result["bwd_err"], len(result["rows"])


CASES = [
    ("ringbench", _case(mask="causal", layout="striped", buffer="sync", order="reverse", **SMALL)),
    ("torch-ring:alltoall", _case(mask="causal", layout="zigzag", **SMALL)),
    ("torch-ring:allgather", _case(mask="causal", layout="contiguous", **SMALL)),
    ("torch-ring", _case(mask="none", layout="contiguous", **SMALL)),
    ("test_impls:user_ring", _case(mask="causal", layout="zigzag", **SMALL)),
]


@pytest.mark.slow
@pytest.mark.parametrize(("impl", "workload"), CASES, ids=[c[0] for c in CASES])
def test_adapters_match_float64(impl, workload):
    results = launch_local(4, _errors, (impl, workload), timeout_s=120)
    for fwd, bwd, rows in results:
        assert fwd < 1e-5 and bwd < 1e-5 and rows == 2, results  # fp64 inputs, fp32 merges inside torch's ring


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ring_attention_pytorch") is None, reason="ring-attention-pytorch absent")
def test_ring_attention_pytorch_forward_matches_float64():
    workload = _case(mask="causal", layout="striped", **(SMALL | {"dtype": "float32"}))  # fp32 only
    results = launch_local(4, _errors, ("ring-attention-pytorch", workload), timeout_s=120)
    assert max(fwd for fwd, _, _ in results) < 1e-5, results


def test_user_adapter_refuses_layouts_it_does_not_declare():
    with pytest.raises(UsageError, match="layout='striped'"):
        get_adapter("test_impls:user_ring").check(_case(layout="striped"), "cpu")


def _torch_ring_errors(worker_ctx, workload):
    result = run_impl_case("torch-ring", workload, rank=0, world=1, device=worker_ctx.env.device, iters=1, warmup=1)
    return result["fwd_err"], result["bwd_err"]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_ring_runs_fp32_and_bf16_on_cuda(dtype):
    """The adapter at world 1 on a GPU (a 1-rank NCCL group): fp32 through the memory-efficient op, bf16 flash."""
    from ringbench.vocab import TOLERANCE

    workload = _case(world=1, seq=1024, heads=8, head_dim=128, dtype=dtype, mask="causal", layout="zigzag")
    ((fwd, bwd),) = launch_local(1, _torch_ring_errors, (workload,), timeout_s=120, device="cuda")
    fwd_tol, bwd_tol = TOLERANCE[dtype]
    assert fwd <= fwd_tol and bwd <= bwd_tol, (fwd, bwd)
