"""Sequence layouts: which global token positions each rank owns, and shard / unshard along the sequence.

Every layout is a union of *segments*, each an arithmetic progression of positions with one stride, stored
contiguously in the rank's local rows:
  contiguous: rank r owns [r*L, (r+1)*L)                         1 segment, stride 1   (L = S/N)
  zigzag:     rank r owns chunks r and 2N-1-r of size C = S/(2N)  2 segments, stride 1
  striped:    rank r owns r, r+N, r+2N, ...                        1 segment, stride N
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ringbench.errors import UsageError
from ringbench.vocab import Layout


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
        return torch.arange(self.length) * self.stride + self.start


def check_divisible(layout: Layout | str, seq: int, world: int) -> None:
    layout = Layout.parse(layout, "layout")
    if world < 1:
        raise UsageError(f"world={world!r} is not allowed; expected an integer >= 1")
    parts = 2 * world if layout is Layout.ZIGZAG else world
    if seq < parts or seq % parts:
        raise UsageError(
            f"seq={seq} is not allowed for layout={layout.value!r} on {world} ranks; "
            f"expected a positive multiple of {parts}"
        )


def segments(layout: Layout | str, seq: int, world: int, rank: int) -> tuple[Segment, ...]:
    """The segments rank ``rank`` owns, in local-row order."""
    layout = Layout.parse(layout, "layout")
    check_divisible(layout, seq, world)
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


def token_positions(layout: Layout | str, seq: int, world: int, rank: int) -> torch.Tensor:
    """Global positions of rank ``rank``'s local rows, in local-row order."""
    return torch.cat([segment.positions() for segment in segments(layout, seq, world, rank)])


def shard(x: torch.Tensor, layout: Layout | str = "contiguous", world: int = 1, rank: int = 0, dim: int = -2):
    """This rank's rows of a full-sequence tensor: (B, H, S, D) -> (B, H, S/N, D) along ``dim``."""
    seq = x.shape[dim]
    index = token_positions(layout, seq, world, rank).to(x.device)
    return x.index_select(dim, index).contiguous()


def unshard(shards: Sequence[torch.Tensor], layout: Layout | str = "contiguous", dim: int = -2) -> torch.Tensor:
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
        index = token_positions(layout, seq, world, rank).to(part.device)
        full.index_copy_(dim, index, part)
    return full
