"""ringbench: benchmarking and topology profiling for ring attention.

Library use (inside any torch.distributed program)::

    from ringbench import ring_attention, shard, unshard
"""

from ringbench.engine.api import build_context, reference_attention, ring_attention
from ringbench.engine.layout import shard, token_positions, unshard
from ringbench.orders import parse_order
from ringbench.vocab import Buffer, Layout, Mask

__version__ = "0.1.0"

__all__ = [
    "Buffer",
    "Layout",
    "Mask",
    "__version__",
    "build_context",
    "parse_order",
    "reference_attention",
    "ring_attention",
    "shard",
    "token_positions",
    "unshard",
]
