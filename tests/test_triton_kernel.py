"""The ``triton`` block kernel against the ``math`` reference: forward, backward, masks, tails, strides, the ring.

On the CPU the kernels run under the Triton interpreter. TRITON_INTERPRET is read when a kernel is decorated, i.e.
when ringbench.kernels.triton_attn is first imported, so it is set here before that import (only without CUDA:
with a GPU the ``gpu`` class must exercise the compiled kernels). Tiles are capped at 16 rows in most CPU cases so
that lengths of 24 and 40 span several tiles and end in a partial one.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from support.selfcheck import CheckCase, check_case

from ringbench.kernels import get_kernel, triton_attn
from ringbench.kernels.base import BlockMask, MaskKind, PositionMask, stats_dtype
from ringbench.kernels.torch_sdpa import MathKernel
from ringbench.kernels.triton_attn import TritonKernel
from ringbench.vocab import TOLERANCE

# A Triton whose CPU interpreter cannot run the kernels here (Triton 3.6 with NumPy 2.4): the kernel refuses in one
# line (test_kernels.py checks that); nothing below could run.
pytestmark = pytest.mark.skipif(bool(triton_attn.interpreter_problem()), reason=str(triton_attn.interpreter_problem()))

# (atol, rtol) against the math kernel run on the same inputs, for out and for dq/dk/dv. 16-bit outputs differ by
# the rounding of the final cast (one ulp of values of order 1) plus the 16-bit P and dS fed to the dots.
TOLERANCES = {
    torch.float64: ((1e-12, 1e-12), (1e-12, 1e-12)),
    torch.float32: ((5e-6, 1e-5), (1e-5, 1e-5)),
    torch.float16: ((2e-3, 2e-3), (4e-3, 4e-3)),
    torch.bfloat16: ((1.6e-2, 1.6e-2), (3.2e-2, 1.6e-2)),
}
LSE_TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6}  # by statistics dtype

# (name, Lq, Lk, D): lengths off the tile sizes on purpose; CAUSAL blocks are square.
CASES = [
    ("full", 16, 16, 16),
    ("full", 24, 40, 32),
    ("full", 40, 24, 16),
    ("causal", 16, 16, 32),
    ("causal", 24, 24, 16),
    ("causal", 40, 40, 32),
    ("strict-lower", 24, 24, 16),  # the striped layout's d = -1 block: row 0 sees nothing
    ("random", 24, 40, 32),
    ("random", 40, 24, 16),
]
# PARTIAL masks given by a positional rule (documents, causal, a window), evaluated tile by tile.
RULE_CASES = [("rule-documents", 40, 24, 16), ("rule-window", 24, 40, 32), ("rule-full-document", 24, 40, 16)]


def rule_mask(q_len: int, k_len: int, *, causal=True, window=0, docs=True, q_start=20, doc_len=7) -> BlockMask:
    """A PARTIAL mask by its positional rule: keys at 0.., queries from ``q_start``, documents of ``doc_len``."""
    q_pos, k_pos = torch.arange(q_len) + q_start, torch.arange(k_len)
    rule = PositionMask(q_pos=q_pos, k_pos=k_pos, q_doc=q_pos // doc_len if docs else None,
                        k_doc=k_pos // doc_len if docs else None, causal=causal, window=window)  # fmt: skip
    return BlockMask.from_rule(rule, rule.allowed().sum(dim=1))


def make_mask(name: str, q_len: int, k_len: int, generator: torch.Generator) -> BlockMask:
    if name == "rule-documents":
        return rule_mask(q_len, k_len, window=9)
    if name == "rule-window":
        return rule_mask(q_len, k_len, window=11, docs=False, q_start=10)
    if name == "rule-full-document":
        return rule_mask(q_len, k_len, causal=False, doc_len=13)
    if name == "full":
        return BlockMask(MaskKind.FULL)
    if name == "causal":
        return BlockMask(MaskKind.CAUSAL)
    if name == "strict-lower":
        allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(-1)
    elif name == "random":
        allowed = torch.rand(q_len, k_len, generator=generator) < 0.4
        allowed[q_len // 2] = False  # one empty row in the middle of a tile
    else:
        allowed = torch.zeros(q_len, k_len, dtype=torch.bool)
    empty = ~allowed.any(dim=1)
    return BlockMask(MaskKind.PARTIAL, allowed=allowed, empty_rows=empty if bool(empty.any()) else None)


def make_inputs(q_len, k_len, head_dim, dtype, device="cpu", seed=0, batch=1, heads=2):
    generator = torch.Generator().manual_seed(seed)

    def randn(length):
        return torch.randn(batch, heads, length, head_dim, generator=generator).to(dtype).to(device)

    return randn(q_len), randn(k_len), randn(k_len), randn(q_len)  # q, k, v, dout


def compare(q, k, v, dout, mask: BlockMask, kernel: TritonKernel) -> dict[str, float]:
    """Assert the triton kernel matches the math kernel; return the max abs errors (out, lse, dq, dk, dv)."""
    scale = q.shape[-1] ** -0.5
    reference = MathKernel()
    out, lse = kernel.forward(q, k, v, mask, scale)
    ref_out, ref_lse = reference.forward(q, k, v, mask, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == stats_dtype(q.dtype) and lse.shape == q.shape[:-1]
    (out_atol, out_rtol), (grad_atol, grad_rtol) = TOLERANCES[q.dtype]
    lse_tol = LSE_TOLERANCE[lse.dtype]
    torch.testing.assert_close(out, ref_out, atol=out_atol, rtol=out_rtol)
    torch.testing.assert_close(lse, ref_lse, atol=lse_tol, rtol=lse_tol)  # -inf rows must match exactly

    # Backward against the reference's (out, lse), as the ring passes the final merged ones.
    grads = kernel.backward(dout, q, k, v, ref_out, ref_lse, mask, scale)
    ref_grads = reference.backward(dout, q, k, v, ref_out, ref_lse, mask, scale)
    errors = {"out": (out - ref_out).abs().max().item()}
    finite = torch.isfinite(ref_lse)
    errors["lse"] = (lse - ref_lse)[finite].abs().max().item() if bool(finite.any()) else 0.0
    for label, grad, ref_grad, source in zip(("dq", "dk", "dv"), grads, ref_grads, (q, k, v), strict=True):
        assert grad.dtype == source.dtype and grad.shape == source.shape
        torch.testing.assert_close(grad, ref_grad, atol=grad_atol, rtol=grad_rtol, msg=lambda m, x=label: f"{x}: {m}")
        errors[label] = (grad - ref_grad).abs().max().item()
    return errors


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(triton_attn, "MAX_BLOCK", 16)


CPU_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(("name", "q_len", "k_len", "head_dim"), CASES, ids=lambda x: str(x))
def test_matches_math_kernel(small_tiles, name, q_len, k_len, head_dim, dtype):
    generator = torch.Generator().manual_seed(q_len * 100 + k_len)
    mask = make_mask(name, q_len, k_len, generator)
    compare(*make_inputs(q_len, k_len, head_dim, dtype), mask, TritonKernel())


@pytest.mark.parametrize(("name", "q_len", "k_len", "head_dim"), RULE_CASES, ids=lambda x: str(x))
def test_rule_masks_match_math_kernel(small_tiles, name, q_len, k_len, head_dim):
    mask = make_mask(name, q_len, k_len, torch.Generator())
    compare(*make_inputs(q_len, k_len, head_dim, torch.float32), mask, TritonKernel())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(("name", "q_len", "k_len", "head_dim"), RULE_CASES, ids=lambda x: str(x))
def test_rule_masks_match_math_kernel_in_every_dtype(small_tiles, name, q_len, k_len, head_dim, dtype):
    mask = make_mask(name, q_len, k_len, torch.Generator())
    compare(*make_inputs(q_len, k_len, head_dim, dtype), mask, TritonKernel())


@pytest.mark.parametrize("name", ["full", "causal", "random"])
def test_single_tile_default_blocks(name):
    """The default tile cap (64): each length fits in one tile, partly filled."""
    mask = make_mask(name, 40, 40, torch.Generator().manual_seed(1))
    compare(*make_inputs(40, 40, 32, torch.float32, seed=1), mask, TritonKernel())


def test_empty_rows_give_merge_identity(small_tiles):
    """Rows with no visible key: out 0, lse -inf, and no gradient flows through them."""
    q, k, v, dout = make_inputs(24, 24, 16, torch.float32)
    mask = make_mask("strict-lower", 24, 24, torch.Generator())
    kernel = TritonKernel()
    out, lse = kernel.forward(q, k, v, mask, 0.25)
    assert torch.equal(lse[..., 0], torch.full_like(lse[..., 0], float("-inf")))
    assert torch.isfinite(lse[..., 1:]).all()
    assert torch.equal(out[..., 0, :], torch.zeros_like(out[..., 0, :]))
    dq, dk, dv = kernel.backward(dout, q, k, v, out, lse, mask, 0.25)
    assert torch.equal(dq[..., 0, :], torch.zeros_like(dq[..., 0, :]))
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv))

    hidden = make_mask("hidden", 16, 24, torch.Generator())  # nothing visible at all
    out, lse = kernel.forward(q[..., :16, :], k, v, hidden, 0.25)
    assert torch.isneginf(lse).all() and not out.any()
    grads = kernel.backward(dout[..., :16, :], q[..., :16, :], k, v, out, lse, hidden, 0.25)
    assert not any(g.any() for g in grads)


def test_fully_masked_tiles_are_skipped(small_tiles):
    """Keys of tiles no query sees are NaN: a kernel that computed them would spread NaN (0 x NaN = NaN); one that
    skips them matches the math kernel on the same inputs with those keys zeroed."""
    q, k, v, dout = make_inputs(32, 64, 16, torch.float32)
    mask = rule_mask(32, 64, window=12, docs=False, q_start=40)  # queries 40..71 see keys 29..63: tiles 0, 1 hidden
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[..., :16, :] = float("nan")
    poisoned_v[..., :16, :] = float("nan")
    kernel, reference = TritonKernel(), MathKernel()
    out, lse = kernel.forward(q, poisoned_k, poisoned_v, mask, 0.25)
    ref_out, ref_lse = reference.forward(q, k, v, mask, 0.25)
    torch.testing.assert_close(out, ref_out, atol=5e-6, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=2e-6, rtol=2e-6)
    grads = kernel.backward(dout, q, poisoned_k, poisoned_v, ref_out, ref_lse, mask, 0.25)
    ref_grads = reference.backward(dout, q, k, v, ref_out, ref_lse, mask, 0.25)
    torch.testing.assert_close(grads[0], ref_grads[0], atol=1e-5, rtol=1e-5)  # dq never reads the hidden keys
    # The hidden keys' dk, dv: every query tile skipped, so exactly zero (computed, they would be NaN).
    assert not grads[1][..., :16, :].any() and not grads[2][..., :16, :].any()
    torch.testing.assert_close(grads[1][..., 16:, :], ref_grads[1][..., 16:, :], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[2][..., 16:, :], ref_grads[2][..., 16:, :], atol=1e-5, rtol=1e-5)


def test_partial_mask_is_copied_once():
    """The int8 mask comes from the kernel's cache: built on the first call, the same tensor afterwards."""
    q, k, v, dout = make_inputs(24, 24, 16, torch.float32)
    mask = make_mask("random", 24, 24, torch.Generator().manual_seed(5))
    kernel = TritonKernel()
    first = kernel.forward(q, k, v, mask, 0.25)
    pointer, stride, has_mask = kernel._mask_args(mask, q)
    assert has_mask and stride == 24 and pointer.dtype == torch.int8 and torch.equal(pointer.bool(), mask.allowed)
    entries = len(kernel.mask_tensors)
    second = kernel.forward(q, k, v, mask, 0.25)
    kernel.backward(dout, q, k, v, *second, mask, 0.25)
    assert kernel._mask_args(mask, q)[0] is pointer and len(kernel.mask_tensors) == entries
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_strided_inputs_like_the_ring(small_tiles):
    """The ring passes row slices of q and of a stacked (2, B, H, L, D) key/value buffer."""
    q_full, k_full, v_full, dout_full = make_inputs(40, 40, 32, torch.float32, batch=2, heads=2)
    kv = torch.stack([k_full, v_full])  # (2, B, H, L, D)
    rows, cols = slice(5, 29), slice(8, 40)
    q, dout = q_full[:, :, rows], dout_full[:, :, rows]
    k, v = kv[0, :, :, cols], kv[1, :, :, cols]
    assert not q.is_contiguous() and not k.is_contiguous()
    mask = make_mask("random", 24, 32, torch.Generator().manual_seed(3))
    compare(q, k, v, dout, mask, TritonKernel())
    compare(q, k[:, :, :24], v[:, :, :24], dout, BlockMask(MaskKind.CAUSAL), TritonKernel())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("mask", ["none", "causal", "causal-naive"])
