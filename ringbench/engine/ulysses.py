"""Ulysses and the hybrid (USP): all-to-all from sequence shards to head shards, attention, all-to-all back.

``hybrid:U`` on N ranks: groups of U ranks (ringbench/engine/groups.py). Rank (g, i) -- group g, index i -- starts
with its L = S/N tokens of every head, (B, H, L, D). The all-to-all inside the group gives it heads
[i H/U, (i+1) H/U) of all U L tokens of its group, (B, H/U, U L, D), the members' rows one after another. A ring of
N/U ranks across the groups (the ranks with index i; ringbench/engine/subring.py) then brings it the K/V of every
other group for the same heads: the ring loops of ringbench/engine/ring.py, with the block plan of a group against a
group. An all-to-all back returns each member its rows of every head. ``ulysses`` is the hybrid with U = N (a ring
of one: the attention is local, over the whole sequence, for H/N heads).

Backward: dO goes to the head layout by the same all-to-all; the ring backward runs across the groups with the
head-layout Q, K, V, O and lse kept from the forward; dQ, dK, dV come back by one all-to-all.

Grouped-query attention (K, V of KV < H heads; query head h reads KV head h // (H / KV)): member i's message
carries its H/U query heads and only the KV heads they read (``StrategyContext.kv_span``), so K/V travel at KV-head
size. With U dividing KV that is KV/U heads each; with U a multiple of KV (U > KV) every member's query heads read
one KV head, which goes to U/KV members (DeepSpeed's repetition, made in the message, never as a copy of K/V
beforehand). The ring across the groups then moves (B, KV/U or 1, U L, D) blocks. On the way back, a KV head that
went to several members has their partial dK/dV summed where it lives; those partials travel in the statistics
dtype (as the ring's dK/dV accumulators do) so that the sum is rounded once.

Steps of the record: the ring's 0 .. N/U - 1; the all-to-alls in (qkv, dout) at step 0 and out (out, dqkv) at the
last step, each a ``send`` / ``recv`` pair per peer with ``exchange`` saying what moved.
"""

from __future__ import annotations

import torch


def _to_heads(sctx, parts_of, *, phase: str, step: int, exchange: str) -> torch.Tensor:
    """All-to-all: member j receives ``parts_of(j)`` (this rank's rows, member j's heads); returns the stacked
    chunks of every member (this rank's heads), the members' rows one after another along the sequence."""
    members = sctx.members
    parts = {member: parts_of(j) for j, member in enumerate(members)}
    received = sctx.exchange(parts, phase=phase, step=step, exchange=exchange)
    return torch.cat([received[m] for m in members], dim=-2)


def _to_rows(sctx, head_tensor: torch.Tensor, *, phase: str, step: int, exchange: str, head_dim: int) -> torch.Tensor:
    """All-to-all back: member j receives its rows of this rank's heads; returns this rank's rows of every head,
    heads in member order along ``head_dim``."""
    members, local = sctx.members, sctx.local
    parts = {m: head_tensor[..., j * local : (j + 1) * local, :] for j, m in enumerate(members)}
    received = sctx.exchange(parts, phase=phase, step=step, exchange=exchange)
    return torch.cat([received[m] for m in members], dim=head_dim)


def _qkv_for(q, k, v, sctx, index: int) -> torch.Tensor:
    """What member ``index`` receives from this rank: its query heads and the KV heads they read, one message
    (B, H/U + 2 KV_i, L, D)."""
    hu = sctx.heads_per_rank
    lo, hi = sctx.kv_span(index)
    return torch.cat([q[:, index * hu : (index + 1) * hu], k[:, lo:hi], v[:, lo:hi]], dim=1)


def hybrid_forward(q, k, v, sctx):
    """Shards q (B, H, L, D), k and v (B, KV, L, D) -> (out (B, H, L, D) in q's dtype, saved head-layout tensors
    for the backward)."""
    from ringbench.engine.ring import ring_forward

    hu = sctx.heads_per_rank
    stacked = _to_heads(sctx, lambda j: _qkv_for(q, k, v, sctx, j), phase="fwd", step=0,
                        exchange="qkv")  # (B, H/U + 2 KV_i, U L, D)  # fmt: skip
    kv_local = (stacked.shape[1] - hu) // 2
    q_h, k_h, v_h = stacked.split([hu, kv_local, kv_local], dim=1)
    ring = sctx.ring_context()
    out_h, lse_h = ring_forward(q_h, k_h, v_h, ring)  # (B, H/U, U L, D), (B, H/U, U L)
    out = _to_rows(sctx, out_h, phase="fwd", step=ring.world - 1, exchange="out", head_dim=1)  # (B, H, L, D)
    sctx.recorder.end_phase("fwd")
    return out, (q_h, k_h, v_h, out_h, lse_h)


def hybrid_backward(dout, saved, sctx):
    """Gradients of the shards: dq (B, H, L, D), dk and dv (B, KV, L, D), in the input dtype."""
    from ringbench.engine.ring import ring_backward

    q_h, k_h, v_h, out_h, lse_h = saved
    hu = sctx.heads_per_rank
    dout_h = _to_heads(sctx, lambda j: dout[:, j * hu : (j + 1) * hu], phase="bwd", step=0, exchange="dout")
    ring = sctx.ring_context()
    dout_h, out_h = sctx.kernel.prepare_backward(dout_h, out_h)  # once per call, as the ring does: no copy per block
    repeated = sctx.kv_repeats > 1  # partial dK/dV to sum: they travel unrounded (module doc)
    dq_h, dk_h, dv_h = ring_backward(dout_h, q_h, k_h, v_h, out_h, lse_h, ring, keep_acc=repeated)
    members, local = sctx.members, sctx.local
    grads_h = torch.cat([dq_h, dk_h, dv_h], dim=1)  # (B, H/U + 2 KV_i, U L, D): one message per member
    parts = {m: grads_h[..., j * local : (j + 1) * local, :] for j, m in enumerate(members)}
    received = sctx.exchange(parts, phase="bwd", step=ring.world - 1, exchange="dqkv")
    sctx.recorder.end_phase("bwd")
    kv_local = dk_h.shape[1]
    dq = torch.cat([received[m][:, :hu] for m in members], dim=1).to(q_h.dtype)  # (B, H, L, D)
    if not repeated:  # each KV head came from one member: in member order, as the query heads
        dk, dv = (torch.cat([received[m][:, hu + a * kv_local : hu + (a + 1) * kv_local] for m in members], dim=1)
                  for a in (0, 1))  # fmt: skip
        return dq, dk, dv
    kv_heads = sctx.kv_heads or sctx.heads
    batch, _, rows, head_dim = dq.shape
    summed = torch.zeros((2, batch, kv_heads, rows, head_dim), dtype=grads_h.dtype, device=grads_h.device)
    for j, member in enumerate(members):
        lo, hi = sctx.kv_span(j)
        summed[:, :, lo:hi] += received[member][:, hu:].unflatten(1, (2, kv_local)).movedim(1, 0)
    return dq, summed[0].to(k_h.dtype), summed[1].to(v_h.dtype)


__all__ = ["hybrid_backward", "hybrid_forward"]
