"""The one module that reads RANK / WORLD_SIZE / LOCAL_RANK and chooses the backend and the device.

Launch modes:
  * local:    ``ringbench run`` spawns N processes itself, bound to 127.0.0.1 on a free port.
  * torchrun: ``torchrun --nproc-per-node 8 -m ringbench run ...`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR.
  * SLURM:    ``srun --ntasks-per-node 8 python -m ringbench run ...`` sets SLURM_PROCID, SLURM_NTASKS,
              SLURM_LOCALID; MASTER_ADDR / MASTER_PORT must be exported by the batch script.
Backend: NCCL when the device is CUDA, gloo otherwise. Same code path either way.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ringbench.errors import UsageError, bad_value


@dataclass(frozen=True, kw_only=True, slots=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    backend: str  # "gloo" | "nccl"
    device: torch.device
    launcher: str  # "local" | "torchrun" | "slurm" | "single"


def choose_device(local_rank: int, device: str | None = None) -> torch.device:
    """``device``: "cpu", "cuda" or None (CUDA when this process can see a GPU for its local rank).

    One GPU per rank, never two ranks on one GPU (NCCL refuses that with "Duplicate GPU detected"): a local rank
    beyond the visible GPUs is a usage error with ``device="cuda"``, and falls back to the CPU with None.
    """
    if device == "cpu":
        return torch.device("cpu")
    if device not in (None, "cuda"):
        raise bad_value("device", device, "cpu or cuda")
    gpus = local_gpu_count()
    if gpus > local_rank:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if device == "cuda":
        raise gpu_shortage(local_rank + 1, gpus)
    return torch.device("cpu")


def gpu_shortage(ranks_on_host: int, gpus: int) -> UsageError:
    if gpus == 0:
        return UsageError("device='cuda' is not allowed: no CUDA device is visible; expected cpu")
    return UsageError(
        f"device='cuda' is not allowed with {ranks_on_host} ranks on this host: it has {gpus} visible GPU(s) and "
        "each rank needs its own; expected at most that many ranks per host, or device cpu"
    )


def group_timeout(timeout_s: float, backend: str) -> timedelta:
    """The process group's own timeout. NCCL's watchdog aborts the whole job when it expires, so it is set above
    ringbench's bound: ringbench names the stalled hop first. gloo's bounds the harness's own barriers."""
    if backend == "nccl":
        return timedelta(seconds=timeout_s + max(30.0, 0.5 * timeout_s))
    return timedelta(seconds=timeout_s)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def local_gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launched_env() -> tuple[int, int, int, str] | None:
    """(rank, world, local_rank, launcher) when started by torchrun or SLURM; None otherwise."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        return rank, world, int(os.environ.get("LOCAL_RANK", rank)), "torchrun"
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ and "MASTER_ADDR" in os.environ:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        return rank, world, int(os.environ.get("SLURM_LOCALID", 0)), "slurm"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def init_local(rank: int, world: int, store_path: str, timeout_s: float, device: str | None = None) -> DistEnv:
    """Join a local process group: rendezvous through ``store_path`` (a file), gloo bound to loopback."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # local runs never listen beyond 127.0.0.1, whatever is inherited
    if device is None and local_gpu_count() < world:
        device = "cpu"  # NCCL needs one GPU per rank: with fewer GPUs than ranks, run gloo on CPU
    if device == "cuda" and local_gpu_count() < world:
        raise gpu_shortage(world, local_gpu_count())
    dev = choose_device(rank, device)
    backend = backend_for(dev)
    dist.init_process_group(
        backend,
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=world,
        timeout=group_timeout(timeout_s, backend),
        **({"device_id": dev} if dev.type == "cuda" else {}),
    )
    return DistEnv(rank=rank, world=world, local_rank=rank, backend=backend, device=dev, launcher="local")


def init_launched(timeout_s: float, device: str | None = None) -> DistEnv | None:
    """Join the process group described by torchrun / SLURM variables; None when not launched that way."""
    launched = launched_env()
    if launched is None:
        return None
    rank, world, local_rank, launcher = launched
    dev = choose_device(local_rank, device)
    backend = backend_for(dev)
    if not dist.is_initialized():
        if launcher == "slurm":
            os.environ.setdefault("RANK", str(rank))
            os.environ.setdefault("WORLD_SIZE", str(world))
            os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(
            backend,
            timeout=group_timeout(timeout_s, backend),
            rank=rank,
            world_size=world,
            **({"device_id": dev} if dev.type == "cuda" else {}),
        )
    return DistEnv(rank=rank, world=world, local_rank=local_rank, backend=backend, device=dev, launcher=launcher)


def maybe_init_dist(timeout_s: float = 60.0) -> DistEnv | None:
    """For use inside a user's program: join the launched group if there is one, else None (single process)."""
    return init_launched(timeout_s)