def test_ring_selfcheck(mask, layout, dtype):
    """The whole ring (world 1: zigzag gives FULL + CAUSAL sub-blocks, causal-naive a PARTIAL one)."""
    case = CheckCase.of(1, mask=mask, layout=layout, dtype=dtype, kernel="triton", seq_per_rank=24, head_dim=16)
    fwd_err, bwd_err = check_case(case)
    fwd_tol, bwd_tol = TOLERANCE[dtype]
    assert fwd_err <= fwd_tol and bwd_err <= bwd_tol, (fwd_err, bwd_err)


@pytest.mark.parametrize(
    "mask",
    [
        "causal-document+window:5",
        pytest.param("causal-document", marks=pytest.mark.slow),
        pytest.param("window:7", marks=pytest.mark.slow),
    ],
)
def test_ring_selfcheck_new_masks(mask):
    """The ring at world 1 on documents and windows: FULL, CAUSAL and rule-PARTIAL sub-blocks through triton."""
    docs = "lengths:3,9,1,12,7" if "document" in mask else "none"
    case = CheckCase.of(1, mask=mask, layout="zigzag", dtype="float32", kernel="triton", seq_per_rank=32, head_dim=16,
                        docs=docs)  # fmt: skip
    fwd_err, bwd_err = check_case(case)
    fwd_tol, bwd_tol = TOLERANCE["float32"]
    assert fwd_err <= fwd_tol and bwd_err <= bwd_tol, (fwd_err, bwd_err)


