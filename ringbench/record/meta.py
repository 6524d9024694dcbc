"""meta.json: one registry of keys, one writer, typed accessors and a versioned reader.

Every producer of a results folder -- a run (``run``), a probe (``probe``), the simulator (``simulate``), an
imported profiler trace (``import``) -- writes its metadata through ``write_meta``, which refuses a key that is not
in ``KEYS`` or a value of the wrong type, so the registry below is the whole vocabulary of meta.json. Consumers
read it through ``RunMeta`` (a dict with typed properties), never with ad-hoc ``.get`` chains.

Versions: meta.json carries ``schema_version`` (ringbench/record/schema.py: the version of the whole record). The reader
accepts every version in READABLE_VERSIONS; what a newer key adds reads as its default in an older file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ringbench.errors import UsageError
from ringbench.record.schema import READABLE_VERSIONS

META_FILE = "meta.json"
PRODUCERS = ("run", "probe", "simulate", "import")
_ALL = frozenset(PRODUCERS)
_MEASURED = frozenset({"run", "probe", "import"})
_TEXT, _INT, _BOOL, _NUM = (str,), (int,), (bool,), (int, float)
_DICT, _LIST = (dict,), (list,)
_NONE = (type(None),)


@dataclass(frozen=True, slots=True)
class MetaKey:
    name: str
    types: tuple[type, ...]
    producers: frozenset[str]
    meaning: str


KEYS = (
    MetaKey(
        "schema_version", _INT, _ALL, "version of the record (events, cases, meta); see ringbench/record/schema.py"
    ),
    MetaKey("run_id", _TEXT, _ALL, "the folder's name: <UTC time>-<scenario name>"),
    MetaKey("kind", _TEXT, _ALL, "what made the folder: run, probe, simulate or import"),
    MetaKey("created", _TEXT, _ALL, "ISO 8601 UTC time the folder was created"),
    MetaKey("finished", _TEXT, _ALL, "ISO 8601 UTC time the last case was stored (absent: interrupted)"),
    MetaKey("command", _TEXT, _ALL, "the command line that made the folder"),
    MetaKey("world", _INT + _LIST, _ALL, "the world size, or the list of world sizes of a sweep"),
    MetaKey(
        "scenario", _DICT, frozenset({"run", "simulate"}), "the whole sweep (axes and settings): --resume reads it"
    ),
    MetaKey("scenario_source", _TEXT, frozenset({"run", "simulate"}), "the scenario file, or <embedded default>"),
    MetaKey("emulated", _BOOL, _ALL, "some compute or link time is modelled, not measured"),
    MetaKey("emulated_links", _BOOL, _ALL, "link costs of a topology were injected as delays"),
    MetaKey("simulated", _BOOL, frozenset({"simulate"}), "nothing was measured: a model wrote every number"),
    MetaKey(
        "faults", _LIST, _ALL, "injected faults as canonical specs (ringbench.scenario.faults: slow-rank:3:1.5, ...)"
    ),
    MetaKey("trace", _BOOL, _ALL, "per-step spans were recorded (false: iteration times only, --no-trace)"),
    MetaKey("topology", _DICT + _NONE, _ALL, "the ranks' topology (ringbench.topology.Topology.to_dict), or null"),
    MetaKey("backend", _TEXT, _ALL, "the backend the ranks ran on: gloo or nccl"),
    MetaKey("device_kind", _TEXT, _ALL, "cpu, or the GPU model the ranks ran on"),
    MetaKey("devices", _LIST, _ALL, "the device of each rank (GPU names) or the CPU model"),
    MetaKey("gpus", _LIST, _MEASURED, "per rank of a GPU run: name, memory, capability, count, driver, CUDA, NCCL"),
    MetaKey("nccl_options", _DICT, _MEASURED, "the NCCL group's options (is_high_priority_stream: true)"),
    MetaKey("cpu_count", _INT + _NONE, _ALL, "CPU cores available to the run (oversubscription of real compute)"),
    MetaKey("torch_version", _TEXT, _ALL, "torch.__version__"),
    MetaKey("versions", _DICT, _ALL, "python, torch, triton, nccl, cuda, ringbench versions"),
    MetaKey("host", _TEXT, _ALL, "the host that wrote the folder"),
    MetaKey("platform", _TEXT, _ALL, "platform.platform() of that host"),
    MetaKey("git_commit", _TEXT + _NONE, _ALL, "the checkout's commit, when ringbench runs from one"),
    MetaKey("git_dirty", _BOOL, _ALL, "the checkout had uncommitted changes"),
    MetaKey("launcher", _TEXT, _MEASURED, "local, torchrun or slurm"),
    MetaKey("ranks", _DICT, _ALL, "per world size: hosts, devices, timeline, clock, saturation, peak memory"),
    MetaKey("launch_seconds", _LIST, frozenset({"run"}), "wall time of each local launch (one per process group)"),
    MetaKey("failure", _TEXT, frozenset({"run"}), "why the run ended early (a rank died or stalled)"),
    MetaKey(
        "interrupted",
        _DICT,
        frozenset({"run"}),
        "a signal stopped the run: signal, rank (launched), case in flight, where, kept / total, resume command",
    ),
    MetaKey("emulated_auto", _DICT, frozenset({"run"}), "case id -> the rate (GFLOP/s) emulated:auto chose"),
    MetaKey("emulated_auto_gflops", _NUM, frozenset({"run"}), "the one rate emulated:auto runs the whole run at"),
    MetaKey("emulated_auto_floor_ms", _NUM, frozenset({"run"}), "the least time an emulated:auto call takes (0: none)"),
    MetaKey("check_notes", _DICT, frozenset({"run"}), "case id -> what the float64 check left out (budget)"),
    MetaKey("skipped", _DICT, frozenset({"run"}), "case id -> why an implementation could not run it here"),
    MetaKey("profile", _DICT, frozenset({"run"}), "profiler captures (run --profile): dir and timed iteration"),
    MetaKey("probe", _DICT, frozenset({"probe"}), "the probe's latency and bandwidth matrices"),
    MetaKey("files", _LIST, _ALL, "the files of the folder besides the record (probe.parquet, ...)"),
    MetaKey("simulation", _DICT, frozenset({"simulate"}), "the simulator's calibration and model settings"),
    MetaKey(
        "calibration",
        _DICT,
        frozenset({"run"}),
        "ringbench calibrate: the simulator's costs fitted on this run, "
        "each with its source (measured or a stated prior)",
    ),
    MetaKey("source", _TEXT, _ALL, "where the record came from: ringbench, simulator or profiler"),
    MetaKey("imported", _DICT, frozenset({"import"}), "the imported program: distributed info, trace files, hashes"),
    MetaKey(
        "plans",
        _DICT,
        frozenset({"run", "simulate"}),
        "case id -> the mask plan's predictions: per layer the "
        "mask, the pair-kind grid, each rank's visible score entries and kernel calls, the ring steps",
    ),
    MetaKey(
        "docs",
        _DICT,
        frozenset({"run", "simulate"}),
        "docs spec@seq -> the packed documents: count, mean, min, max and (up to 4096) the lengths",
    ),
)
REGISTRY = {key.name: key for key in KEYS}


class RunMeta(dict):
    """meta.json as read: a plain dict (it is JSON), with typed accessors for what consumers need."""

    @property
    def plans(self) -> dict:
        """case id -> the mask plan's predictions (empty for records written before plans were kept)."""
        value = self.get("plans")
        return value if isinstance(value, dict) else {}

    @property
    def schema_version(self) -> int:
        return int(self.get("schema_version", 0))

    @property
    def run_id(self) -> str | None:
        return self.get("run_id")

    @property
    def kind(self) -> str:
        return str(self.get("kind", "simulate" if self.get("simulated") else "run"))

    @property
    def emulated(self) -> bool:
        return bool(self.get("emulated", False))

    @property
    def emulated_links(self) -> bool:
        return bool(self.get("emulated_links", False))

    @property
    def simulated(self) -> bool:
        return bool(self.get("simulated", False))

    @property
    def faults(self) -> list[str]:
        value = self.get("faults") or []
        return [value] if isinstance(value, str) else [str(spec) for spec in value]

    @property
    def device_kind(self) -> str | None:
        return self.get("device_kind")

    @property
    def backend(self) -> str | None:
        return self.get("backend")

    @property
    def cpu_count(self) -> int | None:
        value = self.get("cpu_count")
        return int(value) if value else None

    @property
    def busy_ranks(self) -> dict[str, float] | None:
        """An imported record's CPU demand per host: its ranks' summed share of their iterations in CPU ops (how
        many cores they kept busy); None for other records (a run knows which of its ranks compute for real)."""
        value = (self.get("imported") or {}).get("busy_ranks")
        return {str(k): float(v) for k, v in value.items()} if isinstance(value, dict) and value else None

    @property
    def topology_document(self) -> dict | None:
        return self.get("topology") or None

    @property
    def world_size(self) -> int | None:
        """The world size when there is exactly one (an int ``world`` or ``world_size``)."""
        for key in ("world", "world_size"):
            value = self.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    @property
    def scenario(self) -> dict | None:
        value = self.get("scenario")
        return value if isinstance(value, dict) else None

    @property
    def interrupted(self) -> dict | None:
        """What stopped an interrupted run (signal, case in flight, kept / total, resume command), else None."""
        value = self.get("interrupted")
        return value if isinstance(value, dict) else None

    @property
    def profile(self) -> dict:
        return self.get("profile") or {}

    @property
    def bounded_cases(self) -> set[str]:
        """Simulated cases whose events are bounded (per-step aggregates for all ranks, spans for some): per-rank
        balance cannot be computed from them (docs/simulate.md, "Events at scale")."""
        cases = (self.get("simulation") or {}).get("cases") or {}
        return {
            str(case_id)
            for case_id, info in cases.items()
            if isinstance(info, dict) and info.get("events") == "bounded"
        }

    def ranks(self, world: int | str | None = None) -> dict:
        """What the ranks of one world size reported (``{}`` when not recorded); all of them with None."""
        ranks = self.get("ranks") or {}
        return ranks if world is None else dict(ranks.get(str(world), {}))

    def clock_residual_ns(self, world: int | str | None = None) -> int:
        """The clock-alignment bound of one world size (the largest over world sizes with None)."""
        values = [info.get("clock_residual_ns") or 0 for info in self.ranks().values()] if world is None else [
            self.ranks(world).get("clock_residual_ns") or 0]  # fmt: skip
        return int(max(values, default=0))

    def saturated_blocks(self, world: int | str) -> int | None:
        value = self.ranks(world).get("emulation_saturated_blocks")
        return int(value) if value is not None else None


