"""One rank's trace reduced to what a ring is made of: iterations, compute spans, messages grouped into exchanges,
sync points, and the intervals in which its ring thread was busy in an op (the rest of its time is waiting or
unprofiled work, which evidence.py tells apart).

``reduce_rank(path, pattern, marker)`` reads the trace (kineto.py), keeps these tables and drops the events. The
*ring thread* is the thread that runs the rank's compute (else the one that posts its exchanges). It is *busy*
inside any op that is no communication and holds none (``autograd::engine::evaluate_function:`` holds a whole
backward ring: it is a container, its children count) and inside its compute spans.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.markers import EMULATED_MARKER
from ringbench.traces.block_compute import NONE, Choice, annotations_seen, candidates, choose, select
from ringbench.traces.evidence import union
from ringbench.traces.exchanges import (
    COMM_PREFIXES,
    EXCHANGE_COLUMNS,
    SYNC_COLUMNS,
    WAIT_OPS,
    exchange_groups,
    kernels_by_launch,
    message_frame,
    p2p_messages,
    rotations,
    sync_points,
)
from ringbench.traces.rank_view import (
    HOST_CATS,
    LAUNCH_CATS,
    backward_ranges,
    compute_ops,
    find_iterations,
    merge_compute,
    ranges_hold,
)
from ringbench.traces.trace_set import describe_file

STEP_MARKER = r"(?:fwd|bwd) step \d+$"
DTYPE_NAMES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
               "Half": "float16", "BFloat16": "bfloat16"}  # fmt: skip


@dataclass(kw_only=True, slots=True)
class RankImport:
    """What one trace contributes, once reduced (its full event table is dropped). Times on the trace's clock."""

    file: object  # trace_set.TraceFile
    iterations: object  # rank_view.Iterations
    messages: pd.DataFrame  # MESSAGE_COLUMNS + iteration, phase, group (index of ``exchanges``)
    exchanges: pd.DataFrame  # EXCHANGE_COLUMNS + iteration, phase (+ wait_start_ns, wait_end_ns on a GPU)
    compute: pd.DataFrame
    syncs: pd.DataFrame  # SYNC_COLUMNS + iteration
    busy: np.ndarray  # (n, 2) the ring thread in an op or a compute span
    cpu_busy: np.ndarray  # (n, 2) the ring thread in a CPU op (what takes a core)
    ring_tid: int
    backward_starts: dict[int, int]  # iteration index -> first backward op start
    found: Counter
    shape: dict  # batch, heads, local_seq, head_dim, dtype of the attention ops (when recorded)
    devices: tuple = ()
    top_ops: tuple[str, ...] = ()
    kernels: int = 0
    emulated: bool = False  # ringbench's emulated kernel ran here (its modelled time is in the trace)
    annotations: tuple[str, ...] = field(default=())  # the most frequent record_function names
    reader: str = ""  # how the trace was read (kineto.KinetoTrace.reader)
    # The block computation (block_compute.py): the candidates, this rank's choice, and what rebuilds its compute
    # spans with another choice (``rebuild_compute``).
    candidates: pd.DataFrame | None = None
    choice: Choice = NONE
    compute_breaks: np.ndarray | None = None
    backward: pd.DataFrame | None = None


def _attention_shape(compute_host: pd.DataFrame) -> tuple[dict, set[int]]:
    """(B, H, local S, D and dtype of the forward attention ops, element counts of a K/V buffer)."""
    numels: set[int] = set()
    shape: dict = {}
    for name, dims, types in zip(compute_host["name"], compute_host["input_dims"], compute_host["input_types"],
                                 strict=True):  # fmt: skip
        try:
            shapes = json.loads(dims) if dims else []
        except ValueError:
            continue
        backward = "backward" in name
        if len(shapes) < 3:
            continue
        q, k = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
        if isinstance(k, list) and k and all(isinstance(n, int) for n in k):
            numel = int(np.prod(k))
            numels.update((numel, 2 * numel))
        if not backward and isinstance(q, list) and len(q) == 4 and isinstance(k, list) and len(k) == 4:
            dtype = types.split(",")[0] if types else ""
            # A step may compute a sub-block (zigzag halves): the longest side seen is the rank's share.
            local = max(q[2], k[2], shape.get("local_seq", 0))
            shape = dict(batch=q[0], heads=q[1], local_seq=local, head_dim=q[3], dtype=DTYPE_NAMES.get(dtype, dtype))
    return shape, numels


