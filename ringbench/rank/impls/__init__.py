"""Other ring-attention implementations under ringbench's sweeps and checks: adapters and their registry.

    from ringbench.rank.impls import get_adapter, adapter_names
    adapter = get_adapter("torch-ring:alltoall")   # or ringbench, ring-attention-pytorch, my_pkg.ring:attention
    adapter.check(case, "cpu")                     # one line (UsageError) when it cannot run the scenario's Case here

The interface is ringbench/rank/impls/base.py; the per-rank call the runner makes is ringbench/rank/impls/rank.py.
"""

from __future__ import annotations

from ringbench.rank.impls.base import Adapter, AttentionFn, Support
from ringbench.rank.impls.builtin import (
    RingAttentionPytorchAdapter,
    RingbenchAdapter,
    RingFlashAttnAdapter,
    TransformerEngineAdapter,
    UserAdapter,
)
from ringbench.rank.impls.torch_ring import TorchRingAdapter
from ringbench.scenario.impls import DEFAULT_IMPL, IMPL_NAMES, check_impl

_BUILTIN = {
    "ringbench": RingbenchAdapter,
    "torch-ring": lambda: TorchRingAdapter("ALL_GATHER", "torch-ring"),
    "torch-ring:allgather": lambda: TorchRingAdapter("ALL_GATHER", "torch-ring:allgather"),
    "torch-ring:alltoall": lambda: TorchRingAdapter("ALL_TO_ALL", "torch-ring:alltoall"),
    "ring-attention-pytorch": RingAttentionPytorchAdapter,
    "ring-flash-attn": RingFlashAttnAdapter,
    "transformer-engine": TransformerEngineAdapter,
}


def adapter_names() -> tuple[str, ...]:
    """The built-in adapter names (a user's ``module:function`` is accepted too)."""
    return tuple(_BUILTIN)


assert tuple(_BUILTIN) == IMPL_NAMES, "the scenario's impl names (ringbench/scenario/impls.py) and the adapters differ"


def get_adapter(name: str) -> Adapter:
    """The adapter called ``name``: a built-in one, or ``module:function`` for a user's implementation."""
    check_impl(name)
    return _BUILTIN[name]() if name in _BUILTIN else UserAdapter(name)


__all__ = ["DEFAULT_IMPL", "Adapter", "AttentionFn", "Support", "adapter_names", "get_adapter"]
