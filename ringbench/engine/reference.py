"""The float64 attention reference of ringbench: one implementation, streaming, restricted to a rank's rows.

For one query row i and the keys j it may see (ringbench.engine.masks.MaskRule: all, j <= i under a causal mask, one
document, a window: always an interval [lo_i, hi_i] of positions), with c = D^-1/2:
    s_ij = c q_i . k_j,   lse_i = log sum_j exp(s_ij),   p_ij = exp(s_ij - lse_i),   o_i = sum_j p_ij v_j.
Online softmax over key tiles keeps a running max m_i, sum l_i = sum_j exp(s_ij - m_i) and acc_i = sum_j
exp(s_ij - m_i) v_j; a tile with row max m' rescales by alpha = exp(m_i - m'):
    l_i <- alpha l_i + sum_tile exp(s_ij - m'),   acc_i <- alpha acc_i + sum_tile exp(s_ij - m') v_j,
and at the end o_i = acc_i / l_i, lse_i = m_i + log l_i. A tile in which a row sees nothing (documents, windows)
leaves m_i = -inf; the update then subtracts 0 instead (m_safe), so exp(-inf - 0) = 0 and nothing is NaN. Every row
sees at least its own key, so lse_i is finite at the end. Backward, with dO:
    dp_ij = dO_i . v_j,   delta_i = sum_j p_ij dp_ij = dO_i . o_i,   ds_ij = p_ij (dp_ij - delta_i),
    dq_i = c sum_j ds_ij k_j,   dk_j = c sum_i ds_ij q_i,   dv_j = sum_i p_ij dO_i.
Grouped-query attention (K, V of KV heads, query head h reading KV head h // (H / KV)): the reference repeats each KV
head for its query heads as it reads them (it is the oracle, so clarity beats memory) and sums dk, dv over each
group at the end, in float64.
dq of a rank's rows streams over key tiles. dk, dv of its key rows need every query row's lse and delta, so the
whole sequence is swept in query groups (a constant number of tokens): each group's (o, lse) is recomputed by
streaming the keys, then its contribution is added to the rank's dk, dv. Inputs are regenerated from the seed
(ringbench.engine.inputs), so per-rank memory is O(S/N + tile^2 + group) and no (S x S) or (S x D) tensor exists; the
price is compute: the sweep is a full attention forward on every rank. ``check_errors`` therefore estimates its
cost and, over ``budget_s``, checks less and says so (see CheckResult).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ringbench.engine.inputs import CHUNK_TOKENS, ShardSpec, token_block, token_rows
from ringbench.engine.layout import token_positions
from ringbench.engine.masks import MaskRule, mask_rule
from ringbench.errors import bad_value
from ringbench.kernels.base import expand_kv, sum_kv


@dataclass(frozen=True, slots=True)
class Block:
    """A run of rows [rows.start, rows.stop) whose global token positions span [first, last]."""

    rows: slice
    positions: torch.Tensor  # (r,) on the compute device
    first: int
    last: int
    lo: torch.Tensor | None = None  # (r,) first visible key position of each row (query blocks), on the device
    hi: torch.Tensor | None = None  # (r,) last visible key position of each row
    lo_max: int = 0  # every row sees [lo_max, hi_min] when that is not empty: a tile inside it needs no mask
    hi_min: int = -1
    lo_min: int = 0  # no row sees outside [lo_min, hi_max]
    hi_max: int = -1


# (lo, hi) -> (block, k, v) over key positions [lo, hi), ascending
KeyTiles = Callable[[int, int], Iterator[tuple[Block, torch.Tensor, torch.Tensor]]]


def blocks(positions: torch.Tensor, tile: int, device, rule: MaskRule | None = None) -> list[Block]:
    """Cut rows into tiles of ``tile`` rows; ``positions`` (R,) on the CPU. With ``rule`` (query rows) each tile
    also carries its rows' visible key bounds."""
    out = []
    for lo in range(0, positions.numel(), tile):
        part = positions[lo : lo + tile]
        extra = {}
        if rule is not None:
            k_lo, k_hi = rule.key_bounds(part.numpy())
            extra = dict(lo=torch.as_tensor(k_lo).to(device), hi=torch.as_tensor(k_hi).to(device),
                         lo_max=int(k_lo.max()), hi_min=int(k_hi.min()), lo_min=int(k_lo.min()),
                         hi_max=int(k_hi.max()))  # fmt: skip
        out.append(Block(slice(lo, lo + part.numel()), part.to(device), int(part.min()), int(part.max()), **extra))
    return out


