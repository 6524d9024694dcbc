"""What a rank's attention computes (``AttentionSpec``) and where it runs (``Runtime``), and the checks of a call.

    spec = AttentionSpec(mask="causal", layout="zigzag", strategy="hybrid:2", placement="interleaved")
    out_l = ringbench.attention(q_l, k_l, v_l, spec=spec, runtime=Runtime(group=group))

The spec is the computation: the mask and its documents, how the tokens are sharded (``layout``), how the ranks share
the work (``strategy``, ``placement``, ``buffer``, ``order``), the block kernel, the softmax scale, the layer it
runs and whether its exchanges take process groups of their own. The runtime is the machinery: the process group,
the clocks of its spans (``timeline``), the recorder, injected link delays, the bound on every wait and what a
stall calls. ``ringbench.engine.api.build_context(q, k, v, spec, runtime)`` validates both once and builds the
rank's context for the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from ringbench.errors import UsageError, bad_value
from ringbench.vocab import Buffer, Strategy


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionSpec:
    """What one rank's attention computes: the same on every rank of the group."""

    mask: object = "causal"
    """A mask mode name (none, causal, causal-naive, causal-document, full-document, window:W, ...) or a MaskRule
    of ringbench.engine.masks (which carries its documents)."""
    docs: str = "none"
    """The packed documents of a document mask named by mode (ringbench.engine.documents specs)."""
    layout: object = "contiguous"
    """contiguous, zigzag, striped, doc-balanced, or a resolved doc-balanced layout (ringbench.engine.layout)."""
    strategy: str = "ring"
    """ring, ulysses, hybrid:U, double-ring:W, allgather (ringbench.vocab.Strategy)."""
    placement: str | tuple[int, ...] = "heads-first"
    """Grouped strategies: heads-first, interleaved, or the ranks in placement order (ringbench.orders)."""
    buffer: str = "double"
    """sync, double, allgather, sync-short, double-short (ringbench.vocab.Buffer); the strategy ``allgather`` runs
    the all-gather baseline whatever this says."""
    order: str | tuple[int, ...] = "identity"
    """The ring order of ring and allgather: a spec (identity, reverse, stride:K, random:SEED, 0-3-1-2) or ranks."""
    kernel: object = "torch"
    """A block kernel name (ringbench.kernels: torch, math, triton, emulated:GFLOPS, ...) or a kernel object."""
    scale: float | None = None
    """The softmax scale; None: head_dim ** -0.5."""
    layer: int = 0
    """The attention layer this context runs (recorded with its spans)."""
    groups: str = "auto"
    """auto, own or shared: whether each exchange gets a process group of its own (ringbench/engine/pgroups.py)."""

    def __post_init__(self) -> None:
        strategy = Strategy.parse(self.strategy, "strategy")
        object.__setattr__(self, "strategy", strategy.spec)
        Buffer.parse(self.buffer, "buffer")
        if strategy.kind == "allgather":
            object.__setattr__(self, "buffer", "allgather")
        for name in ("placement", "order"):  # ranks given as a list: a tuple, so the spec stays immutable
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise bad_value("layer", self.layer, "an integer >= 0")

    @property
    def grouped(self) -> bool:
        """Ulysses, the hybrid or the double ring (not one ring over every rank)."""
        return not Strategy.parse(self.strategy).ordered


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Runtime:
    """Where a rank's attention runs: the machinery around the computation, never part of its result."""

    group: object = None
    """The torch.distributed process group of the ranks (None: the default group, or one rank without one)."""
    timeline: object = None
    """Where spans get their times (ringbench.engine.timeline.timeline_for(device) when None)."""
    recorder: object = None
    """Receives the spans of the ring (ringbench.engine.recorder; a no-op when None)."""
    link_delay: object = None
    """Injected transfer delay, ``(src, dst, nbytes) -> seconds`` (emulated links, slow links), or None."""
    timeout_s: float = 60.0
    """Seconds any distributed wait may take before it is a stall naming the rank and the ring step."""
    on_stall: object = None
    """Called with a stall's diagnosis before it raises (a run uses it to stop its peers), or None."""
    loopback: bool = False
    """A 1-rank ring still exchanges its block with itself (the one-device test of the transfer path)."""


SPEC_FIELDS = tuple(f.name for f in fields(AttentionSpec))
RUNTIME_FIELDS = tuple(f.name for f in fields(Runtime))


def split_options(caller: str, options: dict) -> tuple[AttentionSpec, Runtime]:
    """(spec, runtime) from keyword options named as their fields (the keywords of ``ring_attention``); an unknown
    keyword is a TypeError, as Python's own."""
    unknown = sorted(set(options) - set(SPEC_FIELDS) - set(RUNTIME_FIELDS))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    spec = AttentionSpec(**{k: v for k, v in options.items() if k in SPEC_FIELDS})
    return spec, Runtime(**{k: v for k, v in options.items() if k in RUNTIME_FIELDS})


def group_world_rank(group) -> tuple[int, int]:
    """(world, rank) of ``group``: (1, 0) without torch.distributed."""
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise UsageError("group is given but torch.distributed is not initialized; call init_process_group first")
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def check_tensors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """q: this rank's (B, H, S/N, D) shard; k, v: (B, KV, S/N, D), KV dividing H (grouped-query attention: query
    head h reads KV head h // (H / KV)); alike in dtype and device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise bad_value(f"{name}.shape", shape, "a 4-D tensor (batch, heads, local_seq, head_dim)")
        if not t.is_floating_point():
            raise bad_value(f"{name}.dtype", str(t.dtype), "a floating-point dtype")
    if k.shape != v.shape:
        raise bad_value("v.shape", tuple(v.shape), f"the shape of k, {tuple(k.shape)}")
    batch, heads, local, head_dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, local, head_dim) or k.shape[1] < 1 or heads % k.shape[1]:
        raise bad_value("k.shape", tuple(k.shape), f"({batch}, KV, {local}, {head_dim}): q's batch, local length and "
                        f"head dim, with KV heads dividing q's {heads} (grouped-query attention)")  # fmt: skip
    if not (q.dtype == k.dtype == v.dtype):
        raise bad_value("k.dtype/v.dtype", f"{k.dtype}/{v.dtype}", f"q's dtype, {q.dtype}")
    if not (q.device == k.device == v.device):
        raise bad_value("k.device/v.device", f"{k.device}/{v.device}", f"q's device, {q.device}")


__all__ = ["RUNTIME_FIELDS", "SPEC_FIELDS", "AttentionSpec", "Runtime", "check_tensors", "group_world_rank",
           "split_options"]  # fmt: skip
