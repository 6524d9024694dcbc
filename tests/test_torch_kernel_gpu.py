"""The block kernels on CUDA in 16-bit with several heads: the ``torch`` kernel per mask kind and backend against a
float64 reference, forward and backward; ``torch`` and ``triton`` inside a 1-rank ring against float64 attention;
and no host synchronisation inside a kernel call. Every test here is marked ``gpu`` (skipped without CUDA).

Tolerances: |got - want| <= TOL * (1 + |want|) per element. Emulating the kernels' rounding points on these shapes
(fp32 scores; P and dS rounded to 16 bits before their matmuls; out, dq, dk, dv rounded at the end; the final out
handed to the backward in 16 bits) needs at most 6e-3 in bf16 and 8e-4 in fp16; TOL leaves four times that.
A layout or statistics error shows up as errors of order 0.1 to 1.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from ringbench.engine.api import reference_attention, ring_attention
from ringbench.engine.layout import shard
from ringbench.kernels import BlockMask, MaskKind, get_kernel
from ringbench.kernels.torch_sdpa import MathKernel, TorchSdpaKernel

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16]
TOL = {torch.bfloat16: 2.5e-2, torch.float16: 3e-3}
LSE_TOL = 2e-4  # fp32 statistics from exactly representable inputs
SHAPES = [  # (B, H, Lq, Lk, D)
    (2, 4, 128, 128, 64),
    (2, 4, 128, 128, 128),
    (2, 4, 96, 96, 64),
    (2, 4, 130, 130, 64),
    (2, 4, 96, 130, 64),  # not square: FULL and PARTIAL only
]
MASKS = ["full", "causal", "partial-random", "partial-strict"]


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def make_mask(name: str, q_len: int, k_len: int) -> BlockMask:
    if name == "full":
        return BlockMask(MaskKind.FULL)
    if name == "causal":
        return BlockMask(MaskKind.CAUSAL)
    if name == "partial-strict":  # the striped layout's d = -1 block: row 0 sees nothing
        allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(-1)
    else:
        allowed = torch.rand(q_len, k_len, generator=torch.Generator().manual_seed(q_len * 1000 + k_len)) < 0.5
        allowed[q_len // 3] = False  # an empty row in the middle
    return BlockMask.partial(allowed)


def make_inputs(batch, heads, q_len, k_len, head_dim, dtype, seed=0):
    """q, k, v, dout on CUDA in ``dtype``, and their float64 CPU copies (the same, exactly representable values)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = ((q_len, head_dim), (k_len, head_dim), (k_len, head_dim), (q_len, head_dim))
    host = [torch.randn(batch, heads, *shape, generator=generator).to(dtype) for shape in shapes]
    return [t.cuda() for t in host], [t.double() for t in host]


@contextlib.contextmanager
def sdpa_backend(name: str):
    """'default': whatever the kernel picks (flash for FULL and CAUSAL 16-bit blocks); 'efficient': flash off."""
    if name == "default":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        yield


def flash_expected() -> bool:
    return torch.backends.cuda.is_flash_attention_available() and torch.cuda.get_device_capability() >= (8, 0)


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    torch.testing.assert_close(got.double().cpu(), want, atol=tol, rtol=tol, msg=lambda m: f"{what}: {m}")


