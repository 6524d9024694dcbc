"""What one rank hands the parent for one case: a frozen record, the same over a local queue, torch.distributed's
object gather (launched runs) and a JSON line (network-namespace ranks)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """One rank's result of one case."""

    case_id: str
    rank: int
    rows: list = field(default_factory=list)
    """The rank's event rows (dicts of the events schema), on the reference clock."""
    fwd_err: float = math.nan
    """Largest absolute error of the outputs against float64 attention (NaN: not checked)."""
    bwd_err: float = math.nan
    check_note: str = ""
    errors: dict = field(default_factory=dict)
    """Largest absolute error of each tensor (out, lse, dq, dk, dv: ringbench.engine.reference.TENSORS) against
    float64 attention; NaN where not compared (lse not exposed, dk/dv over the check's budget) or non-finite."""
    nonfinite: str = ""
    """The tensors holding a NaN or an infinity, comma-joined (out, dq, dk, dv); "" when none."""
    clock_offset_ns: int = 0
    clock_residual_ns: int = 0
    clock_method: str = ""
    clock_drift_ppm: float = 0.0
    emulated_gflops: float | None = None
    """The emulated kernel's rate (GFLOP/s), or None for real compute."""
    saturated_blocks: int = 0
    """Emulated blocks whose real arithmetic outlasted the modelled time."""
    paced_blocks: int = 0
    peak_mem_mb: float | None = None
    attn_mem_mb: float | None = None
    """Peak of the attention's own tensors (inputs included), counted."""
    memory_method: str | None = None
    host: str = ""
    device: str = ""
    device_info: dict = field(default_factory=dict)
    timeline: str = "host"
    """host (host clocks) or cuda (CUDA events resolved after the iteration)."""
    impl: str = "ringbench"
    layout: str = ""
    profile: str | None = None
    """Another implementation's profiler capture, on this host (the parent converts it to spans)."""
    profile_note: str = ""
    profile_bytes: bytes | None = None
    """A launched rank's capture, shipped to rank 0 (its host's disk is not rank 0's)."""

    def replace(self, **changes) -> RankReport:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-ready (without the shipped bytes)."""
        out = dataclasses.asdict(self)
        out.pop("profile_bytes")
        return out

    @classmethod
    def from_dict(cls, document: dict) -> RankReport:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in document.items() if key in known})


__all__ = ["RankReport"]