def _ring_tid(ops: pd.DataFrame, messages: pd.DataFrame, host: pd.DataFrame) -> int:
    for frame in (ops, messages, host[host["cat"] == "cpu_op"]):
        if len(frame):
            return int(frame["tid"].mode().iloc[0])
    return -1


def _busy(host: pd.DataFrame, tid: int, compute: pd.DataFrame, comm_times: np.ndarray):
    """(ring thread in an op or compute span, ring thread in a CPU op): module doc."""
    ops = host[(host["tid"] == tid) & (host["cat"] == "cpu_op") & ~host["name"].str.startswith(COMM_PREFIXES)]
    starts, ends = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    times = np.sort(comm_times)
    holds = np.searchsorted(times, ends, side="right") - np.searchsorted(times, starts, side="left") > 0
    starts, ends = starts[~holds], ends[~holds]
    cpu = union(starts, ends)
    mine = compute[compute["tid"] == tid] if len(compute) else compute
    both = union(np.r_[starts, mine["start_ns"].to_numpy(np.int64)], np.r_[ends, mine["end_ns"].to_numpy(np.int64)])
    return both, cpu


def _gpu_waits(exchanges: pd.DataFrame, messages: pd.DataFrame, compute: pd.DataFrame) -> pd.DataFrame:
    """On a GPU, an exchange's wait: the compute stream idle from its last attention kernel until the exchange's
    SendRecv kernel ended (zero-length at the end when compute did not resume after)."""
    out = exchanges.assign(wait_start_ns=np.nan, wait_end_ns=np.nan)
    ends = np.sort(compute["end_ns"].to_numpy(np.int64)) if len(compute) else np.empty(0, np.int64)
    starts = np.sort(compute["start_ns"].to_numpy(np.int64)) if len(compute) else np.empty(0, np.int64)
    done = messages.groupby("group")["obs_ns"].max()
    for group, ex in out.iterrows():
        end = float(done.get(group, ex["done_ns"]))
        if not np.isfinite(end):
            continue
        end = int(end)
        last = ends[np.searchsorted(ends, end, side="right") - 1] if np.any(ends <= end) else int(ex["post_ns"])
        later = np.searchsorted(starts, end, side="left") < len(starts)
        start = max(int(last), int(ex["post_ns"])) if later else end
        out.at[group, "wait_start_ns"], out.at[group, "wait_end_ns"] = min(start, end), end
    return out