def test_flash_attention_is_available():
    """On sm80+ the FULL/CAUSAL 16-bit blocks must take the flash path, or the other tests check only the fallback."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("flash attention needs sm80 or newer")
    assert torch.backends.cuda.is_flash_attention_available()
    assert torch.backends.cuda.flash_sdp_enabled()


@pytest.mark.parametrize("backend", ["default", "efficient"])
@pytest.mark.parametrize("mask_name", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
def test_torch_kernel_16bit_multihead(dtype, shape, mask_name, backend):
    _, _, q_len, k_len, head_dim = shape
    if mask_name == "causal" and q_len != k_len:
        pytest.skip("CAUSAL blocks are square")
    mask = make_mask(mask_name, q_len, k_len)
    (q, k, v, dout), (q64, k64, v64, dout64) = make_inputs(*shape, dtype)
    scale = head_dim**-0.5
    kernel, reference = TorchSdpaKernel(), MathKernel()
    ref_out, ref_lse = reference.forward(q64, k64, v64, mask, scale)  # float64, CPU
    ref_grads = reference.backward(dout64, q64, k64, v64, ref_out, ref_lse, mask, scale)
    with sdpa_backend(backend):
        flash = backend == "default" and mask.kind is not MaskKind.PARTIAL and flash_expected()
        assert kernel.route(q, k, mask) == ("flash" if flash else "efficient")
        out, lse = kernel.forward(q, k, v, mask, scale)
        # The ring hands the backward the final out in q's dtype and the fp32 lse.
        grads = kernel.backward(dout, q, k, v, ref_out.to(dtype).cuda(), ref_lse.float().cuda(), mask, scale)
    tol = TOL[dtype]
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32 and lse.shape == q.shape[:-1]
    assert torch.equal(torch.isneginf(lse).cpu(), torch.isneginf(ref_lse)), "rows with no visible key: lse = -inf"
    torch.testing.assert_close(lse.double().cpu(), ref_lse, atol=LSE_TOL, rtol=0.0)
    assert_close(out, ref_out, tol, "out")
    for name, grad, ref_grad, source in zip(("dq", "dk", "dv"), grads, ref_grads, (q, k, v), strict=True):
        assert grad.dtype == dtype and grad.shape == source.shape, name
        assert torch.isfinite(grad).all(), name
        assert_close(grad, ref_grad, tol, name)
    if mask.empty_rows is not None:
        rows = mask.empty_rows.cuda()
        assert not out[:, :, rows].any() and not grads[0][:, :, rows].any()  # the merge's identity, no gradient


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("seq", [128, 130])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("mask", ["none", "causal", "causal-naive"])
def test_one_rank_ring_16bit(mask, layout, seq, dtype, kernel):
    """A 1-rank ring on CUDA (zigzag: FULL + CAUSAL sub-blocks on row slices; causal-naive: a PARTIAL block)."""
    if kernel == "triton":
        pytest.importorskip("triton")
    batch, heads, head_dim = 2, 4, 64
    (q, k, v, grad), (q64, k64, v64, grad64) = make_inputs(batch, heads, seq, seq, head_dim, dtype, seed=11)
    q_ref, k_ref, v_ref = (t.cuda().requires_grad_() for t in (q64, k64, v64))
    ref = reference_attention(q_ref, k_ref, v_ref, mask="none" if mask == "none" else "causal")  # float64
    ref_grads = torch.autograd.grad(ref, (q_ref, k_ref, v_ref), grad64.cuda())

    def local(t: torch.Tensor) -> torch.Tensor:
        return shard(t, layout, 1, 0)

    q_l, k_l, v_l = (local(t).requires_grad_() for t in (q, k, v))
    out = ring_attention(q_l, k_l, v_l, mask=mask, layout=layout, buffer="double", group=None, kernel=kernel)
    grads = torch.autograd.grad(out, (q_l, k_l, v_l), local(grad))
    tol = TOL[dtype]
    assert out.dtype == dtype
    assert_close(out, local(ref.detach()).cpu(), tol, "out")
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        assert got.dtype == dtype, name
        assert_close(got, local(want).cpu(), tol, name)


@pytest.mark.parametrize("kernel_name", ["torch", "triton"])
def test_kernel_calls_do_not_synchronise(kernel_name):
    """sync debug mode 'error' raises on any host-GPU synchronisation (.item(), pageable copies, ...). The masks'
    device copies are built inside the checked calls too: only the one-off compilation runs outside."""
    if kernel_name == "triton":
        pytest.importorskip("triton")
    (q, k, v, dout), _ = make_inputs(2, 4, 128, 128, 64, torch.bfloat16)
    masks = [make_mask(name, 128, 128) for name in MASKS]
    for mask in masks:  # compile (Triton) and initialise the libraries with another instance: its cache is unused
        warm = get_kernel(kernel_name)
        out, lse = warm.forward(q, k, v, mask, 0.125)
        warm.backward(dout, q, k, v, out, lse, mask, 0.125)
    kernel = get_kernel(kernel_name)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):  # first pass builds the cached mask tensors, the second reuses them
            for mask in masks:
                out, lse = kernel.forward(q, k, v, mask, 0.125)
                kernel.backward(dout, q, k, v, out, lse, mask, 0.125)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
