"""One conformance case: a global attention problem, its sharding over ``world`` ranks, and where each token lives.

A case is a workload an adapter can take (the attributes of ringbench.rank.impls.base.Workload, plus ``kv_heads``
and ``docs``). Its global inputs are those of ringbench.engine.inputs: a pure function of (seed, tensor, token), so
the same ``seq`` at CP = 1, 2 and N sees the same Q, K, V and dO (the CP-degree invariance check relies on it).

Positions: with ``seq`` a multiple of what the layout needs, a rank owns the positions of
ringbench.engine.layout.token_positions. Otherwise (an implementation that declares uneven shards) the split is the
one torch.tensor_split makes: contiguous ranks get ``seq // world`` or one more token, the first ones first;
striped is t mod N whatever S; zigzag cuts S into 2N such chunks and gives rank r chunks r and 2N-1-r.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringbench.engine.layout import token_positions
from ringbench.engine.masks import MaskRule, mask_rule
from ringbench.errors import bad_value
from ringbench.vocab import MaskSpec

CHECK_DTYPES = ("float64", "float32", "bfloat16", "float16")
SHORT_DTYPE = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
MAX_SEQ = 8192  # the reference is dense float64 (S x S scores per head): check is for small problems


@dataclass(frozen=True, kw_only=True, slots=True)
class ConformanceCase:
    """One point of the check's matrix (an adapter workload). ``purpose`` says why the matrix holds it."""

    world: int
    seq: int
    heads: int = 2
    kv_heads: int = 0
    """Key/value heads (grouped-query attention: fewer than ``heads``, dividing it); 0 means ``heads``."""
    head_dim: int = 16
    batch: int = 1
    dtype: str = "float32"
    mask: str = "causal"
    docs: str = "none"
    layout: str = "contiguous"
    seed: int = 0
    backward: bool = True
    purpose: str = ""
    buffer: str = "double"  # what ringbench's own engine runs with (adapters read these attributes)
    order: str = "identity"
    kernel: str = "torch"

    def __post_init__(self) -> None:
        for name in ("world", "seq", "heads", "head_dim", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_value(name, value, "an integer >= 1")
        if self.seq > MAX_SEQ:
            raise bad_value("seq", self.seq, f"at most {MAX_SEQ} (check compares with dense float64 attention; "
                            "time larger problems with `ringbench run --impl`)")  # fmt: skip
        if self.seq < self.world:
            raise bad_value("seq", self.seq, f"at least world={self.world} (every rank holds a token)")
        kv = self.kv_heads or self.heads
        if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or self.heads % kv:
            raise bad_value("kv_heads", self.kv_heads, f"an integer >= 1 dividing heads={self.heads}")
        if self.dtype not in CHECK_DTYPES:
            raise bad_value("dtype", self.dtype, f"one of: {', '.join(CHECK_DTYPES)}")
        MaskSpec.parse(self.mask, "mask")
        rule = self.rule()  # a document mask without documents, or documents that do not fill seq: one line now
        if self.layout == "doc-balanced" and not rule.documents:
            raise bad_value("layout", self.layout, f"contiguous, zigzag or striped with mask {self.mask!r} "
                            "(doc-balanced balances documents)")  # fmt: skip

    @property
    def kv(self) -> int:
        """The key/value heads (``kv_heads`` or ``heads``)."""
        return self.kv_heads or self.heads

    @property
    def gqa(self) -> bool:
        return self.kv < self.heads

    @property
    def even(self) -> bool:
        """Every rank holds the same number of tokens, as the layout's own definition needs."""
        parts = 2 * self.world if self.layout in ("zigzag", "doc-balanced") else self.world
        return self.seq % parts == 0

    @property
    def case_id(self) -> str:
        docs = f"[{_docs_label(self.docs)}]" if self.docs != "none" else ""
        heads = f"h{self.heads}" + (f"kv{self.kv}" if self.gqa else "")
        batch = f"b{self.batch}/" if self.batch > 1 else ""
        return (f"w{self.world}/{self.mask}{docs}/{self.layout}/{SHORT_DTYPE[self.dtype]}/S{self.seq}/{heads}/"
                f"{batch}d{self.head_dim}")  # fmt: skip

    def rule(self) -> MaskRule:
        return mask_rule(self.mask, self.docs, self.seq)

    def positions(self, rank: int) -> torch.Tensor:
        """Global token positions of ``rank``'s local rows, in local-row order (see the module doc)."""
        if self.even:
            return token_positions(self.layout, self.seq, self.world, rank, self.rule())
        if self.layout == "striped":
            return torch.arange(rank, self.seq, self.world)
        if self.layout == "contiguous":
            return torch.tensor_split(torch.arange(self.seq), self.world)[rank]
        if self.layout == "zigzag":
            chunks = torch.tensor_split(torch.arange(self.seq), 2 * self.world)
            return torch.cat([chunks[rank], chunks[2 * self.world - 1 - rank]])
        raise bad_value("layout", self.layout, f"contiguous, zigzag or striped when seq={self.seq} is not a "
                        f"multiple of {2 * self.world}")  # fmt: skip

    def all_positions(self) -> list[torch.Tensor]:
        return [self.positions(rank) for rank in range(self.world)]


def _docs_label(docs: str) -> str:
    """A short label for a docs spec (explicit lengths are shown whole only when short)."""
    if docs.startswith("lengths:") and len(docs) > 30:
        count = docs.count(",") + 1
        return f"{count} docs"
    return docs.removeprefix("lengths:")


__all__ = ["CHECK_DTYPES", "MAX_SEQ", "ConformanceCase"]
