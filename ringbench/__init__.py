"""ringbench: benchmarking and topology profiling for ring attention.

Library use (inside any torch.distributed program)::

    from ringbench import AttentionSpec, Runtime, attention, ring_attention, shard, unshard
    out_l = attention(q_l, k_l, v_l, spec=AttentionSpec(mask="causal", layout="zigzag", strategy="ulysses"))

The names load on first use (PEP 562), so ``import ringbench`` and the commands that never touch a tensor
(``analyze``, ``report``, ``compare``, ``simulate``, ...) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ringbench._version import __version__

_EXPORTS = {
    "attention": "ringbench.engine.api",
    "build_context": "ringbench.engine.api",
    "reference_attention": "ringbench.engine.api",
    "ring_attention": "ringbench.engine.api",
    "shard": "ringbench.engine.layout",
    "token_positions": "ringbench.engine.layout",
    "unshard": "ringbench.engine.layout",
    "AttentionSpec": "ringbench.engine.spec",
    "Runtime": "ringbench.engine.spec",
    "parse_order": "ringbench.orders",
    "Buffer": "ringbench.vocab",
    "Layout": "ringbench.vocab",
    "Mask": "ringbench.vocab",
}

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ below loads each name once
    from ringbench.engine.api import attention, build_context, reference_attention, ring_attention
    from ringbench.engine.layout import shard, token_positions, unshard
    from ringbench.engine.spec import AttentionSpec, Runtime
    from ringbench.orders import parse_order
    from ringbench.vocab import Buffer, Layout, Mask


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ringbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "AttentionSpec",
    "Buffer",
    "Layout",
    "Mask",
    "Runtime",
    "__version__",
    "attention",
    "build_context",
    "parse_order",
    "reference_attention",
    "ring_attention",
    "shard",
    "token_positions",
    "unshard",
]
