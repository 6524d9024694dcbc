"""Context-parallel attention written the way users write it, correct and with the bugs rings are known for.

``ring`` is one small ring attention (plain torch.distributed P2P, an autograd.Function with its own backward:
K/V travel forward, dK/dV accumulators travel with them and arrive home after N hops; partials merged in fp32)
that takes what ringbench's widened interface hands a user function: positions, document lengths, the window,
KV heads. Each exported function is that ring with one planted bug (or none), for `ringbench check` to diagnose:

    correct            the ring as it should be
    dkv_summed         dK arrives home as dK + dV (a stacked pair summed on its way home)
    dkv_local          dK/dV keep only their own rank's queries' contributions (the accumulators never travel)
    stale_kv           the backward computes every step with the rank's own K/V (saved at the first step)
    local_positions    the mask is applied to local row indices, not global positions
    contiguous_only    positions computed as if the layout were contiguous
    nan_block          a block whose rows see none of its keys gives NaN (no guard in the merge)
    low_precision      the running output, log-sum-exp and the dK/dV accumulators kept in the input dtype
    short_ring         the forward stops one ring step short
    gqa_interleaved    query head h reads KV head h % KV instead of h // (H / KV)
    window_off_by_one  query t sees t-W..t (W + 1 keys)
    hangs              rank 1 stalls in the forward (at world > 1)
    raises             rank 0 raises in the forward
    wrong_shape        returns (B, S/N, H, D)
    rejects_window     declares windows, then raises on every one
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

ALL_MASKS = ("none", "causal", "causal-document", "full-document", "window", "causal-document+window")
ALL_LAYOUTS = ("contiguous", "zigzag", "striped", "doc-balanced")


def _visible(q_pos, k_pos, *, causal, window, doc_of, bug):
    """(Lq, Lk) bool from global positions."""
    if bug == "window_off_by_one" and window is not None:
        window = window + 1
    q, k = q_pos[:, None], k_pos[None, :]
    seen = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool)
    if causal:
        seen &= k <= q
    if window is not None:
        seen &= k > q - window
    if doc_of is not None:
        seen &= doc_of[q_pos][:, None] == doc_of[k_pos][None, :]
    return seen


def _expand(x, heads, bug):
    group = heads // x.shape[1]
    if group == 1:
        return x
    return x.repeat(1, group, 1, 1) if bug == "gqa_interleaved" else x.repeat_interleave(group, dim=1)


def _reduce(x, kv):
    b, h, s, d = x.shape
    return x.reshape(b, kv, h // kv, s, d).sum(2)


def _rotate(tensors, lengths, rank, world, step, group):
    """Send ``tensors`` to rank + 1, receive the same from rank - 1 (whose block started at rank - 1 - step)."""
    source = (rank - 1 - step) % world  # whose block arrives
    incoming = [torch.empty((*t.shape[:2], lengths[source], *t.shape[3:]), dtype=t.dtype) if t.dim() == 4 else
                torch.empty(lengths[source], dtype=t.dtype) for t in tensors]  # fmt: skip
    ops = [dist.P2POp(dist.isend, t.contiguous(), (rank + 1) % world, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, (rank - 1) % world, group) for t in incoming]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return incoming


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, positions, settings):
        group, world, rank, lengths, bug = (settings[n] for n in ("group", "world", "rank", "lengths", "bug"))
        heads, scale = q.shape[1], settings["scale"]
        acc = q.dtype if bug == "low_precision" else torch.float32
        out = torch.zeros(q.shape, dtype=acc)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=acc)
        block = (k, v, positions)
        steps = world - 1 if bug == "short_ring" and world > 1 else world
        for step in range(steps):
            k_b, v_b, pos_b = block
            seen = settings["mask"](settings["q_pos"], pos_b)
            if bool(seen.any()):
                scores = torch.matmul(q.float(), _expand(k_b, heads, bug).float().transpose(-1, -2)) * scale
                scores = scores.masked_fill(~seen, float("-inf"))
                block_lse = torch.logsumexp(scores, -1)
                if bug == "nan_block":
                    block_out = torch.matmul(torch.softmax(scores, -1), _expand(v_b, heads, bug).float())
                else:
                    safe = torch.where(torch.isinf(block_lse), torch.zeros_like(block_lse), block_lse)
                    block_out = torch.matmul(torch.exp(scores - safe[..., None]), _expand(v_b, heads, bug).float())
                new_lse = torch.logaddexp(lse.float(), block_lse)
                if bug == "nan_block":
                    old_w, new_w = torch.exp(lse.float() - new_lse), torch.exp(block_lse - new_lse)
                else:
                    finite = torch.isfinite(new_lse)
                    base = torch.where(finite, new_lse, torch.zeros_like(new_lse))
                    old_w = torch.where(finite, torch.exp(lse.float() - base), torch.zeros_like(base))
                    new_w = torch.where(finite, torch.exp(block_lse - base), torch.zeros_like(base))
                out = (out.float() * old_w[..., None] + block_out * new_w[..., None]).to(acc)
                lse = new_lse.to(acc)
            if step < world - 1:
                block = _rotate(list(block), lengths, rank, world, step, group)
        ctx.save_for_backward(q, k, v, positions, out, lse)
        ctx.settings = settings
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, positions, out, lse = ctx.saved_tensors
        settings = ctx.settings
        group, world, rank, lengths, bug = (settings[n] for n in ("group", "world", "rank", "lengths", "bug"))
        heads, kv, scale = q.shape[1], k.shape[1], settings["scale"]
        acc = q.dtype if bug == "low_precision" else torch.float32
        delta = (dout.float() * out.float()).sum(-1)
        lse = lse.float()
        dq = torch.zeros(q.shape, dtype=torch.float32)
        block = [k, v, positions, torch.zeros(k.shape, dtype=acc), torch.zeros(v.shape, dtype=acc)]
        own_dkv = None
        for step in range(world):
            k_b, v_b, pos_b, dk_b, dv_b = block
            if bug == "stale_kv":
                k_b, v_b = k, v
            seen = settings["mask"](settings["q_pos"], pos_b)
            if bool(seen.any()):
                k_e, v_e = _expand(k_b, heads, bug).float(), _expand(v_b, heads, bug).float()
                scores = (torch.matmul(q.float(), k_e.transpose(-1, -2)) * scale).masked_fill(~seen, float("-inf"))
                probs = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
                dscores = probs * (torch.matmul(dout.float(), v_e.transpose(-1, -2)) - delta[..., None])
                dq += torch.matmul(dscores, k_e) * scale
                dk_b = (dk_b.float() + _reduce(torch.matmul(dscores.transpose(-1, -2), q.float()) * scale, kv)).to(acc)
                dv_b = (dv_b.float() + _reduce(torch.matmul(probs.transpose(-1, -2), dout.float()), kv)).to(acc)
            if step == 0:
                own_dkv = (dk_b, dv_b)
            block = [block[0], block[1], block[2], dk_b, dv_b]
            if world > 1:  # the last hop takes every block (and its accumulators) home
                block = _rotate(block, lengths, rank, world, step, group)
        dk, dv = block[3], block[4]
        if bug == "dkv_local":
            dk, dv = own_dkv
        if bug == "dkv_summed":
            dk = dk + dv
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None


def _attention(q, k, v, *, bug, mask, layout, group, positions, causal, window, doc_lengths, seq, scale, **_):
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    rank = dist.get_rank(group) if dist.is_initialized() else 0
    if bug == "rejects_window" and window is not None:
        raise ValueError(f"window={window} is not supported")
    if bug == "raises" and rank == 0:
        raise RuntimeError("boom: rank 0 gave up")
    if bug == "hangs" and rank == 1:
        time.sleep(3600)
    lengths = [positions.numel()] * world
    if world > 1:
        gathered = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor([positions.numel()]), group=group)
        lengths = [int(x) for x in gathered]
    q_pos = positions
    if bug == "contiguous_only":
        q_pos = sum(lengths[:rank]) + torch.arange(positions.numel())
        positions = q_pos
    if bug == "local_positions":
        q_pos = torch.arange(positions.numel())
        positions = q_pos
    doc_of = None
    if doc_lengths is not None:
        doc_of = torch.repeat_interleave(torch.arange(len(doc_lengths)), torch.tensor(doc_lengths))

    def mask_of(q_positions, k_positions):
        return _visible(q_positions, k_positions, causal=causal, window=window, doc_of=doc_of, bug=bug)

    settings = {"group": group, "world": world, "rank": rank, "lengths": lengths, "bug": bug, "scale": scale,
                "mask": mask_of, "q_pos": q_pos}  # fmt: skip
    out = _Ring.apply(q, k, v, positions, settings)
    return out.transpose(1, 2) if bug == "wrong_shape" else out


def _declare(function):
    function.ringbench_masks = ALL_MASKS
    function.ringbench_layouts = ALL_LAYOUTS
    function.ringbench_gqa = True
    function.ringbench_uneven = True
    return function


def _make(bug: str):
    def attention(q, k, v, *, mask, layout, group, **given):
        return _attention(q, k, v, bug=bug, mask=mask, layout=layout, group=group, **given)

    attention.__name__ = bug
    return _declare(attention)


BUGS = ("correct", "dkv_summed", "dkv_local", "stale_kv", "local_positions", "contiguous_only", "nan_block",
        "low_precision", "short_ring", "gqa_interleaved", "window_off_by_one", "hangs", "raises", "wrong_shape",
        "rejects_window")  # fmt: skip
correct = _make("correct")
dkv_summed = _make("dkv_summed")
dkv_local = _make("dkv_local")
stale_kv = _make("stale_kv")
local_positions = _make("local_positions")
contiguous_only = _make("contiguous_only")
nan_block = _make("nan_block")
low_precision = _make("low_precision")
short_ring = _make("short_ring")
gqa_interleaved = _make("gqa_interleaved")
window_off_by_one = _make("window_off_by_one")
hangs = _make("hangs")
raises = _make("raises")
wrong_shape = _make("wrong_shape")
rejects_window = _make("rejects_window")


def legacy(q, k, v, *, mask, layout, group):
    """A function written for the first interface (mask, layout, group only): still called that way."""
    from ringbench.engine.api import ring_attention

    return ring_attention(q, k, v, mask=mask, layout=layout, group=group)


legacy.ringbench_layouts = ("contiguous", "zigzag")


def blocks_of_8(q, k, v, *, mask, layout, group, **given):
    """A correct ring that takes only runs of whole blocks of 8 tokens, and says so."""
    runs = given["positions"].numel() // (2 if layout == "zigzag" else 1)
    if layout != "striped" and runs % 8:
        raise ValueError(f"runs of {runs} tokens: blocks of 8 only")
    return correct(q, k, v, mask=mask, layout=layout, group=group, **given)


blocks_of_8.ringbench_multiple = 8
blocks_of_8.ringbench_masks = ("causal", "window")
blocks_of_8.ringbench_layouts = ("contiguous", "zigzag")


def forward_only(q, k, v, *, mask, layout, group, **given):
    """The correct ring, declared forward only: check compares out (and never differentiates)."""
    with torch.no_grad():
        return correct(q, k, v, mask=mask, layout=layout, group=group, **given)


forward_only.ringbench_backward = False


def never_alone(q, k, v, *, mask, layout, group, **given):
    """The correct ring, declared to need two ranks at least."""
    return correct(q, k, v, mask=mask, layout=layout, group=group, **given)


never_alone.ringbench_min_world = 2
