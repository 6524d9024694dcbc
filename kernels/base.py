"""The block-kernel contract shared by every kernel."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:

    class _Torch:
        """torch, imported on first use: naming kernels, planning masks and counting FLOPs need none of it (the
        simulator and `ringbench plan` start without loading torch)."""

        def __getattr__(self, name: str):
            return getattr(importlib.import_module("torch"), name)

    torch = _Torch()


class MaskKind(str, Enum):
    FULL = "full"  # every key visible to every query
    CAUSAL = "causal"  # square block on the diagonal: query i sees keys 0..i (top-left aligned)
    PARTIAL = "partial"  # an arbitrary boolean mask (True = visible), derived from token positions


@dataclass(frozen=True, slots=True)
class PositionMask:
    """A PARTIAL block's mask as a rule on its tokens: query i sees key j iff
    (not causal or k_pos[j] <= q_pos[i]) and (window == 0 or q_pos[i] - k_pos[j] < window) and
    (no documents or q_doc[i] == k_doc[j]). Positions and document ids are (Lq,) / (Lk,) int64 CPU tensors;
    kernels evaluate the rule on their own tiles (Triton) or build the (Lq, Lk) mask once on their device."""

    q_pos: torch.Tensor
    k_pos: torch.Tensor
    q_doc: torch.Tensor | None = None
    k_doc: torch.Tensor | None = None
    causal: bool = True
    window: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.q_pos.numel()), int(self.k_pos.numel()))

    def allowed(self, device: torch.device | None = None) -> torch.Tensor:
        """(Lq, Lk) bool on ``device`` (default CPU), True = visible."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        q = to_device(self.q_pos, device)[:, None]
        k = to_device(self.k_pos, device)[None, :]
        visible = torch.ones((q.shape[0], k.shape[1]), dtype=torch.bool, device=device)
        if self.causal:
            visible &= k <= q
        if self.window:
            visible &= (q - k) < self.window
        if self.q_doc is not None and self.k_doc is not None:
            visible &= to_device(self.q_doc, device)[:, None] == to_device(self.k_doc, device)[None, :]
        return visible


