"""`ringbench import`: PyTorch profiler traces of any ring-attention program -> a results/<run-id>/ record.

    from ringbench.traces.importer import import_traces
    result = import_traces(["traces/"], out="results")          # one trace per rank, any program
    result.run_dir, result.ring, result.events                   # analyze / report / compare / recommend read it

Each trace is read (streaming, ringbench/traces/kineto.py) and reduced at once to the rank's iterations, phases,
compute spans and exchanges (rank_view.py, exchanges.py), so a reading process holds one trace at a time; the ranks
are shared among the cores (rank_readers.py). Then the ranks are
checked to be one job's (trace_set.py), put on one clock (clocks.py) and the ring is rebuilt into events rows
(reconstruct.py). The record has the schema of a ringbench run (source "profiler" in meta.json, with the job's
distributedInfo and the traces' names and hashes), one case, repeat 0, the iterations found in every trace.

Bad input raises UsageError with one line that says what was found and what to pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.record.folder import RecordFolder, new_run_dir
from ringbench.record.rows import case_row
from ringbench.record.schema import CASE_COLUMNS, SCHEMA_VERSION
from ringbench.record.store import RunData
from ringbench.scenario.workload import Case, Workload
from ringbench.traces.arrow_memory import system_allocator
from ringbench.traces.assemble import assemble
from ringbench.traces.block_compute import annotations_seen, describe, settle
from ringbench.traces.clocks import align_clocks
from ringbench.traces.rank_import import RankImport, rebuild_compute, reduce_rank
from ringbench.traces.rank_readers import ProgressFn, read_ranks
from ringbench.traces.rank_view import compile_patterns
from ringbench.traces.reconstruct import events_frame, ring_order
from ringbench.traces.trace_set import check_ranks, find_trace_files

SOURCE = "profiler"
MIN_ITERATIONS = 3  # analysis/confidence.py: fewer timed iterations make the analysis inconclusive


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
    """No block computation: the user's own record_function names (not aten internals) say what to pass."""
    seen = annotations_seen(name for rank in ranks for name in rank.annotations)
    ranges = f"record_function ranges seen: {', '.join(seen)}" if seen else "no record_function range in the traces"
    lacking = [r.file.rank for r in ranks if not len(r.compute)]
    where = f"rank {lacking[0]}" if len(lacking) == 1 else f"ranks {', '.join(map(str, lacking[:8]))}"
    if extra:
        return UsageError(
            f"no compute spans matched: --compute-pattern {' '.join(repr(p) for p in extra)} names no op, range or "
            f"kernel of {where} ({ranges}); pass a regular expression naming the range, op or kernel around each "
            "block computation"
        )
    return UsageError(
        f"no compute spans matched: between the ring's posts and waits the ring thread of {where} runs no op, "
        f"range or kernel the profiler saw ({ranges}); wrap each block computation in record_function(NAME), or "
        "pass --compute-pattern REGEX naming the range, op or kernel around it"
    )


def _override(patterns: tuple[str, ...]) -> re.Pattern | None:
    """The user's --compute-pattern added to the attention patterns, as one expression (each checked, the error
    naming the field), or None: what it names is compute, outright, with the attention ops."""
    return compile_patterns(patterns) if patterns else None


def _compute_taken(events: pd.DataFrame, choice) -> tuple[str, dict]:
    """What was taken as the block computation: the sentence of the import's summary and meta's record of it
    (families, how, where; spans per iteration per rank and the share of the step, medians)."""
    compute = events[events["kind"] == "compute"]
    iterations = events[events["kind"] == "iteration"]
    counts = compute.groupby(["rank", "iteration"]).size().groupby("rank").median()
    per_rank = {int(r): float(counts.get(r, 0.0)) for r in sorted(events["rank"].unique())}
    busy = (compute["end_ns"] - compute["start_ns"]).groupby([compute["rank"], compute["iteration"]]).sum()
    length = (
        (iterations["end_ns"] - iterations["start_ns"]).groupby([iterations["rank"], iterations["iteration"]]).sum()
    )
    share = (busy / length.reindex(busy.index)).groupby(level="rank").median()
    median_share = float(share.median()) if len(share) else 0.0
    record = {"families": list(choice.families), "how": choice.how, "where": choice.where,
              "per_iteration": {str(r): n for r, n in per_rank.items()}, "share_of_step": round(median_share, 4)}  # fmt: skip
    return describe(choice, per_rank, median_share), record


