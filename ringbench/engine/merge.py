"""The online-softmax merge of partial attention results, as (out, lse) pairs.

For one query row, a block's partial result is out_b = sum_j p_j v_j / l_b with l_b = sum_j exp(s_j) and
lse_b = log l_b. Two partials over disjoint key sets combine exactly:
    lse = log(exp(lse_a) + exp(lse_b))                    (logaddexp: stable, no overflow)
    out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b
since exp(lse_a - lse) = l_a / (l_a + l_b) re-weights each normalised partial by its share of the total sum. The
identity element is (out=0, lse=-inf); when both sides are -inf the weights are 0/0, and are taken as 0.
Everything is done in the statistics dtype (fp32, or fp64 for fp64 inputs) whatever the input dtype.
"""

from __future__ import annotations

import torch


def merge(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure merge: (B, H, L, D), (B, H, L) twice -> the combined (out, lse)."""
    lse = torch.logaddexp(lse_a, lse_b)
    weight_a = torch.exp(lse_a - lse).nan_to_num_(0.0)[..., None]
    weight_b = torch.exp(lse_b.to(lse.dtype) - lse).nan_to_num_(0.0)[..., None]
    out = weight_a * out_a + weight_b * out_b.to(out_a.dtype)
    return out, lse


def merge_into(acc_out: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge a block's (out, lse) into accumulator views in place."""
    new_out, new_lse = merge(acc_out, acc_lse, out, lse.to(acc_lse.dtype))
    acc_out.copy_(new_out)
    acc_lse.copy_(new_lse)
