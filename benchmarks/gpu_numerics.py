"""How the GPU check judges a kernel's results against float64: ringbench's tolerances (ringbench.vocab.TOLERANCE),
absolute for values up to 1 and relative above, as the kernels' error model asks.

The error model. The torch flash op and ringbench's Triton kernel round where FlashAttention-2 does (u: 2**-8 in
bf16, 2**-11 in fp16; u32 = 2**-24): scores and the softmax statistics are fp32; P is rounded to 16 bits before
P V, dS before dS K and dS^T Q; out, dq, dk and dv are summed in fp32 and rounded once at the end. Per element of
the output, with p the row's probabilities over its n visible keys:

    |out - out*|  <=  u |out*|  +  u sum_j p_j |v_j|  +  n u32 sum_j p_j |v_j|

(the final rounding; P's rounding; the fp32 sum), and the gradients follow the same pattern. The first term grows
with the value itself: the largest outputs of a long sequence are rows that see few keys (the first rows under a
causal mask, the first tokens of each packed document), which average a few of the 16 million draws of v, are
2 to 5 in magnitude, and carry a final bf16 rounding of up to 0.008 to 0.02 -- the whole of an absolute bound
tuned on values of order one. The others stay below u max|v| and n u32 = 5e-4 relative at n = 8192, whatever the
sequence length.

So a result passes when max |got - want| / max(1, |want|) <= TOLERANCE[dtype]: the same bound as ringbench's own
checks where values are of order one or less, and relative to the value above that, as the final rounding is. A
layout, mask or statistics fault shows as errors of order 0.1 to 1 on values of order one, caught as before.
"""

from __future__ import annotations

import torch


def scaled_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(1, |want|) over the elements (``want``: the float64 reference)."""
    want = want.double()
    return ((got.double() - want).abs() / want.abs().clamp(min=1.0)).max().item()


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| (reported beside the judged, scaled error)."""
    return (got.double() - want.double()).abs().max().item()


__all__ = ["max_error", "scaled_error"]
