"""The float64 single-device answer of a conformance case, and of the wrong answers a ring is known to give.

``Problem`` holds a case's global inputs in float64 (the very values the ranks were given, widened exactly), where
each token lives (rank, local row) and the mask as a dense (S, S) visibility matrix. ``solve(problem, visible)``
is attention under any visibility matrix, forward and backward by autograd:

    s = c Q K^T (keys of query head h: KV head h // (H / KV)),  lse = logsumexp_j s,  out = softmax(s) V,
    (dq, dk, dv) = d out / d(q, k, v) . dO

so the truth is ``solve(problem, problem.visible)``, and a hypothesis about a bug ("positions local to the shard",
"the ring stops a step short") is the same call with another matrix (ringbench/conformance/hypotheses.py). A row
that sees no key has no softmax: its out, lse and dq are undefined (NaN here), and comparisons skip it.

Dense on purpose: S x S per head is nothing at the sizes a conformance check runs (S <= 8192, usually a few
hundred), and a dense matrix can express any hypothesis. The streaming reference of ringbench.engine.reference is
for the large shapes of `run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ringbench.conformance.check_case import ConformanceCase
from ringbench.engine.inputs import token_rows
from ringbench.engine.masks import MaskRule

TENSORS = ("out", "lse", "dq", "dk", "dv")
KEY_TENSORS = ("dk", "dv")  # rows are key positions (the others: query positions)


@dataclass(frozen=True, kw_only=True, slots=True)
class Problem:
    """A case's global float64 inputs and its token placement."""

    case: ConformanceCase
    q: torch.Tensor  # (B, H, S, D) float64
    k: torch.Tensor  # (B, KV, S, D)
    v: torch.Tensor  # (B, KV, S, D)
    dout: torch.Tensor  # (B, H, S, D)
    positions: tuple[torch.Tensor, ...]  # per rank: the global positions of its local rows
    rank_of: torch.Tensor  # (S,) the rank holding each position
    local_of: torch.Tensor  # (S,) its local row there
    visible: torch.Tensor  # (S, S) bool: query i sees key j under the case's mask

    @property
    def scale(self) -> float:
        return self.case.head_dim**-0.5

    @property
    def world(self) -> int:
        return self.case.world


def visibility(rule: MaskRule, q_positions, k_positions) -> torch.Tensor:
    """(Lq, Lk) bool: the query at q_positions[i] sees the key at k_positions[j] under ``rule``."""
    return rule.visible(torch.as_tensor(q_positions).numpy(), torch.as_tensor(k_positions).numpy())


def build_problem(case: ConformanceCase) -> Problem:
    seq = case.seq
    everything = torch.arange(seq)
    q, k, v, dout = (token_rows(case.shard(), name, everything, float64=True) for name in ("q", "k", "v", "dout"))
    positions = tuple(case.all_positions())
    rank_of = torch.empty(seq, dtype=torch.long)
    local_of = torch.empty(seq, dtype=torch.long)
    for rank, where in enumerate(positions):
        rank_of[where] = rank
        local_of[where] = torch.arange(where.numel())
    visible = visibility(case.rule(), everything, everything)
    return Problem(case=case, q=q, k=k, v=v, dout=dout, positions=positions, rank_of=rank_of, local_of=local_of,
                   visible=visible)  # fmt: skip


def expand_kv(x: torch.Tensor, heads: int, interleaved: bool = False) -> torch.Tensor:
    """(B, KV, S, D) -> (B, H, S, D): query head h reads KV head h // (H / KV) (``interleaved``: h % KV)."""
    group = heads // x.shape[1]
    if group == 1:
        return x
    return x.repeat(1, group, 1, 1) if interleaved else x.repeat_interleave(group, dim=1)


def solve(problem: Problem, visible: torch.Tensor, *, interleaved: bool = False, scale: float | None = None) -> dict:
    """Attention of the problem's inputs under ``visible`` (S, S): {out, lse, dq, dk, dv} in float64, global rows;
    rows that see nothing are NaN in out, lse and dq. ``interleaved``: the other mapping of query heads to KV heads;
    ``scale``: another softmax scale than D^-1/2."""
    heads = problem.case.heads
    q = problem.q.clone().requires_grad_()
    k = problem.k.clone().requires_grad_()
    v = problem.v.clone().requires_grad_()
    scale = problem.scale if scale is None else scale
    scores = torch.matmul(q, expand_kv(k, heads, interleaved).transpose(-1, -2)) * scale  # (B, H, S, S)
    scores = scores.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)  # (B, H, S); -inf where a row sees nothing
    seen = visible.any(dim=-1)  # (S,)
    safe_lse = torch.where(seen, lse, torch.zeros_like(lse))
    probs = torch.exp(scores - safe_lse[..., None])  # exp(-inf) = 0 for hidden keys and empty rows
    out = torch.matmul(probs, expand_kv(v, heads, interleaved))
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), problem.dout)
    empty = ~seen
    nan = torch.tensor(math.nan, dtype=torch.float64)
    return {
        "out": torch.where(empty[:, None], nan, out.detach()),
        "lse": torch.where(empty, nan, lse.detach()),
        "dq": torch.where(empty[:, None], nan, dq),
        "dk": dk,
        "dv": dv,
    }


def assemble(problem: Problem, shards: list[dict], name: str) -> torch.Tensor | None:
    """The global tensor ``name`` from every rank's local rows (float64), or None when a rank lacks it."""
    parts = [shard.get(name) for shard in shards]
    if any(part is None for part in parts):
        return None
    first = parts[0]
    shape = (*first.shape[:2], problem.case.seq, *first.shape[3:])
    full = torch.full(shape, math.nan, dtype=torch.float64)
    for rank, part in enumerate(parts):
        full.index_copy_(2, problem.positions[rank], part.to(torch.float64))
    return full


__all__ = ["KEY_TENSORS", "TENSORS", "Problem", "assemble", "build_problem", "expand_kv", "solve", "visibility"]
