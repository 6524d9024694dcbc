"""Sequence layouts: which global token positions each rank owns, and shard / unshard along the sequence.

Every layout is a union of *segments*, each an arithmetic progression of positions with one stride, stored
contiguously in the rank's local rows:
  contiguous: rank r owns [r*L, (r+1)*L)                         1 segment, stride 1   (L = S/N)
  zigzag:     rank r owns chunks r and 2N-1-r of size C = S/(2N)  2 segments, stride 1
  striped:    rank r owns r, r+N, r+2N, ...                        1 segment, stride N
  doc-balanced: S cut into m*N equal chunks (m in 2, 4, 8, 16), each rank given m of them by their visible work
              (``balanced_chunks``); up to m segments, stride 1

Why doc-balanced is a greedy assignment of equal chunks and not per-document zigzag (TransformerEngine's THD
layout): zigzag per document needs every document's length to be a multiple of 2N (THD pads them; padding changes
the workload), gives each rank 2 segments per document (kernel calls grow with the document count), and still
leaves the ranks unequal when documents are short. Equal chunks keep every shard S/N tokens whatever the lengths;
each chunk's work is the visible score entries of its queries (MaskRule.key_bounds: an interval per query, so
O(S) to count), and the largest-first greedy (each chunk to the least loaded rank that still has room, as
MagiAttention dispatches by area) balances a pack of documents, windows included. The smallest m whose predicted
imbalance (max / mean visible entries) is within BALANCE_TARGET is taken: more chunks balance better but cost
more kernel calls per pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ringbench.errors import UsageError
from ringbench.vocab import Layout

if TYPE_CHECKING:
    import torch

BALANCE_CHUNKS = (2, 4, 8, 16)  # chunks per rank tried by doc-balanced, fewest first
BALANCE_TARGET = 1.03  # doc-balanced takes the fewest chunks whose predicted imbalance is within this


@dataclass(frozen=True, slots=True)
class Segment:
    """Local rows [local_start, local_start + length) hold positions start, start + stride, ..."""

    local_start: int
    length: int
    start: int
    stride: int

    @property
    def first(self) -> int:
        return self.start

    @property
    def last(self) -> int:
        return self.start + (self.length - 1) * self.stride

    def positions(self) -> torch.Tensor:
        import torch  # the plan is plain Python; only tensors need torch (commands that plan do not load it)

        return torch.arange(self.length) * self.stride + self.start


@dataclass(frozen=True, slots=True)
class BalancedLayout:
    """doc-balanced, resolved for one sequence: chunks of ``chunk`` tokens and the rank that owns each. Accepted
    wherever a layout is (the plan, the inputs, the check), so that every layer of a model shares one sharding."""

    chunk: int
    owners: tuple[int, ...]
    predicted_imbalance: float = 1.0
    """max / mean visible score entries over ranks that the assignment predicts."""

    value = "doc-balanced"

    def __str__(self) -> str:
        return self.value


def as_layout(layout) -> Layout | BalancedLayout:
    """A Layout member from its name, or a resolved BalancedLayout as it is."""
    return layout if isinstance(layout, BalancedLayout) else Layout.parse(layout, "layout")


def resolve_layout(layout, seq: int, world: int, rules=None) -> Layout | BalancedLayout:
    """``doc-balanced`` resolved into its chunk assignment for ``rules`` (a MaskRule, or a tuple of them: one per
    layer, balanced on their summed work); any other layout as its Layout member."""
    layout = as_layout(layout)
    if layout is not Layout.DOC_BALANCED:
        return layout
    rules = rules if isinstance(rules, tuple) else (rules,)
    _check_documented(rules)
    chunk, owners, ratio = balanced_chunks(rules, seq, world)
    return BalancedLayout(chunk=chunk, owners=owners, predicted_imbalance=ratio)


def check_divisible(layout: Layout | str, seq: int, world: int) -> None:
    if isinstance(layout, BalancedLayout):
        if layout.chunk * len(layout.owners) != seq or (world >= 1 and max(layout.owners) >= world):
            raise UsageError(f"layout='doc-balanced' was resolved for another sequence or ring than seq={seq}, "
                             f"world={world}")  # fmt: skip
        return
    layout = Layout.parse(layout, "layout")
    if world < 1:
        raise UsageError(f"world={world!r} is not allowed; expected an integer >= 1")
    parts = 2 * world if layout in (Layout.ZIGZAG, Layout.DOC_BALANCED) else world
    if seq < parts or seq % parts:
        raise UsageError(
            f"seq={seq} is not allowed for layout={layout.value!r} on {world} ranks; "
            f"expected a positive multiple of {parts}"
        )


def _chunk_work(rules: tuple, seq: int, chunk: int) -> np.ndarray:
    """Visible score entries of each chunk's queries against the whole sequence (keys all present), summed over
    the rules (the layers)."""
    total = np.zeros(seq)
    for rule in rules:
        lo, hi = rule.key_bounds(np.arange(seq))
        total += np.maximum(hi - lo + 1, 0)
    return total.reshape(-1, chunk).sum(axis=1)


def _greedy(work: np.ndarray, world: int, per_rank: int) -> tuple[np.ndarray, float]:
    """Largest chunk first to the least loaded rank with room; (owner of each chunk, max / mean load)."""
    owners = np.empty(len(work), dtype=np.int64)
    load = np.zeros(world)
    room = np.full(world, per_rank)
    for index in np.argsort(-work, kind="stable"):
        candidates = np.flatnonzero(room > 0)
        rank = int(candidates[np.argmin(load[candidates])])
        owners[index] = rank
        load[rank] += work[index]
        room[rank] -= 1
    mean = load.mean()
    return owners, float(load.max() / mean) if mean > 0 else 1.0


@lru_cache(maxsize=64)
def balanced_chunks(rules, seq: int, world: int) -> tuple[int, tuple[int, ...], float]:
    """doc-balanced: (chunk size, owner rank of each chunk, predicted imbalance) for ``rules`` (a MaskRule or a
    tuple of them, one per layer)."""
    rules = rules if isinstance(rules, tuple) else (rules,)
    best = None
    for per_rank in BALANCE_CHUNKS:
        if seq % (world * per_rank):
            continue
        chunk = seq // (world * per_rank)
        owners, ratio = _greedy(_chunk_work(rules, seq, chunk), world, per_rank)
        if best is None or ratio < best[2] - 1e-12:
            best = (chunk, tuple(int(x) for x in owners), ratio)
        if ratio <= BALANCE_TARGET:
            break
    if best is None:
        raise UsageError(f"seq={seq} is not allowed for layout='doc-balanced' on {world} ranks; expected a "
                         f"positive multiple of {2 * world}")  # fmt: skip
    return best


def _check_documented(rules: tuple) -> None:
    for rule in rules:
        if rule is None or not getattr(rule, "documents", False):
            mask = getattr(rule, "text", "none") if rule is not None else "none"
            raise UsageError(
                f"layout='doc-balanced' is not allowed with mask={mask!r}: it balances packed documents; expected a "
                "mask with documents (causal-document, full-document or causal-document+window:W) and a docs spec"
            )


def _balanced_segments(layout: BalancedLayout, rank: int) -> tuple[Segment, ...]:
    chunk, owners = layout.chunk, layout.owners
    mine = [c for c, owner in enumerate(owners) if owner == rank]
    out: list[Segment] = []
    local = 0
    for c in mine:  # adjacent chunks of one rank are one segment
        if out and out[-1].start + out[-1].length == c * chunk:
            last = out.pop()
            out.append(Segment(local_start=last.local_start, length=last.length + chunk, start=last.start, stride=1))
        else:
            out.append(Segment(local_start=local, length=chunk, start=c * chunk, stride=1))
        local += chunk
    return tuple(out)


def segments(layout: Layout | str, seq: int, world: int, rank: int, rule=None) -> tuple[Segment, ...]:
    """The segments rank ``rank`` owns, in local-row order. ``rule`` (a ringbench.engine.masks.MaskRule, or a
    tuple of them): the mask and documents ``doc-balanced`` balances when it is given by name (the other layouts
    and a resolved BalancedLayout ignore it)."""
    if not isinstance(layout, BalancedLayout):
        layout = Layout.parse(layout, "layout")
    check_divisible(layout, seq, world)
    if layout is Layout.DOC_BALANCED:
        layout = resolve_layout(layout, seq, world, rule)
    if isinstance(layout, BalancedLayout):
        return _balanced_segments(layout, rank)
    if layout is Layout.CONTIGUOUS:
        local = seq // world
        return (Segment(local_start=0, length=local, start=rank * local, stride=1),)
    if layout is Layout.ZIGZAG:
        chunk = seq // (2 * world)
        return (
            Segment(local_start=0, length=chunk, start=rank * chunk, stride=1),
            Segment(local_start=chunk, length=chunk, start=(2 * world - 1 - rank) * chunk, stride=1),
        )
    return (Segment(local_start=0, length=seq // world, start=rank, stride=world),)


def token_positions(layout: Layout | str, seq: int, world: int, rank: int, rule=None) -> torch.Tensor:
    """Global positions of rank ``rank``'s local rows, in local-row order."""
    import torch

    return torch.cat([segment.positions() for segment in segments(layout, seq, world, rank, rule)])


