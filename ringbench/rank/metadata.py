"""The metadata record of a run: one ``collect_*`` function per source, merged into meta.json."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from ringbench.rank.dist import local_gpu_count


def collect_versions() -> dict:
    versions = {"python": platform.python_version(), "torch": torch.__version__, "ringbench": _ringbench_version()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except Exception:  # triton is optional at run time (not on every platform)
        versions["triton"] = None
    nccl = None
    if torch.cuda.is_available():
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:
            nccl = None
    versions["nccl"] = nccl
    versions["cuda"] = torch.version.cuda
    return versions


def _ringbench_version() -> str:
    from ringbench._version import __version__

    return __version__


def collect_device_metadata(world: int | None = None) -> dict:
    gpus = local_gpu_count()
    uses_gpu = gpus >= 2 and (world is None or gpus >= world)
    if uses_gpu:
        names = [torch.cuda.get_device_name(i) for i in range(gpus)]
        return {"backend": "nccl", "device_kind": names[0], "devices": names}
    return {
        "backend": "gloo",
        "device_kind": "cpu",
        "devices": [platform.processor() or platform.machine()],
        "cpu_count": _cpu_count(),
    }


def _cpu_count() -> int | None:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def describe_device(device: torch.device) -> dict:
    """What one rank runs on: for a GPU its name, memory, capability, the GPU count, driver, CUDA and NCCL."""
    if device.type != "cuda":
        return {"type": "cpu", "name": platform.processor() or platform.machine(), "cpu_count": _cpu_count()}
    props = torch.cuda.get_device_properties(device)
    versions = collect_versions()
    return {
        "type": "cuda",
        "name": props.name,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "capability": f"{props.major}.{props.minor}",
        "gpu_count": torch.cuda.device_count(),
        "driver": _driver_version(),
        "cuda": versions["cuda"],
        "nccl": versions["nccl"],
    }


def _driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML (or no driver): the rest of the record stands
        return None


def collect_host_metadata() -> dict:
    return {"host": socket.gethostname(), "platform": platform.platform()}


def collect_git_metadata() -> dict:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None}
    if commit.returncode != 0:
        return {"git_commit": None}
    return {"git_commit": commit.stdout.strip(), "git_dirty": bool(dirty.stdout.strip())}


def collect_environment(command: str = "") -> dict:
    """What every results folder records about where and by what it was made (run, probe, import)."""
    return {
        "created": datetime.now(timezone.utc).isoformat(),
        "command": command or " ".join(sys.argv),
        "torch_version": torch.__version__,
        "versions": collect_versions(),
        **collect_host_metadata(),
        **collect_git_metadata(),
    }


def collect_metadata(scenario, *, command: str, trace: bool) -> dict:
    """A run's metadata before its first case (ringbench.run.results adds run_id and the schema version)."""
    from ringbench.scenario.faults import parse_fault

    worlds = list(scenario.world)
    device = collect_device_metadata(max(worlds))
    cases = scenario.cases()
    topology = scenario.load_topology() if scenario.topology else None
    return {
        **collect_environment(command),
        "world": worlds[0] if len(worlds) == 1 else worlds,
        "topology": topology.to_dict() if topology is not None else None,
        "emulated_links": bool(scenario.emulate_links),
        "scenario": scenario.to_dict(),
        "scenario_source": scenario.source,
        "emulated": any(case.emulated for case in cases) or bool(scenario.emulate_links),
        "faults": [parse_fault(f).spec for f in scenario.faults],
        "trace": trace,
        **device,
    }
