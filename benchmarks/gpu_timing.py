"""What CUPTI saw of one profiled ring step, against what ringbench's recorder said (for benchmarks/gpu_probe.py).

Pure functions of a PyTorch profiler trace's events (``ringbench.traces.kineto.read_kineto_trace(path).events``:
name, cat, start_ns, end_ns, stream, correlation) and the recorder's resolved rows; tests/test_gpu_check.py drives
them on CPU with synthetic traces, so the first real GPU run meets code that has already run.

The step's kernels are those *launched* inside its ``ringbench:<phase> step <s>`` range (a kernel's correlation id
links it to its runtime / driver launch on the host). Among them: NCCL's (``ncclDevKernel_SendRecv``: the transfer),
the attention kernels (their stream is the compute stream: everything launched on it in the step -- attention, the
merge, emulated pads -- is the step's compute), and the busy-waits (``spin_kernel``) on any other stream (an injected
link delay on the comm stream, part of the transfer as the recorder sees it).

Figures:
  overlap    share of the NCCL kernels' time during which a compute kernel ran (0: serialised; 1: hidden); of a
             backward step, of its K/V's kernels only (``first_comm``);
  edges      recorder vs profiler for the compute span's start and end and the transfer's start and end, after one
             shift for the whole step (the two clocks differ by a constant: the recorder's anchor), taken from the
             edges that are tied to the kernel beside their mark (TWO_SIDED); the signed offset per edge is what
             gpu_overlap.py judges.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field, replace

import pandas as pd

ATTENTION = re.compile(r"flash|fmha|attention|_attn_|sdpa", re.IGNORECASE)
NCCL = re.compile(r"nccl", re.IGNORECASE)
SPIN = re.compile(r"spin_kernel|sleep", re.IGNORECASE)
LAUNCHES = ("cuda_runtime", "cuda_driver")


@dataclass(frozen=True, kw_only=True, slots=True)
class StepKernels:
    """A step's kernels as (start_ns, end_ns, name), by role."""

    compute: list[tuple[int, int, str]] = field(default_factory=list)  # on the compute stream
    nccl: list[tuple[int, int, str]] = field(default_factory=list)
    comm_spins: list[tuple[int, int, str]] = field(default_factory=list)  # busy-waits off the compute stream
    compute_stream: int | None = None
    nccl_by_stream: dict[int, list[tuple[int, int, str]]] = field(default_factory=dict)  # one per communicator

    def first_comm(self) -> StepKernels:
        """The step with only its first communicator's NCCL kernels (the stream whose first kernel starts first):
        a backward step's K/V, whose dK/dV travel on a communicator of their own, posted after the step's compute
        (on one rank nothing computes during them: they are not the overlap being measured)."""
        if len(self.nccl_by_stream) <= 1:
            return self
        first = min(self.nccl_by_stream, key=lambda stream: min(k[0] for k in self.nccl_by_stream[stream]))
        return replace(self, nccl=self.nccl_by_stream[first], nccl_by_stream={first: self.nccl_by_stream[first]})

    @property
    def compute_span(self) -> tuple[int, int] | None:
        return (min(k[0] for k in self.compute), max(k[1] for k in self.compute)) if self.compute else None

    @property
    def transfer_span(self) -> tuple[int, int] | None:
        """The NCCL kernel, extended by the busy-waits that follow it on the comm stream (a link delay)."""
        if not self.nccl:
            return None
        start, end = min(k[0] for k in self.nccl), max(k[1] for k in self.nccl)
        for spin_start, spin_end, _ in self.comm_spins:
            if spin_start >= start:
                end = max(end, spin_end)
        return start, end