def _common_iterations(ranks: list[RankImport]) -> tuple[list[str], list[str]]:
    """Iteration labels present in every trace (rank 0's order), and the dropped ones."""
    labels = [set(r.iterations.labels) for r in ranks]
    everywhere = set.intersection(*labels)
    kept = [label for label in ranks[0].iterations.labels if label in everywhere]
    dropped = sorted(set.union(*labels) - everywhere)
    return kept, dropped


# What a trace says of its case, in the order its id digests them (ids stay stable across versions).
_ID_AXES = ("world", "seq", "heads", "head_dim", "batch", "dtype", "mask", "layout", "buffer", "order", "kernel",
            "backward")  # fmt: skip
# What a trace does not say: null in the record, read as the defaults (record/schema.py CASE_DEFAULTS, ring, ...).
_UNSAID = dict.fromkeys(("impl", "strategy", "placement", "docs", "layers"))


def _case(shape: dict, world: int, ring: list[int], backward: bool, kernel: str) -> tuple[Case, str]:
    """The imported ring as a case (its mask, layout and buffer unknown) and the case's id."""
    workload = Workload(
        world=world, seq=int(shape.get("local_seq", 0)) * world or -1, heads=int(shape.get("heads", -1)),
        head_dim=int(shape.get("head_dim", -1)), batch=int(shape.get("batch", -1)),
        dtype=str(shape.get("dtype", "unknown") or "unknown"), mask="unknown", layout="unknown", buffer="unknown",
        order="-".join(map(str, ring)),
    )  # fmt: skip
    case = Case(workload=workload, kernel=kernel, backward=backward)
    axes = case.axes()
    digest = hashlib.sha1(("import-" + "-".join(f"{axes[name]}" for name in _ID_AXES)).encode()).hexdigest()[:6]
    return case, f"import-w{world}-s{case.seq}-h{case.heads}x{case.head_dim}-{case.dtype}-{digest}"


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
    paths,
    *,
    iteration_marker: str | None = None,
    compute_patterns: tuple[str, ...] = (),
    command: str = "",
    progress: ProgressFn | None = None,
    workers: int | None = None,
) -> Reconstruction:
    """Rebuild the ring of one job's profiler traces (files or folders, one trace per rank), in memory.

    ``progress(name, bytes, total)`` is called as each trace is read; ``workers``: processes that read the traces
    (the importing process included; default: one per core, up to one per trace, from rank_readers.PARALLEL_MIN_MB
    of JSON on; else 1)."""
    with system_allocator():
        return _reconstruct(paths, iteration_marker, compute_patterns, command, progress, workers)


