"""The fixed vocabulary of a ring: mask modes, layouts, buffer strategies and dtypes, and their parsing."""

from __future__ import annotations

from enum import Enum

import torch

from ringbench.errors import bad_value


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


class Layout(_Choice):
    CONTIGUOUS = "contiguous"  # rank i owns [i*S/N, (i+1)*S/N)
    ZIGZAG = "zigzag"  # 2N chunks; rank i owns chunks i and 2N-1-i
    STRIPED = "striped"  # token t belongs to rank t mod N


class Buffer(_Choice):
    SYNC = "sync"  # blocking exchange, then compute: no overlap
    DOUBLE = "double"  # post the next exchange, compute the block in hand, then wait: two KV buffers
    ALLGATHER = "allgather"  # gather all K, V and compute locally: exact, O(S) memory per device


DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Largest absolute error allowed against the float64 reference, forward and backward, per input dtype.
TOLERANCE = {
    "float64": (1e-10, 1e-9),
    "float32": (1e-5, 5e-5),
    "bfloat16": (2e-2, 5e-2),
    "float16": (4e-3, 1e-2),
}
