"""`ringbench import`: PyTorch profiler traces of any ring-attention program -> a results/<run-id>/ record.

    from ringbench.traces.importer import import_traces
    result = import_traces(["traces/"], out="results")          # one trace per rank, any program
    result.run_dir, result.ring, result.events                   # analyze / report / compare / recommend read it

Each trace is read (streaming, ringbench/traces/kineto.py) and reduced at once to the rank's iterations, phases,
compute spans and exchanges (rank_view.py, exchanges.py), so memory holds one trace at a time. Then the ranks are
checked to be one job's (trace_set.py), put on one clock (clocks.py) and the ring is rebuilt into events rows
(reconstruct.py). The record has the schema of a ringbench run (source "profiler" in meta.json, with the job's
distributedInfo and the traces' names and hashes), one case, repeat 0, the iterations found in every trace.

Bad input raises UsageError with one line that says what was found and what to pass.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.record import store
from ringbench.record.meta import write_meta
from ringbench.record.schema import CASE_COLUMNS, SCHEMA_VERSION
from ringbench.traces.clocks import align_clocks
from ringbench.traces.exchanges import WAIT_OPS, attach_waits, rank_exchanges
from ringbench.traces.kineto import read_kineto_trace
from ringbench.traces.rank_view import (
    HOST_CATS,
    LAUNCH_CATS,
    backward_ranges,
    compile_patterns,
    compute_ops,
    find_iterations,
    merge_compute,
    ranges_hold,
)
from ringbench.traces.reconstruct import (
    LATE_TAKE_SLACK_NS,
    events_frame,
    rank_rows,
    ring_order,
    settle_late_takes,
)
from ringbench.traces.trace_set import check_ranks, describe_file, find_trace_files

SOURCE = "profiler"
STEP_MARKER = r"(?:fwd|bwd) step \d+$"
DTYPE_NAMES = {"float": "float32", "double": "float64", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
               "Half": "float16", "BFloat16": "bfloat16"}  # fmt: skip


@dataclass(kw_only=True, slots=True)
class RankImport:
    """What one trace contributes, once reduced (its full event table is dropped)."""

    file: object  # trace_set.TraceFile
    iterations: object  # rank_view.Iterations
    exchanges: pd.DataFrame
    compute: pd.DataFrame
    backward_starts: dict[int, int]  # iteration index -> first backward op start
    found: Counter
    shape: dict  # batch, heads, local_seq, head_dim, dtype of the attention ops (when recorded)
    devices: tuple = ()
    top_ops: tuple[str, ...] = ()
    kernels: int = 0


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


def reduce_rank(path: Path, pattern, marker: str | None) -> RankImport:
    """Read one trace and keep only what the ring is made of."""
    trace = read_kineto_trace(path)
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
    iterations = find_iterations(host, marker)
    ops = compute_ops(host, kernels, launches, pattern)
    host_attention = host[host["name"].str.contains(pattern)]
    shape, kv_numels = _attention_shape(host_attention)
    exchanges, found = rank_exchanges(host, kernels, launches, kv_numels, trace.rank)
    backward = backward_ranges(host)
    exchanges["phase"] = np.where(ranges_hold(backward, exchanges["tid"], exchanges["post_ns"]), "bwd", "fwd")
    exchanges["iteration"] = iterations.index_of(exchanges["post_ns"].to_numpy(np.int64))
    ops_phase = np.where(ranges_hold(backward, ops["tid"], ops["order_ns"]), "bwd", "fwd")
    ops_iteration = iterations.index_of(ops["order_ns"].to_numpy(np.int64))
    keys = pd.Series(ops_iteration).astype(str).to_numpy() + ops_phase
    compute = merge_compute(ops, _compute_breaks(exchanges, host), keys)
    if len(compute):
        compute["iteration"] = iterations.index_of(compute["order_ns"].to_numpy(np.int64))
        compute["phase"] = compute["key"].str.slice(-3)
    else:
        compute = compute.assign(iteration=pd.Series(dtype="int64"), phase=pd.Series(dtype=object))
    exchanges = attach_waits(exchanges, host, compute, on_gpu=not kernels.empty)
    starts = {}
    if len(backward):
        where = iterations.index_of(backward["start_ns"].to_numpy(np.int64))
        for index, start in zip(where, backward["start_ns"], strict=True):
            if index >= 0:
                starts[int(index)] = min(starts.get(int(index), int(start)), int(start))
    cpu_names = host.loc[host["cat"] == "cpu_op", "name"]
    top = tuple(name for name, _ in Counter(cpu_names).most_common(5))
    return RankImport(file=file, iterations=iterations, exchanges=exchanges, compute=compute, backward_starts=starts,
                      found=found, shape=shape, devices=trace.device_properties, top_ops=top,
                      kernels=len(kernels))  # fmt: skip


def _compute_breaks(exchanges: pd.DataFrame, host: pd.DataFrame) -> np.ndarray:
    """Times that end a block computation: every exchange post and wait op, the start of a step marker (ranges
    named "<prefix>fwd step S" / "<prefix>bwd step S", as ringbench marks its steps); after a phase's last post
    (the last step of a double-buffered ring posts nothing), the arrival of a block too."""
    waits = host.loc[host["name"].isin(WAIT_OPS), "start_ns"].to_numpy(np.int64)
    markers = host.loc[(host["cat"] == "user_annotation") & host["name"].str.contains(STEP_MARKER), "start_ns"]
    arrivals = exchanges["recv_end_ns"].fillna(exchanges["send_end_ns"])
    last_post = exchanges.groupby(["iteration", "phase"])["post_ns"].transform("max")
    late = arrivals[arrivals > last_post].to_numpy(np.int64)
    return np.concatenate([exchanges["post_ns"].to_numpy(np.int64), waits, late, markers.to_numpy(np.int64)])


def _no_ring(ranks: list[RankImport]) -> UsageError:
    found = Counter()
    for rank in ranks:
        found.update(rank.found)
    parts = [f"{count} {what}" for what, count in sorted(found.items())] or ["no collectives"]
    world = ranks[0].file.world_size
    return UsageError(
        f"no ring in these traces ({len(ranks)} of {world} ranks): no P2P send/recv and no all-to-all or all-gather "
        f"rotation of attention K/V (found {', '.join(parts)}); pass traces of a program that runs ring attention"
    )


def _no_compute(ranks: list[RankImport], extra: tuple[str, ...]) -> UsageError:
    top = ", ".join(ranks[0].top_ops[:5]) or "none"
    what = f"{ranks[0].kernels} kernels and host ops" if ranks[0].kernels else "host ops"
    given = f" or the given {', '.join(extra)}" if extra else ""
    return UsageError(
        f"no compute spans matched: no {what} match the attention patterns{given} (most frequent ops: {top}); "
        "pass --compute-pattern REGEX naming the attention ops or kernels"
    )


def _common_iterations(ranks: list[RankImport]) -> tuple[list[str], list[str]]:
    """Iteration labels present in every trace (rank 0's order), and the dropped ones."""
    labels = [set(r.iterations.labels) for r in ranks]
    everywhere = set.intersection(*labels)
    kept = [label for label in ranks[0].iterations.labels if label in everywhere]
    dropped = sorted(set.union(*labels) - everywhere)
    return kept, dropped


def _case(shape: dict, world: int, ring: list[int], backward: bool, kernel: str) -> dict:
    axes = dict(
        world=world, seq=int(shape.get("local_seq", 0)) * world or -1, heads=int(shape.get("heads", -1)),
        head_dim=int(shape.get("head_dim", -1)), batch=int(shape.get("batch", -1)),
        dtype=str(shape.get("dtype", "unknown") or "unknown"), mask="unknown", layout="unknown", buffer="unknown",
        order="-".join(map(str, ring)), kernel=kernel, backward=backward,
    )  # fmt: skip
    slug = "import-" + "-".join(f"{v}" for v in axes.values())
    digest = hashlib.sha1(slug.encode()).hexdigest()[:6]
    case_id = f"import-w{world}-s{axes['seq']}-h{axes['heads']}x{axes['head_dim']}-{axes['dtype']}-{digest}"
    return axes | {"case_id": case_id, "ring": axes["order"]}


def _kernel_label(ranks: list[RankImport]) -> str:
    names = Counter()
    for rank in ranks:
        names.update(rank.compute["name"].astype(str))
    return names.most_common(1)[0][0].split("(")[0][:60] if names else "unknown"


@dataclass(frozen=True, kw_only=True, slots=True)
class Reconstruction:
    """A ring rebuilt from one job's traces, in memory: the events table, its one case row and meta.json."""

    events: pd.DataFrame
    cases: pd.DataFrame
    meta: dict
    ring: list[int]
    trace_bytes: int
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportResult:
    """An imported record: where it went, the ring found and the tables written."""

    run_dir: Path
    ring: list[int]
    events: pd.DataFrame
    cases: pd.DataFrame
    meta: dict
    seconds: float
    trace_bytes: int
    notes: tuple[str, ...] = field(default=())


ITERATION_NUMBER = re.compile(r"^(?:ringbench:iteration |ProfilerStep#)(\d+)$")


def _numbers(labels: list[str]) -> list[int]:
    """Iteration numbers: K of "ringbench:iteration K" / "ProfilerStep#K" rebased to start at 0, else 0, 1, ..."""
    found = [ITERATION_NUMBER.match(label) for label in labels]
    if all(found) and len({m.group(1) for m in found}) == len(found):
        numbers = [int(m.group(1)) for m in found]
        if labels and labels[0].startswith("ProfilerStep#"):
            numbers = [n - min(numbers) for n in numbers]
        return numbers
    return list(range(len(labels)))


def reconstruct(
    paths, *, iteration_marker: str | None = None, compute_patterns: tuple[str, ...] = (), command: str = ""
) -> Reconstruction:
    """Rebuild the ring of one job's profiler traces (files or folders, one trace per rank), in memory."""
    pattern = compile_patterns(compute_patterns)
    files = find_trace_files(paths)
    ranks = [reduce_rank(path, pattern, iteration_marker) for path in files]
    check_ranks([r.file for r in ranks], complete=False)  # one job, no rank twice
    ranks.sort(key=lambda r: r.file.rank)
    if not any(len(r.exchanges) for r in ranks):
        raise _no_ring(ranks)
    world = check_ranks([r.file for r in ranks])  # and every rank of it
    if not any(len(r.compute) for r in ranks):
        raise _no_compute(ranks, compute_patterns)
    # A profiler trace holds shapes, not masks: say so rather than assume causal anywhere downstream.
    notes: list[str] = [
        "mask unknown: a profiler trace does not say which keys the attention masked (causal, "
        "documents, a window), so compute spans count whole blocks and no mask plan predicts balance"
    ]
    exchanges = {r.file.rank: r.exchanges for r in ranks}
    ring, ring_method = ring_order(exchanges, world)
    if ring_method.startswith("rank order"):
        notes.append(f"ring order: {ring_method}")
    clock = align_clocks({r.file.rank: r.file.host for r in ranks}, exchanges)
    notes.extend(clock.notes)
    labels, dropped = _common_iterations(ranks)
    if dropped:
        notes.append(f"iterations not in every trace, left out: {', '.join(dropped[:6])}")
    if not labels:
        raise UsageError("no iteration appears in every trace; pass traces captured over the same steps")
    numbers = _numbers(labels)
    origin, all_windows, all_ex, all_comp = None, {}, {}, {}
    for rank in ranks:
        shift = clock.offsets_ns[rank.file.rank]
        index = {label: i for i, label in enumerate(rank.iterations.labels)}
        remap = {index[label]: number for number, label in zip(numbers, labels, strict=True)}
        windows = {}
        for label in labels:
            i = index[label]
            backward = rank.backward_starts.get(i)
            windows[remap[i]] = (int(rank.iterations.starts[i]) + shift,
                                 None if backward is None else backward + shift,
                                 int(rank.iterations.ends[i]) + shift)  # fmt: skip
        origin = min(origin if origin is not None else 1 << 62, *(w[0] for w in windows.values()))
        all_windows[rank.file.rank] = windows
        all_ex[rank.file.rank] = _shifted(rank.exchanges, shift, remap, ["post_ns", "start_ns", "send_end_ns",
                                          "recv_end_ns", "wait_start_ns", "wait_end_ns"])  # fmt: skip
        all_comp[rank.file.rank] = _shifted(rank.compute, shift, remap, ["order_ns", "start_ns", "end_ns"])
    if not any(r.kernels for r in ranks):  # host-side completions: a late take is the receiver's own time
        slack = max(LATE_TAKE_SLACK_NS, int(clock.residual_ns or 0))
        late = settle_late_takes(all_ex, all_comp, slack)
        if late:
            notes.append(f"{late} block(s) arrived well before their receiver took them: counted as the "
                         "receiver's own time, not as transfer or wait")  # fmt: skip
    rows = []
    for rank in ranks:
        r = rank.file.rank
        rows += rank_rows(r, ring, all_ex[r], all_comp[r], all_windows[r], world)
    backward = any(r.backward_starts for r in ranks)
    case = _case(ranks[0].shape, world, ring, backward, _kernel_label(ranks))
    events = events_frame(rows, case["case_id"], origin)
    cases = _case_table(events, case)
    meta = _meta(ranks, world, ring, ring_method, clock, labels, command, iteration_marker, compute_patterns, notes)
    total = sum(r.file.size_bytes for r in ranks)
    return Reconstruction(events=events, cases=cases, meta=meta, ring=ring, trace_bytes=total, notes=tuple(notes))


def import_traces(
    paths,
    *,
    out: str | Path = "results",
    iteration_marker: str | None = None,
    compute_patterns: tuple[str, ...] = (),
    command: str = "",
    run_name: str = "import",
) -> ImportResult:
    """Import one job's profiler traces (files or folders, one trace per rank) into results/<run-id>/."""
    started = time.monotonic()
    rebuilt = reconstruct(paths, iteration_marker=iteration_marker, compute_patterns=compute_patterns,
                          command=command)  # fmt: skip
    run_dir = _new_run_dir(out, run_name)
    meta = rebuilt.meta | {"run_id": run_dir.name}
    store.write_events(run_dir, rebuilt.events)
    store.write_cases(run_dir, rebuilt.cases)
    seconds = round(time.monotonic() - started, 3)
    meta["imported"] = meta["imported"] | {"seconds": seconds}
    write_meta(run_dir, meta, "import")
    return ImportResult(run_dir=run_dir, ring=rebuilt.ring, events=rebuilt.events, cases=rebuilt.cases, meta=meta,
                        seconds=seconds, trace_bytes=rebuilt.trace_bytes,
                        notes=rebuilt.notes)  # fmt: skip


def _shifted(frame: pd.DataFrame, shift: int, remap: dict[int, int], columns: list[str]) -> pd.DataFrame:
    frame = frame.copy()
    for column in columns:
        frame[column] = frame[column] + shift
    frame["iteration"] = frame["iteration"].map(remap).fillna(-1).astype("int64")
    return frame


def _case_table(events: pd.DataFrame, case: dict) -> pd.DataFrame:
    from ringbench.figures.metrics import CASE_FIGURES, case_figures

    sizes = pd.DataFrame([{"case_id": case["case_id"], "batch": case["batch"], "seq": case["seq"]}])
    figures = case_figures(events, sizes)
    figures = figures.iloc[0] if len(figures) else pd.Series(dtype=float)
    row = {name: case.get(name) for name in CASE_COLUMNS if name in case}
    row |= {name: float(figures.get(name, np.nan)) for name in CASE_FIGURES}
    row |= dict(repeat=0, emulated=False, faults="", iters=int(events["iteration"].nunique()), warmup=0,
                fwd_max_abs_err=np.nan, bwd_max_abs_err=np.nan, passed=True, status="ok", peak_mem_mb=np.nan,
                saturated_blocks=0, emulated_blocks=0, emulated_gflops=np.nan,
                check_note="not checked: imported from profiler traces")  # fmt: skip
    return pd.DataFrame([row], columns=list(CASE_COLUMNS))


def _meta(ranks, world, ring, ring_method, clock, labels, command, marker, patterns, notes) -> dict:
    """meta.json of an import (ringbench/record/meta.py registry; what only an import has goes under ``imported``)."""
    from ringbench import __version__

    hosts = sorted({r.file.host for r in ranks})
    devices = ranks[0].devices
    device_kind = str(devices[0].get("name", "cuda")) if devices else "cpu"
    return {
        "schema_version": SCHEMA_VERSION,
        "source": SOURCE,
        "created": datetime.now(timezone.utc).isoformat(),
        "command": command,
        "world": world,
        "backend": ranks[0].file.backend,
        "device_kind": device_kind,
        "devices": [str(d.get("name", "")) for d in devices] if devices else [device_kind],
        "emulated": False,
        "trace": True,
        "faults": [],
        "versions": {"ringbench": __version__},
        "ranks": {
            str(world): {
                "hosts": hosts,
                "devices": [device_kind],
                "timeline": "profiler",
                "clock": clock.method,
                "clock_residual_ns": clock.residual_ns,
                "clock_offsets_ns": [clock.offsets_ns[r] for r in range(world)],
            }
        },
        "imported": {
            "distributed_info": ranks[0].file.distributed_info,
            "traces": [r.file.to_dict() for r in ranks],
            "ring": ring,
            "ring_method": ring_method,
            "iterations": dict(enumerate(labels)),
            "iteration_source": ranks[0].iterations.source,
            "iteration_marker": marker,
            "compute_patterns": list(patterns),
            "notes": list(notes),
        },
    }


def _new_run_dir(out: str | Path, name: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = f"{stamp}-{name}"
    for suffix in range(1, 1000):
        run_dir = Path(out) / (base if suffix == 1 else f"{base}-{suffix}")
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            continue
        except OSError as exc:
            raise UsageError(f"out={str(out)!r} is not writable ({exc.strerror})") from None
    raise UsageError(f"out={str(out)!r}: could not create a new run folder")


__all__ = ["ImportResult", "Reconstruction", "import_traces", "reconstruct", "reduce_rank"]
