"""The workload (the axes of one attention computation, the one model every case of ringbench wraps) and the case.

    workload = Workload(world=8, seq=8192, heads=32, kv_heads=8, mask="window:1024", strategy="hybrid:2")
    Case(workload=workload, kernel="torch")            # a measured case (scenario/scenario.py)
    SimCase(workload=workload, iterations=5)           # a simulated one (simulate/case.py)

A run's case, a simulated case, a plan request, an adapter's call and a self-check all carry a ``Workload`` (its
fields are the sweep axes of scenario/axes.py, less the kernel and the implementation, which say how the workload
is computed, plus ``kv_heads``); a ``Case`` is a workload with the kernel, the implementation and the backward
switch, the point of a sweep that ``ringbench run`` measures and its record names. Construction normalises without judging, so that one computation has one spelling
and one case id (a bad value is left for ``checked()`` or the scenario's validation to name); ``checked()`` refuses
a bad axis with the one-line error that names the field.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from operator import attrgetter

from ringbench.errors import UsageError, bad_value
from ringbench.fmt import ring_text
from ringbench.orders import parse_placement, ring_of
from ringbench.scenario.layers import layer_masks, needs_docs
from ringbench.vocab import DTYPES, Buffer, Layout, MaskSpec, Strategy


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """One attention computation: its shape, its mask and how the ranks share it."""

    world: int
    """Ranks N."""
    seq: int
    """Total sequence length S over all ranks (tokens)."""
    heads: int = 8
    """Attention (query) heads."""
    head_dim: int = 128
    batch: int = 1
    dtype: str = "bfloat16"
    """float64, float32, bfloat16, float16 (ringbench.vocab.DTYPES)."""
    mask: str = "causal"
    """none | causal | causal-naive | causal-document | full-document | window:W | causal-document+window:W."""
    docs: str = "none"
    """The packed documents of a document mask (ringbench.engine.documents); ``none`` for the other masks."""
    layers: str = "1"
    """Attention layers per iteration (ringbench.scenario.layers): a count, or a pattern of masks."""
    layout: str = "zigzag"
    """contiguous | zigzag | striped | doc-balanced: which token positions each rank owns."""
    strategy: str = "ring"
    """How the ranks share the attention (ringbench.vocab.Strategy): ring, ulysses, hybrid:U, double-ring:W,
    allgather. ``buffer: allgather`` is the all-gather baseline whatever this says (as before strategies)."""
    placement: str = ""
    """Grouped strategies (hybrid, double ring): which ranks form the groups (ringbench.orders.parse_placement);
    "" for the others."""
    buffer: str = "double"
    """sync | double | allgather | sync-short | double-short."""
    order: str = "identity"
    """The ring order (ringbench.orders.parse_order): identity, reverse, stride:K, random:SEED or 0-3-1-2."""
    kv_heads: int = 0
    """Key/value heads (grouped-query attention: each serves heads / kv_heads query heads); 0: as many as heads."""

    def __post_init__(self) -> None:
        # One canonical workload per computation, so a sweep over strategy x buffer x order x placement runs each
        # once: allgather is the buffer of that name; Ulysses has no ring to double-buffer; only grouped
        # strategies have a placement, only ring strategies an order; K/V heads as many as the heads are 0. A bad
        # spec is left for checked() (or the scenario's validation) to name.
        if self.kv_heads == self.heads and isinstance(self.kv_heads, int) and not isinstance(self.kv_heads, bool):
            object.__setattr__(self, "kv_heads", 0)
        try:
            strategy = Strategy.parse(self.strategy)
            Buffer.parse(self.buffer, "buffer")
        except UsageError:
            return
        if self.buffer == "allgather" or strategy.kind == "allgather":
            strategy = Strategy("allgather")
            object.__setattr__(self, "buffer", "allgather")
        elif self.buffer not in strategy.buffers():
            # a grouped strategy's rings are full rings: sync-short runs as sync, double-short as double
            unshort = self.buffer.removesuffix("-short")
            object.__setattr__(self, "buffer", unshort if unshort in strategy.buffers() else strategy.buffers()[0])
        object.__setattr__(self, "strategy", strategy.spec)
        if not strategy.grouped:
            object.__setattr__(self, "placement", "")
        elif not self.placement:
            object.__setattr__(self, "placement", "heads-first")
        if not strategy.ordered:
            object.__setattr__(self, "order", "identity")

    @property
    def key_value_heads(self) -> int:
        """The K/V heads that travel (``kv_heads``, or ``heads`` when 0)."""
        return self.kv_heads or self.heads

    @property
    def layer_masks(self) -> tuple[str, ...]:
        """The mask of each attention layer (one layer: the workload's mask)."""
        return layer_masks(self.layers, self.mask)

    @property
    def ring(self) -> list[int]:
        """Ranks in ring order; for a grouped strategy, in placement order (its groups are consecutive runs)."""
        return ring_of(self.order, self.placement, self.world, self.strategy)

    def axes(self) -> dict:
        """The workload's axes by name."""
        return {name: getattr(self, name) for name in WORKLOAD_FIELDS}

    def replace(self, **changes) -> Workload:
        return dataclasses.replace(self, **changes)

    def checked(self) -> Workload:
        """This workload, each axis checked (the first bad one raises the one-line error that names it), with its
        mask in canonical spelling and the documents of a mask without them dropped. Whether the layout splits the
        sequence is the engine's arithmetic (ringbench.engine.layout.check_divisible), checked by its users."""
        self.check_sizes()
        strategy = Strategy.parse(self.strategy, "strategy")
        strategy.check(self.world, self.heads, kv_heads=self.key_value_heads)
        if self.placement:
            parse_placement(self.placement, self.world, strategy.group_size(self.world))
        if self.dtype not in DTYPES:
            raise bad_value("dtype", self.dtype, "one of: " + ", ".join(DTYPES))
        mask = MaskSpec.parse(self.mask, "mask").text
        Layout.parse(self.layout, "layout")
        Buffer.parse(self.buffer, "buffer")
        docs = self.docs if any(needs_docs(m) for m in layer_masks(self.layers, mask)) else "none"
        return self.replace(mask=mask, docs=docs) if (mask, docs) != (self.mask, self.docs) else self

    def check_sizes(self) -> None:
        """The counts: integers >= 1, and K/V heads that divide the query heads."""
        for name in ("world", "seq", "heads", "head_dim", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad_value(name, value, "an integer >= 1")
        kv_heads = self.kv_heads
        if isinstance(kv_heads, bool) or not isinstance(kv_heads, int) or kv_heads < 0 or (
            kv_heads and self.heads % kv_heads
        ):  # fmt: skip
            raise bad_value("kv_heads", kv_heads, f"an integer >= 1 dividing heads={self.heads}")


WORKLOAD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Workload))
"""The workload's axes: the sweep axes (scenario/axes.py) less kernel and impl, plus kv_heads."""


