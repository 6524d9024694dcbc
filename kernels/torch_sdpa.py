"""Block kernels on PyTorch's own attention ops.

``torch``: on CPU ``aten._scaled_dot_product_flash_attention_for_cpu`` (returns out and logsumexp, with a matching
``_backward``); on CUDA the memory-efficient SDPA op, which accepts an additive mask and returns the log-sum-exp.
Where neither applies (fp64 on CUDA), it falls back to ``math``. ``math``: explicit matmuls and logsumexp in the
statistics dtype; slow, but any dtype and device: the reference the other kernels are checked against.
"""

from __future__ import annotations

import torch

from ringbench.kernels.base import BlockKernel, BlockMask, MaskKind, additive_mask, clear_empty_rows, stats_dtype

aten = torch.ops.aten


def _math_scores(q, k, mask: BlockMask, scale: float) -> torch.Tensor:
    acc = stats_dtype(q.dtype)
    scores = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale  # (B, H, Lq, Lk)
    if mask.kind is MaskKind.CAUSAL:
        lq, lk = scores.shape[-2:]
        visible = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    elif mask.kind is MaskKind.PARTIAL:
        scores = scores.masked_fill(~mask.allowed.to(q.device), float("-inf"))
    return scores


def _aligned_bias(bias: torch.Tensor | None, batch: int, heads: int) -> torch.Tensor | None:
    """(Lq, Lk) bias -> (B, H, Lq, Lk) view whose rows start on 16-element boundaries.

    The memory-efficient CUDA kernel wants the bias's last-dimension stride aligned; the public SDPA pads the
    storage and slices it back, which is what this does. (Needs a GPU to exercise: tests marked gpu.)
    """
    if bias is None:
        return None
    q_len, k_len = bias.shape
    padded = torch.zeros(q_len, (k_len + 15) // 16 * 16, dtype=bias.dtype, device=bias.device)
    padded[:, :k_len] = bias
    return padded[:, :k_len].expand(batch, heads, q_len, k_len)


class MathKernel(BlockKernel):
    name = "math"

    def forward(self, q, k, v, mask, scale):
        scores = _math_scores(q, k, mask, scale)
        lse = torch.logsumexp(scores, dim=-1)  # (B, H, Lq); -inf on rows with no visible key
        probs = torch.exp(scores - lse[..., None]).nan_to_num_(0.0)
        out = torch.matmul(probs, v.to(probs.dtype)).to(q.dtype)
        return clear_empty_rows(out, lse, mask)

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        acc = stats_dtype(q.dtype)
        scores = _math_scores(q, k, mask, scale)
        probs = torch.exp(scores - lse.to(acc)[..., None]).nan_to_num_(0.0)  # P against the final lse
        dout_acc = dout.to(acc)
        dv = torch.matmul(probs.transpose(-1, -2), dout_acc)
        dprobs = torch.matmul(dout_acc, v.to(acc).transpose(-1, -2))
        delta = (dout_acc * out.to(acc)).sum(-1, keepdim=True)  # D = rowsum(dO * O_final)
        dscores = probs * (dprobs - delta) * scale
        dq = torch.matmul(dscores, k.to(acc))
        dk = torch.matmul(dscores.transpose(-1, -2), q.to(acc))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class TorchSdpaKernel(BlockKernel):
    name = "torch"

    def __init__(self) -> None:
        self._math = MathKernel()

    def _use_math(self, q: torch.Tensor) -> bool:
        return q.device.type == "cuda" and q.dtype == torch.float64

    def forward(self, q, k, v, mask, scale):
        if self._use_math(q):
            return self._math.forward(q, k, v, mask, scale)
        causal = mask.kind is MaskKind.CAUSAL
        bias = additive_mask(mask, q.dtype, q.device)
        if q.device.type == "cuda":
            bias = _aligned_bias(bias, q.shape[0], q.shape[1])
            out, lse, _, _ = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal, scale=scale)
            lse = lse[..., : q.shape[-2]]
        else:
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, causal, attn_mask=bias, scale=scale
            )
        return clear_empty_rows(out, lse.to(stats_dtype(q.dtype)), mask)

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        if self._use_math(q):
            return self._math.backward(dout, q, k, v, out, lse, mask, scale)
        causal = mask.kind is MaskKind.CAUSAL
        bias = additive_mask(mask, q.dtype, q.device)
        out = out.to(q.dtype).contiguous()
        dout = dout.to(q.dtype).contiguous()
        # Rows that saw no key (lse = -inf) get no gradient: lse = +inf makes P = exp(S - lse) exactly 0 there
        # (the op would otherwise compute exp(-inf + inf) = NaN).
        lse = lse.masked_fill(torch.isneginf(lse), float("inf"))
        if q.device.type == "cuda":
            bias = _aligned_bias(bias, q.shape[0], q.shape[1])
            seed = torch.zeros((), dtype=torch.int64, device=q.device)
            lse_in = lse.float().contiguous()
            pad = (-lse_in.shape[-1]) % 32
            if pad:  # the efficient kernel stores lse padded to a multiple of 32 rows
                lse_in = torch.nn.functional.pad(lse_in, (0, pad))
            dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
                dout, q, k, v, bias, out, lse_in, seed, seed, 0.0, [True, True, True, False], causal, scale=scale
            )
        else:
            lse_in = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32).contiguous()
            dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                dout, q, k, v, out, lse_in, 0.0, causal, attn_mask=bias, scale=scale
            )
        return dq, dk, dv
