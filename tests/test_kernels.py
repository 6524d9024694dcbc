"""Block kernels against the `math` kernel: every mask kind, forward and backward, per dtype; the registry; the
device-tensor cache; and, on CPU, the plumbing of the CUDA ops (routing table, argument order on meta tensors).
The CUDA kernels themselves are checked in test_torch_kernel_gpu.py."""

import time

import pytest
import torch

from ringbench.errors import UsageError
from ringbench.kernels import BlockMask, MaskKind, available_kernels, get_kernel, torch_sdpa
from ringbench.kernels.base import MaskTensors, PositionMask, additive_mask
from ringbench.kernels.torch_sdpa import MathKernel, TorchSdpaKernel, cuda_route

TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 3e-2, torch.float16: 4e-3}
# On CUDA fp32 goes to the memory-efficient kernel, whose fp32 matmuls are 3xTF32 (close to, not exactly, fp32).
CUDA_TOLERANCE = {**TOLERANCE, torch.float32: 2e-5}


def _masks(q_len, k_len):
    strict = torch.ones(q_len, k_len, dtype=torch.bool).tril(-1)  # row 0 sees nothing
    random = torch.rand(q_len, k_len, generator=torch.Generator().manual_seed(0)) > 0.4
    return {
        "full": BlockMask(MaskKind.FULL),
        "causal": BlockMask(MaskKind.CAUSAL),
        "partial-strict": BlockMask.partial(strict),
        "partial-random": BlockMask.partial(random),
        "rule-documents-window": rule_mask(q_len, k_len, causal=True, window=5, docs=True),
        "rule-full-document": rule_mask(q_len, k_len, causal=False, window=0, docs=True),
    }


def rule_mask(q_len: int, k_len: int, *, causal: bool, window: int, docs: bool, offset: int = 3) -> BlockMask:
    """A PARTIAL mask given by its positional rule (documents of 5 tokens; queries ``offset`` tokens later)."""
    q_pos, k_pos = torch.arange(q_len) + offset, torch.arange(k_len)
    rule = PositionMask(q_pos=q_pos, k_pos=k_pos, q_doc=q_pos // 5 if docs else None, k_doc=k_pos // 5 if docs else None,
                        causal=causal, window=window)  # fmt: skip
    return BlockMask.from_rule(rule, rule.allowed().sum(dim=1))


def test_a_positional_rule_is_the_mask_it_stands_for():
    mask = rule_mask(12, 10, causal=True, window=4, docs=True)
    q, k = torch.arange(12)[:, None] + 3, torch.arange(10)[None, :]
    want = (k <= q) & (q - k < 4) & (q // 5 == k // 5)
    assert mask.allowed is None and torch.equal(MaskTensors().allowed(mask, "cpu"), want)
    assert mask.visible == pytest.approx(float(want.float().mean())) and mask.shape == (12, 10)
    assert torch.equal(mask.empty_rows, ~want.any(dim=1))


def _compare(kernel, device, dtype):
    generator = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(2, 3, 12, 16, generator=generator).to(device, dtype) for _ in range(4))
    reference = MathKernel()
    for name, mask in _masks(12, 12).items():
        out, lse = kernel.forward(q, k, v, mask, 0.25)
        ref_out, ref_lse = reference.forward(q, k, v, mask, 0.25)
        tol = (CUDA_TOLERANCE if str(device).startswith("cuda") else TOLERANCE)[dtype]
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
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
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


# -- the device-tensor cache -----------------------------------------------------------------------------------------
class _RecordingAten:
    """Stands in for torch.ops.aten in torch_sdpa: records the attn_mask handed to the CPU ops, then runs them."""

    def __init__(self):
        self.masks = []

    def __getattr__(self, name):
        op = getattr(torch.ops.aten, name)
        if not name.startswith("_scaled_dot_product_flash_attention_for_cpu"):
            return op

        def recording(*args, **kwargs):
            self.masks.append(kwargs.get("attn_mask"))
            return op(*args, **kwargs)

        return recording