@dataclass(frozen=True, slots=True)
class BlockMask:
    """What a block kernel must mask. PARTIAL masks carry ``allowed`` ((Lq, Lk) bool) or a positional ``rule``
    (PositionMask) from which the kernel derives it; FULL and CAUSAL carry neither."""

    kind: MaskKind
    allowed: torch.Tensor | None = None
    # Rows with no visible key at all (PARTIAL only): their lse is -inf and their output 0, so the online-softmax
    # merge ignores them. Kernels are not trusted to report this themselves (the CPU flash op returns lse=0).
    empty_rows: torch.Tensor | None = None
    visible: float | None = None  # share of visible entries (PARTIAL), precomputed by the planner
    rule: PositionMask | None = None

    @staticmethod
    def partial(allowed: torch.Tensor) -> BlockMask:
        """A PARTIAL mask with its empty rows and visible share worked out once."""
        empty = ~allowed.any(dim=1)
        return BlockMask(
            MaskKind.PARTIAL,
            allowed=allowed,
            empty_rows=empty if bool(empty.any()) else None,
            visible=float(allowed.float().mean()),
        )

    @staticmethod
    def from_rule(rule: PositionMask, row_counts: torch.Tensor) -> BlockMask:
        """A PARTIAL mask given by a positional rule; ``row_counts`` (Lq,): visible keys per query (the planner
        counts them without building the mask)."""
        q_len, k_len = rule.shape
        empty = row_counts == 0
        share = float(row_counts.sum()) / max(1, q_len * k_len)
        return BlockMask(MaskKind.PARTIAL, empty_rows=empty if bool(empty.any()) else None, visible=share, rule=rule)

    @property
    def shape(self) -> tuple[int, int] | None:
        """(Lq, Lk) of a PARTIAL mask; None for FULL and CAUSAL."""
        if self.allowed is not None:
            return tuple(self.allowed.shape)
        return self.rule.shape if self.rule is not None else None

    @property
    def work_fraction(self) -> float:
        """Share of the Lq x Lk score matrix the kernel computes: a PARTIAL mask is applied, not exploited."""
        return 0.5 if self.kind is MaskKind.CAUSAL else 1.0

    @property
    def visible_fraction(self) -> float:
        if self.kind is MaskKind.FULL:
            return 1.0
        if self.kind is MaskKind.CAUSAL:
            return 0.5  # (L + 1) / (2L) rounded: the kernel's own work, not the exact count
        if self.visible is not None:
            return self.visible
        if self.allowed is None:
            assert self.rule is not None
            return float(self.rule.allowed().float().mean())
        return float(self.allowed.float().mean())


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """Online-softmax statistics are kept in fp32, or fp64 when the inputs are fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_flops(batch: int, heads: int, q_len: int, k_len: int, head_dim: int, visible: float, backward: bool) -> float:
    """Useful FLOPs of one block: QK^T and PV are 2*Lq*Lk*D each (forward); backward adds 5 matmuls (2.5x)."""
    forward = 4.0 * batch * heads * q_len * k_len * head_dim * visible
    return forward * 2.5 if backward else forward


class _Dtypes:
    """A kernel's default dtypes (fp64, fp32, bf16, fp16), made on first read (a subclass or an instance may set
    its own)."""

    def __get__(self, obj, owner=None) -> tuple:
        return (torch.float64, torch.float32, torch.bfloat16, torch.float16)


class BlockKernel:
    """Base class: subclasses implement forward and backward for one (query block, key block) pair.

    Shapes: q (B, H, Lq, D), k and v (B, KV, Lk, D) with KV dividing H (grouped-query attention: query head h reads
    KV head h // (H / KV), the convention of torch's ``enable_gqa`` and flash-attn); out (B, H, Lq, D) in q's dtype;
    lse (B, H, Lq) in stats_dtype(q.dtype). Backward receives the *final* (merged) out and lse of the whole ring,
    which makes each block's gradient contribution exact: P = exp(S - lse_final) and D = rowsum(dO * O_final); its
    dk, dv are (B, KV, Lk, D), each KV head's summed over the query heads of its group.
    """

    name: str = "base"
    emulated: bool = False
    max_head_dim: int | None = None
    dtypes: tuple[torch.dtype, ...] = _Dtypes()

    def check(self, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Raise ValueError (UsageError) when this kernel cannot take the shape, dtype or device."""
        from ringbench.errors import bad_value

        if self.max_head_dim is not None and head_dim > self.max_head_dim:
            raise bad_value("head_dim", head_dim, f"at most {self.max_head_dim} for kernel {self.name!r}")
        if dtype not in self.dtypes:
            allowed = ", ".join(str(d).removeprefix("torch.") for d in self.dtypes)
            raise bad_value("dtype", str(dtype).removeprefix("torch."), f"one of {allowed} for kernel {self.name!r}")

    def forward(self, q, k, v, mask: BlockMask, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, mask: BlockMask, scale: float):
        raise NotImplementedError

    def prepare_backward(self, dout: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Once per backward call, before the ring steps: the whole (B, H, L, D) ``dout`` and final ``out`` in the
        layout this kernel's ``backward`` reads, so that no block converts them again inside a measured span. By
        default ``dout`` contiguous; a kernel that wraps another (``_inner`` / ``inner``) defers to it."""
        inner = getattr(self, "_inner", None) or getattr(self, "inner", None)
        if isinstance(inner, BlockKernel):
            return inner.prepare_backward(dout, out)
        return dout.contiguous(), out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def kv_group(q: torch.Tensor, k: torch.Tensor) -> int:
    """Query heads per KV head, H / KV (1 without grouped-query attention)."""
    return q.shape[1] // k.shape[1]


def expand_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, KV, L, D) -> (B, KV * group, L, D), KV head c serving query heads c * group .. (c + 1) * group - 1: for
    an op that cannot take grouped K/V itself (a local copy, never made before a transfer)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def sum_kv(grad: torch.Tensor, group: int) -> torch.Tensor:
    """The gradient of ``expand_kv``: (B, KV * group, L, D) -> (B, KV, L, D), each KV head summed over its group
    (in the statistics dtype, rounded once)."""
    if group == 1:
        return grad
    return grad.unflatten(1, (-1, group)).sum(2, dtype=stats_dtype(grad.dtype)).to(grad.dtype)


def additive_mask(mask: BlockMask, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """(Lq, Lk) additive mask (0 visible, -inf hidden) for PARTIAL masks; None otherwise. Built afresh on every
    call: kernels take it from a MaskTensors cache instead."""
    if mask.kind is not MaskKind.PARTIAL:
        return None
    allowed = mask.allowed if mask.allowed is not None else mask.rule.allowed(device)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~allowed.to(device), float("-inf"))


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a host tensor to ``device`` without blocking the host: a pageable host-to-device copy waits for the
    GPU to drain the stream; a copy from pinned memory is queued on the stream like any kernel. (The caching host
    allocator keeps the pinned buffer until the copy has run, so the temporary may be dropped at once.)"""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class MaskTensors:
    """Device-resident tensors derived from block masks, built on first use and reused afterwards.

    Plans are cached for the whole run (``ringbench.engine.plan.pair_plan``), so the same BlockMask object comes back at
    every ring step of every iteration. Rebuilding its bias from the CPU bool tensor each time would cost
    allocations, kernels and a host-to-device copy per block. Entries are keyed by ``id(mask)`` and hold a
    reference to the mask, so the id cannot be reused by another object while its entry lives. A kernel owns one
    instance; the tensors are freed with the kernel, or by ``clear()``. Bounded: when ``max_entries`` is reached
    the cache is emptied and refilled on demand.
    """

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[object, torch.Tensor | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def _get(self, key: Hashable, keep: object, build: Callable[[], torch.Tensor | None]) -> torch.Tensor | None:
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            entry = (keep, build())
            self._entries[key] = entry
        return entry[1]

    def allowed(self, mask: BlockMask, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
        """(Lq, Lk) visibility of a PARTIAL mask on ``device``, contiguous, in ``dtype`` (1 / True = visible); a
        positional rule is evaluated on the device itself (no (Lq, Lk) host tensor, no copy)."""
        assert mask.allowed is not None or mask.rule is not None, "allowed() needs a PARTIAL mask"
        device = torch.device(device)
        dtype = torch.bool if dtype is None else dtype

        def build() -> torch.Tensor:
            if mask.allowed is None:
                return mask.rule.allowed(device).to(dtype).contiguous()
            return to_device(mask.allowed.to(dtype).contiguous(), device)

        return self._get((id(mask), "allowed", device, dtype), mask, build)

    def rule_tensors(self, mask: BlockMask, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(q_pos, k_pos, q_doc, k_doc) of a positional rule on ``device`` as int32 (docs: q_pos / k_pos again
        when the rule has none), contiguous; for kernels that evaluate the rule on their tiles."""
        rule = mask.rule
        assert rule is not None, "rule_tensors() needs a PARTIAL mask given by a positional rule"
        device = torch.device(device)

        def build():
            q_doc = rule.q_doc if rule.q_doc is not None else rule.q_pos
            k_doc = rule.k_doc if rule.k_doc is not None else rule.k_pos
            return tuple(to_device(t.to(torch.int32).contiguous(), device) for t in (rule.q_pos, rule.k_pos,
                                                                                      q_doc, k_doc))  # fmt: skip

        return self._get((id(mask), "rule", device), mask, build)

    def empty_rows(self, mask: BlockMask, device: torch.device) -> torch.Tensor | None:
        """(Lq,) bool rows that see no key, on ``device``; None when there are none (worked out at plan time)."""
        if mask.empty_rows is None:
            return None
        device = torch.device(device)
        return self._get((id(mask), "empty_rows", device), mask, lambda: to_device(mask.empty_rows, device))

    def additive(
        self, mask: BlockMask, dtype: torch.dtype, device: torch.device, align: int = 1
    ) -> torch.Tensor | None:
        """(Lq, Lk) additive bias (0 visible, -inf hidden) of a PARTIAL mask, None for other kinds. ``align``: the
        row stride is a multiple of it (the storage is padded and sliced back), as fused CUDA kernels require."""
        if mask.kind is not MaskKind.PARTIAL:
            return None
        device = torch.device(device)

        def build() -> torch.Tensor:
            visible = self.allowed(mask, device)  # (Lq, Lk) bool
            q_len, k_len = visible.shape
            storage = torch.zeros(q_len, -(-k_len // align) * align, dtype=dtype, device=device)
            return storage[:, :k_len].masked_fill_(~visible, float("-inf"))

        return self._get((id(mask), "additive", device, dtype, align), mask, build)

    def causal(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """(Lq, Lk) bool lower triangle (top-left aligned: query i sees keys 0..i) on ``device``."""
        device = torch.device(device)
        return self._get(
            ("causal", q_len, k_len, device),
            None,
            lambda: torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(),
        )


def clear_empty_rows(
    out: torch.Tensor, lse: torch.Tensor, rows: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Force (out=0, lse=-inf), the merge's identity, on ``rows`` ((Lq,) bool on out's device, or None)."""
    if rows is not None:
        lse = lse.masked_fill(rows, float("-inf"))
        out = out.masked_fill(rows[..., None], 0.0)
    return out, lse
