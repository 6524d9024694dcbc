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


def hybrid_forward(q, k, v, sctx):
    """(B, H, L, D) shards -> (out (B, H, L, D) in q's dtype, saved head-layout tensors for the backward)."""
    from ringbench.engine.ring import ring_forward

    hu = sctx.heads_per_rank
    stacked = _to_heads(sctx, lambda j: torch.stack([t[:, j * hu : (j + 1) * hu] for t in (q, k, v)]),
                        phase="fwd", step=0, exchange="qkv")  # (3, B, H/U, U L, D)  # fmt: skip
    q_h, k_h, v_h = stacked.unbind(0)
    ring = sctx.ring_context()
    out_h, lse_h = ring_forward(q_h, k_h, v_h, ring)  # (B, H/U, U L, D), (B, H/U, U L)
    out = _to_rows(sctx, out_h, phase="fwd", step=ring.world - 1, exchange="out", head_dim=1)  # (B, H, L, D)
    sctx.recorder.end_phase("fwd")
    return out, (q_h, k_h, v_h, out_h, lse_h)


def hybrid_backward(dout, saved, sctx):
    """Gradients of the shards (dq, dk, dv), each (B, H, L, D) in the input dtype."""
    from ringbench.engine.ring import ring_backward

    q_h, k_h, v_h, out_h, lse_h = saved
    hu = sctx.heads_per_rank
    dout_h = _to_heads(sctx, lambda j: dout[:, j * hu : (j + 1) * hu], phase="bwd", step=0, exchange="dout")
    ring = sctx.ring_context()
    dout_h, out_h = sctx.kernel.prepare_backward(dout_h, out_h)  # once per call, as the ring does: no copy per block
    dq_h, dk_h, dv_h = ring_backward(dout_h, q_h, k_h, v_h, out_h, lse_h, ring)
    grads = _to_rows(sctx, torch.stack([dq_h, dk_h, dv_h]), phase="bwd", step=ring.world - 1, exchange="dqkv",
                     head_dim=2)  # (3, B, H, L, D)  # fmt: skip
    sctx.recorder.end_phase("bwd")
    return grads.unbind(0)


__all__ = ["hybrid_backward", "hybrid_forward"]