def shard(x: torch.Tensor, layout: Layout | str = "contiguous", world: int = 1, rank: int = 0, dim: int = -2,
          rule=None):  # fmt: skip
    """This rank's rows of a full-sequence tensor: (B, H, S, D) -> (B, H, S/N, D) along ``dim``. ``rule``: the
    MaskRule a doc-balanced layout balances."""
    seq = x.shape[dim]
    index = token_positions(layout, seq, world, rank, rule).to(x.device)
    return x.index_select(dim, index).contiguous()


def unshard(shards: Sequence[torch.Tensor], layout: Layout | str = "contiguous", dim: int = -2,
            rule=None) -> torch.Tensor:  # fmt: skip
    """Reassemble the full sequence from every rank's shard (a list in rank order)."""
    world = len(shards)
    if world == 0:
        raise UsageError("shards=[] is not allowed; expected one tensor per rank, in rank order")
    local = shards[0].shape[dim]
    if any(s.shape != shards[0].shape for s in shards):
        raise UsageError("shards have different shapes; expected one equally shaped tensor per rank")
    seq = local * world
    full_shape = list(shards[0].shape)
    full_shape[dim] = seq
    full = shards[0].new_empty(full_shape)
    for rank, part in enumerate(shards):
        index = token_positions(layout, seq, world, rank, rule).to(part.device)
        full.index_copy_(dim, index, part)
    return full
