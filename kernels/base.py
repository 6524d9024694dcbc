"""The block-kernel contract shared by every kernel."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch


class MaskKind(str, Enum):
    FULL = "full"  # every key visible to every query
    CAUSAL = "causal"  # square block on the diagonal: query i sees keys 0..i (top-left aligned)
    PARTIAL = "partial"  # an arbitrary boolean mask (True = visible), derived from token positions


@dataclass(frozen=True, slots=True)
class BlockMask:
    """What a block kernel must mask. ``allowed`` is (Lq, Lk) bool for PARTIAL, None otherwise."""

    kind: MaskKind
    allowed: torch.Tensor | None = None
    # Rows with no visible key at all (PARTIAL only): their lse is -inf and their output 0, so the online-softmax
    # merge ignores them. Kernels are not trusted to report this themselves (the CPU flash op returns lse=0).
    empty_rows: torch.Tensor | None = None
    visible: float | None = None  # share of visible entries (PARTIAL), precomputed by the planner

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
        assert self.allowed is not None
        return float(self.allowed.float().mean())


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """Online-softmax statistics are kept in fp32, or fp64 when the inputs are fp64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def block_flops(batch: int, heads: int, q_len: int, k_len: int, head_dim: int, visible: float, backward: bool) -> float:
    """Useful FLOPs of one block: QK^T and PV are 2*Lq*Lk*D each (forward); backward adds 5 matmuls (2.5x)."""
    forward = 4.0 * batch * heads * q_len * k_len * head_dim * visible
    return forward * 2.5 if backward else forward


class BlockKernel:
    """Base class: subclasses implement forward and backward for one (query block, key block) pair.

    Shapes: q (B, H, Lq, D), k and v (B, H, Lk, D); out (B, H, Lq, D) in q's dtype; lse (B, H, Lq) in
    stats_dtype(q.dtype). Backward receives the *final* (merged) out and lse of the whole ring, which makes each
    block's gradient contribution exact: P = exp(S - lse_final) and D = rowsum(dO * O_final).
    """

    name: str = "base"
    emulated: bool = False
    max_head_dim: int | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.float64, torch.float32, torch.bfloat16, torch.float16)

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def additive_mask(mask: BlockMask, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """(Lq, Lk) additive mask (0 visible, -inf hidden) for PARTIAL masks; None otherwise."""
    if mask.kind is not MaskKind.PARTIAL:
        return None
    assert mask.allowed is not None
    bias = torch.zeros(mask.allowed.shape, dtype=dtype, device=device)
    return bias.masked_fill_(~mask.allowed.to(device), float("-inf"))


def clear_empty_rows(out: torch.Tensor, lse: torch.Tensor, mask: BlockMask) -> tuple[torch.Tensor, torch.Tensor]:
    """Force (out=0, lse=-inf), the merge's identity, on rows that see no key."""
    if mask.empty_rows is not None:
        rows = mask.empty_rows.to(out.device)
        lse = lse.masked_fill(rows, float("-inf"))
        out = out.masked_fill(rows[..., None], 0.0)
    return out, lse
