"""One conformance case: a global attention problem, its sharding over ``world`` ranks, and where each token lives.

A case carries the scenario's ``Workload`` (ringbench.scenario.workload; its axes read as the case's own, so an
adapter takes it as it takes a run's Case) with the kernel, the backward switch, the inputs' seed and why the matrix
holds it. Its global inputs are those of ringbench.engine.inputs: a pure function of (seed, tensor, token), so
the same ``seq`` at CP = 1, 2 and N sees the same Q, K, V and dO (the CP-degree invariance check relies on it).

Positions: with ``seq`` a multiple of what the layout needs, a rank owns the positions of
ringbench.engine.layout.token_positions. Otherwise (an implementation that declares uneven shards) the split is the
one torch.tensor_split makes: contiguous ranks get ``seq // world`` or one more token, the first ones first;
striped is t mod N whatever S; zigzag cuts S into 2N such chunks and gives rank r chunks r and 2N-1-r.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ringbench.engine.inputs import ShardSpec
from ringbench.engine.layout import token_positions
from ringbench.engine.masks import MaskRule, mask_rule
from ringbench.errors import bad_value
from ringbench.scenario.workload import Workload, reads_workload
from ringbench.vocab import MaskSpec

CHECK_DTYPES = ("float64", "float32", "bfloat16", "float16")
SHORT_DTYPE = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
MAX_SEQ = 8192  # the reference is dense float64 (S x S scores per head): check is for small problems
SMALL = dict(heads=2, head_dim=16, dtype="float32", layout="contiguous")  # the axes a case leaves out


@reads_workload
@dataclass(frozen=True, kw_only=True, slots=True)
class ConformanceCase:
    """One point of the check's matrix: a workload (it reads the workload's axes as its own) and how it is run.
    ``ConformanceCase.of(world=..., seq=..., **axes)`` builds one from flat axes."""

    workload: Workload
    kernel: str = "torch"
    """The block kernel of ringbench's own engine (adapters read it as a run's Case)."""
    backward: bool = True
    seed: int = 0
    """The seed of the global inputs (ringbench.engine.inputs)."""
    purpose: str = ""
    """Why the matrix holds the case (``ladder``: one global problem at several CP degrees)."""

    @classmethod
    def of(cls, *, world: int, seq: int, kernel: str = "torch", backward: bool = True, seed: int = 0,
           purpose: str = "", **axes) -> ConformanceCase:  # fmt: skip
        """A case from flat axes; those not given are small (``SMALL``)."""
        return cls(workload=Workload(world=world, seq=seq, **(SMALL | axes)), kernel=kernel, backward=backward,
                   seed=seed, purpose=purpose)  # fmt: skip

    def __post_init__(self) -> None:
        self.workload.check_sizes()
        if self.seq > MAX_SEQ:
            raise bad_value("seq", self.seq, f"at most {MAX_SEQ} (check compares with dense float64 attention; "
                            "time larger problems with `ringbench run --impl`)")  # fmt: skip
        if self.seq < self.world:
            raise bad_value("seq", self.seq, f"at least world={self.world} (every rank holds a token)")
        if self.dtype not in CHECK_DTYPES:
            raise bad_value("dtype", self.dtype, f"one of: {', '.join(CHECK_DTYPES)}")
        MaskSpec.parse(self.mask, "mask")
        rule = self.rule()  # a document mask without documents, or documents that do not fill seq: one line now
        if self.layout == "doc-balanced" and not rule.documents:
            raise bad_value("layout", self.layout, f"contiguous, zigzag or striped with mask {self.mask!r} "
                            "(doc-balanced balances documents)")  # fmt: skip

    @property
    def gqa(self) -> bool:
        return self.key_value_heads < self.heads

    @property
    def even(self) -> bool:
        """Every rank holds the same number of tokens, as the layout's own definition needs."""
        parts = 2 * self.world if self.layout in ("zigzag", "doc-balanced") else self.world
        return self.seq % parts == 0

    @property
    def case_id(self) -> str:
        docs = f"[{_docs_label(self.docs)}]" if self.docs != "none" else ""
        heads = f"h{self.heads}" + (f"kv{self.key_value_heads}" if self.gqa else "")
        batch = f"b{self.batch}/" if self.batch > 1 else ""
        return (f"w{self.world}/{self.mask}{docs}/{self.layout}/{SHORT_DTYPE[self.dtype]}/S{self.seq}/{heads}/"
                f"{batch}d{self.head_dim}")  # fmt: skip

    def shard(self, rank: int = 0) -> ShardSpec:
        """The inputs' values (seed, shapes, dtype; K and V of the KV heads) as rank ``rank``'s ShardSpec; pass
        ``positions(rank)`` to token_rows, which holds for uneven shards too."""
        return ShardSpec(seed=self.seed, batch=self.batch, heads=self.heads, head_dim=self.head_dim, seq=self.seq,
                         dtype=self.dtype, world=self.world, rank=rank, kv_heads=self.key_value_heads)  # fmt: skip

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
