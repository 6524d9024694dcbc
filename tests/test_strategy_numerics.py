"""What the strategies pay for and round, on one rank: the backward prepares ``out`` and ``dout`` once per call (as
the ring does), partial results stay in fp32 between rotations, and a ring without hops holds no rotation buffers."""

import pytest
import torch

from ringbench.engine.api import attention, build_context
from ringbench.engine.ring import _Rotation, ring_backward, ring_forward
from ringbench.engine.spec import AttentionSpec
from ringbench.kernels.torch_sdpa import TorchSdpaKernel


class CountingKernel(TorchSdpaKernel):
    """The torch kernel, counting ``prepare_backward`` calls and the storage each block's dout came from."""

    def __init__(self) -> None:
        super().__init__()
        self.prepared = 0
        self.prepared_ptrs: set[int] = set()
        self.block_ptrs: set[int] = set()

    def prepare_backward(self, dout, out):
        self.prepared += 1
        dout, out = super().prepare_backward(dout, out)
        self.prepared_ptrs.add(dout.untyped_storage().data_ptr())
        return dout, out

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        self.block_ptrs.add(dout.untyped_storage().data_ptr())
        return super().backward(dout, q, k, v, out, lse, mask, scale)


@pytest.mark.parametrize("strategy", ["ulysses", "hybrid:1", "double-ring:1"])
def test_a_strategys_backward_prepares_out_and_dout_once_per_call(strategy):
    kernel = CountingKernel()
    q, k, v = (torch.randn(1, 2, 32, 8, requires_grad=True) for _ in range(3))
    ctx = build_context(q, k, v, AttentionSpec(strategy=strategy, mask="causal-naive", kernel=kernel))
    out = attention(q, k, v, context=ctx)
    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert kernel.prepared == 1
    assert kernel.block_ptrs and kernel.block_ptrs <= kernel.prepared_ptrs  # every block read the prepared dout


def test_partial_results_can_stay_in_the_statistics_dtype():
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.bfloat16) for _ in range(3))
    ctx = build_context(q, k, v, AttentionSpec(mask="causal"))
    out, lse = ring_forward(q, k, v, ctx, keep_acc=True)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert ring_forward(q, k, v, ctx)[0].dtype == torch.bfloat16
    dout = torch.randn_like(q)
    grads = ring_backward(dout, q, k, v, out.to(q.dtype), lse, ctx, keep_acc=True)
    assert all(g.dtype == torch.float32 for g in grads)


def test_a_ring_without_hops_keeps_its_own_block_and_no_receive_buffer():
    k, v = torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)
    lone = _Rotation(k, v, hops=0)
    assert lone.in_hand[0] is k and lone.in_hand[1] is v and lone.spare is None  # no stacked copy, no spare
    travelling = _Rotation(k, v, hops=1)
    assert travelling.in_hand.shape == (2, 1, 2, 16, 8) and travelling.spare is None  # made at the first post


class CompilingKernel(CountingKernel):
    """A kernel that says it compiles (as Triton's does); counts its calls."""

    compiles = True

    def __init__(self) -> None:
        super().__init__()
        self.forwards = 0

    def forward(self, q, k, v, mask, scale):
        self.forwards += 1
        return super().forward(q, k, v, mask, scale)


@pytest.mark.parametrize(("strategy", "mask"), [("ring", "causal-document"), ("ulysses", "window:8"),
                                                ("double-ring:1", "causal")])  # fmt: skip
def test_a_jit_kernel_runs_each_block_variant_once_before_timing(strategy, mask):
    from ringbench.engine.warm import compiles, warm
    from ringbench.kernels.emulated import EmulatedKernel

    kernel = CompilingKernel()
    q, k, v = (torch.randn(1, 2, 32, 8) for _ in range(3))
    ctx = build_context(q, k, v, AttentionSpec(strategy=strategy, mask=mask, docs="lengths:20,12", kernel=kernel))
    ran = warm(ctx, q)
    assert ran >= 1 and kernel.forwards == ran and compiles(kernel)
    assert not compiles(EmulatedKernel(10.0)) and warm(build_context(q, k, v), q) == 0  # torch's: nothing to do