def reads_workload(cls):
    """Class decorator: a model that wraps a ``workload`` reads its axes as its own (``case.seq``), read-only."""
    for name in WORKLOAD_FIELDS:
        setattr(cls, name, property(attrgetter(f"workload.{name}"), doc=f"The workload's {name}."))
    for name in ("key_value_heads", "layer_masks", "ring"):
        setattr(cls, name, property(attrgetter(f"workload.{name}"), doc=getattr(Workload, name).__doc__))
    return cls


@reads_workload
@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One point of the sweep: a workload and how it is computed (it reads the workload's axes as its own)."""

    workload: Workload
    kernel: str = "torch"
    """The attention kernel (ringbench.kernels): torch, math, triton, emulated:GFLOPS, modelled:GFLOPS, ..."""
    impl: str = "ringbench"
    """The ring-attention implementation (ringbench.rank.impls): ringbench's own engine unless another is named."""
    backward: bool = True

    @classmethod
    def from_axes(cls, **axes) -> Case:
        """A case from flat axes (``world=4, seq=1024, ..., kernel="torch"``), as ``axes()`` gives them (the ring,
        derived from them, is left out)."""
        axes.pop("ring", None)
        own = {name: axes.pop(name) for name in ("kernel", "impl", "backward") if name in axes}
        return cls(workload=Workload(**axes), **own)

    @property
    def case_id(self) -> str:
        """Readable and stable: the same axes give the same id in every run (resume and compare rely on it).
        ringbench's own engine is the default implementation and does not appear in the id; nor do the ring
        strategies (ring, allgather: the buffer says which), nor one layer without documents (the default workload),
        so records made before strategies, documents, layers and grouped-query attention keep their ids (K/V heads
        appear only when fewer than the heads: ``h8kv2x128``)."""
        impl = "" if self.impl == "ringbench" else f"-{self.impl}"
        strategy = "" if self.strategy in ("ring", "allgather") else f"-{self.strategy}"
        if self.placement:
            strategy += f"-{self.placement}"
        kv = f"kv{self.key_value_heads}" if self.key_value_heads != self.heads else ""
        slug = (
            f"w{self.world}-s{self.seq}-h{self.heads}{kv}x{self.head_dim}-b{self.batch}-{self.dtype}-{self.mask}-"
            f"{self.layout}-{self.buffer}-{self.order}-{self.kernel}{impl}{strategy}-{'fb' if self.backward else 'f'}"
        )
        readable = slug
        if self.docs != "none":
            slug += f"-docs={self.docs}"
            readable += "-docs-" + _short(self.docs)
        if self.layers != "1":
            slug += f"-layers={self.layers}"
            readable += "-layers-" + _short(self.layers)
        digest = hashlib.sha1(slug.encode()).hexdigest()[:6]
        return f"{readable.replace(':', '_')}-{digest}"

    @property
    def emulated(self) -> bool:
        from ringbench.kernels import get_kernel

        return get_kernel(self.kernel).emulated

    def axes(self) -> dict:
        """Every axis by name (the workload's, the kernel, impl and backward) and the ring."""
        return self.workload.axes() | {"kernel": self.kernel, "impl": self.impl, "backward": self.backward,
                                       "ring": ring_text(self.ring)}  # fmt: skip


def _short(text: str, limit: int = 32) -> str:
    """A spec as an id part: safe characters, at most ``limit`` of them (the digest keeps ids distinct)."""
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in text.replace(", ", "+").replace(" ", ""))
    return safe[:limit]


__all__ = ["WORKLOAD_FIELDS", "Case", "Workload", "reads_workload"]