def _scores(q, q_block: Block, k, k_block: Block, scale: float) -> torch.Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # (B, H, r, c)
    if not (q_block.lo_max <= k_block.first and k_block.last <= q_block.hi_min):  # some key hidden from some row
        keys = k_block.positions[None, :]
        hidden = (keys < q_block.lo[:, None]) | (keys > q_block.hi[:, None])  # (r, c)
        scores = scores.masked_fill(hidden, float("-inf"))
    return scores


def _visible(q_block: Block, k_block: Block) -> bool:
    """Some row of the query block may see some key of the key tile (its keys are consecutive positions)."""
    return (
        q_block.lo_min <= k_block.last
        and k_block.first <= q_block.hi_max
        and bool(((q_block.lo <= k_block.last) & (q_block.hi >= k_block.first) & (q_block.lo <= q_block.hi)).any())
    )


def _key_span(q_blocks: list[Block]) -> tuple[int, int]:
    """[lo, hi) of the key positions any of the rows sees."""
    return min(b.lo_min for b in q_blocks), max(b.hi_max for b in q_blocks) + 1


def attend_rows(q, q_blocks: list[Block], key_tiles: KeyTiles, *, scale: float, tick=None):
    """(out (B, H, R, D), lse (B, H, R)) of query rows ``q`` (B, H, R, D) by online softmax over key tiles.

    ``q_blocks`` come from ``blocks(..., rule=...)`` (they carry the rows' visible key bounds). Functional updates
    only, so autograd can differentiate it (``attention`` relies on that).
    """
    m = [torch.full_like(q[:, :, b.rows, 0], -math.inf) for b in q_blocks]  # (B, H, r) running row max
    total = [torch.zeros_like(x) for x in m]
    acc = [torch.zeros_like(q[:, :, b.rows]) for b in q_blocks]
    for step, (k_block, k, v) in enumerate(key_tiles(*_key_span(q_blocks))):
        if tick is not None:
            tick(step)
        for i, q_block in enumerate(q_blocks):
            if not _visible(q_block, k_block):
                continue
            scores = _scores(q[:, :, q_block.rows], q_block, k, k_block, scale)  # (B, H, r, c)
            m_new = torch.maximum(m[i], scores.detach().amax(-1))  # o is invariant to m: no gradient through it
            m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)  # a row that saw nothing
            alpha = torch.exp(m[i] - m_safe)
            probs = torch.exp(scores - m_safe[..., None])
            total[i] = alpha * total[i] + probs.sum(-1)
            acc[i] = alpha[..., None] * acc[i] + torch.matmul(probs, v)  # (B, H, r, D)
            m[i] = m_new
    out = torch.cat([a / t[..., None] for a, t in zip(acc, total, strict=True)], dim=2)  # (B, H, R, D)
    lse = torch.cat([mi + torch.log(t) for mi, t in zip(m, total, strict=True)], dim=2)  # (B, H, R)
    return out, lse


def grad_rows(q, dout, lse, delta, q_blocks, key_tiles: KeyTiles, *, scale, tick=None):
    """dq (B, H, R, D) of query rows: c sum_j p_ij (dp_ij - delta_i) k_j, streaming over key tiles."""
    dq = torch.zeros_like(q)
    for step, (k_block, k, v) in enumerate(key_tiles(*_key_span(q_blocks))):
        if tick is not None:
            tick(step)
        for q_block in q_blocks:
            if not _visible(q_block, k_block):
                continue
            rows = q_block.rows
            scores = _scores(q[:, :, rows], q_block, k, k_block, scale)
            probs = torch.exp(scores - lse[:, :, rows, None])  # (B, H, r, c)
            dprobs = torch.matmul(dout[:, :, rows], v.transpose(-1, -2))
            dq[:, :, rows] += torch.matmul(probs * (dprobs - delta[:, :, rows, None]), k)
    return dq * scale


