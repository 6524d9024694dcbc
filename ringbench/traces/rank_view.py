"""One rank's trace reduced to what a ring is made of: iterations, phases and compute spans.

* Iterations: ``ProfilerStep#N`` ranges (``torch.profiler.profile(schedule=...)`` and ``prof.step()``), else the
  ranges of a user annotation (``--iteration-marker NAME``: ``record_function(NAME)``, or names starting with
  ``NAME`` and a space or ``#``), else ringbench's own ``ringbench:iteration K`` markers, else the whole trace as
  one iteration. An event belongs to the iteration whose range holds its host time (any thread).
* Phases: an event is in the backward when its host time lies inside an ``autograd::engine::evaluate_function:``
  range on its thread (the autograd engine runs every backward op inside one); a GPU kernel takes the host time of
  its launch (same correlation id).
* Compute: ops or kernels whose names match the attention patterns (DEFAULT_COMPUTE_PATTERNS, plus the user's).
  Only the outermost match counts on a thread (``aten::scaled_dot_product_attention`` holds the flash op it
  dispatches to). Consecutive matches with no exchange in between are one block computation (a zigzag block
  runs as two SDPA calls; ring-attention-pytorch runs einsums per bucket): ``merge_compute``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.markers import EMULATED_MARKER, ITERATION_MARKER

# Host ops and kernels of attention arithmetic: the one definition of "compute" in a profiler trace, for imports
# and for the profiler witness of ringbench's own ring (ring_spans). Documented in docs/import.md; extended by
# --compute-pattern.
HOST_ATTENTION_PATTERNS = (
    r"^aten::_?scaled_dot_product_",  # SDPA and its flash / efficient / cuDNN / math / CPU-flash ops, backwards
    r"^aten::_flash_attention_",
    r"^aten::_efficient_attention_",
    r"^aten::_cudnn_attention",
    r"^flash_attn::",  # the flash-attn package's custom ops (ring-flash-attn calls them)
    r"^" + re.escape(EMULATED_MARKER),  # ringbench's emulated kernel: its modelled time
)
# GPU kernels: flash / fmha / efficient / cuDNN sdpa / Triton attention (_attn_fwd, _attn_bwd) / fused_attn
KERNEL_ATTENTION_PATTERNS = (r"flash_fwd|flash_bwd|flash::|fmha|sdpa|_attn_fwd|_attn_bwd|fused_attn|attention_kernel",)
DEFAULT_COMPUTE_PATTERNS = HOST_ATTENTION_PATTERNS + KERNEL_ATTENTION_PATTERNS
STEP_ANNOTATION = re.compile(r"^ProfilerStep#(\d+)$")
BACKWARD_RANGE = "autograd::engine::evaluate_function:"
HOST_CATS = ("cpu_op", "user_annotation")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
COMPUTE_COLUMNS = ["order_ns", "start_ns", "end_ns", "tid", "flops", "name"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Iterations:
    """The iteration ranges of one rank: labels (matched across ranks), starts and ends (ns)."""

    labels: tuple[str, ...]
    starts: np.ndarray
    ends: np.ndarray
    source: str  # "ProfilerStep", "marker NAME", "ringbench:iteration", "whole trace"

    def index_of(self, times: np.ndarray) -> np.ndarray:
        """Window index of each host time (-1 outside every window; windows do not overlap)."""
        times = np.asarray(times, dtype=np.int64)
        if not len(self.starts):
            return np.full(len(times), -1)
        order = np.argsort(self.starts, kind="stable")
        starts, ends = self.starts[order], self.ends[order]
        slot = np.searchsorted(starts, times, side="right") - 1
        inside = (slot >= 0) & (times <= ends[np.clip(slot, 0, None)])
        return np.where(inside, order[np.clip(slot, 0, None)], -1)


def _marker_ranges(host: pd.DataFrame, marker: str) -> pd.DataFrame:
    names = host["name"]
    hits = host[(names == marker) | names.str.startswith(marker + " ") | names.str.startswith(marker + "#")]
    return hits.sort_values("start_ns", kind="stable")


def find_iterations(host: pd.DataFrame, marker: str | None = None, path=None) -> Iterations:
    """Iteration ranges of a rank from its host events (see the module doc for the order of preference).
    A ``marker`` that names no range of the trace raises UsageError naming the ranges it has."""
    annotations = host[host["cat"] == "user_annotation"]
    if marker:
        hits = _marker_ranges(host, marker)
        if hits.empty:
            raise _marker_missing(annotations, marker, path)
        names = tuple(hits["name"])  # "NAME 3", "NAME#3": matched across ranks by name; a repeated NAME by order
        labels = names if len(set(names)) == len(names) else tuple(str(i) for i in range(len(hits)))
        return Iterations(labels=labels, starts=hits["start_ns"].to_numpy(np.int64),
                          ends=hits["end_ns"].to_numpy(np.int64), source=f"marker {marker}")  # fmt: skip
    steps = annotations[annotations["name"].str.match(STEP_ANNOTATION.pattern)]
    if len(steps):
        steps = steps.sort_values("start_ns", kind="stable").drop_duplicates("name")
        return Iterations(labels=tuple(steps["name"]), starts=steps["start_ns"].to_numpy(np.int64),
                          ends=steps["end_ns"].to_numpy(np.int64), source="ProfilerStep")  # fmt: skip
    ours = _marker_ranges(annotations, ITERATION_MARKER)
    if len(ours):
        return Iterations(labels=tuple(ours["name"]), starts=ours["start_ns"].to_numpy(np.int64),
                          ends=ours["end_ns"].to_numpy(np.int64), source=ITERATION_MARKER)  # fmt: skip
    first, last = int(host["start_ns"].min()), int(host["end_ns"].max())
    return Iterations(labels=("trace",), starts=np.array([first]), ends=np.array([last]), source="whole trace")


def _marker_missing(annotations: pd.DataFrame, marker: str, path):
    from ringbench.errors import UsageError

    names = annotations["name"]
    names = names[~names.str.startswith(("gloo:", "nccl:"))].str.replace(r"(#| )\d+$", "", regex=True)
    found = [name for name, _ in names.value_counts().head(8).items()]
    where = f"{path}: " if path is not None else ""
    shown = ", ".join(found) if found else "none"
    return UsageError(
        f"{where}--iteration-marker {marker!r} names no range of this trace (its record_function ranges: {shown}); "
        "pass one of them, or leave the option out to use ProfilerStep#N"
    )


def ranges_hold(ranges: pd.DataFrame, tids: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Whether each (tid, time) lies inside one of ``ranges`` (columns tid, start_ns, end_ns) on that thread."""
    tids, times = np.asarray(tids), np.asarray(times, dtype=np.int64)
    inside = np.zeros(len(times), dtype=bool)
    for tid, group in ranges.groupby("tid", sort=False):
        mine = np.nonzero(tids == tid)[0]
        if not len(mine):
            continue
        group = group.sort_values("start_ns")
        starts = group["start_ns"].to_numpy(np.int64)
        reach = np.maximum.accumulate(group["end_ns"].to_numpy(np.int64))  # union of nested / chained ranges
        slot = np.searchsorted(starts, times[mine], side="right") - 1
        inside[mine] = (slot >= 0) & (times[mine] <= reach[np.clip(slot, 0, None)])
    return inside


