"""Benchmark inputs as a pure function of (seed, tensor name, global token chunk).

The global sequence is cut into chunks of CHUNK_TOKENS tokens. Chunk c of tensor ``name`` (one of q, k, v, dout)
is drawn from its own torch.Generator seeded with a stable hash of (seed, name, c), always at full chunk size, so
token t's vectors depend only on (seed, name, t, batch, heads, head_dim, dtype): never on the world size, the
layout, the rank or even the sequence length. A run at N=2 and one at N=8 with the same seed see the same global
tensors, and any rank can regenerate any token (the float64 reference does, see ringbench.engine.reference).

Values are standard normal draws made in float32 and rounded to the case dtype, so they are exactly representable
in it: ``rank_shards`` hands out tensors of the case dtype, ``token_block`` and ``token_rows(..., float64=True)``
the very same values widened to float64 (exactly).

Memory: a rank generates only the chunks that hold its tokens, one at a time, so its peak is O(S/N + chunk).
Contiguous and zigzag touch about S/N tokens' worth of chunks; striped touches every chunk (each holds C/N of
its tokens), which costs time O(S) but never more than one chunk of memory beyond the shard.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ringbench.engine.layout import token_positions
from ringbench.errors import bad_value

CHUNK_TOKENS = 256  # tokens per generated chunk; fixed, independent of world size and layout (see module doc)
TENSOR_NAMES = ("q", "k", "v", "dout")
DTYPE_NAMES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A case dtype given as a torch.dtype or by name (float64, float32, bfloat16, float16)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPE_NAMES.values():
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise bad_value("dtype", str(dtype), f"one of: {', '.join(DTYPE_NAMES)}")


def _check_shape(**sizes: int) -> None:
    for field, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad_value(field, value, "an integer >= 1")


def _check_name(name: str) -> None:
    if name not in TENSOR_NAMES:
        raise bad_value("name", name, f"one of: {', '.join(TENSOR_NAMES)}")


def chunk_seed(seed: int, name: str, chunk: int) -> int:
    """A 63-bit generator seed from (seed, name, chunk) by BLAKE2b: stable across processes and Python versions
    (the built-in hash() of a str is salted per process)."""
    digest = hashlib.blake2b(f"ringbench-inputs/{seed}/{name}/{chunk}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class ShardSpec:
    """One rank's shard of the benchmark inputs: the tensors' values (seed, shape, dtype) and which tokens the rank
    holds (layout, world, rank). ``rank_shards`` makes it; the float64 reference regenerates any token of it."""

    seed: int
    batch: int
    heads: int
    head_dim: int
    seq: int
    """Tokens of the whole sequence S."""
    dtype: object
    """float64, float32, bfloat16, float16: a name or the torch.dtype."""
    layout: object = "contiguous"
    """A layout name or a resolved doc-balanced layout (ringbench.engine.layout)."""
    world: int = 1
    rank: int = 0
    kv_heads: int = 0
    """Heads of k and v (grouped-query attention: fewer than ``heads``, dividing it); 0: as many as ``heads``."""

    def __post_init__(self) -> None:
        _check_shape(batch=self.batch, heads=self.heads, head_dim=self.head_dim, seq=self.seq, world=self.world)
        parse_dtype(self.dtype)
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.world:
            raise bad_value("rank", self.rank, f"an integer in [0, {self.world})")
        kv = self.kv_heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 0 or (kv and self.heads % kv):
            raise bad_value("kv_heads", kv, f"an integer >= 1 dividing heads={self.heads} (0: as many as heads)")

    def heads_of(self, name: str) -> int:
        """Heads of tensor ``name``: the KV heads for k and v, the query heads for q and dout."""
        return (self.kv_heads or self.heads) if name in ("k", "v") else self.heads

    @classmethod
    def of(cls, workload, *, seed: int, rank: int, layout=None) -> ShardSpec:
        """The shard of ``rank`` of a workload (anything with batch, heads, head_dim, seq, dtype, layout, world: a
        scenario's Case, with its ``key_value_heads``); ``layout``: the resolved layout in its place (doc-balanced)."""
        return cls(seed=seed, batch=workload.batch, heads=workload.heads, head_dim=workload.head_dim,
                   seq=workload.seq, dtype=workload.dtype, layout=workload.layout if layout is None else layout,
                   world=workload.world, rank=rank, kv_heads=workload.key_value_heads)  # fmt: skip


def chunk_values(shard: ShardSpec, name: str, chunk: int) -> torch.Tensor:
    """Tokens [chunk * CHUNK_TOKENS, (chunk + 1) * CHUNK_TOKENS) of one tensor: (B, H, CHUNK_TOKENS, D) in dtype
    (H: ``shard.heads_of(name)``)."""
    generator = torch.Generator().manual_seed(chunk_seed(shard.seed, name, chunk))
    shape = (shard.batch, shard.heads_of(name), CHUNK_TOKENS, shard.head_dim)
    values = torch.randn(shape, generator=generator)  # float32
    return values.to(parse_dtype(shard.dtype))


def token_rows(shard: ShardSpec, name: str, positions: torch.Tensor, *, float64: bool = False) -> torch.Tensor:
    """The rows of tensor ``name`` at the global token ``positions`` (any order, no repeats), on the CPU.

    Returns (B, H, len(positions), D) (H: ``shard.heads_of(name)``) in the shard's dtype (or the same values widened to float64 with
    ``float64``). The positions are visited in sorted order, so each chunk is generated once and only one chunk is
    alive at a time.
    """
    _check_name(name)
    dtype = parse_dtype(shard.dtype)
    positions = torch.as_tensor(positions, dtype=torch.long).cpu()
    if positions.numel() and int(positions.min()) < 0:
        raise bad_value("positions", int(positions.min()), "token positions >= 0")
    rows = torch.empty((shard.batch, shard.heads_of(name), positions.numel(), shard.head_dim),
                       dtype=torch.float64 if float64 else dtype)  # fmt: skip
    order = torch.argsort(positions, stable=True)  # local rows by ascending position
    ordered = positions[order]
    chunks, counts = torch.unique_consecutive(ordered // CHUNK_TOKENS, return_counts=True)
    start = 0
    for chunk, count in zip(chunks.tolist(), counts.tolist(), strict=True):
        values = chunk_values(shard, name, chunk)
        local = order[start : start + count]
        offsets = ordered[start : start + count] - chunk * CHUNK_TOKENS
        first, last = int(offsets[0]), int(offsets[-1])
        if last - first == count - 1 and int(local[-1]) - int(local[0]) == count - 1:
            # A run of consecutive tokens landing in consecutive rows (contiguous, zigzag): one slice copy.
            lo = int(local[0])
            rows[:, :, lo : lo + count] = values[:, :, first : last + 1]
        else:
            rows.index_copy_(2, local, values.index_select(2, offsets).to(rows.dtype))
        start += count
    return rows


def token_block(shard: ShardSpec, name: str, lo: int, hi: int, device=None) -> torch.Tensor:
    """Global tokens [lo, hi) of tensor ``name`` as float64 (B, H, hi - lo, D) on ``device`` (default CPU).

    The values are those of ``rank_shards`` (the shard's dtype) widened exactly to float64; for the streaming
    reference.
    """
    if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo < hi):
        raise bad_value("lo, hi", (lo, hi), "integers with 0 <= lo < hi")
    _check_name(name)
    block = torch.empty((shard.batch, shard.heads_of(name), hi - lo, shard.head_dim), dtype=torch.float64)
    for chunk in range(lo // CHUNK_TOKENS, (hi - 1) // CHUNK_TOKENS + 1):
        base = chunk * CHUNK_TOKENS
        first, last = max(lo, base), min(hi, base + CHUNK_TOKENS)
        values = chunk_values(shard, name, chunk)
        block[:, :, first - lo : last - lo] = values[:, :, first - base : last - base]
    return block.to(device) if device is not None else block


def rank_shards(shard: ShardSpec, device=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's (q, k, v, dout), each (B, H, S/N, D) in the shard's dtype on ``device`` (k and v: KV heads).

    Rows are in the local-row order of ``ringbench.engine.layout.token_positions(layout, seq, world, rank)``, so the
    shards of all ranks reassemble (``unshard``) to the same global tensors for any N and layout. Built on the CPU
    chunk by chunk (peak O(S/N + chunk)) and moved to ``device`` once. The tensors do not require grad.
    """
    positions = token_positions(shard.layout, shard.seq, shard.world, shard.rank)  # (S/N,) the local rows' tokens
    shards = []
    for name in TENSOR_NAMES:
        rows = token_rows(shard, name, positions)  # (B, H, S/N, D)
        shards.append(rows.to(device) if device is not None else rows)
    q, k, v, dout = shards
    return q, k, v, dout


__all__ = ["CHUNK_TOKENS", "TENSOR_NAMES", "ShardSpec", "chunk_values", "rank_shards", "token_block", "token_rows"]
