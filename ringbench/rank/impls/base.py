"""The adapter interface: how ringbench runs someone else's ring attention under its sweeps and checks.

An adapter says what it supports (``Support``), which shard layout it expects (a ringbench layout name: the
rows each rank holds, see ringbench/engine/layout.py), whether it can run here (``missing``: one line, or None), and
builds a per-case attention function:

    fn = adapter.prepare(case, group=group, device=device)  # once per case, outside the timed loop
    out = fn(q, k, v)        # q, k, v: (B, H, S/N, D) this rank's shards in adapter.layout(case) order;
                             # or (out, lse), lse (B, H, S/N) without gradient, where the implementation exposes it
    grads = torch.autograd.grad(out, (q, k, v), dout)           # backward through autograd
    fn.close()

``out`` is (B, H, S/N, D) in q's dtype, the rows of this rank's queries; gradients flow to q, k, v. Inputs come
from ringbench.engine.inputs.rank_shards (a ShardSpec in adapter.layout(case)) and the output and gradients are checked
against float64 by ringbench.engine.reference.check_errors, exactly as for ringbench's own engine.

A *case* is the scenario's ``Case`` (ringbench.scenario.scenario): a ``Workload`` (its axes read as the case's own:
world, seq, heads, head_dim, batch, dtype, mask, layout, buffer, order, ...) with the kernel, the implementation and
the backward switch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ringbench.errors import UsageError


def mask_family(mask: str) -> str:
    """The key a mask has in ``Support.layouts``: its name, or ``window`` / ``causal-document+window`` for a
    window of any size (``window:512`` -> ``window``)."""
    head, _, tail = str(mask).partition("window:")
    return head + "window" if tail else str(mask)


def _run_length(case) -> int | None:
    """Tokens in each run of consecutive positions a rank holds (None: striped, or shards of unequal length)."""
    world, seq, layout = case.world, case.seq, str(case.layout)
    parts = 2 * world if layout in ("zigzag", "doc-balanced") else world
    if layout == "striped" or seq % parts:
        return None
    return seq // parts


@dataclass(frozen=True, kw_only=True, slots=True)
class Support:
    """What an adapter can run. ``layouts`` maps a mask (or mask family, ``mask_family``) to the layouts it
    accepts with that mask."""

    layouts: dict[str, tuple[str, ...]]
    dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
    devices: tuple[str, ...] = ("cpu", "cuda")
    orders: tuple[str, ...] = ("identity",)  # ("*",): any ring order
    backward: bool = True
    gqa: bool = False
    """Grouped-query attention: K and V with fewer heads than Q (``kv_heads`` dividing ``heads``)."""
    uneven: bool = False
    """Shards of unequal length: a sequence that is not a multiple of the world (or of 2N for zigzag)."""
    min_world: int = 1
    """The fewest ranks it runs on (a ring that always exchanges cannot run alone: gloo refuses a send to self)."""
    multiple: int = 1
    """Every run of consecutive tokens a rank holds (a contiguous shard, a zigzag chunk) is a multiple of this:
    an implementation that works in blocks of that many tokens (1: any length)."""
    notes: str = ""

    def layouts_for(self, mask: str) -> tuple[str, ...] | None:
        """The layouts accepted with ``mask`` (by name, else by family), None when the mask is not supported."""
        allowed = self.layouts.get(str(mask))
        return allowed if allowed is not None else self.layouts.get(mask_family(mask))

    def problems(self, case, device_type: str) -> list[str]:
        found = []
        allowed = self.layouts_for(case.mask)
        if allowed is None:
            found.append(f"mask={case.mask!r} (supported: {', '.join(self.layouts)})")
        elif case.layout not in allowed:
            found.append(f"layout={case.layout!r} with mask {case.mask!r} (supported: {', '.join(allowed)})")
        if case.key_value_heads != case.heads and not self.gqa:
            found.append(f"kv_heads={case.key_value_heads} (K and V of as many heads as the queries' {case.heads})")
        if case.world < self.min_world:
            found.append(f"world={case.world} (at least {self.min_world} ranks)")
        runs = _run_length(case)
        if self.multiple > 1 and runs is not None and runs % self.multiple:
            found.append(f"seq={case.seq} on {case.world} ranks with layout {case.layout!r} (runs of {runs} tokens, "
                         f"not a multiple of {self.multiple})")  # fmt: skip
        if not getattr(case, "even", True) and not self.uneven:
            found.append(f"seq={case.seq} on {case.world} ranks with layout {case.layout!r} (uneven shards)")
        if case.dtype not in self.dtypes:
            found.append(f"dtype={case.dtype!r} (supported: {', '.join(self.dtypes)})")
        if device_type not in self.devices:
            found.append(f"device {device_type!r} (supported: {', '.join(self.devices)})")
        if "*" not in self.orders and case.order not in self.orders:
            found.append(f"order={case.order!r} (supported: {', '.join(self.orders)})")
        if case.backward and not self.backward:
            found.append("backward (forward only)")
        return found


@dataclass(slots=True)
class AttentionFn:
    """A prepared attention call: ``fn(q, k, v) -> out`` (autograd-capable), and ``close()`` when done."""

    call: Callable
    cleanup: Callable | None = None
    info: dict = field(default_factory=dict)

    def __call__(self, q, k, v):
        return self.call(q, k, v)

    def close(self) -> None:
        if self.cleanup is not None:
            self.cleanup()


class Adapter:
    """Base class of the adapters (see the module doc). Subclasses set name, description and support and
    implement ``build``; ``missing`` says why the adapter cannot run here (None when it can)."""

    name: str = ""
    description: str = ""
    support: Support = Support(layouts={})
    requires: str = ""  # what to install, for the one-line skip
    # Its attention arithmetic in a profiler trace when that is not the SDPA / flash family the importer knows
    # (ringbench.traces.rank_view.DEFAULT_COMPUTE_PATTERNS): regular expressions over op or kernel names.
    compute_patterns: tuple[str, ...] = ()

    def missing(self, device_type: str = "cpu") -> str | None:
        return None

    def layout(self, case) -> str:
        """The shard layout this adapter expects for ``case`` (ringbench layout name)."""
        return case.layout

    def check(self, case, device_type: str) -> None:
        """UsageError with one line when this adapter cannot run ``case`` here."""
        reason = self.missing(device_type)
        if reason:
            raise UsageError(f"impl={self.name!r} cannot run here: {reason}")
        problems = self.support.problems(case, device_type)
        if problems:
            raise UsageError(f"impl={self.name!r} does not support {'; '.join(problems)}")

    def prepare(self, case, *, group=None, device=None, recorder=None) -> AttentionFn:
        self.check(case, getattr(device, "type", "cpu"))
        return self.build(case, group=group, device=device, recorder=recorder)

    def build(self, case, *, group, device, recorder) -> AttentionFn:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "description": self.description, "layouts": self.support.layouts,
                "dtypes": list(self.support.dtypes), "devices": list(self.support.devices),
                "orders": list(self.support.orders), "backward": self.support.backward, "gqa": self.support.gqa,
                "uneven": self.support.uneven, "multiple": self.support.multiple,
                "min_world": self.support.min_world, "requires": self.requires, "notes": self.support.notes}  # fmt: skip


def world_group(group):
    """The process group to pass to libraries that need a ProcessGroup object (the default one for None)."""
    import torch.distributed as dist

    return group if group is not None else dist.group.WORLD


def flash_layout(tensor):
    """(B, H, L, D) -> (B, L, H, D), the layout of flash-attn style libraries (a view; gradients flow)."""
    return tensor.transpose(1, 2)


__all__ = ["Adapter", "AttentionFn", "Support", "flash_layout", "mask_family", "world_group"]
