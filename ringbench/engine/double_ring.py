"""The double ring (LoongTrain): inner rings of W ranks, an outer ring across them, forward and backward.

Rank (g, i) -- group g of the placement, index i in it -- holds at outer step o the *outer block* of rank
(g - o, i) (its own at o = 0). With it, an inner rotation runs: today's ring (ringbench/engine/ring.py) over the
W ranks of group g, whose blocks at that rotation are the outer blocks of group g - o; so at inner step s the block
in hand is the shard of rank (g - o, i - s), and after N/W rotations every rank has seen every shard once.

Double buffering on the outer ring: the exchange that brings the next outer block (from (g-1, i)) is posted when
a rotation starts and waited for when it ends, so a slow link between inner rings hides behind W steps of compute
instead of one. ``sync``: the outer exchange is made, then the rotation runs.

Backward: each rotation is the ring's backward over the inner ring; its dK/dV accumulator travels the inner ring
and comes home to the rank that held the outer block. That sum, plus the outer block's accumulator from the outer
predecessor (which travelled while this rotation computed; ``double``), goes on to the outer successor, where the
block goes next; after the last rotation it lands on the block's own rank, fully summed.

Partial results stay in the statistics dtype (fp32 for 16-bit inputs) between rotations: each rotation's (out,
lse) and dK/dV come back unrounded and are merged or summed in fp32; only the final result is rounded to the input
dtype, once, as the ring does.

Steps of the record: rotation o covers steps o W .. o W + W - 1; its outer K/V exchange is labelled with step o W,
its outer dK/dV exchange with o W + W - 1 (the posting steps, as the ring labels its own exchanges).
"""

from __future__ import annotations

import torch

from ringbench.engine.merge import merge_into
from ringbench.engine.subring import post, wait
from ringbench.kernels.base import stats_dtype
from ringbench.vocab import Buffer


def _rotation_context(sctx, outer_step: int):
    """The inner ring's context for rotation ``outer_step``: inner rank (g, j) holds the shard of (g - o, j)."""
    return sctx.inner_context(outer_step)


def _own_block(k, v, outer):
    """The outer block in hand at rotation 0: stacked when it travels the outer ring, else (k, v) as they are."""
    return torch.stack([k, v]) if outer is not None else (k, v)


def double_ring_forward(q, k, v, sctx):
    """(B, H, L, D) shards -> (out in q's dtype, lse in the statistics dtype)."""
    from ringbench.engine.ring import ring_forward

    acc = stats_dtype(q.dtype)
    acc_out = torch.zeros(q.shape, dtype=acc, device=q.device)  # the merge's identity: (out=0, lse=-inf)
    acc_lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc, device=q.device)
    outer = sctx.outer_comm
    block, spare = _own_block(k, v, outer), None  # (2, B, H, L, D): the outer block in hand
    rotations, width = sctx.outer_world, sctx.inner_world
    sync = sctx.buffer is Buffer.SYNC
    for o in range(rotations):
        sctx.recorder.on_step("fwd", o * width)
        pending = None
        if outer is not None and sync and o >= 1:  # the outer block of this rotation, then the rotation
            spare = torch.empty_like(block) if spare is None else spare
            posted = post(outer, block, into=spare, phase="fwd", step=o * width, exchange="kv", blocking=True)
            block, spare = wait(posted, sctx.recorder, sctx.timeline), block
        if outer is not None and not sync and o < rotations - 1:  # double: the next outer block travels meanwhile
            spare = torch.empty_like(block) if spare is None else spare
            pending = post(outer, block, into=spare, phase="fwd", step=o * width, exchange="kv")
        out_o, lse_o = ring_forward(q, block[0], block[1], _rotation_context(sctx, o), keep_acc=True)
        merge_into(acc_out, acc_lse, out_o, lse_o)
        if pending is not None:
            block, spare = wait(pending, sctx.recorder, sctx.timeline), block
    sctx.recorder.end_phase("fwd")
    return acc_out.to(q.dtype), acc_lse


def double_ring_backward(dout, q, k, v, out, lse, sctx):
    """Gradients of the shards (dq, dk, dv), each (B, H, L, D) in the input dtype."""
    from ringbench.engine.ring import ring_backward

    acc = stats_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    outer = sctx.outer_comm
    block, spare = _own_block(k, v, outer), None
    rotations, width = sctx.outer_world, sctx.inner_world
    sync = sctx.buffer is Buffer.SYNC
    dout, out = sctx.kernel.prepare_backward(dout, out)  # once per call, as the ring does: no copy per block
    buffers = [torch.empty((2, *k.shape), dtype=acc, device=q.device) for _ in range(2)] if outer else []
    dkv_pending, incoming, sent = None, None, None  # sent: kept alive until its exchange completed
    total = None
    for o in range(rotations):
        sctx.recorder.on_step("bwd", o * width)
        kv_pending = None
        if outer is not None and sync and o >= 1:
            spare = torch.empty_like(block) if spare is None else spare
            posted = post(outer, block, into=spare, phase="bwd", step=o * width, exchange="kv", blocking=True)
            block, spare = wait(posted, sctx.recorder, sctx.timeline), block
        if outer is not None and not sync and o < rotations - 1:
            spare = torch.empty_like(block) if spare is None else spare
            kv_pending = post(outer, block, into=spare, phase="bwd", step=o * width, exchange="kv")
        dq_o, dk_o, dv_o = ring_backward(dout, q, block[0], block[1], out, lse, _rotation_context(sctx, o),
                                         keep_acc=True)  # fmt: skip
        dq += dq_o
        total = torch.stack([dk_o, dv_o])  # (2, B, H, L, D) in fp32: this group's part of the block's dK, dV
        if dkv_pending is not None:  # double: the block's accumulator from the groups before travelled meanwhile
            incoming, dkv_pending = wait(dkv_pending, sctx.recorder, sctx.timeline), None
        if incoming is not None:
            total += incoming
            incoming = None
        if outer is not None:  # on to where the block goes next (after the last rotation: its own rank)
            sent = total
            dkv_pending = post(sctx.outer_dkv_comm, sent, into=buffers[o % 2], phase="bwd",
                               step=o * width + width - 1, exchange="dkv", blocking=sync)  # fmt: skip
            if sync or o == rotations - 1:
                incoming, dkv_pending = wait(dkv_pending, sctx.recorder, sctx.timeline), None
        if kv_pending is not None:
            block, spare = wait(kv_pending, sctx.recorder, sctx.timeline), block
    if outer is not None:
        total = incoming  # the own block's accumulator, home after the last outer hop
    sctx.recorder.end_phase("bwd")
    return dq.to(q.dtype), total[0].to(k.dtype), total[1].to(v.dtype)


__all__ = ["double_ring_backward", "double_ring_forward"]
