"""The positional rule of a mask: which keys each query sees, from token positions and document ids alone.

``mask_rule(mask, docs, seq)`` turns a mask mode (ringbench.vocab.MaskSpec) and the case's documents
(ringbench.engine.documents) into a ``MaskRule``. For a query at position p in document d = [s_d, e_d) the visible
keys are one interval of positions,

    lo(p) = max(s_d if documents, p - W + 1 if window, 0)        hi(p) = min(p if causal, e_d - 1 if documents, S - 1)

so counting, planning and checking never need an (S x S) mask: ``key_bounds`` gives [lo, hi] per query,
``row_counts`` the visible keys of each query among a sorted key set, ``visible`` the (Lq, Lk) mask of a small
block, and ``position_mask`` the kernels' form of it (ringbench.kernels.base.PositionMask: positions, document ids,
the causal flag and the window). Everything here is a pure function of positions and document ids, so any strategy
that knows which positions meet which (a ring, all-to-all, a local block) can use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from ringbench.engine.documents import documents
from ringbench.errors import UsageError
from ringbench.kernels.base import PositionMask
from ringbench.vocab import MaskSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, eq=True, slots=True)
class MaskRule:
    """A mask mode applied to one sequence: the spec, the sequence length and (document masks) the documents."""

    spec: MaskSpec
    seq: int
    doc_ends: tuple[int, ...] | None = None
    """Exclusive end position of every document, in order (document masks only)."""
    docs: str = "none"
    """The docs spec the documents came from (for messages and records)."""
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.spec, self.seq, self.doc_ends)))

    def __hash__(self) -> int:  # plans are cached by rule: hash a long document list once
        return self._hash

    # -- the mode ------------------------------------------------------------------------------------------------
    @property
    def causal(self) -> bool:
        return self.spec.causal

    @property
    def window(self) -> int | None:
        return self.spec.window

    @property
    def documents(self) -> bool:
        return self.doc_ends is not None

    @property
    def naive(self) -> bool:
        return self.spec.naive

    @property
    def legacy(self) -> bool:
        """none, causal or causal-naive: planned exactly as before documents and windows existed."""
        return self.spec.legacy

    @property
    def text(self) -> str:
        return self.spec.text

    @property
    def everything(self) -> bool:
        """Every query sees every key (mask none)."""
        return not self.causal and not self.documents

    # -- positions -----------------------------------------------------------------------------------------------
    def _ends(self) -> np.ndarray:
        return np.asarray(self.doc_ends, dtype=np.int64)

    def doc_ids(self, positions) -> np.ndarray:
        """Document index of each position (all 0 without documents)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.documents:
            return np.zeros(positions.shape, dtype=np.int64)
        return np.searchsorted(self._ends(), positions, side="right")

    def doc_span(self, positions) -> tuple[np.ndarray, np.ndarray]:
        """(start, exclusive end) of each position's document ([0, S) without documents)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.documents:
            return np.zeros_like(positions), np.full_like(positions, self.seq)
        ends = self._ends()
        index = np.searchsorted(ends, positions, side="right")
        starts = np.concatenate([[0], ends[:-1]])
        return starts[index], ends[index]

    def key_bounds(self, q_positions) -> tuple[np.ndarray, np.ndarray]:
        """[lo, hi] (inclusive) of the keys each query sees (see the module docstring); empty where lo > hi."""
        p = np.asarray(q_positions, dtype=np.int64)
        start, end = self.doc_span(p)
        lo = start.copy()
        hi = end - 1
        if self.causal:
            hi = np.minimum(hi, p)
        if self.window is not None:
            lo = np.maximum(lo, p - self.window + 1)
        return lo, hi

    def row_counts(self, q_positions, k_positions) -> np.ndarray:
        """Visible keys of each query among ``k_positions`` (any order)."""
        keys = np.sort(np.asarray(k_positions, dtype=np.int64))
        lo, hi = self.key_bounds(q_positions)
        counts = np.searchsorted(keys, hi, side="right") - np.searchsorted(keys, lo, side="left")
        return np.maximum(counts, 0)

    def visible(self, q_positions, k_positions) -> torch.Tensor:
        """(Lq, Lk) bool: query i sees key j. For blocks, never for a whole sequence."""
        import torch  # on first use (module docstring of ringbench.kernels.base)

        q = torch.as_tensor(np.asarray(q_positions, dtype=np.int64))
        k = torch.as_tensor(np.asarray(k_positions, dtype=np.int64))
        lo, hi = (torch.as_tensor(x) for x in self.key_bounds(q.numpy()))
        return (k[None, :] >= lo[:, None]) & (k[None, :] <= hi[:, None])

    def position_mask(self, q_positions, k_positions) -> PositionMask:
        """The kernels' form of this rule on one block (positions, document ids, causal flag, window)."""
        import torch  # on first use (module docstring of ringbench.kernels.base)

        q = np.asarray(q_positions, dtype=np.int64)
        k = np.asarray(k_positions, dtype=np.int64)
        q_doc = k_doc = None
        if self.documents:
            q_doc = torch.as_tensor(self.doc_ids(q))
            k_doc = torch.as_tensor(self.doc_ids(k))
        return PositionMask(q_pos=torch.as_tensor(q), k_pos=torch.as_tensor(k), q_doc=q_doc, k_doc=k_doc,
                            causal=self.causal, window=self.window or 0)  # fmt: skip

    def may_see(self, q_first: int, q_last: int, k_first: int, k_last: int) -> bool:
        """False when no query in [q_first, q_last] can see a key in [k_first, k_last] (a safe test: True may
        still hide no visible pair when the positions are not contiguous)."""
        if self.causal and k_first > q_last:
            return False
        if self.window is not None and q_first - k_last >= self.window:
            return False
        if self.documents:
            doc = self.doc_ids([q_first, q_last, k_first, k_last])
            if doc[3] < doc[0] or doc[2] > doc[1]:
                return False
        return True

    def key_range(self, q_first: int, q_last: int) -> tuple[int, int]:
        """[lo, hi) of the key positions queries in [q_first, q_last] may see."""
        lo, hi = self.key_bounds([q_first, q_last])
        return int(lo[0]), int(hi[1]) + 1

    def query_range(self, k_first: int, k_last: int) -> tuple[int, int]:
        """[lo, hi) of the query positions that may see keys in [k_first, k_last]."""
        lo, hi = 0, self.seq
        if self.documents:
            start, end = self.doc_span([k_first, k_last])
            lo, hi = int(start[0]), int(end[1])
        if self.causal:
            lo = max(lo, k_first)
        if self.window is not None:
            hi = min(hi, k_last + self.window)
        return lo, hi