class QueryGroup(NamedTuple):
    """A group of query rows as the key gradients read them: q, dO, their lse and delta = dO . o, and their blocks."""

    q: torch.Tensor
    dout: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    blocks: list


def add_key_grads(dk, dv, k, v, k_blocks, queries: QueryGroup, *, scale) -> None:
    """dk += c sum_i ds_ij q_i and dv += sum_i p_ij dO_i for key rows ``k``, over the query rows given (in place)."""
    q, dout, lse, delta, q_blocks = queries
    for k_block in k_blocks:
        keys = k_block.rows
        for q_block in q_blocks:
            if not _visible_rows(q_block, k_block):
                continue
            rows = q_block.rows
            scores = _scores(q[:, :, rows], q_block, k[:, :, keys], k_block, scale)
            probs = torch.exp(scores - lse[:, :, rows, None])  # (B, H, r, c)
            dprobs = torch.matmul(dout[:, :, rows], v[:, :, keys].transpose(-1, -2))
            dscores = probs * (dprobs - delta[:, :, rows, None])
            dv[:, :, keys] += torch.matmul(probs.transpose(-1, -2), dout[:, :, rows])  # (B, H, c, D)
            dk[:, :, keys] += torch.matmul(dscores.transpose(-1, -2), q[:, :, rows]) * scale


def _visible_rows(q_block: Block, k_block: Block) -> bool:
    """Some query row sees some key of a key block whose positions need not be consecutive (a rank's rows)."""
    if not (q_block.lo_min <= k_block.last and k_block.first <= q_block.hi_max):
        return False
    keys = k_block.positions
    return bool(((keys[None, :] >= q_block.lo[:, None]) & (keys[None, :] <= q_block.hi[:, None])).any())


def _tiles_of(lo: int, hi: int, tile: int, device) -> list[Block]:
    """Key tiles over positions [lo, hi), aligned to multiples of ``tile``."""
    start = max(0, lo) // tile * tile
    return [Block(slice(a, min(a + tile, hi)), torch.arange(a, min(a + tile, hi), device=device), a,
                  min(a + tile, hi) - 1) for a in range(start, hi, tile)]  # fmt: skip


def attention(q, k, v, *, causal: bool = True, scale: float | None = None, tile: int = CHUNK_TOKENS,
              rule: MaskRule | None = None) -> torch.Tensor:  # fmt: skip
    """Float64 attention of in-memory (B, H, S, D) tensors, token i at position i; autograd-capable.

    ``rule``: the mask (a MaskRule of ringbench.engine.masks); without it, causal or none. The small-shape oracle
    behind ``ringbench.engine.api.reference_attention``: the same math as the streaming check. k, v may have fewer
    heads than q (grouped-query attention); their gradients then sum over each group.
    """
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), expand_kv(k.double(), group), expand_kv(v.double(), group)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    seq = k.shape[-2]
    rule = rule if rule is not None else mask_rule("causal" if causal else "none", "none", seq)

    def tiles(lo: int, hi: int):
        for block in _tiles_of(lo, min(hi, seq), tile, k.device):
            yield block, k[:, :, block.rows], v[:, :, block.rows]

    q_blocks = blocks(torch.arange(q.shape[-2]), tile, q.device, rule)
    out, _ = attend_rows(q, q_blocks, tiles, scale=scale)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class RankReference:
    """Float64 reference of one rank's rows; dq, dk, dv are None when not computed."""

    out: torch.Tensor  # (B, H, R, D), R = the rows asked for
    lse: torch.Tensor  # (B, H, R)
    dq: torch.Tensor | None
    dk: torch.Tensor | None  # (B, KV, R, D)
    dv: torch.Tensor | None


