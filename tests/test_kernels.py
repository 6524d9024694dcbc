"""Block kernels against the `math` kernel: every mask kind, forward and backward, per dtype; and the registry."""

import time

import pytest
import torch

from ringbench.errors import UsageError
from ringbench.kernels import BlockMask, MaskKind, available_kernels, get_kernel
from ringbench.kernels.torch_sdpa import MathKernel

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 3e-2}


def _masks(q_len, k_len):
    strict = torch.ones(q_len, k_len, dtype=torch.bool).tril(-1)  # row 0 sees nothing
    random = torch.rand(q_len, k_len, generator=torch.Generator().manual_seed(0)) > 0.4
    return {
        "full": BlockMask(MaskKind.FULL),
        "causal": BlockMask(MaskKind.CAUSAL),
        "partial-strict": BlockMask.partial(strict),
        "partial-random": BlockMask.partial(random),
    }


def _compare(kernel, device, dtype):
    generator = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(2, 3, 12, 16, generator=generator).to(device, dtype) for _ in range(4))
    reference = MathKernel()
    for name, mask in _masks(12, 12).items():
        out, lse = kernel.forward(q, k, v, mask, 0.25)
        ref_out, ref_lse = reference.forward(q, k, v, mask, 0.25)
        tol = TOLERANCE[dtype]
        assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), name
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), name  # empty rows: lse = -inf
        assert (lse[finite] - ref_lse[finite]).abs().max() <= tol, name
        assert (out.double() - ref_out.double()).abs().max() <= tol, name
        grads = kernel.backward(dout, q, k, v, ref_out, ref_lse, mask, 0.25)
        ref_grads = reference.backward(dout, q, k, v, ref_out, ref_lse, mask, 0.25)
        for got, want in zip(grads, ref_grads, strict=True):
            assert (got.double() - want.double()).abs().max() <= 4 * tol, name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_torch_kernel_matches_math_on_cpu(dtype):
    _compare(get_kernel("torch"), "cpu", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_torch_kernel_matches_math_on_cuda(dtype):
    _compare(get_kernel("torch"), "cuda", dtype)


def test_emulated_kernel_is_exact_and_takes_the_modelled_time():
    kernel = get_kernel("emulated:1")  # 1 GFLOP/s
    q, k, v = (torch.randn(1, 2, 64, 32) for _ in range(3))
    mask = BlockMask(MaskKind.FULL)

    start = time.perf_counter()
    out, _ = kernel.forward(q, k, v, mask, 0.2)
    elapsed = time.perf_counter() - start
    modelled = 4 * 2 * 64 * 64 * 32 / 1e9  # 4 B H Lq Lk D FLOPs at 1 GFLOP/s
    assert elapsed >= modelled
    ref_out, _ = MathKernel().forward(q, k, v, mask, 0.2)
    assert (out - ref_out).abs().max() < 1e-5
    assert kernel.emulated and not get_kernel("torch").emulated


def test_registry_lists_the_kernels_and_rejects_unknown_ones():
    assert {"torch", "math", "triton", "emulated"} <= set(available_kernels())
    with pytest.raises(UsageError, match="kernel='flash9' is not allowed"):
        get_kernel("flash9")
    with pytest.raises(UsageError, match="kernel='torch:fast' is not allowed"):
        get_kernel("torch:fast")