def reduce_rank(path: Path, pattern, marker: str | None, trace=None, progress=None, override=None) -> RankImport:
    """Read one trace (or take the read ``trace``) and keep only what the ring is made of (``progress(bytes)``:
    kineto.read_kineto_trace). ``pattern``: the attention ops (hints, block_compute.py); ``override``: the
    user's --compute-pattern (with the attention patterns), which names the compute outright."""
    from ringbench.traces.kineto import read_kineto_trace

    trace = trace if trace is not None else read_kineto_trace(path, progress=progress)
    events = trace.events
    if events.empty:
        raise UsageError(f"{path}: the trace holds no complete events; pass a trace of a profiled program")
    host = events[events["cat"].isin(HOST_CATS)]
    if host.empty:
        raise UsageError(f"{path}: the trace holds no host ops (cpu_op / user_annotation); pass a trace recorded with "
                         "the CPU activity")  # fmt: skip
    kernels = events[events["cat"] == "kernel"]
    launches = events[events["cat"].isin(LAUNCH_CATS) & (events["correlation"] >= 0)]
    file = describe_file(path, trace, int(events["start_ns"].min()), int(events["end_ns"].max()))
    iterations = find_iterations(host, marker, path=path)
    hinted = compute_ops(host, kernels, launches, override or pattern)
    shape, kv_numels = _attention_shape(host[host["name"].str.contains(pattern)])
    found: Counter = Counter()
    nccl = kernels_by_launch(kernels, launches)
    turned, collectives, claimed = rotations(host, nccl, kv_numels, trace.rank, found)
    sendrecv = int(nccl["name"].str.contains("SendRecv").sum()) if len(nccl) else 0
    if sendrecv:
        found["NCCL SendRecv kernels"] += sendrecv
    plain = message_frame(p2p_messages(host, nccl, claimed))
    syncs = sync_points(host, nccl, found)
    backward = backward_ranges(host)

    def place(frame: pd.DataFrame, column: str) -> pd.DataFrame:
        times = frame[column].to_numpy(np.int64)
        return frame.assign(phase=np.where(ranges_hold(backward, frame["tid"], times), "bwd", "fwd"),
                            iteration=iterations.index_of(times))  # fmt: skip

    plain = place(plain.sort_values("post_ns", kind="stable").reset_index(drop=True), "post_ns")
    syncs = place(syncs, "join_ns") if len(syncs) else syncs.assign(iteration=pd.Series(dtype="int64"))
    ring_tid = _ring_tid(hinted, plain, host)
    waits = host.loc[host["name"].isin(WAIT_OPS), "start_ns"].to_numpy(np.int64)
    seen = plain.loc[plain["obs_tid"] == ring_tid, "obs_ns"].dropna().to_numpy(np.int64)
    markers = host.loc[(host["cat"] == "user_annotation") & host["name"].str.contains(STEP_MARKER), "start_ns"]
    posted = plain.loc[plain["tid"] == ring_tid, "post_ns"].to_numpy(np.int64)
    events_of_ring = {"post": posted, "wait": seen.astype(np.int64), "wait_op": waits,
                      "other": np.r_[syncs["join_ns"].to_numpy(np.int64), markers.to_numpy(np.int64)]}  # fmt: skip
    found_spans = candidates(host, ring_tid, events_of_ring, override or pattern, kernels, launches,
                             iteration_of=iterations.index_of)  # fmt: skip
    found_spans["iteration"] = iterations.index_of(found_spans["order_ns"].to_numpy(np.int64))
    found_spans = found_spans[found_spans["iteration"] >= 0].reset_index(drop=True)
    choice = choose(found_spans, override=override is not None)
    ops = hinted if override is not None else select(found_spans, choice)
    breaks = np.concatenate([ops["order_ns"].to_numpy(np.int64), seen, waits, syncs["join_ns"].to_numpy(np.int64)])
    plain["group"] = exchange_groups(plain, breaks)
    messages, exchanges = _exchanges(plain, turned, collectives, place)
    compute_breaks = _compute_breaks(messages, host)
    compute = _merged(ops, compute_breaks, iterations, backward)
    if len(kernels):
        exchanges = _gpu_waits(exchanges, messages, compute)
    comm_times = np.concatenate([host.loc[host["name"].str.startswith(COMM_PREFIXES[:4]), "start_ns"]
                                 .to_numpy(np.int64), seen, waits])  # fmt: skip
    busy, cpu_busy = _busy(host, ring_tid, compute, comm_times)
    starts = {}
    if len(backward):
        where = iterations.index_of(backward["start_ns"].to_numpy(np.int64))
        for index, start in zip(where, backward["start_ns"], strict=True):
            if index >= 0:
                starts[int(index)] = min(starts.get(int(index), int(start)), int(start))
    cpu_names = host.loc[host["cat"] == "cpu_op", "name"]
    top = tuple(name for name, _ in Counter(cpu_names).most_common(5))
    notes = host.loc[(host["cat"] == "user_annotation") & ~host["name"].str.startswith(("gloo:", "nccl:")), "name"]
    emulated = bool(notes.str.startswith(EMULATED_MARKER).any())
    named = tuple(annotations_seen(notes))  # the user's own ranges (markers, numbers folded), most frequent first
    return RankImport(file=file, iterations=iterations, messages=messages, exchanges=exchanges, compute=compute,
                      syncs=syncs, busy=busy, cpu_busy=cpu_busy, ring_tid=ring_tid, backward_starts=starts,
                      found=found, shape=shape, devices=trace.device_properties, top_ops=top, kernels=len(kernels),
                      emulated=emulated, annotations=named, reader=trace.reader, candidates=found_spans,
                      choice=choice, compute_breaks=compute_breaks,
                      backward=backward[["tid", "start_ns", "end_ns"]].reset_index(drop=True))  # fmt: skip


def _merged(ops: pd.DataFrame, breaks: np.ndarray, iterations, backward: pd.DataFrame) -> pd.DataFrame:
    """Compute ops merged into block computations (rank_view.merge_compute), with their iteration and phase."""
    ops_phase = np.where(ranges_hold(backward, ops["tid"], ops["order_ns"]), "bwd", "fwd")
    keys = pd.Series(iterations.index_of(ops["order_ns"].to_numpy(np.int64))).astype(str).to_numpy() + ops_phase
    compute = merge_compute(ops.astype({"order_ns": "int64", "start_ns": "int64", "end_ns": "int64"}), breaks, keys)
    if len(compute):
        compute["iteration"] = iterations.index_of(compute["order_ns"].to_numpy(np.int64))
        compute["phase"] = compute["key"].str.slice(-3)
    else:
        compute = compute.assign(iteration=pd.Series(dtype="int64"), phase=pd.Series(dtype=object))
    return compute


