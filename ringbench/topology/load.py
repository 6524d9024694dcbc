"""Load a topology from a path: a file in any supported format (detected), or a results run directory.

Detection: a file holding a `nvidia-smi topo -m` matrix (a GPU0.. header and GPU rows) is parsed as such; anything
else must be YAML/JSON (a hand-written description, a measured matrix, a `Topology.to_dict` document, or a run's
meta.json with a ``"topology"`` key).
"""

from __future__ import annotations

import json
from pathlib import Path

from ringbench.errors import UsageError
from ringbench.topology.model import Topology
from ringbench.topology.nvsmi import looks_like_nvidia_smi, parse_nvidia_smi
from ringbench.topology.yaml_source import parse_yaml_topology

RUN_META_KEY = "topology"


def read_topology_text(text: str, *, source: str = "topology") -> Topology:
    """Parse topology text, detecting nvidia-smi output versus YAML/JSON."""
    if looks_like_nvidia_smi(text):
        return parse_nvidia_smi(text, source=f"nvidia-smi:{source}")
    if not text.strip():
        raise UsageError(f"{source}: empty file; expected `nvidia-smi topo -m` output or a YAML topology")
    if text.lstrip().startswith("<"):  # NCCL_GRAPH_DUMP_FILE / NCCL_TOPO_DUMP_FILE write XML
        raise UsageError(f"{source}: XML (an NCCL graph or topology dump?) is not read here; expected "
                         "`nvidia-smi topo -m` output or a YAML topology (docs/topology.md)")  # fmt: skip
    return parse_yaml_topology(text, source=source)


def _run_meta(run_dir: Path) -> dict:
    """A results folder's meta.json as plain JSON: the topology is one of its sources, read like any other file
    (the model knows nothing of the results store)."""
    path = run_dir / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"run_dir={str(run_dir)!r} is not a ringbench run: meta.json is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(meta).__name__}")
    return meta


def topology_from_run(run_dir: str | Path) -> Topology:
    """The topology recorded in a run's meta.json (under ``"topology"``)."""
    if not Path(run_dir).is_dir():
        raise UsageError(f"run_dir={str(run_dir)!r} is not a directory (expected a results/<run-id>/ folder)")
    meta = _run_meta(Path(run_dir))
    document = meta.get(RUN_META_KEY)
    if document is None:
        raise UsageError(f"run_dir={str(run_dir)!r}: meta.json has no {RUN_META_KEY!r}; pass --topology FILE")
    return Topology.from_dict(document, f"{Path(run_dir).name}/meta.json:{RUN_META_KEY}")


def run_world(run_dir: str | Path) -> int | None:
    """The run's world size from its meta.json (``world`` or ``world_size``), if recorded."""
    meta = _run_meta(Path(run_dir))
    for key in ("world", "world_size"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def load_topology(path: str | Path) -> Topology:
    """A topology from a file (format detected) or a run directory."""
    path = Path(path)
    if path.is_dir():
        return topology_from_run(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file; expected `nvidia-smi topo -m` output or a YAML topology") from None
    return read_topology_text(text, source=path.name)


def resolve_topology(topology: str | Path | None = None, run_dir: str | Path | None = None) -> Topology:
    """The topology for `ringbench recommend`: from ``topology`` (file or run dir), else from ``run_dir``.

    With both, the file's device count must match the run's world size.
    """
    if topology is None and run_dir is None:
        raise UsageError("no topology: pass --topology FILE or a RUN_DIR whose meta.json records one")
    loaded = load_topology(topology) if topology is not None else topology_from_run(run_dir)
    if run_dir is not None:
        world = run_world(run_dir)
        if world is not None and world != loaded.world:
            raise UsageError(
                f"topology has {loaded.world} devices but run_dir={str(run_dir)!r} ran on world={world}; "
                "give the topology of the machines the run used"
            )
    return loaded
