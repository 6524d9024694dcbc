"""The attention kernel's achieved rate as a function of what it is given (a PRIOR from published curves).

One call computes, per (batch, head), ``q`` query rows against ``k`` key columns. Its time is

    time = call + batch x heads x entries x t_entry / util

    t_entry  = F x head_dim / (matmul_efficiency x peak)   +   exp_per_entry / exp_rate
               (the tensor-core matmuls: F = 4 FLOPs per score entry and head dim forward, 10 backward, the
               FlashAttention convention bwd = 2.5 x fwd)      (the softmax's exponentials at 16 per SM and clock)
    entries  = q (k + tile_overhead_keys)                                     full block
             = (visible + q (TILE/2 + tile_overhead_keys)) / causal_efficiency  causal or partial block
               (a query tile pays a fixed cost worth ``tile_overhead_keys`` key columns -- loading Q, the epilogue;
               a masked block computes its diagonal tiles whole and schedules less evenly)
    util     = tiles / (waves x SMs),  tiles = batch x heads x ceil(q / TILE)   (the last wave's idle SMs)

Small head dims run far below peak (the exponentials do not shrink with the head dim), short blocks pay the tile
overhead, and a causal block pays its diagonal: what separates a ring's N calls on S/N blocks from Ulysses' one
call on S. ringbench/hardware/catalogue.yaml holds the fitted parameters beside the curves they were fitted to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TILE = 128
"""Query rows per kernel tile (FlashAttention-2 and -3 at head dims 64-128)."""
FLOPS_PER_ENTRY = {"fwd": 4.0, "bwd": 10.0}
"""FLOPs per score entry and head dim: two matmuls forward, five backward."""
EXP_PER_SM_CLOCK = 16
"""Special-function (exp) results per SM and clock (Ampere, Ada, Hopper)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PassModel:
    """One pass (forward or backward) of one kernel on one architecture."""

    matmul_efficiency: float
    """Share of the GPU's dense tensor peak the kernel's matmuls reach."""
    exp_per_entry: float
    """Exponentials (or their equivalent in other non-matmul work) per score entry not hidden behind the matmuls."""
    tile_overhead_keys: float
    """Fixed cost of one query tile, in key columns."""
    causal_efficiency: float
    """Masked blocks: the share of the scheduled work that a full block would do at the same cost."""


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelRates:
    """One attention kernel on one GPU: the time of a call (ms) for any block shape."""

    kernel: str
    """Kernel family key (``fa2``, ``fa3``, ``cudnn``)."""
    gpu: str
    """Catalogue key of the GPU."""
    dtype: str
    peak_tflops: float
    exp_tera: float
    """Exponentials per second / 1e12 (16 x SMs x boost clock)."""
    sms: int
    fwd: PassModel
    bwd: PassModel
    call_us: float
    """Launch and stream gap of one call."""

    def pass_model(self, phase: str) -> PassModel:
        return self.bwd if phase == "bwd" else self.fwd

    def entry_ps(self, phase: str, head_dim: int) -> float:
        """Picoseconds per score entry of one (batch, head)."""
        model = self.pass_model(phase)
        matmul = FLOPS_PER_ENTRY[phase] * head_dim / (model.matmul_efficiency * self.peak_tflops)  # ps
        return matmul + model.exp_per_entry / self.exp_tera

    def utilisation(self, q_len: float, batch_heads: float) -> float:
        """The share of SMs busy over the call's waves of query tiles."""
        tiles = max(1.0, batch_heads * math.ceil(max(q_len, 1.0) / TILE))
        waves = math.ceil(tiles / self.sms)
        return tiles / (waves * self.sms)

    def entries(self, phase: str, kind: str, q_len: float, k_len: float, visible: float | None = None) -> float:
        """Work of one (batch, head), in score entries at the full-block rate."""
        model = self.pass_model(phase)
        if kind == "full":
            return q_len * (k_len + model.tile_overhead_keys)
        seen = q_len * k_len / 2.0 if visible is None else visible
        return (seen + q_len * (TILE / 2 + model.tile_overhead_keys)) / model.causal_efficiency

    def call_ms(self, phase: str, kind: str, q_len: float, k_len: float, batch_heads: float, head_dim: int,
                visible: float | None = None) -> float:  # fmt: skip
        """Milliseconds of one call: ``visible`` entries per (batch, head) for a causal or partial block."""
        if q_len <= 0 or k_len <= 0:
            return 0.0
        work = self.entries(phase, kind, q_len, k_len, visible) * self.entry_ps(phase, head_dim) * 1e-9  # ms
        return self.call_us / 1e3 + batch_heads * work / self.utilisation(q_len, batch_heads)

    def arithmetic_ms(self, phase: str, kind: str, q_len: float, k_len: float, batch_heads: float, head_dim: int,
                      visible: float | None = None) -> float:  # fmt: skip
        """The call without its fixed cost (what a slower rank stretches)."""
        return max(0.0, self.call_ms(phase, kind, q_len, k_len, batch_heads, head_dim, visible) - self.call_us / 1e3)

    def rate_tflops(self, phase: str, causal: bool, length: int, head_dim: int, tokens: int = 16384) -> float:
        """Achieved TFLOP/s of the FlashAttention benchmark's shape: batch x length = ``tokens``, hidden 2048."""
        batch_heads = max(1, tokens // length) * max(1, 2048 // head_dim)
        kind = "causal" if causal else "full"
        visible = length * length / 2.0 if causal else None
        flops = FLOPS_PER_ENTRY[phase] * head_dim * length * length * (0.5 if causal else 1.0) * batch_heads
        ms = self.call_ms(phase, kind, length, length, batch_heads, head_dim, visible) - self.call_us / 1e3
        return flops / (ms * 1e-3) / 1e12 if ms > 0 else math.nan

    def describe(self) -> str:
        return (f"{self.kernel} on {self.gpu} ({self.dtype}): fwd {self.rate_tflops('fwd', False, 8192, 128):.0f} / "
                f"causal {self.rate_tflops('fwd', True, 8192, 128):.0f}, bwd {self.rate_tflops('bwd', False, 8192, 128):.0f}"
                f" TFLOP/s at 8K x 8K, head dim 128; fwd {self.rate_tflops('fwd', False, 8192, 32):.0f} at head dim 32")  # fmt: skip


def benchmark_tflops(rates: KernelRates, phase: str, causal: bool, head_dim: int, lengths) -> list[float]:
    """TFLOP/s of FlashAttention's benchmark shape (batch x length = 16k tokens, hidden 2048) at each length, for
    ``phase`` fwd, bwd or fwd+bwd: what the catalogue's measured curves report (FLOPs at 4 / 10 per entry and
    head dim, halved causal; the call's fixed cost left out, as a CUDA-event timing of many calls does)."""
    passes = ("fwd", "bwd") if phase == "fwd+bwd" else (phase,)
    out = []
    for length in lengths:
        batch_heads = max(1, 16384 // length) * max(1, 2048 // head_dim)
        kind, visible = ("causal", length * length / 2.0) if causal else ("full", None)
        ms = sum(rates.arithmetic_ms(p, kind, length, length, batch_heads, head_dim, visible) for p in passes)
        flops = sum(FLOPS_PER_ENTRY[p] for p in passes) * head_dim * length * length * batch_heads
        out.append(flops * (0.5 if causal else 1.0) / (ms * 1e-3) / 1e12)
    return out


__all__ = ["EXP_PER_SM_CLOCK", "FLOPS_PER_ENTRY", "TILE", "KernelRates", "PassModel", "benchmark_tflops"]
