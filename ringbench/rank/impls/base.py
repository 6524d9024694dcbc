"""The adapter interface: how ringbench runs someone else's ring attention under its sweeps and checks.

An adapter says what it supports (``Support``), which shard layout it expects (a ringbench layout name: the
rows each rank holds, see ringbench/engine/layout.py), whether it can run here (``missing``: one line, or None), and
builds a per-case attention function:

    fn = adapter.prepare(workload, group=group, device=device)  # once per case, outside the timed loop
    out = fn(q, k, v)        # q, k, v: (B, H, S/N, D) this rank's shards in adapter.layout(workload) order
    grads = torch.autograd.grad(out, (q, k, v), dout)           # backward through autograd
    fn.close()

``out`` is (B, H, S/N, D) in q's dtype, the rows of this rank's queries; gradients flow to q, k, v. Inputs come
from ringbench.engine.inputs.rank_shards(layout=adapter.layout(workload)) and the output and gradients are checked
against float64 by ringbench.engine.reference.check_errors, exactly as for ringbench's own engine.

A *workload* is any object with the case axes as attributes (world, seq, heads, head_dim, batch, dtype, mask,
layout, buffer, order, kernel, backward): a ringbench Case, or ``Workload`` below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ringbench.errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """One point of a sweep, for adapters (the same axes as ringbench.scenario.scenario.Case)."""

    world: int = 4
    seq: int = 4096
    heads: int = 4
    head_dim: int = 64
    batch: int = 1
    dtype: str = "float32"
    mask: str = "causal"
    layout: str = "zigzag"
    buffer: str = "double"
    order: str = "identity"
    kernel: str = "torch"
    backward: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Support:
    """What an adapter can run. ``layouts`` maps a mask to the layouts it accepts with that mask."""

    layouts: dict[str, tuple[str, ...]]
    dtypes: tuple[str, ...] = ("float64", "float32", "bfloat16", "float16")
    devices: tuple[str, ...] = ("cpu", "cuda")
    orders: tuple[str, ...] = ("identity",)  # ("*",): any ring order
    backward: bool = True
    notes: str = ""

    def problems(self, workload, device_type: str) -> list[str]:
        found = []
        allowed = self.layouts.get(workload.mask)
        if allowed is None:
            found.append(f"mask={workload.mask!r} (supported: {', '.join(self.layouts)})")
        elif workload.layout not in allowed:
            found.append(f"layout={workload.layout!r} with mask {workload.mask!r} (supported: {', '.join(allowed)})")
        if workload.dtype not in self.dtypes:
            found.append(f"dtype={workload.dtype!r} (supported: {', '.join(self.dtypes)})")
        if device_type not in self.devices:
            found.append(f"device {device_type!r} (supported: {', '.join(self.devices)})")
        if "*" not in self.orders and str(getattr(workload, "order", "identity")) not in self.orders:
            found.append(f"order={workload.order!r} (supported: {', '.join(self.orders)})")
        if getattr(workload, "backward", False) and not self.backward:
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

    def layout(self, workload) -> str:
        """The shard layout this adapter expects for ``workload`` (ringbench layout name)."""
        return workload.layout

    def check(self, workload, device_type: str) -> None:
        """UsageError with one line when this adapter cannot run ``workload`` here."""
        reason = self.missing(device_type)
        if reason:
            raise UsageError(f"impl={self.name!r} cannot run here: {reason}")
        problems = self.support.problems(workload, device_type)
        if problems:
            raise UsageError(f"impl={self.name!r} does not support {'; '.join(problems)}")

    def prepare(self, workload, *, group=None, device=None, recorder=None) -> AttentionFn:
        self.check(workload, getattr(device, "type", "cpu"))
        return self.build(workload, group=group, device=device, recorder=recorder)

    def build(self, workload, *, group, device, recorder) -> AttentionFn:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name, "description": self.description, "layouts": self.support.layouts,
                "dtypes": list(self.support.dtypes), "devices": list(self.support.devices),
                "orders": list(self.support.orders), "backward": self.support.backward,
                "requires": self.requires, "notes": self.support.notes}  # fmt: skip


def world_group(group):
    """The process group to pass to libraries that need a ProcessGroup object (the default one for None)."""
    import torch.distributed as dist

    return group if group is not None else dist.group.WORLD


def flash_layout(tensor):
    """(B, H, L, D) -> (B, L, H, D), the layout of flash-attn style libraries (a view; gradients flow)."""
    return tensor.transpose(1, 2)


__all__ = ["Adapter", "AttentionFn", "Support", "Workload", "flash_layout", "world_group"]
