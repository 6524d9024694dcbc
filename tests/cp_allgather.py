"""docs/implementations.md's worked example: context-parallel attention by all-gathering K and V.

Every rank gathers all ranks' K, V and positions (differentiably: torch.distributed.nn's all_gather sends the
gradients of the gathered K, V back to their owners), then attends its own queries to every key under the mask,
built from global positions. Not a ring -- O(S) memory per rank -- but exact, and short enough to read whole.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as distributed

# torch 2.13 calls the autograd all_gather deprecated (its successor is private): quiet for the example
warnings.filterwarnings("ignore", message=".*all_gather is deprecated.*", category=FutureWarning)


def _attend(q, k, v, *, mask, layout, group, positions, causal, window, doc_lengths, scale, **_):
    """q: (B, H, L, D) this rank's queries; k, v: (B, KV, L, D); positions: (L,) their global token positions."""
    keys = torch.cat(distributed.all_gather(k, group=group), dim=2)  # (B, KV, S, D), rank by rank
    values = torch.cat(distributed.all_gather(v, group=group), dim=2)
    where = [torch.empty_like(positions) for _ in range(dist.get_world_size(group))]
    dist.all_gather(where, positions, group=group)
    key_positions = torch.cat(where)  # (S,) the global position of each gathered key
    heads, kv_heads = q.shape[1], k.shape[1]
    keys = keys.repeat_interleave(heads // kv_heads, dim=1)  # query head h reads KV head h // (H / KV)
    values = values.repeat_interleave(heads // kv_heads, dim=1)
    query, key = positions[:, None], key_positions[None, :]
    visible = torch.ones(query.shape[0], key.shape[1], dtype=torch.bool)
    if causal:
        visible &= key <= query
    if window is not None:
        visible &= key > query - window
    if doc_lengths is not None:
        document = torch.repeat_interleave(torch.arange(len(doc_lengths)), torch.tensor(doc_lengths))
        visible &= document[query] == document[key]
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) * scale  # (B, H, L, S)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), values.float()).to(q.dtype), torch.logsumexp(scores, -1)


def attention(q, k, v, **given):
    """The example: out only."""
    return _attend(q, k, v, **given)[0]


def with_lse(q, k, v, **given):
    """The same, returning (out, lse): check compares the log-sum-exp too."""
    return _attend(q, k, v, **given)


for function in (attention, with_lse):
    function.ringbench_masks = ("none", "causal", "causal-document", "full-document", "window",
                                "causal-document+window")  # fmt: skip
    function.ringbench_layouts = ("contiguous", "zigzag", "striped", "doc-balanced")
    function.ringbench_gqa = True
