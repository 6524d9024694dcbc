"""The online-softmax merge of partial attention results, as (out, lse) pairs.

For one query row, a block's partial result is out_b = sum_j p_j v_j / l_b with l_b = sum_j exp(s_j) and
lse_b = log l_b. Two partials over disjoint key sets combine exactly:
    lse = log(exp(lse_a) + exp(lse_b))                    (logaddexp: stable, no overflow)
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b
since exp(lse_a - lse) = l_a / (l_a + l_b) re-weights each normalised partial by its share of the total sum. With
w = exp(lse_b - lse) = l_b / (l_a + l_b) = sigmoid(lse_b - lse_a), the same reads

    out = out_a - w * (out_a - out_b)

which the ring's accumulator takes in place. The identity element is (out=0, lse=-inf): against it w = sigmoid(+inf)
= 1 and out = out_b; a block with lse = -inf (no visible key) has w = 0 and changes nothing; when both are -inf the
weight is 0/0, taken as 0. Everything is done in the statistics dtype (fp32, or fp64 for fp64 inputs) whatever the
input dtype.
"""

from __future__ import annotations

import torch


def merge(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure merge: (B, H, L, D), (B, H, L) twice -> the combined (out, lse)."""
    out, lse = out_a.clone(), lse_a.clone()
    merge_into(out, lse, out_b, lse_b)
    return out, lse


def merge_into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge a block's (out, lse) into accumulator views in place: six elementwise kernels on a GPU (the
    weight's difference, sigmoid and NaN clean-up; the out difference and a fused multiply-add; the logaddexp),
    and no full-size copy back, since they run inside every measured compute span."""
    weight = torch.sigmoid(lse.to(acc_lse.dtype) - acc_lse).nan_to_num_(0.0)  # (B, H, L)
    acc_out.addcmul_(acc_out - out, weight[..., None], value=-1.0)  # out_a - w * (out_a - out_b)
    torch.logaddexp(acc_lse, lse.to(acc_lse.dtype), out=acc_lse)