def check_meta(meta: Mapping, producer: str) -> None:
    """Every key registered, of its type, and produced by ``producer``; raises ValueError (a programming error)."""
    if producer not in PRODUCERS:
        raise ValueError(f"producer={producer!r}; expected one of {PRODUCERS}")
    for name, value in meta.items():
        key = REGISTRY.get(name)
        if key is None:
            raise ValueError(
                f"meta.json key {name!r} is not in ringbench.record.meta.KEYS: register it (type, meaning)"
            )
        if producer not in key.producers:
            raise ValueError(
                f"meta.json key {name!r} is not written by a {producer!r} producer (ringbench.record.meta)"
            )
        if not isinstance(value, key.types) or (isinstance(value, bool) and bool not in key.types):
            kinds = ", ".join(t.__name__ for t in key.types)
            raise ValueError(f"meta.json key {name!r}={value!r} has type {type(value).__name__}; expected {kinds}")


def write_meta(run_dir: str | Path, meta: Mapping, producer: str) -> None:
    """The one writer of meta.json (atomic, sorted keys, NaN as null)."""
    from ringbench.fmt import json_value
    from ringbench.record.atomic import write_bytes

    check_meta(meta, producer)
    document = json_value({**meta, "kind": meta.get("kind", producer)})
    data = json.dumps(document, indent=2, sort_keys=True, allow_nan=False, default=str).encode()
    write_bytes(Path(run_dir) / META_FILE, data)


def read_meta(run_dir: str | Path) -> RunMeta:
    """A results folder's meta.json; one line (UsageError) when the folder, the file or its version is wrong."""
    run_dir = Path(run_dir)
    path = run_dir / META_FILE
    if not run_dir.is_dir():
        raise UsageError(f"run_dir={str(run_dir)!r} is not a directory (expected a results/<run-id>/ folder)")
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"run_dir={str(run_dir)!r} is not a ringbench run: {META_FILE} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    version = meta.get("schema_version")
    if version not in READABLE_VERSIONS:
        allowed = ", ".join(str(v) for v in READABLE_VERSIONS)
        raise UsageError(f"{path}: schema_version={version!r} is not supported; expected one of {allowed}")
    return RunMeta(meta)