def backward_ranges(host: pd.DataFrame) -> pd.DataFrame:
    return host.loc[host["name"].str.startswith(BACKWARD_RANGE), ["tid", "start_ns", "end_ns"]]


def outermost(ops: pd.DataFrame) -> pd.DataFrame:
    """Drop ops that lie inside an earlier op of the same set on the same thread."""
    if ops.empty:
        return ops
    ops = ops.sort_values(["tid", "start_ns", "end_ns"], ascending=[True, True, False], kind="stable")
    reach = ops.groupby("tid", sort=False)["end_ns"].transform(lambda e: e.cummax().shift(fill_value=-1))
    return ops[ops["start_ns"] >= reach.to_numpy()]


def compile_patterns(extra=()) -> re.Pattern:
    patterns = [*DEFAULT_COMPUTE_PATTERNS, *extra]
    for pattern in extra:
        try:
            re.compile(pattern)
        except re.error as exc:
            from ringbench.errors import bad_value

            raise bad_value("compute_pattern", pattern, f"a regular expression ({exc})") from None
    return re.compile("|".join(f"(?:{p})" for p in patterns))


def attention_flops(names: pd.Series, dims: pd.Series, concrete_causal: pd.Series | None = None) -> np.ndarray:
    """Useful FLOPs of SDPA-family ops from their input shapes: 4 B H Lq Lk D (forward), 2.5x that for a
    backward op; 0 where the shapes are not (B, H, L, D) tensors. Causal masks are not visible in a trace, so a
    block is counted whole (ringbench's own record counts only visible pairs)."""
    out = np.zeros(len(names))
    for i, (name, text) in enumerate(zip(names.to_numpy(), dims.to_numpy(), strict=True)):
        if not text or not str(name).startswith(("aten::_scaled_dot_product", "aten::scaled_dot_product")):
            continue
        try:
            shapes = json.loads(text)
        except ValueError:
            continue
        backward = "backward" in name
        q, k = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
        if not (isinstance(q, list) and isinstance(k, list) and len(q) == 4 and len(k) == 4):
            continue
        batch, heads, q_len, head_dim = q
        forward = 4.0 * batch * heads * q_len * k[2] * head_dim
        out[i] = forward * 2.5 if backward else forward
    return out


