"""The run's metadata as tables: the run, the versions, the devices and what the ranks of each world size reported.

Read from meta.json through ``ringbench.record.meta.RunMeta`` (its accessors, or plain keys for what is only shown):
never a dict's repr in a cell.
"""

from __future__ import annotations

from ringbench.record.store import RunData
from ringbench.report.model import Section, Table, fmt

VERSION_ORDER = ("ringbench", "python", "torch", "triton", "cuda", "nccl")
GPU_FIELDS = {
    "name": "GPU",
    "memory_gib": "memory GiB",
    "capability": "capability",
    "gpu_count": "GPUs on host",
    "driver": "driver",
    "cuda": "CUDA",
    "nccl": "NCCL",
}


def _text(value) -> str:
    """A metadata value in words: lists joined, booleans as yes / no, missing as an en dash."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value) or "–"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_text(v)}" for k, v in value.items()) or "–"
    return fmt(value, ".6g")


def _run_table(run: RunData) -> Table:
    meta = run.meta
    rows = [["run id", run.run_id], ["results", str(run.path)], ["made by", meta.kind]]
    scenario = meta.scenario or {}
    if meta.get("scenario_source") or scenario.get("name"):
        described = f" — {scenario['description']}" if scenario.get("description") else ""
        if meta.get("simulated"):  # the scenario named the sweep's axes; nothing of it ran
            described = " — its sweep axes, SIMULATED (the scenario's words about ranks and compute do not apply)"
        rows.append(["scenario", f"{scenario.get('name') or meta.get('scenario_source')}{described}"])
    for key, title in (("created", "created"), ("finished", "finished"), ("command", "command")):
        if meta.get(key):
            rows.append([title, _text(meta[key])])
    if meta.get("host") or meta.get("hosts"):
        rows.append(["host", _text(meta.get("host") or meta.get("hosts"))])
    if meta.get("platform"):
        rows.append(["platform", str(meta["platform"])])
    if "git_commit" in meta:
        dirty = " (uncommitted changes)" if meta.get("git_dirty") else ""
        rows.append(["git commit", f"{_text(meta['git_commit'])}{dirty}"])
    if meta.get("emulated_auto_gflops") is not None:
        rows.append(["emulated rate", f"{_text(meta['emulated_auto_gflops'])} GFLOP/s (emulated:auto, every case)"])
        if meta.get("emulated_auto_floor_ms"):
            rows.append(["emulated floor", f"{_text(meta['emulated_auto_floor_ms'])} ms per kernel call at least "
                                            "(emulated:auto: calls too small to pace at the rate)"])  # fmt: skip
    rows.append(["faults", ", ".join(meta.faults) or "none"])
    imported = meta.get("imported") or {}
    if imported.get("compute"):
        compute = imported["compute"]
        per_rank = ", ".join(f"rank {r}: {n:g}" for r, n in sorted(compute.get("per_iteration", {}).items(),
                                                                   key=lambda item: int(item[0])))  # fmt: skip
        rows.append(["compute taken", f"{', '.join(compute.get('families', []))} ({compute.get('how')}, "
                     f"{compute.get('where')}); per iteration {per_rank}; {100 * compute.get('share_of_step', 0):.0f}% "
                     "of the step"])  # fmt: skip
    if "trace" in meta:
        rows.append(["per-step spans", _text(meta.get("trace"))])
    if meta.get("failure"):
        rows.append(["ended early", str(meta["failure"])])
    rows.append(["events", f"{len(run.events):,}"])
    rows.append(["cases", f"{run.cases['case_id'].nunique() if len(run.cases) else 0:,}"])
    return Table("", ["field", "value"], rows, key_value=True)  # the section's title says it


def _versions_table(run: RunData) -> Table | None:
    versions = dict(run.meta.get("versions") or {})
    if not versions and run.meta.get("torch_version"):
        versions = {"torch": run.meta["torch_version"]}
    if not versions:
        return None
    names = [n for n in VERSION_ORDER if n in versions] + sorted(n for n in versions if n not in VERSION_ORDER)
    rows = [[name, _text(versions[name]) if versions[name] is not None else "none"] for name in names]
    return Table("Versions", ["component", "version"], rows)


def _devices_table(run: RunData) -> Table | None:
    meta = run.meta
    gpus = meta.get("gpus") or []
    if gpus and all(isinstance(g, dict) for g in gpus):
        fields = [f for f in GPU_FIELDS if any(f in g for g in gpus)]
        rows = [[str(rank), *(_text(g.get(f)) for f in fields)] for rank, g in enumerate(gpus)]
        return Table("Devices (one row per rank)", ["rank", *(GPU_FIELDS[f] for f in fields)], rows)
    rows = []
    if meta.backend:
        rows.append(["backend", meta.backend])
    if meta.device_kind:
        rows.append(["device kind", meta.device_kind])
    if meta.get("devices"):
        rows.append(["devices", _text(meta["devices"])])
    if meta.cpu_count:
        rows.append(["CPU cores available", str(meta.cpu_count)])
    return Table("Devices", ["field", "value"], rows, key_value=True) if rows else None


def _ranks_table(run: RunData) -> Table | None:
    ranks = run.meta.ranks()
    if not ranks:
        return None
    rows = []
    for world, info in sorted(ranks.items(), key=lambda item: int(item[0]) if str(item[0]).isdigit() else 0):
        info = info or {}
        residual = info.get("clock_residual_ns")
        saturated, paced = info.get("emulation_saturated_blocks"), info.get("emulation_paced_blocks")
        rows.append([
            str(world),
            _text(info.get("hosts")),
            _text(info.get("devices")),
            _text(info.get("timeline")),
            _text(info.get("clock")),
            "–" if residual is None else f"{residual / 1e3:,.1f}",
            fmt(info.get("peak_mem_mb"), ",.0f"),
            "–" if saturated is None else f"{saturated:,}" + ("" if paced is None else f" of {paced:,}"),
        ])  # fmt: skip
    headers = ["world", "hosts", "devices", "timeline", "clock", "clock bound us", "peak MiB", "emulation saturated"]
    note = "emulation saturated: emulated kernel calls that outlasted their modelled time, of those paced."
    return Table("Ranks per world size", headers, rows, note)


def run_section(run: RunData) -> Section:
    tables = [_run_table(run), _versions_table(run), _devices_table(run), _ranks_table(run)]
    return Section(
        "Run",
        tables=tuple(t for t in tables if t is not None),
        notes=("Trace: open trace.json (next to this file) in https://ui.perfetto.dev or chrome://tracing.",),
        anchor="run",
    )
