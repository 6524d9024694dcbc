"""The profiler's view of the ring: one rank's trace -> compute / send / recv spans per ring step.

The ring-step markers (ringbench/rank/profiling.py) only say which step an op belongs to; every time here is the
profiler's own op or kernel timestamp, in ns from the start of the ``ringbench:iteration K`` marker.

* Steps. A host event belongs to ring step (phase, s) when it starts inside the ``ringbench:<phase> step s`` range
  on the same thread. A GPU kernel belongs to the step of its launch (a host event -- ``cuda_runtime`` or
  ``cuda_driver`` -- with the same correlation id).
* compute: the extent (first start .. last end) of the step's attention work (patterns shared with the importer,
  rank_view). On the host: ops matching
  ``HOST_ATTENTION_PATTERNS`` -- the SDPA ops (flash, efficient, cudnn, math; the CPU flash op and every backward)
  and the emulated kernel's ``ringbench:emulated pad`` range, which carries its modelled time. On a GPU: kernels
  matching ``KERNEL_ATTENTION_PATTERNS`` (flash, fmha / efficient, cudnn sdpa, triton ``_attn_*``) plus the
  ``spin_kernel`` pads of the emulated kernel on the attention kernels' stream (a link-delay spin elsewhere is not
  compute). The ``math`` kernel runs plain matmuls: it has no attention op to find.
* send / recv on gloo: from the start of the exchange's first c10d op (``c10d::send`` / ``c10d::recv_``: the
  post) to the end of ``gloo:send`` / ``gloo:recv`` (gloo ends those when the transfer's wait returns); the i-th
  exchange of a step pairs the i-th of each. On NCCL: the ``nccl(Dev)Kernel_SendRecv`` kernel, which carries both
  directions of a batched exchange.
"""

from __future__ import annotations

import re

import pandas as pd

from ringbench.markers import ITERATION_MARKER
from ringbench.traces.rank_view import HOST_ATTENTION_PATTERNS, KERNEL_ATTENTION_PATTERNS

SPAN_KEYS = ["phase", "step", "kind", "order"]
SPIN_KERNEL_PATTERN = r"spin_kernel"  # torch.cuda._sleep: the emulated kernel's pad on a GPU
SENDRECV_KERNEL_PATTERN = r"^nccl(?:Dev)?Kernel_SendRecv"
_STEP_MARKER = re.compile(r"^ringbench:(fwd|bwd) step (\d+)$")
_HOST_CATS = ("cpu_op", "user_annotation")

PROFILED_SPAN_COLUMNS = [*SPAN_KEYS, "start_ns", "end_ns", "source"]


def _iteration_marker(trace: pd.DataFrame, iteration: int) -> pd.DataFrame:
    return trace[(trace["name"] == f"{ITERATION_MARKER} {iteration}") & (trace["cat"] == "user_annotation")]


def iteration_anchor_ns(trace: pd.DataFrame, iteration: int) -> int | None:
    """Start of the profiler's ``ringbench:iteration K`` range (None when the trace has none)."""
    marker = _iteration_marker(trace, iteration)
    return int(marker["start_ns"].min()) if len(marker) else None


def step_ranges(trace: pd.DataFrame, iteration: int | None = None) -> pd.DataFrame:
    """The ``ringbench:<phase> step <s>`` ranges (inside iteration K's marker when given): phase, step, pid, tid,
    start_ns, end_ns."""
    ranges = trace[(trace["cat"] == "user_annotation") & trace["name"].str.startswith("ringbench:")]
    if iteration is not None:
        marker = _iteration_marker(trace, iteration)
        first, last = marker["start_ns"].min(), marker["end_ns"].max()
        ranges = ranges[(ranges["start_ns"] >= first) & (ranges["start_ns"] < last)]
    parsed = ranges["name"].str.extract(_STEP_MARKER)
    ranges = ranges[parsed[0].notna()].assign(phase=parsed[0], step=pd.to_numeric(parsed[1]))
    return ranges[["phase", "step", "pid", "tid", "start_ns", "end_ns"]].reset_index(drop=True)


def _in_range(events: pd.DataFrame, step_range) -> pd.DataFrame:
    return events[
        (events["pid"] == step_range.pid)
        & (events["tid"] == step_range.tid)
        & (events["start_ns"] >= step_range.start_ns)
        & (events["start_ns"] < step_range.end_ns)
    ]


def _matches(names: pd.Series, patterns) -> pd.Series:
    return names.str.contains("|".join(f"(?:{p})" for p in patterns), regex=True)


def _extent(phase, step, kind, events: pd.DataFrame, source: str) -> list[dict]:
    if events.empty:
        return []
    return [dict(phase=phase, step=step, kind=kind, start_ns=int(events["start_ns"].min()),
                 end_ns=int(events["end_ns"].max()), source=source)]  # fmt: skip