def test_torch_kernel_builds_the_partial_bias_once(monkeypatch):
    recorder = _RecordingAten()
    monkeypatch.setattr(torch_sdpa, "aten", recorder)
    generator = torch.Generator().manual_seed(2)
    q, k, v, dout = (torch.randn(2, 3, 12, 16, generator=generator) for _ in range(4))
    mask = _masks(12, 12)["partial-strict"]
    kernel = TorchSdpaKernel()
    first = kernel.forward(q, k, v, mask, 0.25)
    entries = len(kernel.mask_tensors)
    second = kernel.forward(q, k, v, mask, 0.25)
    grads = kernel.backward(dout, q, k, v, *first, mask, 0.25)
    assert len(recorder.masks) == 3
    assert recorder.masks[0] is recorder.masks[1] is recorder.masks[2]  # the cached tensor, not a rebuilt one
    assert len(kernel.mask_tensors) == entries
    assert torch.equal(recorder.masks[0], additive_mask(mask, q.dtype, q.device))
    # Results are those of an uncached kernel, bit for bit.
    fresh = TorchSdpaKernel()
    for got, want in zip((*first, *second), (*fresh.forward(q, k, v, mask, 0.25),) * 2, strict=True):
        assert torch.equal(got, want)
    for got, want in zip(grads, fresh.backward(dout, q, k, v, *first, mask, 0.25), strict=True):
        assert torch.equal(got, want)


def test_math_kernel_reuses_its_masks():
    q, k, v = (torch.randn(1, 2, 10, 8, generator=torch.Generator().manual_seed(3)) for _ in range(3))
    kernel = MathKernel()
    causal = BlockMask(MaskKind.CAUSAL)
    partial = _masks(10, 10)["partial-random"]
    first = [kernel.forward(q, k, v, mask, 0.3) for mask in (causal, partial)]
    tril = kernel.mask_tensors.causal(10, 10, q.device)
    allowed = kernel.mask_tensors.allowed(partial, q.device)
    entries = len(kernel.mask_tensors)
    second = [kernel.forward(q, k, v, mask, 0.3) for mask in (causal, partial)]
    assert kernel.mask_tensors.causal(10, 10, q.device) is tril
    assert kernel.mask_tensors.allowed(partial, q.device) is allowed
    assert len(kernel.mask_tensors) == entries
    assert torch.equal(tril, torch.ones(10, 10, dtype=torch.bool).tril())
    for (out_a, lse_a), (out_b, lse_b) in zip(first, second, strict=True):
        assert torch.equal(out_a, out_b) and torch.equal(lse_a, lse_b)


def test_mask_tensors_are_keyed_by_mask_object_and_bounded():
    tensors = MaskTensors(max_entries=4)
    allowed = torch.ones(5, 7, dtype=torch.bool).tril(-1)  # row 0 sees nothing
    a, b = BlockMask.partial(allowed), BlockMask.partial(allowed.clone())
    bias = tensors.additive(a, torch.float32, "cpu", align=16)
    assert bias.shape == (5, 7) and bias.stride() == (16, 1)  # padded rows, sliced back
    assert torch.equal(bias, additive_mask(a, torch.float32, torch.device("cpu")))
    assert tensors.additive(a, torch.float32, "cpu", align=16) is bias
    assert tensors.additive(b, torch.float32, "cpu", align=16) is not bias  # equal content, another mask
    assert tensors.additive(BlockMask(MaskKind.FULL), torch.float32, "cpu") is None
    assert torch.equal(tensors.empty_rows(a, "cpu"), torch.tensor([True, False, False, False, False]))
    assert tensors.empty_rows(BlockMask.partial(torch.ones(3, 3, dtype=torch.bool)), "cpu") is None
    assert len(tensors) <= 4  # full: emptied and refilled, never past the bound
    int8 = tensors.allowed(a, "cpu", torch.int8)
    assert int8.dtype == torch.int8 and int8.is_contiguous() and torch.equal(int8.bool(), allowed)


# -- the CUDA ops, checked on CPU as far as a CPU can --------------------------------------------------------------
SM90 = (9, 0)


def _route(kind=MaskKind.FULL, dtype=torch.bfloat16, q_len=128, k_len=128, head_dim=64, capability=SM90, **flags):
    facts = {"flash_available": True, "flash_enabled": True, "efficient_enabled": True, **flags}
    return cuda_route(kind, dtype, q_len, k_len, head_dim, False, capability, **facts)