@lru_cache(maxsize=256)
def _rule(spec: MaskSpec, docs: str, seq: int) -> MaskRule:
    if not spec.documents:
        return MaskRule(spec=spec, seq=seq)
    found = documents(docs, seq)
    return MaskRule(spec=spec, seq=seq, doc_ends=found.ends, docs=found.spec)


def mask_rule(mask, docs: str | None = "none", seq: int | None = None) -> MaskRule:
    """The rule of ``mask`` (a name, a MaskSpec or already a MaskRule) on a sequence of ``seq`` tokens whose
    documents ``docs`` gives (a docs spec; ignored by masks without documents). Cached."""
    if isinstance(mask, MaskRule):
        return mask
    spec = MaskSpec.parse(mask, "mask")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise UsageError(f"seq={seq!r} is not allowed; expected an integer >= 1")
    docs = "none" if docs is None else docs
    if spec.documents and str(docs).strip() == "none":
        raise UsageError(
            f"mask={spec.text!r} is not allowed without documents; expected docs (--docs) to be lengths:..., "
            "file:PATH, lognormal:MEAN:SIGMA:SEED or uniform:MIN:MAX:SEED"
        )
    return _rule(spec, str(docs) if spec.documents else "none", seq)


def needs_documents(mask) -> bool:
    """True for the masks that read the docs axis (causal-document, full-document, and their windows)."""
    return MaskSpec.parse(mask, "mask").documents


__all__ = ["MaskRule", "mask_rule", "needs_documents"]
