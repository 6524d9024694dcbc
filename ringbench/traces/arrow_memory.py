"""Arrow's memory returned to the system while traces are imported.

pandas keeps text columns in Arrow arrays, and Arrow's default allocator (mimalloc) keeps the memory it frees for
its next allocations. An import allocates and frees a trace's worth of text columns per rank (and its worker
processes inherit the allocator), so with mimalloc the freed columns stay in the process: measured on a set of 8
traces of 50 MB, the parent peaked about 108 MB above its imports and each reader 30 MB; with the system allocator,
which returns what it frees, 80 MB and 28 MB, at the same speed. pyarrow's own calls follow ``system_allocator()``;
parts of Arrow's C++ (the Parquet writer) take the process default, which only ``ARROW_DEFAULT_MEMORY_POOL=system``
set before pyarrow loads changes (`ringbench import` sets it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def system_allocator() -> Iterator[None]:
    """Arrow allocates with the system allocator inside the block (and in processes forked there), as before after
    it; buffers keep the allocator that made them."""
    import pyarrow as pa

    previous = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(previous)


__all__ = ["system_allocator"]