def test_cuda_route_table():
    for dtype in (torch.bfloat16, torch.float16):
        assert _route(MaskKind.FULL, dtype) == "flash"
        assert _route(MaskKind.CAUSAL, dtype) == "flash"
        assert _route(MaskKind.PARTIAL, dtype) == "efficient"  # flash takes no mask
        assert _route(MaskKind.FULL, dtype, q_len=96, k_len=130) == "flash"
        assert _route(MaskKind.CAUSAL, dtype, q_len=96, k_len=130) == "efficient"  # flash aligns bottom-right
        assert _route(dtype=dtype, head_dim=256) == "flash"
        assert _route(dtype=dtype, head_dim=256, capability=(8, 6)) == "efficient"  # no flash backward > 192
        assert _route(dtype=dtype, head_dim=128, capability=(8, 6)) == "flash"
        assert _route(dtype=dtype, head_dim=512) == "efficient"
        assert _route(dtype=dtype, head_dim=12) == "math"  # not a whole 16-byte vector
        assert _route(dtype=dtype, flash_enabled=False) == "efficient"  # sdpa_kernel(EFFICIENT_ATTENTION)
        assert _route(dtype=dtype, flash_available=False) == "efficient"
        assert _route(dtype=dtype, flash_enabled=False, efficient_enabled=False) == "math"
    assert _route(dtype=torch.float16, capability=(7, 5)) == "efficient"
    assert _route(dtype=torch.bfloat16, capability=(7, 5)) == "math"
    assert _route(dtype=torch.float32) == "efficient"
    assert _route(dtype=torch.float32, head_dim=12) == "efficient"
    assert _route(dtype=torch.float32, head_dim=10) == "math"
    assert _route(dtype=torch.float64) == "math"
    assert _route(k_len=0) == "math"
    assert cuda_route(MaskKind.FULL, torch.bfloat16, 0, 8, 64, True, SM90, flash_available=True,
                      flash_enabled=True, efficient_enabled=True) == "math"  # fmt: skip


def test_cuda_op_arguments_match_the_schemas_on_meta_tensors():
    """The fused ops' meta kernels check argument order, types and shapes against the schemas of this torch."""
    batch, heads, length, head_dim = 2, 4, 130, 64
    storage = torch.empty(batch, heads, 2 * length, head_dim, dtype=torch.bfloat16, device="meta")
    q, k = storage[:, :, :length], storage[:, :, length:]  # row slices, as the ring passes them
    v, dout = k, q

    out, lse = torch_sdpa.flash_forward(q, k, v, True, 0.125)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (batch, heads, length) and lse.dtype == torch.float32
    for grad, source in zip(torch_sdpa.flash_backward(dout, q, k, v, out, lse, True, 0.125), (q, k, v), strict=True):
        assert grad.shape == source.shape and grad.dtype == source.dtype

    mask = BlockMask.partial(torch.rand(length, length, generator=torch.Generator().manual_seed(0)) > 0.5)
    bias = TorchSdpaKernel().mask_tensors.additive(mask, q.dtype, q.device, align=torch_sdpa.BIAS_ALIGN)
    bias = bias.expand(batch, heads, length, length)
    for attn_bias, causal in ((bias, False), (None, True), (None, False)):
        out, lse = torch_sdpa.efficient_forward(q, k, v, attn_bias, causal, 0.125)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (batch, heads, length) and lse.dtype == torch.float32
        grads = torch_sdpa.efficient_backward(dout, q, k, v, out, lse, attn_bias, causal, 0.125)
        for grad, source in zip(grads, (q, k, v), strict=True):
            assert grad.shape == source.shape and grad.dtype == source.dtype


def test_this_torchs_fused_ops_take_ringbenchs_arguments_and_a_changed_one_is_named(monkeypatch):
    assert torch_sdpa.fused_ops_problem() is None
    real = torch_sdpa.aten

    class Changed:
        def __getattr__(self, name):
            if name == "_scaled_dot_product_efficient_attention_backward":

                def refuse(*args, **kwargs):
                    raise TypeError("_scaled_dot_product_efficient_attention_backward() missing 1 required argument")

                return refuse
            return getattr(real, name)

    monkeypatch.setattr(torch_sdpa, "aten", Changed())
    monkeypatch.setattr(torch_sdpa, "_FUSED_PROBLEM", [])
    problem = torch_sdpa.fused_ops_problem()
    assert problem.startswith(f"torch {torch.__version__}'s aten._scaled_dot_product_efficient_attention ")
    assert "TypeError: _scaled_dot_product_efficient_attention_backward() missing" in problem and "\n" not in problem


def test_a_torch_without_the_private_busy_wait_says_so_in_one_line(monkeypatch):
    from ringbench.kernels import spin

    assert spin.missing() is None
    monkeypatch.delattr(torch.cuda, "_sleep")
    assert spin.missing() == (f"torch {torch.__version__} lacks torch.cuda._sleep (the busy-wait that paces emulated "
                              "compute and link delays on a GPU)")  # fmt: skip
    with pytest.raises(UsageError, match=r"lacks torch\.cuda\._sleep"):
        spin.spin(0.001, torch.device("cuda"))


