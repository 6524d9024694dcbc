"""The fixed vocabulary of a ring: mask modes, layouts, buffer strategies and dtypes, and their parsing.

Mask modes are data (``MaskSpec``): which keys a query sees follows from token positions and document ids alone.
A query at position i sees the keys j with
    same document (document masks)  and  j <= i (causal)  and  i - j < W (window:W)
so every mode is an interval of key positions per query. ``MaskSpec.parse`` reads the mode names of the ``mask`` axis:
``none``, ``causal``, ``causal-naive``, ``causal-document``, ``full-document``, ``window:W`` and
``causal-document+window:W``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ringbench.errors import UsageError, bad_value

DTYPE_ALIASES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
"""Short dtype names the axes accept."""


class _Choice(str, Enum):
    @classmethod
    def parse(cls, value: object, field: str | None = None):
        """Accept a member or its string value; otherwise raise the standard one-line UsageError."""
        if isinstance(value, cls):
            return value
        for member in cls:
            if value == member.value:
                return member
        allowed = ", ".join(m.value for m in cls)
        raise bad_value(field or cls.__name__.lower(), value, f"one of: {allowed}")

    def __str__(self) -> str:
        return self.value


class Mask(_Choice):
    NONE = "none"
    CAUSAL = "causal"  # fully masked (query, key) segment pairs are skipped: the block is only forwarded
    CAUSAL_NAIVE = "causal-naive"  # every pair computed with its mask: the baseline that wastes ~half the work


MASK_HELP = (
    "one of: none, causal, causal-naive, causal-document, full-document, window:W (a causal sliding window of W "
    "tokens), causal-document+window:W"
)


@dataclass(frozen=True, slots=True)
class MaskSpec:
    """A mask mode as data: the positional rule a query's visible keys follow (see the module docstring)."""

    causal: bool = True
    """Keys at or before the query only."""
    documents: bool = False
    """Keys of the query's own document only (the documents come from the case's ``docs`` spec)."""
    window: int | None = None
    """Causal sliding window: query i sees keys i-W+1..i (None: no window)."""
    naive: bool = False
    """``causal-naive``: every pair is computed with its mask, nothing is skipped (the seed's baseline)."""

    @classmethod
    def parse(cls, value: object, field: str = "mask") -> MaskSpec:
        """A spec, a Mask member or a mode name; anything else raises the one-line UsageError."""
        if isinstance(value, MaskSpec):
            return value
        if isinstance(value, Mask):
            value = value.value
        text = value.strip() if isinstance(value, str) else value
        if not isinstance(text, str) or not text:
            raise bad_value(field, value, MASK_HELP)
        parts = text.split("+")
        windows = [p for p in parts if p.startswith("window:")]
        rest = [p for p in parts if not p.startswith("window:")]
        window = None
        if len(windows) > 1:
            raise bad_value(field, value, MASK_HELP + " (one window at most)")
        if windows:
            number = windows[0].removeprefix("window:")
            if not number.strip().lstrip("+-").isdigit():
                raise bad_value(field, value, "window:W with an integer W >= 1 (tokens), e.g. window:4096")
            window = int(number)
            if window < 1:
                raise bad_value(field, value, "window:W with an integer W >= 1 (tokens), e.g. window:4096")
        base = {
            (): cls(causal=True),
            ("none",): cls(causal=False),
            ("causal",): cls(causal=True),
            ("causal-naive",): cls(causal=True, naive=True),
            ("causal-document",): cls(causal=True, documents=True),
            ("full-document",): cls(causal=False, documents=True),
        }.get(tuple(rest))
        if base is None or (window is not None and not base.causal) or (window is not None and base.naive):
            raise bad_value(field, value, MASK_HELP)
        if window is None and not rest:
            raise bad_value(field, value, MASK_HELP)
        return cls(causal=base.causal, documents=base.documents, window=window, naive=base.naive)

    @property
    def text(self) -> str:
        """The canonical mode name (what case ids, records and reports show)."""
        if self.naive:
            return "causal-naive"
        if self.documents:
            head = "causal-document" if self.causal else "full-document"
            return head + (f"+window:{self.window}" if self.window is not None else "")
        if self.window is not None:
            return f"window:{self.window}"
        return "causal" if self.causal else "none"

    @property
    def legacy(self) -> bool:
        """One of the three original modes (none, causal, causal-naive): their plans never change."""
        return not self.documents and self.window is None

    def __str__(self) -> str:
        return self.text