def rank_reference(shard: ShardSpec, mask, *, device=None, backward=True, key_grads=True, rows=None, sizes=None,
                   tick=None) -> RankReference:  # fmt: skip
    """The float64 out, lse, dq of a rank's query rows and dk, dv of its key rows (the inputs of ``shard``,
    ringbench.engine.inputs).

    ``mask``: a mode name or a MaskRule (which carries the documents of a document mask). ``rows``: local row
    indices to restrict out/lse/dq to (then dk, dv are not computed). ``key_grads=False`` skips dk, dv (their
    full-sequence sweep is most of the cost). ``sizes``: (score tile, query group) in tokens (default:
    ``default_sizes``).
    """
    seq = shard.seq
    rule = mask_rule(mask, "none", seq)
    device = torch.device(device) if device is not None else torch.device("cpu")
    plan_tile, plan_group = _sizes(device, shard.batch * shard.heads, sizes)
    scale = shard.head_dim**-0.5
    group = shard.heads // shard.heads_of("k")  # query heads per KV head (module doc)
    positions = token_positions(shard.layout, seq, shard.world, shard.rank, rule)  # (R,) CPU
    q_positions = positions if rows is None else positions[torch.as_tensor(rows, dtype=torch.long)]

    def local(name: str, where: torch.Tensor) -> torch.Tensor:
        return expand_kv(token_rows(shard, name, where, float64=True).to(device), group if name in ("k", "v") else 1)

    def key_tiles(lo: int, hi: int):
        for block in _tiles_of(lo, min(hi, seq), plan_tile, device):
            a, b = block.rows.start, block.rows.stop
            k, v = (expand_kv(token_block(shard, n, a, b, device), group) for n in ("k", "v"))  # (B, H, c, D)
            yield block, k, v

    common = dict(scale=scale)
    with torch.no_grad():
        q = local("q", q_positions)
        q_blocks = blocks(q_positions, plan_tile, device, rule)
        out, lse = attend_rows(q, q_blocks, key_tiles, tick=tick, **common)
        if not backward:
            return RankReference(out=out, lse=lse, dq=None, dk=None, dv=None)
        dout = local("dout", q_positions)
        delta = (dout * out).sum(-1)  # (B, H, R): dO_i . o_i
        dq = grad_rows(q, dout, lse, delta, q_blocks, key_tiles, tick=tick, **common)
        del q, dout, delta
        if rows is not None or not key_grads:
            return RankReference(out=out, lse=lse, dq=dq, dk=None, dv=None)
        k, v = local("k", positions), local("v", positions)
        k_blocks = blocks(positions, plan_tile, device)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        first, last = rule.query_range(int(positions.min()), int(positions.max()))  # queries that see our keys
        for step, lo in enumerate(range(first // plan_group * plan_group, last, plan_group)):
            hi = min(lo + plan_group, last)
            q_g, dout_g = (token_block(shard, n, lo, hi, device) for n in ("q", "dout"))
            g_blocks = blocks(torch.arange(lo, hi), plan_tile, device, rule)
            out_g, lse_g = attend_rows(q_g, g_blocks, key_tiles, **common)  # (B, H, G, D), (B, H, G)
            delta_g = (dout_g * out_g).sum(-1)
            add_key_grads(dk, dv, k, v, k_blocks, QueryGroup(q_g, dout_g, lse_g, delta_g, g_blocks), scale=scale)
            if tick is not None:
                tick(step)
    return RankReference(out=out, lse=lse, dq=dq, dk=sum_kv(dk, group), dv=sum_kv(dv, group))


# --- sizes, cost and the budgeted check -------------------------------------------------------------------------

MIN_SAMPLE_ROWS = 8  # a sampled check looks at no fewer rows than this (or all, if fewer)
SAFETY = 1.5  # the estimate is multiplied by this before it is held against the budget


def default_sizes(device, batch_heads: int) -> tuple[int, int]:
    """(tile, group) in tokens. CPU: one input chunk per tile (cache-sized scores). CUDA: the largest multiple
    of the chunk with tile^2 * B * H * 8 bytes <= 64 MiB, so that kernel launches do not dominate. The query
    group of the dk/dv sweep is 16 tiles: keys are regenerated once per group, so generation costs about
    1/(2 * group) of the arithmetic per value, and group memory stays a constant."""
    tile = CHUNK_TOKENS
    if torch.device(device).type == "cuda":
        fit = int(math.sqrt((64 << 20) / (8 * batch_heads))) // CHUNK_TOKENS * CHUNK_TOKENS
        tile = min(max(fit, CHUNK_TOKENS), 8 * CHUNK_TOKENS)
    return tile, 16 * tile


def _sizes(device, batch_heads: int, sizes) -> tuple[int, int]:
    tile, group = sizes if sizes is not None else (None, None)
    tile = default_sizes(device, batch_heads)[0] if tile is None else tile
    group = 16 * tile if group is None and isinstance(tile, int) else group
    for field, value in (("tile", tile), ("group", group)):
        if not isinstance(value, int) or value < 1:
            raise bad_value(field, value, "an integer >= 1")
    return tile, group


def _unit_costs(device, batch_heads: int, head_dim: int, tile: int, dtype) -> tuple[float, float]:
    """(seconds per (tile x tile x D) float64 matmul incl. its softmax share, seconds per generated token).

    Timed on the device: one forward tile (2 matmuls + exp), best of 5 after a warm-up; one input chunk."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn((1, batch_heads, tile, head_dim), generator=gen, device=device, dtype=torch.float64)
               for _ in range(3))  # fmt: skip
    block = blocks(torch.arange(tile), tile, device, mask_rule("causal", "none", tile))[0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = math.inf
    for attempt in range(6):
        sync()
        start = time.perf_counter()
        scores = _scores(q, block, k, block, 1.0)
        torch.matmul(torch.exp(scores - scores.amax(-1, keepdim=True)), v)
        sync()
        best = best if attempt == 0 else min(best, time.perf_counter() - start)
    start = time.perf_counter()
    chunk = ShardSpec(seed=0, batch=1, heads=batch_heads, head_dim=head_dim, seq=CHUNK_TOKENS, dtype=dtype)
    token_block(chunk, "k", 0, CHUNK_TOKENS, device)
    sync()
    return best / 2, (time.perf_counter() - start) / CHUNK_TOKENS


def estimate_units(positions: torch.Tensor, *, seq: int, causal: bool, tile: int, group: int) -> dict[str, float]:
    """Work of each stage: 'fwd', 'dq', 'dkdv' in tile matmuls, 'tokens' regenerated (k and v, all passes).

    A forward tile is 2 matmuls (q k^T, p v), a dq tile 3 (q k^T, dO v^T, ds k), a dk/dv tile 4 (q k^T, dO v^T,
    ds^T q, p^T dO). Query tiles of the rank's rows see ceil((last + 1) / tile) key tiles when causal (S/tile
    otherwise); query tile j of the sweep sees j + 1, and a rank key tile starting at position f receives
    from the query tiles j >= f // tile.
    """
    key_tiles = math.ceil(seq / tile)
    rows = [positions[lo : lo + tile] for lo in range(0, positions.numel(), tile)]
    seen = [math.ceil((int(r.max()) + 1) / tile) if causal else key_tiles for r in rows]
    row_tiles = sum(len(r) / tile * n for r, n in zip(rows, seen, strict=True))
    start = (int(positions.min()) // group * group) if causal else 0
    sweep_q = range(start // tile, key_tiles)
    sweep_fwd = sum((j + 1) if causal else key_tiles for j in sweep_q)
    kv = sum(len(r) / tile * (key_tiles - (int(r.min()) // tile if causal else start // tile)) for r in rows)
    group_ends = [min(lo + group, seq) for lo in range(start, seq, group)]
    sweep_tokens = sum(end if causal else seq for end in group_ends)
    limit = max(seen) * tile
    return {
        "fwd": 2 * row_tiles,
        "dq": 3 * row_tiles,
        "dkdv": 2 * sweep_fwd + 4 * kv,
        "tokens_fwd": 2.0 * limit,
        "tokens_dq": 2.0 * limit,
        "tokens_dkdv": 2.0 * sweep_tokens + 2.0 * (seq - start),
    }


TENSORS = ("out", "lse", "dq", "dk", "dv")


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckResult:
    """Max abs errors of a rank's rows against the float64 reference, and how much was checked."""

    fwd_err: float  # out, over the checked rows; NaN (or inf) if any value of out is NaN (inf)
    bwd_err: float  # max over the gradients named in ``grads``; NaN if any gradient holds a NaN; NaN if no backward
    sampled: bool  # True when less than out, dq, dk, dv on every row was checked
    rows_checked: int  # query rows whose out (and dq) were compared
    rows_total: int  # the rank's rows, S/N
    grads: tuple[str, ...]  # the gradients compared: ("dq", "dk", "dv"), ("dq",) or ()
    estimated_s: float  # the estimated cost of the full check on this device (NaN when no budget was given)
    note: str  # one line saying what was left out and why; "" for a full check
    # Per tensor (TENSORS): its max abs error over the checked rows; NaN when not compared (lse not given, a forward-
    # only case, dk/dv over the budget) or when it holds a NaN (the run's ``nonfinite`` column tells which).
    out_err: float = math.nan
    lse_err: float = math.nan
    dq_err: float = math.nan
    dk_err: float = math.nan
    dv_err: float = math.nan

    def errors(self) -> dict[str, float]:
        """{tensor: max abs error} for every tensor of TENSORS (NaN where not compared)."""
        return {name: getattr(self, f"{name}_err") for name in TENSORS}


def _nonfinite(got: torch.Tensor) -> float:
    if bool(torch.isfinite(got).all()):
        return 0.0
    return math.nan if bool(torch.isnan(got).any()) else math.inf


def _worst(*values: float) -> float:
    """max() that lets NaN win (max(0.0, nan) is 0.0 in Python)."""
    return math.nan if any(math.isnan(x) for x in values) else max(values)


def _error(got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor | None) -> float:
    """Max abs error of ``got``'s rows (all, or ``rows``) against ``want``; NaN/inf anywhere in got wins."""
    chosen = got if rows is None else got.index_select(2, rows.to(got.device))
    err = (chosen.detach().to(want.device, torch.float64) - want).abs().max().item()
    return _worst(err, _nonfinite(got.detach()))


def _lse_error(got: torch.Tensor, want: torch.Tensor, rows: torch.Tensor | None) -> float:
    """Max abs error of a log-sum-exp (B, H, R), natural-log units as the reference's; NaN or inf in it wins."""
    chosen = got if rows is None else got.index_select(2, rows.to(got.device))
    return float((chosen.detach().to(want.device, torch.float64) - want).abs().max()) if want.numel() else 0.0


def check_errors(out, grads, shard: ShardSpec, mask, *, device=None, budget_s=None, tick=None, sizes=None,
                 lse=None) -> CheckResult:  # fmt: skip
    """Compare the ring's ``out`` and ``grads`` = (dq, dk, dv) (this rank's local rows: out and dq (B, H, S/N, D),
    dk and dv (B, KV, S/N, D); any dtype and device; grads None for a forward-only case) and, when given, its
    ``lse`` (B, H, S/N) with the float64 reference, computed on ``device`` (default: out's device) from the
    ``shard`` ringbench.engine.inputs.rank_shards made. ``mask``: a mode name or a MaskRule; ``sizes``: as
    ``rank_reference`` takes them. Each tensor's error is in the result (``CheckResult.errors``); ``fwd_err`` is
    out's, ``bwd_err`` the worst gradient's.

    With ``budget_s`` (seconds), the full check's cost is estimated from a quick timing on the device; beyond the
    budget it drops dk, dv (their full-sequence sweep) and, if still too slow, checks out and dq on an evenly
    spaced sample of rows. NaN anywhere in out or grads still makes the error NaN.
    """
    device = torch.device(device) if device is not None else out.device
    seq, batch_heads = shard.seq, shard.batch * shard.heads
    rule = mask_rule(mask, "none", seq)
    causal = rule.causal or rule.documents  # the cost estimate: a document mask sees no more than causal would
    positions = token_positions(shard.layout, seq, shard.world, shard.rank, rule)
    total = positions.numel()
    for name, got in zip(("out", "dq", "dk", "dv"), (out, *(grads or ())), strict=False):
        expected = (shard.batch, shard.heads_of("k" if name in ("dk", "dv") else "q"), total, shard.head_dim)
        if tuple(got.shape) != expected:
            raise bad_value(f"{name}.shape", tuple(got.shape), f"{expected} (this rank's rows)")
    if lse is not None and tuple(lse.shape) != (shard.batch, shard.heads, total):
        raise bad_value("lse.shape", tuple(lse.shape), f"{(shard.batch, shard.heads, total)} (this rank's rows)")
    backward = grads is not None
    plan_tile, plan_group = _sizes(device, batch_heads, sizes)
    rows, key_grads, estimated, note = None, backward, math.nan, ""
    if budget_s is not None:
        units = estimate_units(positions, seq=seq, causal=causal, tile=plan_tile, group=plan_group)
        unit_s, token_s = _unit_costs(device, batch_heads, shard.head_dim, plan_tile, shard.dtype)
        stages = ("fwd", "dq", "dkdv") if backward else ("fwd",)
        cost = {s: SAFETY * (units[s] * unit_s + units[f"tokens_{s}"] * token_s) for s in stages}
        estimated = sum(cost.values())
        if estimated > budget_s and backward and cost["fwd"] + cost["dq"] <= budget_s:
            key_grads = False
            note = f"dk, dv not checked: their full-sequence sweep (est. {cost['dkdv']:.3g} s) exceeds budget_s={budget_s:g}"
        elif estimated > budget_s:
            per_row = SAFETY * unit_s * (5 if backward else 2) * math.ceil(seq / plan_tile) / plan_tile
            fixed = SAFETY * (units["tokens_fwd"] + (units["tokens_dq"] if backward else 0.0)) * token_s
            count = min(total, max(MIN_SAMPLE_ROWS, int((budget_s - fixed) / per_row)))
            rows = torch.arange(count) * (total - 1) // max(count - 1, 1)  # evenly spaced local rows, first and last
            key_grads = False
            what = "out, dq" if backward else "out"
            note = (f"sampled: {what} on {count} of {total} rows (evenly spaced){'; dk, dv not checked' if backward else ''}"
                    f": the full check (est. {estimated:.3g} s) exceeds budget_s={budget_s:g}")  # fmt: skip
    ref = rank_reference(shard, rule, device=device, backward=backward, key_grads=key_grads, rows=rows,
                         sizes=(plan_tile, plan_group), tick=tick)  # fmt: skip
    errors = {"out": _error(out, ref.out, rows)}
    if lse is not None:
        errors["lse"] = _lse_error(lse, ref.lse, rows)
    names: tuple[str, ...] = ()
    bwd_err = math.nan
    if backward:
        dq, dk, dv = grads
        names = ("dq", "dk", "dv") if key_grads else ("dq",)
        errors["dq"] = bwd_err = _error(dq, ref.dq, rows)
        if key_grads:
            errors |= {"dk": _error(dk, ref.dk, None), "dv": _error(dv, ref.dv, None)}
            bwd_err = _worst(bwd_err, errors["dk"], errors["dv"])
        else:
            bwd_err = _worst(bwd_err, _nonfinite(dk.detach()), _nonfinite(dv.detach()))
    checked = total if rows is None else rows.numel()
    return CheckResult(
        fwd_err=errors["out"], bwd_err=bwd_err, sampled=bool(note), rows_checked=checked, rows_total=total,
        grads=names, estimated_s=estimated, note=note, **{f"{name}_err": err for name, err in errors.items()},
    )  # fmt: skip


__all__ = ["TENSORS", "CheckResult", "RankReference", "attention", "check_errors", "default_sizes", "rank_reference"]