def test_emulated_pads_take_their_cuda_events_from_a_pool(monkeypatch):
    """Two events per block, made once and recorded again after each settle (no event made inside a span)."""
    from ringbench.kernels import emulated

    made = []

    class Event:
        def __init__(self, enable_timing=False):
            made.append(self)
            self.recorded = 0

        def record(self, stream=None):
            self.recorded += 1

        def elapsed_time(self, other):
            return 0.5

    monkeypatch.setattr(emulated.torch.cuda, "Event", Event)
    monkeypatch.setattr(emulated, "spin", lambda seconds, device, stream=None: None)
    pacer, cuda = emulated.Pacer(), torch.device("cuda")
    for _ in range(3):  # three iterations of two blocks each
        for block in range(2):
            pacer.pad_to(cuda, ("block", block), pacer.begin(cuda), 1e-3)
        pacer.settle()
    assert len(made) == 4 and all(event.recorded == 3 for event in made)
    assert pacer.blocks == 6 and pacer.saturated_blocks == 0


def test_heads_and_lengths_do_not_make_new_compiled_variants():
    """Triton's own specialisation of each launched kernel's plain ints gives one key for any head count, block
    length, window or mask stride (2 heads or 32, 128 tokens or 4095): a pre-compile at one shape serves another."""
    pytest.importorskip("triton")
    from triton.backends.compiler import BaseBackend
    from triton.runtime import jit

    from ringbench.kernels import triton_attn

    specialise = jit.native_specialize_impl
    for kernel in (triton_attn._attn_fwd, triton_attn._attn_bwd_preprocess, triton_attn._attn_bwd_dkdv,
                   triton_attn._attn_bwd_dq):  # fmt: skip
        compiled = kernel if isinstance(kernel, jit.JITFunction) else jit.JITFunction(kernel.fn, **kernel.kwargs)
        runtime = [p for p in compiled.params if p.name in triton_attn.RUNTIME_INTS]
        assert {p.name for p in runtime} >= {"heads", "q_len"}, kernel
        for param in runtime:
            keys = {specialise(BaseBackend, value, False, not param.do_not_specialize, True)
                    for value in (1, 2, 16, 32, 128, 130, 4095, 4096)}  # fmt: skip
            assert len(keys) == 1, (kernel, param.name, keys)
        strides = [p for p in compiled.params if p.name.startswith("stride_")]
        assert strides and not any(p.do_not_specialize for p in strides)  # their classes follow HEAD_DIM


def test_a_triton_interpreter_that_cannot_run_the_kernels_is_refused_in_one_line(monkeypatch):
    pytest.importorskip("triton")
    from ringbench.kernels import triton_attn

    if not triton_attn._interpreted():
        pytest.skip("the kernels are compiled here")
    found = triton_attn.interpreter_problem()
    if found is None:  # this Triton's interpreter works: make it fail as Triton 3.6's does with NumPy 2.4
        monkeypatch.setattr(triton_attn, "_INTERPRETER_PROBLEM", [])

        def broken(*args, **kwargs):
            raise TypeError("only 0-dimensional arrays can be converted to Python scalars")

        monkeypatch.setattr(triton_attn, "_count_to", {(1,): broken})
        found = triton_attn.interpreter_problem()
    assert f"Triton {triton_attn.triton.__version__}'s CPU interpreter cannot run the kernels" in found
    with pytest.raises(UsageError, match="kernel='triton' is not allowed here: Triton") as info:
        triton_attn.TritonKernel().check(16, torch.float32, torch.device("cpu"))
    assert "\n" not in str(info.value)


def test_layouts_handed_to_the_fused_backwards():
    t = torch.randn(2, 4, 10, 8)[:, :, 1:9]  # a row slice
    bmhk = torch_sdpa._bmhk(t)
    assert torch.equal(bmhk, t) and bmhk.stride() == (8 * 4 * 8, 8, 4 * 8, 1)  # (B, M, H, K) memory
    assert torch_sdpa._bmhk(bmhk).data_ptr() == bmhk.data_ptr()  # already in that layout: no copy

    lse = torch.tensor([[[0.5, float("-inf"), 2.0]]], dtype=torch.float32)
    padded = torch_sdpa._lse_for_backward(lse, torch_sdpa.LSE_ROW_ALIGN)
    assert padded.shape == (1, 1, 32) and padded.is_contiguous() and padded.dtype == torch.float32
    assert padded[0, 0, :3].tolist() == [0.5, float("inf"), 2.0] and torch.isposinf(padded[0, 0, 3:]).all()
    assert torch_sdpa._lse_for_backward(lse.double(), 1).shape == (1, 1, 3)

    assert torch_sdpa._kernel_ready(t) is t  # unit last stride, strides in whole 16-byte vectors
    odd = torch.randn(2, 4, 10, 9)[..., :8]
    assert torch_sdpa._kernel_ready(odd).is_contiguous()