def canonical_mask(value: object, field: str = "mask") -> str:
    """The canonical name of a mask mode (``causal+window:64`` -> ``window:64``); raises the one-line error."""
    return MaskSpec.parse(value, field).text


class Layout(_Choice):
    CONTIGUOUS = "contiguous"  # rank i owns [i*S/N, (i+1)*S/N)
    ZIGZAG = "zigzag"  # 2N chunks; rank i owns chunks i and 2N-1-i
    STRIPED = "striped"  # token t belongs to rank t mod N
    DOC_BALANCED = "doc-balanced"  # equal chunks given to ranks by their visible work (document / window masks)


class Buffer(_Choice):
    SYNC = "sync"  # blocking exchange, then compute: no overlap
    DOUBLE = "double"  # post the next exchange, compute the block in hand, then wait: two KV buffers
    ALLGATHER = "allgather"  # gather all K, V and compute locally: exact, O(S) memory per device
    # The short ring (the window-aware ring): a block travels only as far as some rank's queries see it, and the
    # ring stops after the last step any rank needs; the backward sends dK/dV home along the same short path.
    SYNC_SHORT = "sync-short"
    DOUBLE_SHORT = "double-short"

    @property
    def short(self) -> bool:
        return self in (Buffer.SYNC_SHORT, Buffer.DOUBLE_SHORT)

    @property
    def sync(self) -> bool:
        """Exchange, then compute (no overlap)."""
        return self in (Buffer.SYNC, Buffer.SYNC_SHORT)


DTYPES = ("float64", "float32", "bfloat16", "float16")  # torch dtype names: getattr(torch, name)

# Largest absolute error allowed against the float64 reference, forward and backward, per input dtype.
TOLERANCE = {
    "float64": (1e-10, 1e-9),
    "float32": (1e-5, 5e-5),
    "bfloat16": (2e-2, 5e-2),
    "float16": (4e-3, 1e-2),
}


def tolerance(dtype: str, kv_group: int = 1) -> tuple[float, float]:
    """(forward, backward) largest absolute error allowed for ``dtype`` (TOLERANCE). With grouped-query attention
    (``kv_group`` = heads / kv_heads query heads per KV head) a KV head's dK and dV sum the contributions of that
    many query heads: their magnitude, and with it each rounding to the dtype (a block kernel returns its dK/dV in
    the input dtype), grows up to that many times, and so does the backward's bound."""
    forward, backward = TOLERANCE[dtype]
    return forward, backward * max(1, int(kv_group))


# -- strategies: how N ranks share one attention (ringbench/engine/strategy.py runs them) -------------------------
STRATEGY_HELP = (
    "ring, ulysses, hybrid:U (Ulysses of degree U inside groups, a ring of N/U across them), double-ring:W "
    "(inner rings of W ranks, an outer ring across them) or allgather"
)
STRATEGY_KINDS = ("ring", "ulysses", "hybrid", "double-ring", "allgather")