def _host_transfers(phase, step, in_step: pd.DataFrame) -> list[dict]:
    """gloo: the i-th exchange of a step runs from its first c10d op's start to each gloo span's end."""
    ordered = in_step.sort_values("start_ns")
    sends = ordered[ordered["name"] == "c10d::send"]["start_ns"].to_numpy()
    recvs = ordered[ordered["name"] == "c10d::recv_"]["start_ns"].to_numpy()
    rows = []
    for kind in ("send", "recv"):
        spans = ordered[ordered["name"] == f"gloo:{kind}"]
        for index, span in enumerate(spans.itertuples(index=False)):
            posts = [ops[index] for ops in (sends, recvs) if index < len(ops)]
            start = min([*posts, span.start_ns])
            rows.append(dict(phase=phase, step=step, kind=kind, start_ns=int(start), end_ns=int(span.end_ns),
                             source=span.name))  # fmt: skip
    return rows


def profiled_spans(
    trace: pd.DataFrame,
    iteration: int,
    host_patterns=HOST_ATTENTION_PATTERNS,
    kernel_patterns=KERNEL_ATTENTION_PATTERNS,
) -> pd.DataFrame:
    """One rank's trace -> compute / send / recv spans per ring step, in ns from the iteration marker's start.

    Columns PROFILED_SPAN_COLUMNS; empty when the trace has no ``ringbench:iteration K`` marker.
    """
    anchor = iteration_anchor_ns(trace, iteration)
    if anchor is None:
        return pd.DataFrame(columns=PROFILED_SPAN_COLUMNS)
    host = trace[trace["cat"].isin(_HOST_CATS)]
    launches = trace[(trace["correlation"] >= 0) & (trace["stream"] < 0)]
    kernels = trace[trace["cat"] == "kernel"]
    on_gpu = not kernels.empty
    if on_gpu:
        attention = kernels[_matches(kernels["name"], kernel_patterns)]
        spins = kernels[kernels["name"].str.contains(SPIN_KERNEL_PATTERN)]
        if not attention.empty:  # pads count on the attention kernels' stream only (link delays spin elsewhere)
            spins = spins[spins["stream"] == attention["stream"].mode().iloc[0]]
        compute_kernels = pd.concat([attention, spins])
        sendrecv = kernels[kernels["name"].str.contains(SENDRECV_KERNEL_PATTERN)]
    rows: list[dict] = []
    for step_range in step_ranges(trace, iteration).itertuples(index=False):
        phase, step = step_range.phase, int(step_range.step)
        if on_gpu:
            linked = set(_in_range(launches, step_range)["correlation"])
            rows += _extent(phase, step, "compute", compute_kernels[compute_kernels["correlation"].isin(linked)],
                            "kernels")  # fmt: skip
            for kernel in sendrecv[sendrecv["correlation"].isin(linked)].itertuples(index=False):
                for kind in ("send", "recv"):
                    rows.append(dict(phase=phase, step=step, kind=kind, start_ns=int(kernel.start_ns),
                                     end_ns=int(kernel.end_ns), source="nccl SendRecv kernel"))  # fmt: skip
        else:
            in_step = _in_range(host, step_range)
            ops = in_step[_matches(in_step["name"], host_patterns)]
            rows += _extent(phase, step, "compute", ops, "host ops")
            rows += _host_transfers(phase, step, in_step)
    spans = pd.DataFrame(rows, columns=[c for c in PROFILED_SPAN_COLUMNS if c != "order"])
    spans["start_ns"] = spans["start_ns"].astype("int64") - anchor
    spans["end_ns"] = spans["end_ns"].astype("int64") - anchor
    return with_order(spans)[PROFILED_SPAN_COLUMNS]


def with_order(spans: pd.DataFrame, keys=()) -> pd.DataFrame:
    """Sorted by start within (keys, phase, step, kind), with ``order``: 0, 1, ... in that group (the pairing key)."""
    spans = spans.sort_values([*keys, "phase", "step", "kind", "start_ns"], kind="stable")
    order = spans.groupby([*keys, "phase", "step", "kind"], sort=False).cumcount() if len(spans) else []
    return spans.assign(order=order).reset_index(drop=True)


def profiled_iteration(trace: pd.DataFrame) -> int | None:
    """K of the trace's single ``ringbench:iteration K`` marker (None when it has none or several)."""
    names = trace.loc[trace["cat"] == "user_annotation", "name"]
    found = names[names.str.startswith(f"{ITERATION_MARKER} ")].str.slice(len(ITERATION_MARKER) + 1).unique()
    return int(found[0]) if len(found) == 1 and found[0].isdigit() else None