@pytest.mark.parametrize("head_dim", [8, 24, 48, 256])
def test_bad_head_dim(head_dim):
    with pytest.raises(ValueError, match=rf"head_dim={head_dim} is not allowed; expected a power of two"):
        TritonKernel().check(head_dim, torch.float32, torch.device("cpu"))


def test_bad_head_dim_through_the_ring():
    with pytest.raises(ValueError, match="head_dim=8"):
        check_case(CheckCase.of(1, kernel="triton", dtype="float32", head_dim=8))


def test_registry_and_unavailable(monkeypatch):
    assert isinstance(get_kernel("triton"), TritonKernel)
    kernel = TritonKernel()
    monkeypatch.setattr(triton_attn, "_interpreted", lambda: False)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device and TRITON_INTERPRET=1"):
            kernel.check(16, torch.float32, torch.device("cpu"))
    monkeypatch.setattr(triton_attn, "triton", None)
    with pytest.raises(ValueError, match="triton is not installed"):
        kernel.check(16, torch.float32, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestGpu:
    """Compiled kernels on CUDA: the same comparisons in 16-bit and fp32, plus multi-tile shapes."""

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
    @pytest.mark.parametrize(
        ("name", "q_len", "k_len", "head_dim"),
        [
            *CASES,
            *RULE_CASES,
            ("full", 200, 130, 64),
            ("causal", 300, 300, 128),
            ("random", 150, 257, 64),
            ("rule-documents", 300, 200, 64),
        ],
        ids=lambda x: str(x),
    )
    def test_matches_math_kernel(self, name, q_len, k_len, head_dim, dtype):
        mask = make_mask(name, q_len, k_len, torch.Generator().manual_seed(q_len + k_len))
        compare(*make_inputs(q_len, k_len, head_dim, dtype, device="cuda", batch=2), mask, TritonKernel())

    def test_float64_rejected(self):
        with pytest.raises(ValueError, match="dtype='float64'"):
            TritonKernel().check(64, torch.float64, torch.device("cuda"))

    @pytest.mark.parametrize(
        "mask", ["none", "causal", "causal-naive", "causal-document", "window:40", "causal-document+window:30"]
    )
    def test_ring_selfcheck(self, mask):
        docs = "lengths:10,50,3,70,59" if "document" in mask else "none"
        case = CheckCase.of(1, mask=mask, layout="zigzag", dtype="float32", kernel="triton", seq_per_rank=192,
                            head_dim=64, docs=docs)  # fmt: skip
        fwd_err, bwd_err = check_case(case, device=torch.device("cuda"))
        fwd_tol, bwd_tol = TOLERANCE["float32"]
        assert fwd_err <= fwd_tol and bwd_err <= bwd_tol, (fwd_err, bwd_err)