def rebuild_compute(rank: RankImport, choice: Choice) -> None:
    """Take ``choice`` (the import's, block_compute.settle) as this rank's block computation: its compute spans,
    busy time and (on a GPU) waits rebuilt from the rank's candidates. In place."""
    if choice == rank.choice or rank.candidates is None:
        return
    compute = _merged(select(rank.candidates, choice), rank.compute_breaks, rank.iterations, rank.backward)
    mine = compute[compute["tid"] == rank.ring_tid] if len(compute) else compute
    rank.busy = union(np.r_[rank.cpu_busy[:, 0], mine["start_ns"].to_numpy(np.int64)],
                      np.r_[rank.cpu_busy[:, 1], mine["end_ns"].to_numpy(np.int64)])  # fmt: skip
    if rank.kernels:
        rank.exchanges = _gpu_waits(rank.exchanges.drop(columns=["wait_start_ns", "wait_end_ns"]), rank.messages,
                                    compute)  # fmt: skip
    rank.compute, rank.choice = compute, choice


def _exchanges(plain: pd.DataFrame, turned: list[dict], collectives: list[dict], place):
    """(messages with their exchange's index, exchanges): P2P groups, then rotations, then all-gathers."""
    turned_frame = message_frame(turned, extra=("rotation",))
    if len(turned_frame):
        turned_frame = place(turned_frame, "post_ns")
        turned_frame["group"] = (plain["group"].max() + 1 if len(plain) else 0) + turned_frame.pop("rotation")
    messages = pd.concat([plain, turned_frame], ignore_index=True) if len(turned_frame) else plain
    messages = messages.astype({"group": "int64"})
    clipped = messages.assign(bytes=messages["bytes"].clip(lower=0))
    grouped = clipped.groupby("group", sort=True)
    p2p = grouped.agg(post_ns=("post_ns", "min"), done_ns=("obs_ns", "max"), tid=("tid", "first"),
                      bytes=("bytes", "sum"), via=("via", "first"), rotation=("via", "last"))  # fmt: skip
    rotation = p2p.pop("rotation").str.endswith("(rotation)")
    p2p.loc[rotation, "bytes"] = grouped["bytes"].first()[rotation]  # a rotation's send and receive: one buffer
    p2p.insert(0, "kind", "p2p")
    base = int(p2p.index.max()) + 1 if len(p2p) else 0
    extra = pd.DataFrame(collectives, columns=EXCHANGE_COLUMNS, index=range(base, base + len(collectives)))
    exchanges = pd.concat([p2p[EXCHANGE_COLUMNS], extra]) if len(extra) else p2p[EXCHANGE_COLUMNS]
    exchanges.index.name = None
    if len(exchanges):
        exchanges = place(exchanges.astype({"post_ns": "int64", "tid": "int64"}), "post_ns")
    else:
        exchanges = exchanges.assign(iteration=pd.Series(dtype="int64"), phase=pd.Series(dtype=object))
    return messages, exchanges


def _compute_breaks(messages: pd.DataFrame, host: pd.DataFrame) -> np.ndarray:
    """Times that end a block computation: every post and wait op, the start of a step marker (ranges named
    "<prefix>fwd step S" / "<prefix>bwd step S", as ringbench marks its steps); after a phase's last post (the last
    step of a double-buffered ring posts nothing), the arrival of a block too."""
    waits = host.loc[host["name"].isin(WAIT_OPS), "start_ns"].to_numpy(np.int64)
    markers = host.loc[(host["cat"] == "user_annotation") & host["name"].str.contains(STEP_MARKER), "start_ns"]
    if messages.empty:
        return np.concatenate([waits, markers.to_numpy(np.int64)])
    arrivals = messages["obs_ns"]
    last_post = messages.groupby(["iteration", "phase"])["post_ns"].transform("max")
    late = arrivals[(arrivals > last_post) & arrivals.notna()].to_numpy(np.int64)
    return np.concatenate([messages["post_ns"].to_numpy(np.int64), waits, late, markers.to_numpy(np.int64)])


__all__ = ["SYNC_COLUMNS", "RankImport", "rebuild_compute", "reduce_rank"]