def compute_ops(host: pd.DataFrame, kernels: pd.DataFrame, launches: pd.DataFrame, pattern: re.Pattern):
    """Attention ops of a rank (COMPUTE_COLUMNS): host ops, or on a GPU the matched kernels, timed by the kernel
    and ordered by their launch's host time (``order_ns``)."""
    if len(kernels):
        matched = kernels[kernels["name"].str.contains(pattern)]
        if len(matched):
            launch = launches.drop_duplicates("correlation").set_index("correlation")
            order = launch["start_ns"].reindex(matched["correlation"]).to_numpy()
            tids = launch["tid"].reindex(matched["correlation"]).to_numpy()
            frame = pd.DataFrame({"order_ns": order, "start_ns": matched["start_ns"].to_numpy(),
                                  "end_ns": matched["end_ns"].to_numpy(), "tid": tids, "flops": 0.0,
                                  "name": matched["name"].to_numpy()})  # fmt: skip
            return frame.dropna(subset=["order_ns"]).astype({"order_ns": "int64", "tid": "int64"})
    matched = outermost(host[host["name"].str.contains(pattern)])
    flops = attention_flops(matched["name"], matched["input_dims"])
    return pd.DataFrame({"order_ns": matched["start_ns"].to_numpy(), "start_ns": matched["start_ns"].to_numpy(),
                         "end_ns": matched["end_ns"].to_numpy(), "tid": matched["tid"].to_numpy(), "flops": flops,
                         "name": matched["name"].to_numpy()})[COMPUTE_COLUMNS]  # fmt: skip


def merge_compute(ops: pd.DataFrame, breaks: np.ndarray, keys: np.ndarray) -> pd.DataFrame:
    """Runs of consecutive compute ops (by ``order_ns``) with the same key (iteration, phase) and no break time
    (an exchange's post or arrival) between them, as one span each: first start .. last end, FLOPs summed."""
    if ops.empty:
        return ops.assign(key=pd.Series(dtype=object))
    ops = ops.assign(key=keys).sort_values("order_ns", kind="stable").reset_index(drop=True)
    breaks = np.sort(np.asarray(breaks, dtype=np.int64))
    order = ops["order_ns"].to_numpy(np.int64)
    ends = np.maximum(ops["end_ns"].to_numpy(np.int64), order)  # a host op's end; a kernel's launch otherwise
    between = np.searchsorted(breaks, order[1:], side="right") - np.searchsorted(breaks, ends[:-1], side="left")
    new_key = ops["key"].to_numpy()[1:] != ops["key"].to_numpy()[:-1]
    run = np.concatenate([[0], np.cumsum((between > 0) | new_key)])
    merged = ops.groupby(run, sort=True).agg(
        order_ns=("order_ns", "min"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max"), tid=("tid", "first"),
        flops=("flops", "sum"), name=("name", "first"), key=("key", "first"), ops=("name", "size"),
    )  # fmt: skip
    return merged.reset_index(drop=True)


__all__ = [
    "DEFAULT_COMPUTE_PATTERNS",
    "HOST_ATTENTION_PATTERNS",
    "KERNEL_ATTENTION_PATTERNS",
    "Iterations",
    "backward_ranges",
    "compile_patterns",
    "compute_ops",
    "find_iterations",
    "merge_compute",
    "outermost",
    "ranges_hold",
]