def step_kernels(events: pd.DataFrame, marker: str) -> StepKernels:
    """The kernels launched inside the last ``marker`` range of the trace (the profiled step)."""
    ranges = events[(events["cat"] == "user_annotation") & (events["name"] == marker)]
    if ranges.empty:
        raise ValueError(f"no {marker!r} range in the trace")
    last = ranges.sort_values("start_ns").iloc[-1]
    begin, end = int(last["start_ns"]), int(last["end_ns"])
    launches = events[events["cat"].isin(LAUNCHES) & (events["correlation"] >= 0)]
    inside = set(launches[(launches["start_ns"] >= begin) & (launches["start_ns"] <= end)]["correlation"])
    kernels = events[(events["cat"] == "kernel") & events["correlation"].isin(inside)]
    names = kernels["name"].astype(str)
    nccl = kernels[names.str.contains(NCCL)]
    attention = kernels[names.str.contains(ATTENTION) & ~names.str.contains(NCCL)]
    stream = int(attention["stream"].mode().iloc[0]) if len(attention) else None
    if nccl.empty:  # NCCL may launch through an API the trace does not link: its kernels starting in the step
        all_kernels = events[events["cat"] == "kernel"]
        nccl = all_kernels[all_kernels["name"].astype(str).str.contains(NCCL) & (all_kernels["start_ns"] >= begin)]
        if len(kernels):
            nccl = nccl[nccl["start_ns"] <= kernels["end_ns"].max()]

    def spans(frame: pd.DataFrame) -> list[tuple[int, int, str]]:
        return sorted((int(r.start_ns), int(r.end_ns), str(r.name)) for r in frame.itertuples())

    compute = kernels[kernels["stream"] == stream] if stream is not None else kernels.iloc[0:0]
    others = kernels[(kernels["stream"] != stream) & ~names.str.contains(NCCL) & names.str.contains(SPIN)]
    by_stream = {int(s): spans(frame) for s, frame in nccl.groupby("stream")} if len(nccl) else {}
    return StepKernels(compute=spans(compute), nccl=spans(nccl), comm_spins=spans(others), compute_stream=stream,
                       nccl_by_stream=by_stream)  # fmt: skip


def _merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def overlap(kernels: StepKernels) -> float | None:
    """Share of the NCCL kernels' time during which a compute kernel ran (None without NCCL kernels)."""
    nccl = _merged([(a, b) for a, b, _ in kernels.nccl])
    total = sum(b - a for a, b in nccl)
    if total <= 0:
        return None
    compute = _merged([(a, b) for a, b, _ in kernels.compute])
    both = sum(max(0, min(b, d) - max(a, c)) for a, b in nccl for c, d in compute)
    return both / total


def recorded_edges(rows: list[dict], phase: str = "fwd", step: int = 0) -> dict[str, int]:
    """The recorder's compute and transfer (recv) edges of one step, host ns."""
    compute = [r for r in rows if r["kind"] == "compute" and r["phase"] == phase and r["step"] == step]
    recv = [r for r in rows if r["kind"] == "recv" and r["phase"] == phase and r["step"] == step]
    edges = {}
    if compute:
        edges["compute start"] = min(int(r["start_ns"]) for r in compute)
        edges["compute end"] = max(int(r["end_ns"]) for r in compute)
    if recv:
        edges["transfer start"] = min(int(r["start_ns"]) for r in recv)
        edges["transfer end"] = max(int(r["end_ns"]) for r in recv)
    return edges


def profiled_edges(kernels: StepKernels) -> dict[str, int]:
    edges = {}
    if (span := kernels.compute_span) is not None:
        edges["compute start"], edges["compute end"] = span
    if (span := kernels.transfer_span) is not None:
        edges["transfer start"], edges["transfer end"] = span
    return edges


# The edges whose kernel starts or ends right at the recorder's mark, a stream dependency away at most: the compute
# span's (its first and last kernels run on the stream the marks are on) and the transfer's end (the mark follows the
# NCCL kernel's end through one event). A transfer's *start* mark says when the NCCL kernel could start; beside the
# attention the kernel may wait for SMs after that, so its offset is one-sided there (gpu_overlap.py).
TWO_SIDED = ("compute start", "compute end", "transfer end")


def edge_offsets(
    recorded: dict[str, int], profiled: dict[str, int], anchors: tuple[str, ...] | None = None
) -> tuple[dict[str, float], float]:
    """profiled - recorded - shift per edge in us, signed (positive: the kernel came after the recorder's mark),
    with shift the median difference over ``anchors`` (default: every edge on both sides), one constant offset
    between the two clocks; returns (offsets, shift in us). Edges on one side only are left out."""
    common = [name for name in recorded if name in profiled]
    if not common:
        return {}, float("nan")
    deltas = {name: profiled[name] - recorded[name] for name in common}
    base = [deltas[name] for name in (anchors or ()) if name in deltas] or list(deltas.values())
    shift = statistics.median(base)
    return {name: (delta - shift) / 1e3 for name, delta in deltas.items()}, shift / 1e3


def edge_residuals(
    recorded: dict[str, int], profiled: dict[str, int], anchors: tuple[str, ...] | None = None
) -> tuple[dict[str, float], float]:
    """|edge_offsets| per edge in us, and the shift in us."""
    offsets, shift = edge_offsets(recorded, profiled, anchors)
    return {name: abs(offset) for name, offset in offsets.items()}, shift


__all__ = [
    "TWO_SIDED",
    "StepKernels",
    "edge_offsets",
    "edge_residuals",
    "overlap",
    "profiled_edges",
    "recorded_edges",
    "step_kernels",
]