def _reconstruct(paths, iteration_marker, compute_patterns, command, progress, workers) -> Reconstruction:
    pattern = compile_patterns(())
    override = _override(compute_patterns)
    files = find_trace_files(paths)
    ranks = read_ranks(files, pattern, iteration_marker, progress, workers, override)
    check_ranks([r.file for r in ranks], complete=False)  # one job, no rank twice
    ranks.sort(key=lambda r: r.file.rank)
    if not any(len(r.messages) or len(r.exchanges) for r in ranks):
        raise _no_ring(ranks)
    world = check_ranks([r.file for r in ranks])  # and every rank of it
    choice = settle([r.choice for r in ranks])
    if override is None:
        for rank in ranks:
            rebuild_compute(rank, choice)
    if not any(len(r.compute) for r in ranks):
        raise _no_compute(ranks, compute_patterns)
    # A profiler trace holds shapes, not masks: say so rather than assume causal anywhere downstream.
    notes: list[str] = [
        "mask unknown: a profiler trace does not say which keys the attention masked (causal, "
        "documents, a window), so compute spans count whole blocks and no mask plan predicts balance"
    ]
    messages = {r.file.rank: r.messages for r in ranks}
    ring, ring_method = ring_order(messages, world)
    if ring_method.startswith("rank order"):
        notes.append(f"ring order: {ring_method}")
    clock = align_clocks({r.file.rank: r.file.host for r in ranks}, messages)
    notes.extend(clock.notes)
    labels, dropped = _common_iterations(ranks)
    if dropped:
        notes.append(f"iterations not in every trace, left out: {', '.join(dropped[:6])}")
    if not labels:
        raise UsageError("no iteration appears in every trace; pass traces captured over the same steps")
    built = assemble(ranks, ring, clock, labels, _numbers(labels))
    notes += _evidence_notes(built, ranks)
    run_meta = _run_meta(files)
    if len(labels) < MIN_ITERATIONS:
        notes.append(_few_iterations(len(labels), run_meta))
    backward = any(r.backward_starts for r in ranks)
    case, case_id = _case(ranks[0].shape, world, ring, backward, _kernel_label(ranks))
    events = events_frame(built.rows, case_id, built.origin_ns)
    taken, compute_record = _compute_taken(events, choice)
    notes.insert(0, taken)
    emulated = any(r.emulated for r in ranks) or bool(run_meta.get("emulated", False))
    cases = _case_table(events, case, case_id, emulated)
    meta = _meta(ranks, world, ring, ring_method, clock, labels, command, iteration_marker, compute_patterns, notes,
                 built, run_meta, emulated)  # fmt: skip
    meta["imported"]["compute"] = compute_record
    meta["imported"]["unseen_sides"] = built.unseen_sides
    total = sum(r.file.size_bytes for r in ranks)
    return Reconstruction(events=events, cases=cases, meta=meta, ring=ring, trace_bytes=total, notes=tuple(notes))


def _evidence_notes(built, ranks: list[RankImport]) -> list[str]:
    """What the import inferred that a reader should know: bounds instead of measurements, sides not traced."""
    notes = []
    if built.transfers and built.censored:
        notes.append(f"{built.censored} of {built.transfers} transfers censored: no rank was waiting when they "
                     "completed (both took their blocks late), so their times are bounds, not measurements, and "
                     "only the measured ones judge the links")  # fmt: skip
    if built.synthesized:
        notes.append(f"{built.synthesized} sends or receives are not in their rank's trace (posted by a thread the "
                     "profiler did not follow): their peer's side is the evidence")  # fmt: skip
    own = {r: ms for r, ms in built.own_ms.items() if ms > 0.5}
    if own:
        worst = max(own, key=own.get)
        notes.append(f"time in no op that was no wait is counted as the ranks' own (unprofiled) work: up to "
                     f"{own[worst]:.1f} ms per iteration (rank {worst})")  # fmt: skip
    return notes


def _few_iterations(count: int, run_meta: dict) -> str:
    fix = "analyze the run's own record instead (it holds every timed iteration), or " if run_meta.get(
        "kind") == "run" else ""  # fmt: skip
    return (
        f"{count} iteration(s) captured: too few to judge a straggler (its analysis will be inconclusive: at "
        f"least {MIN_ITERATIONS} are needed); {fix}profile {MIN_ITERATIONS} or more iterations (torch.profiler's "
        f"schedule with active={MIN_ITERATIONS} or more, one ProfilerStep per iteration) and import again"
    )


def _run_meta(files: list[Path]) -> dict:
    """The meta.json of the ringbench run a capture belongs to (``results/<run>/profile/<case>/...``), or {}."""
    for parent in list(Path(files[0]).resolve().parents)[:4]:
        candidate = parent / "meta.json"
        if candidate.is_file():
            try:
                document = json.loads(candidate.read_text())
            except (OSError, ValueError):
                return {}
            return document if isinstance(document, dict) and document.get("kind") == "run" else {}
    return {}


