"""Block kernels on PyTorch's own attention ops.

``torch`` picks, per block, the fastest op that returns the log-sum-exp and fits the block (``TorchSdpaKernel.route``):
  * CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward`` (any mask, additive bias).
  * CUDA, FULL and CAUSAL blocks in fp16/bf16: FlashAttention-2, ``aten._scaled_dot_product_flash_attention`` and
    ``_backward`` (head_dim a multiple of 8 up to 256, sm80 or newer, flash built in and enabled).
  * CUDA otherwise (PARTIAL masks, fp32, flash unavailable): the memory-efficient op,
    ``aten._scaled_dot_product_efficient_attention`` and ``_backward``, with the mask as an additive bias.
  * fp64 on CUDA, head dims those ops cannot align, empty blocks: ``math``.
The CUDA choices honour ``torch.nn.attention.sdpa_kernel`` (``torch.backends.cuda.flash_sdp_enabled()`` and
``mem_efficient_sdp_enabled()``), so a caller can force the memory-efficient or the math path.

``math``: explicit matmuls and logsumexp in the statistics dtype; slow, but any dtype and device: the reference the
other kernels are checked against.

Grouped-query attention (K and V of KV < H heads; query head h reads KV head h // (H / KV)): the CPU op and flash
take it as it is (their backward sums dK, dV over each group); ``math`` folds a KV head's query heads into its rows
(one matmul per KV head); only the memory-efficient op needs K and V repeated per query head, on this rank, and
its dK, dV summed back.

Conventions the CUDA ops rely on (read from PyTorch's attention.cu / attention_backward.cu, checked against the
op schemas of torch 2.13):
  * Both fused ops work in (B, M, H, K) memory: the forward's output is a (B, H, M, K) view of (B, M, H, K)
    storage. The memory-efficient backward reads ``out`` (for delta = rowsum(dO * O)) with a row stride fixed at
    H * K, whatever strides the tensor has, so ``out`` must be handed over in that layout (``_bmhk``); ``grad_out``
    is made contiguous in it by the op itself, so it gets the same treatment to save that copy.
  * lse: flash returns (B, H, M) fp32; the memory-efficient forward returns (B, H, ceil(M / 32) * 32) fp32 (its
    backward checks that the head stride is a multiple of 8, hence the padding). Both are natural-log units.
  * is_causal: the memory-efficient op masks top-left aligned; flash aligns bottom-right, the same thing only for
    square blocks, so a CAUSAL block that is not square never goes to flash.
  * Rows with no visible key: FlashAttention writes lse = +inf for them; FULL blocks (Lk > 0) and square CAUSAL
    blocks have none, PARTIAL blocks never go to flash, and the memory-efficient path clears them with the
    plan's empty rows. In the backward a final lse of -inf becomes +inf so that P = exp(S - lse) is 0, not NaN.
  * Dropout is 0, so the philox seed and offset are never read; they are passed in the form each forward returns
    them (flash: uint64 tensors on the device; memory-efficient: int64 scalars on the host).
Nothing here reads a GPU value on the host: masks come from a per-kernel MaskTensors cache (built once per plan
mask, copied from pinned memory) and every choice is made from shapes, dtypes and device properties.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ringbench.kernels.base import (
    BlockKernel,
    BlockMask,
    MaskKind,
    MaskTensors,
    clear_empty_rows,
    expand_kv,
    kv_group,
    stats_dtype,
    sum_kv,
)

aten = torch.ops.aten

HALF_DTYPES = (torch.float16, torch.bfloat16)
LSE_ROW_ALIGN = 32  # the memory-efficient forward pads its lse rows to this multiple; its backward expects it
BIAS_ALIGN = 16  # elements; row stride of the additive bias (PyTorch's own SDPA pads it to 8 or 16)
_NO_SEED = torch.empty((), dtype=torch.int64)  # what the memory-efficient forward returns without dropout
_capabilities: dict[int, tuple[int, int]] = {}
_flash_rng: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


# -- math: the reference ------------------------------------------------------------------------------------------
def _fold(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, H, L, X) -> (B, KV, G L, X): the G = H / KV query heads of a KV head one after another along the rows,
    so that one matmul against that KV head's (B, KV, Lk, D) serves them all (grouped-query attention without
    repeating K or V); a view when ``x`` is contiguous, the identity when G = 1."""
    batch, heads, rows, last = x.shape
    return x if heads == kv_heads else x.reshape(batch, kv_heads, heads // kv_heads * rows, last)


def _unfold(x: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``_fold``: (B, KV, G L, X) -> (B, H, L, X)."""
    batch, kv_heads, rows, last = x.shape
    return x if heads == kv_heads else x.reshape(batch, heads, rows * kv_heads // heads, last)


def _math_scores(q, k, mask: BlockMask, scale: float, tensors: MaskTensors) -> torch.Tensor:
    acc = stats_dtype(q.dtype)
    scores = _unfold(torch.matmul(_fold(q.to(acc), k.shape[1]), k.to(acc).transpose(-1, -2)), q.shape[1]) * scale
    # (B, H, Lq, Lk); query head h against KV head h // (H / KV)
    if mask.kind is MaskKind.CAUSAL:
        lq, lk = scores.shape[-2:]
        scores = scores.masked_fill(~tensors.causal(lq, lk, q.device), float("-inf"))
    elif mask.kind is MaskKind.PARTIAL:
        scores = scores.masked_fill(~tensors.allowed(mask, q.device), float("-inf"))
    return scores


class MathKernel(BlockKernel):
    name = "math"

    def __init__(self, tensors: MaskTensors | None = None) -> None:
        self.mask_tensors = tensors if tensors is not None else MaskTensors()

    def forward(self, q, k, v, mask, scale):
        scores = _math_scores(q, k, mask, scale, self.mask_tensors)
        lse = torch.logsumexp(scores, dim=-1)  # (B, H, Lq); -inf on rows with no visible key
        probs = torch.exp(scores - lse[..., None]).nan_to_num_(0.0)
        kv_heads, heads = k.shape[1], q.shape[1]
        out = _unfold(torch.matmul(_fold(probs, kv_heads), v.to(probs.dtype)), heads).to(q.dtype)
        return clear_empty_rows(out, lse, self.mask_tensors.empty_rows(mask, q.device))

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        acc = stats_dtype(q.dtype)
        kv_heads, heads = k.shape[1], q.shape[1]
        scores = _math_scores(q, k, mask, scale, self.mask_tensors)
        probs = torch.exp(scores - lse.to(acc)[..., None]).nan_to_num_(0.0)  # P against the final lse
        dout_acc = dout.to(acc)
        # Folded, the sums over a KV head's query heads are the matmuls' own: dK and dV come out per KV head.
        probs_f, dout_f = _fold(probs, kv_heads), _fold(dout_acc, kv_heads)  # (B, KV, G Lq, Lk), (B, KV, G Lq, D)
        dv = torch.matmul(probs_f.transpose(-1, -2), dout_f)  # (B, KV, Lk, D)
        dprobs = _unfold(torch.matmul(dout_f, v.to(acc).transpose(-1, -2)), heads)  # (B, H, Lq, Lk)
        delta = (dout_acc * out.to(acc)).sum(-1, keepdim=True)  # D = rowsum(dO * O_final)
        dscores = _fold(probs * (dprobs - delta) * scale, kv_heads)
        dq = _unfold(torch.matmul(dscores, k.to(acc)), heads)
        dk = torch.matmul(dscores.transpose(-1, -2), _fold(q.to(acc), kv_heads))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# -- the fused CUDA ops -------------------------------------------------------------------------------------------
def _capability(device: torch.device) -> tuple[int, int]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capabilities:
        _capabilities[index] = torch.cuda.get_device_capability(index)
    return _capabilities[index]


def _alignment(dtype: torch.dtype) -> int:
    """Elements per 16 bytes: the vector width the fused kernels load with."""
    return 16 // dtype.itemsize


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its last dim is contiguous, its other strides are whole 16-byte vectors and it starts on a 16-byte
    boundary (true of the ring's row slices when head_dim is aligned); a contiguous copy otherwise."""
    align = _alignment(t.dtype)
    if t.stride(-1) == 1 and all(s % align == 0 for s in t.stride()[:-1]) and t.data_ptr() % 16 == 0:
        return t
    return t.contiguous()


def _bmhk(t: torch.Tensor) -> torch.Tensor:
    """A (B, H, M, K) view whose memory is (B, M, H, K): ``t`` itself when its rows already are H * K apart and its
    heads K apart (a row slice of such a tensor, as the ring hands each block), else a copy into that layout."""
    heads, head_dim = t.shape[1], t.shape[-1]
    if t.stride(-1) == 1 and t.stride(1) == head_dim and t.stride(2) == heads * head_dim:
        return t
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _lse_for_backward(lse: torch.Tensor, row_multiple: int) -> torch.Tensor:
    """(B, H, Lq) final lse -> contiguous fp32, rows padded with +inf to ``row_multiple``. A row that saw no key in
    the whole ring (-inf) becomes +inf, so P = exp(S - lse) is 0 there instead of NaN."""
    lse = lse.float()
    lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
    pad = (-lse.shape[-1]) % row_multiple
    if pad:
        lse = F.pad(lse, (0, pad), value=float("inf"))
    return lse.contiguous()


def _flash_rng_placeholders(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(philox_seed, philox_offset) as the flash forward returns them: uint64 (2,) and () on the device."""
    if device not in _flash_rng:
        _flash_rng[device] = (
            torch.empty(2, dtype=torch.uint64, device=device),
            torch.empty((), dtype=torch.uint64, device=device),
        )
    return _flash_rng[device]


def flash_forward(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2: (out (B, H, Lq, D) in q's dtype, lse (B, H, Lq) fp32)."""
    # -> (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, rng_state, unused, debug_attn_mask)
    out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    return out, lse


def flash_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    """(dq, dk, dv) of one block against the final (out, lse); cum_seq_q/k None: dense, not varlen."""
    seed, offset = _flash_rng_placeholders(q.device)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
        _bmhk(dout), q, k, v, _bmhk(out), _lse_for_backward(lse, 1), None, None, q.shape[-2], k.shape[-2],
        0.0, causal, seed, offset, scale=scale,
    )  # fmt: skip
    return dq, dk, dv


def efficient_forward(q, k, v, bias, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Memory-efficient attention: (out (B, H, Lq, D) in q's dtype, lse (B, H, Lq) fp32, a view of the padded one).
    ``bias``: (B, H, Lq, Lk) additive, in q's dtype, row stride a multiple of BIAS_ALIGN; or None."""
    # -> (output, log_sumexp (B, H, ceil(Lq / 32) * 32), philox_seed, philox_offset)
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal, scale=scale)
    return out, lse[..., : q.shape[-2]]


def efficient_backward(dout, q, k, v, out, lse, bias, causal: bool, scale: float):
    """(dq, dk, dv) of one block against the final (out, lse); out and dout in (B, M, H, K) memory (see above)."""
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        _bmhk(dout), q, k, v, bias, _bmhk(out), _lse_for_backward(lse, LSE_ROW_ALIGN), _NO_SEED, _NO_SEED,
        0.0, [True, True, True, False], causal, scale=scale,
    )  # fmt: skip
    return dq, dk, dv


def cuda_route(
    kind: MaskKind,
    dtype: torch.dtype,
    q_len: int,
    k_len: int,
    head_dim: int,
    empty: bool,
    capability: tuple[int, int],
    *,
    flash_available: bool,
    flash_enabled: bool,
    efficient_enabled: bool,
) -> str:
    """The op for a block on a CUDA device of compute ``capability``: 'flash', 'efficient' or 'math'."""
    if dtype == torch.float64 or empty or k_len == 0:
        return "math"
    if (
        kind is not MaskKind.PARTIAL
        and (kind is MaskKind.FULL or q_len == k_len)  # flash's causal mask is bottom-right aligned
        and dtype in HALF_DTYPES
        and head_dim % 8 == 0
        and head_dim <= 256
        and capability >= (8, 0)
        and (head_dim <= 192 or capability == (8, 0) or capability >= (9, 0))  # sm86/89: no backward above 192
        and flash_available
        and flash_enabled
    ):
        return "flash"
    if (
        efficient_enabled
        and head_dim % _alignment(dtype) == 0  # bf16 has no kernel for unaligned head dims
        and (dtype != torch.bfloat16 or capability >= (8, 0))
    ):
        return "efficient"
    return "math"


_FUSED_PROBLEM: list[str | None] = []  # the one answer of this process


def fused_ops_problem() -> str | None:
    """None when this torch's fused CUDA attention ops (flash and memory-efficient, forward and backward) take the
    arguments this module passes, else one line naming the op and what it said. Private aten signatures change
    between releases; their meta kernels check argument order, types and shapes on meta tensors shaped as the ring
    passes them (row slices, 16-bit, a partial bias), so the answer needs no GPU. A torch without those meta
    kernels (NotImplementedError) cannot tell: None."""
    if _FUSED_PROBLEM:
        return _FUSED_PROBLEM[0]
    batch, heads, length, head_dim = 1, 2, 130, 64
    storage = torch.empty(batch, heads, 2 * length, head_dim, dtype=torch.bfloat16, device="meta")
    q, k = storage[:, :, :length], storage[:, :, length:]
    bias = MaskTensors().additive(BlockMask.partial(torch.ones(length, length, dtype=torch.bool).tril()), q.dtype,
                                  q.device, align=BIAS_ALIGN).expand(batch, heads, length, length)  # fmt: skip
    calls = {
        "_scaled_dot_product_flash_attention": lambda: flash_backward(
            q, q, k, k, *flash_forward(q, k, k, True, 0.1), True, 0.1
        ),
        "_scaled_dot_product_efficient_attention": lambda: efficient_backward(
            q, q, k, k, *efficient_forward(q, k, k, bias, False, 0.1), bias, False, 0.1
        ),
    }
    problem = None
    for name, call in calls.items():
        try:
            call()
        except NotImplementedError:
            continue
        except Exception as exc:  # a changed signature: TypeError or RuntimeError from the schema
            text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
            problem = (f"torch {torch.__version__}'s aten.{name} (forward or backward) does not take ringbench's "
                       f"arguments ({type(exc).__name__}: {text}); ringbench's calls follow torch 2.13")  # fmt: skip
            break
    _FUSED_PROBLEM.append(problem)
    return problem


class TorchSdpaKernel(BlockKernel):
    name = "torch"

    def __init__(self) -> None:
        self.mask_tensors = MaskTensors()
        self._math = MathKernel(self.mask_tensors)

    def route(self, q: torch.Tensor, k: torch.Tensor, mask: BlockMask) -> str:
        """Which op runs this block: 'cpu', 'flash', 'efficient' or 'math' (host-side facts only)."""
        if q.device.type != "cuda":
            return "cpu"
        return cuda_route(
            mask.kind,
            q.dtype,
            q.shape[-2],
            k.shape[-2],
            q.shape[-1],
            q.numel() == 0,
            _capability(q.device),
            flash_available=torch.backends.cuda.is_flash_attention_available(),
            flash_enabled=torch.backends.cuda.flash_sdp_enabled(),
            efficient_enabled=torch.backends.cuda.mem_efficient_sdp_enabled(),
        )

    def _bias(self, mask: BlockMask, q: torch.Tensor) -> torch.Tensor | None:
        """(B, H, Lq, Lk) expanded view of the cached, aligned (Lq, Lk) bias; None for FULL and CAUSAL."""
        bias = self.mask_tensors.additive(mask, q.dtype, q.device, align=BIAS_ALIGN)
        return None if bias is None else bias.expand(q.shape[0], q.shape[1], *bias.shape)

    def forward(self, q, k, v, mask, scale):
        route = self.route(q, k, mask)
        if route == "math":
            return self._math.forward(q, k, v, mask, scale)
        causal = mask.kind is MaskKind.CAUSAL
        rows = self.mask_tensors.empty_rows(mask, q.device)
        if route == "cpu":
            bias = self.mask_tensors.additive(mask, q.dtype, q.device)
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal, attn_mask=bias, scale=scale
            )
            return clear_empty_rows(out, lse.to(stats_dtype(q.dtype)), rows)
        q, k, v = (_kernel_ready(t) for t in (q, k, v))
        if route == "flash":
            return flash_forward(q, k, v, causal, scale)  # FULL / square CAUSAL: no empty rows; takes GQA itself
        group = kv_group(q, k)  # the memory-efficient op wants K/V per query head: repeated here, on this rank
        k, v = (_kernel_ready(expand_kv(t, group)) for t in (k, v))
        out, lse = efficient_forward(q, k, v, self._bias(mask, q), causal, scale)
        return clear_empty_rows(out, lse, rows)

    def prepare_backward(self, dout, out):
        """CUDA: ``dout`` and ``out`` in (B, M, H, K) memory once per call (the fused backwards read them so), so
        each block's row slice is handed over without a copy; CPU: as the base class."""
        if dout.device.type != "cuda":
            return super().prepare_backward(dout, out)
        return _bmhk(dout), _bmhk(out)

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        route = self.route(q, k, mask)
        if route == "math":
            return self._math.backward(dout, q, k, v, out, lse, mask, scale)
        causal = mask.kind is MaskKind.CAUSAL
        out = out.to(q.dtype)
        dout = dout.to(q.dtype)
        if route == "cpu":
            bias = self.mask_tensors.additive(mask, q.dtype, q.device)
            out, dout = out.contiguous(), dout.contiguous()
            # Rows that saw no key (lse = -inf) get no gradient: lse = +inf makes P = exp(S - lse) exactly 0 there
            # (the op would otherwise compute exp(-inf + inf) = NaN).
            lse_in = lse.masked_fill(torch.isneginf(lse), float("inf")).to(stats_dtype(q.dtype)).contiguous()
            return aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse_in, 0.0, causal, attn_mask=bias, scale=scale
            )
        q, k, v = (_kernel_ready(t) for t in (q, k, v))
        if route == "flash":
            return flash_backward(dout, q, k, v, out, lse, causal, scale)  # dk, dv per KV head
        group = kv_group(q, k)
        k_full, v_full = (_kernel_ready(expand_kv(t, group)) for t in (k, v))
        dq, dk, dv = efficient_backward(dout, q, k_full, v_full, out, lse, self._bias(mask, q), causal, scale)
        return dq, sum_kv(dk, group), sum_kv(dv, group)