class Strategy:
    """A parsed strategy spec: ``ring``, ``ulysses``, ``hybrid:U``, ``double-ring:W``, ``allgather``.

    Degrees: ``ulysses`` is Ulysses of degree N (heads divisible by N); ``hybrid:U`` Ulysses of degree U inside
    groups of U ranks and a ring of degree N/U across the groups (heads divisible by U); ``double-ring:W`` inner
    rings of W ranks and an outer ring of N/W across them; ``ring`` and ``allgather`` are today's engine with its
    buffers (``allgather`` is the buffer of that name: the O(S)-memory baseline).
    """

    __slots__ = ("degree", "kind")

    def __init__(self, kind: str, degree: int | None = None) -> None:
        self.kind = kind
        self.degree = degree

    @classmethod
    def parse(cls, value: object, field: str = "strategy") -> Strategy:
        if isinstance(value, Strategy):
            return value
        text = str(value).strip() if isinstance(value, str) else None
        if not text:
            raise bad_value(field, value, STRATEGY_HELP)
        kind, _, argument = text.partition(":")
        if kind in ("ring", "ulysses", "allgather") and not argument:
            return cls(kind)
        if kind in ("hybrid", "double-ring") and argument:
            try:
                degree = int(argument)
            except ValueError:
                raise bad_value(field, value, f"{kind}:K with an integer K >= 1 ({STRATEGY_HELP})") from None
            if degree < 1:
                raise bad_value(field, value, f"{kind}:K with an integer K >= 1")
            return cls(kind, degree)
        raise bad_value(field, value, STRATEGY_HELP)

    @property
    def spec(self) -> str:
        return self.kind if self.degree is None else f"{self.kind}:{self.degree}"

    def __str__(self) -> str:
        return self.spec

    def __repr__(self) -> str:
        return f"Strategy({self.spec!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self.spec)

    @property
    def grouped(self) -> bool:
        """Ranks are cut into groups by a placement (hybrid: Ulysses groups; double ring: inner rings)."""
        return self.kind in ("hybrid", "double-ring")

    @property
    def ordered(self) -> bool:
        """The ``order`` axis (one ring over every rank) applies."""
        return self.kind in ("ring", "allgather")

    def group_size(self, world: int) -> int:
        """Ranks per group: U (hybrid), W (double ring), N (ulysses), 1 (ring, allgather)."""
        if self.kind == "ulysses":
            return world
        return self.degree if self.grouped else 1

    def ulysses_degree(self, world: int) -> int:
        return world if self.kind == "ulysses" else self.degree if self.kind == "hybrid" else 1

    def buffers(self) -> tuple[str, ...]:
        """The buffer modes that mean something for this strategy (the first is its canonical one)."""
        if self.kind == "allgather":
            return ("allgather",)
        if self.kind == "ulysses":
            return ("sync",)  # the all-to-alls block; nothing travels while attention runs
        if self.kind == "ring":
            return ("double", "sync", "double-short", "sync-short")  # the short ring: ringbench/engine/short_ring.py
        return ("double", "sync")

    def check(self, world: int, heads: int, field: str = "strategy", *, kv_heads: int = 0) -> None:
        """One line when the degrees do not divide the world or the heads, or the Ulysses degree neither divides
        the KV heads (``kv_heads``; 0: as many as heads) nor is a multiple of them (each KV head then goes to
        degree / kv_heads ranks of the group, as DeepSpeed repeats them)."""
        size = self.group_size(world)
        if world % size:
            divisors = [d for d in range(1, world + 1) if world % d == 0]
            raise bad_value(field, self.spec, f"a degree dividing world={world} ({', '.join(map(str, divisors))})")
        ulysses = self.ulysses_degree(world)
        if heads % ulysses:
            raise UsageError(
                f"{field}={self.spec!r} is not allowed with heads={heads} on world={world}: Ulysses of degree "
                f"{ulysses} needs the heads divisible by {ulysses}"
            )
        if kv_heads and kv_heads % ulysses and ulysses % kv_heads:
            raise UsageError(
                f"{field}={self.spec!r} is not allowed with kv_heads={kv_heads} on world={world}: Ulysses of degree "
                f"{ulysses} needs the KV heads divisible by {ulysses}, or dividing it (each then repeated)"
            )