def import_traces(
    paths,
    *,
    out: str | Path = "results",
    iteration_marker: str | None = None,
    compute_patterns: tuple[str, ...] = (),
    command: str = "",
    run_name: str = "import",
    progress: ProgressFn | None = None,
    workers: int | None = None,
) -> ImportResult:
    """Import one job's profiler traces (files or folders, one trace per rank) into results/<run-id>/
    (``progress``, ``workers``: reconstruct)."""
    started = time.monotonic()
    rebuilt = reconstruct(paths, iteration_marker=iteration_marker, compute_patterns=compute_patterns,
                          command=command, progress=progress, workers=workers)  # fmt: skip
    run_dir = new_run_dir(out, run_name)
    meta = rebuilt.meta | {"run_id": run_dir.name}
    run = RunData(path=run_dir, events=rebuilt.events, cases=rebuilt.cases, meta=meta)
    with system_allocator():
        folder = RecordFolder.write(run, "import")
    seconds = round(time.monotonic() - started, 3)  # the import's time includes storing it: noted once it is stored
    folder.meta["imported"] = folder.meta["imported"] | {"seconds": seconds}
    folder.save_meta()
    meta = dict(folder.meta)
    return ImportResult(run_dir=run_dir, ring=rebuilt.ring, events=rebuilt.events, cases=rebuilt.cases, meta=meta,
                        seconds=seconds, trace_bytes=rebuilt.trace_bytes,
                        notes=rebuilt.notes)  # fmt: skip


def _case_table(events: pd.DataFrame, case: Case, case_id: str, emulated: bool) -> pd.DataFrame:
    from ringbench.figures.metrics import CASE_FIGURES, case_figures

    sizes = pd.DataFrame([{"case_id": case_id, "batch": case.batch, "seq": case.seq}])
    figures = case_figures(events, sizes)
    figures = figures.iloc[0] if len(figures) else pd.Series(dtype=float)
    row = case_row(case, 0, case_id=case_id, **_UNSAID)
    row |= {name: float(figures.get(name, np.nan)) for name in CASE_FIGURES}
    row |= dict(emulated=emulated, faults="", iters=int(events["iteration"].nunique()), warmup=0,
                fwd_max_abs_err=np.nan, bwd_max_abs_err=np.nan, passed=True, status="ok", peak_mem_mb=np.nan,
                saturated_blocks=0, emulated_blocks=0, emulated_gflops=np.nan,
                check_note="not checked: imported from profiler traces")  # fmt: skip
    return pd.DataFrame([row], columns=list(CASE_COLUMNS))


def _meta(ranks, world, ring, ring_method, clock, labels, command, marker, patterns, notes, built, run_meta,
          emulated) -> dict:  # fmt: skip
    """meta.json of an import (ringbench/record/meta.py registry; what only an import has goes under ``imported``)."""
    from ringbench._version import __version__

    hosts = sorted({r.file.host for r in ranks})
    devices = ranks[0].devices
    device_kind = str(devices[0].get("name", "cuda")) if devices else "cpu"
    busy = {}
    for r in ranks:
        busy[r.file.host] = busy.get(r.file.host, 0.0) + built.busy_share.get(r.file.rank, 0.0)
    return {
        "schema_version": SCHEMA_VERSION,
        "source": SOURCE,
        "created": datetime.now(timezone.utc).isoformat(),
        "command": command,
        "world": world,
        "backend": ranks[0].file.backend,
        "device_kind": device_kind,
        "devices": [str(d.get("name", "")) for d in devices] if devices else [device_kind],
        "emulated": emulated,
        "trace": True,
        "faults": list(run_meta.get("faults") or []),
        "cpu_count": _cores(hosts, run_meta),
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
            # per host, the ranks' summed share of their iterations spent in CPU ops: how many cores they kept busy
            "busy_ranks": {host: round(value, 3) for host, value in busy.items()},
            "readers": [r.reader for r in ranks],
            "transfers": built.transfers,
            "censored": built.censored,
            "from_run": run_meta.get("run_id"),
        },
    }


def _cores(hosts: list[str], run_meta: dict) -> int | None:
    """CPU cores of the traced host: the capturing run's record says; a trace does not, but when it was taken on
    this very host, this host's count is the answer. None when unknown (oversubscription cannot be checked)."""
    import socket

    if run_meta.get("cpu_count"):
        return int(run_meta["cpu_count"])
    if len(hosts) == 1 and hosts[0] and hosts[0] == socket.gethostname():
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return None


__all__ = ["ImportResult", "Reconstruction", "import_traces", "reconstruct", "reduce_rank"]
