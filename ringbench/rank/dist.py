"""The one module that reads RANK / WORLD_SIZE / LOCAL_RANK and chooses the backend and the device.

Launch modes:
  * local:    ``ringbench run`` spawns N processes itself, bound to 127.0.0.1 on a free port.
  * torchrun: ``torchrun --nproc-per-node 8 -m ringbench run ...`` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR.
  * SLURM:    ``srun --ntasks-per-node 8 python -m ringbench run ...`` sets SLURM_PROCID, SLURM_NTASKS,
              SLURM_LOCALID; MASTER_ADDR / MASTER_PORT must be exported by the batch script.
Backend and device: one decision for the whole group, which every rank computes from every rank's facts (its host,
its local rank, the GPUs it sees, the UUID of the one it would take), exchanged through the rendezvous store before
the group exists (``decide_backend``). NCCL when every rank has a GPU of its own: its local rank's among several
visible GPUs, or the only visible one (a one-GPU-per-task binding, SLURM's ``--gpus-per-task`` or
``CUDA_VISIBLE_DEVICES=n``: ``cuda:0`` in every task); gloo on the CPU for all when any rank has none or two ranks
of a host would share one (NCCL refuses that), with the reason; ``device="cuda"`` that cannot be met is one line.
NCCL groups run their P2P and collectives on high-priority streams (``is_high_priority_stream``, recorded in
meta.json), so a transfer's kernel is scheduled ahead of queued attention blocks. Launched, the CPU side group
(gloo) uses the interface NCCL is told to (NCCL_SOCKET_IFNAME), unless GLOO_SOCKET_IFNAME says otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ringbench.engine.pgroups import group_options, group_timeout
from ringbench.errors import UsageError, bad_value


@dataclass(frozen=True, kw_only=True, slots=True)
class DistEnv:
    rank: int
    world: int
    local_rank: int
    backend: str  # "gloo" | "nccl"
    device: torch.device
    launcher: str  # "local" | "torchrun" | "slurm" | "single"
    backend_note: str = ""  # why the group runs gloo although some rank sees a GPU
    group_options: tuple = ()  # (name, value) pairs the backend was given, e.g. (("is_high_priority_stream", True),)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceFacts:
    """What one rank sees before the group exists (exchanged so that every rank takes the same decision)."""

    rank: int
    host: str
    local_rank: int
    visible: int  # CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied)
    gpu: str | None  # the one it would take (its UUID, or a stand-in naming it), None when it has none


def gpu_index(local_rank: int, visible: int) -> int | None:
    """The visible GPU a rank takes: the only one when one is visible (one GPU bound per task), its local rank's
    among several, none when there are fewer than its local rank needs."""
    if visible == 1:
        return 0
    return local_rank if visible > local_rank else None


def decide_backend(facts: list[DeviceFacts], device: str | None = None) -> tuple[str, str]:
    """(backend, note) for the whole group from every rank's facts: ("nccl", "") when each rank has a GPU of its
    own, else ("gloo", why); ``device="cuda"`` that cannot be met raises UsageError naming the ranks, "cpu" is
    gloo. A pure function of the facts: every rank that computes it gets the same answer."""
    if device == "cpu":
        return "gloo", ""
    facts = sorted(facts, key=lambda f: f.rank)
    without = [f.rank for f in facts if f.gpu is None]
    sharing: dict[tuple[str, str], list[int]] = {}
    for fact in facts:
        if fact.gpu is not None:
            sharing.setdefault((fact.host, fact.gpu), []).append(fact.rank)
    shared = [(key, ranks) for key, ranks in sharing.items() if len(ranks) > 1]
    if not without and not shared:
        return "nccl", ""
    if without:
        seen = ", ".join(str(count) for count in sorted({f.visible for f in facts if f.rank in without}))
        note = f"{_ranks(without)} see(s) {seen} GPU(s) and would have none of its own"
    else:
        (host, gpu), ranks = shared[0]
        note = f"{_ranks(ranks)} would share one GPU ({gpu}) on host {host}, which NCCL refuses"
    if device == "cuda":
        raise UsageError(f"device='cuda' is not allowed: {note}; expected one GPU per rank, or device cpu")
    if all(f.visible == 0 for f in facts):
        return "gloo", ""  # a CPU machine: nothing to explain
    return "gloo", f"gloo on the CPU for every rank: {note}"


def _ranks(values: list[int]) -> str:
    shown = ", ".join(map(str, values[:8])) + (f" and {len(values) - 8} more" if len(values) > 8 else "")
    return f"rank{'s' if len(values) > 1 else ''} {shown}"


def local_facts(rank: int, local_rank: int, device: str | None = None) -> DeviceFacts:
    """This process's facts (CUDA is queried only when a GPU is visible and the device is not "cpu")."""
    visible = 0 if device == "cpu" else local_gpu_count()
    index = gpu_index(local_rank, visible)
    return DeviceFacts(rank=rank, host=socket.gethostname(), local_rank=local_rank, visible=visible,
                       gpu=None if index is None else _gpu_name(index))  # fmt: skip


def _gpu_name(index: int) -> str:
    """The GPU's UUID (two tasks bound to different GPUs both see cuda:0); a stand-in when it cannot be read."""
    try:
        return str(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # no uuid attribute, or the driver refuses: the visible list and index still name it
        return f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'all')}#{index}"


FACTS_KEY = "ringbench/device/{rank}"
DECISION_KEY = "ringbench/device/decision"


def agree_backend(store, mine: DeviceFacts, world: int, timeout_s: float, device: str | None = None):
    """Every rank's part in the one decision, through ``store`` (the rendezvous store): each rank publishes its
    facts, rank 0 decides for all and publishes the decision, every rank reads it. Returns (backend, note); a
    usage error decided on rank 0 is raised on every rank."""
    store.set(FACTS_KEY.format(rank=mine.rank), json.dumps(asdict(mine)))
    if mine.rank == 0:
        keys = [FACTS_KEY.format(rank=r) for r in range(world)]
        _wait_keys(store, keys, timeout_s)
        facts = [DeviceFacts(**json.loads(store.get(key))) for key in keys]
        try:
            decision = {"backend": decide_backend(facts, device)}
        except UsageError as exc:
            decision = {"error": str(exc)}
        store.set(DECISION_KEY, json.dumps(decision))
    _wait_keys(store, [DECISION_KEY], timeout_s)
    decision = json.loads(store.get(DECISION_KEY))
    if "error" in decision:
        raise UsageError(decision["error"])
    backend, note = decision["backend"]
    return backend, note


def _wait_keys(store, keys: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks did not publish their devices within {timeout_s:g} s ({keys[0]} ...)")
        time.sleep(0.01)


def device_for(backend: str, local_rank: int, visible: int) -> torch.device:
    """The device a rank runs on once the group's backend is decided (and made current for its main thread)."""
    if backend != "nccl":
        return torch.device("cpu")
    index = gpu_index(local_rank, visible)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def gloo_interface(nccl_ifname: str | None, interfaces: list[str]) -> str | None:
    """The interface for gloo from NCCL_SOCKET_IFNAME's syntax (``eth0``, ``=eth0`` exact, ``eth`` a prefix,
    ``^docker,lo`` exclusions, comma lists): the first of ``interfaces`` it selects; None when it selects none.
    Loopback is taken only when named: a multi-host group on lo cannot connect."""
    if not nccl_ifname:
        return None
    spec = nccl_ifname.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    names = [name.strip() for name in spec.lstrip("=").split(",") if name.strip()]

    def matches(interface: str) -> bool:
        return any(interface == name if exact else interface.startswith(name) for name in names)

    if exclude:
        chosen = [i for i in interfaces if not matches(i) and not i.startswith(("lo", "docker"))]
    else:
        chosen = [i for i in interfaces if matches(i)]
    return chosen[0] if chosen else None


def choose_device(local_rank: int, device: str | None = None) -> torch.device:
    """``device``: "cpu", "cuda" or None: this process's device when its own facts are the whole story (one process
    on its own); a group decides with ``agree_backend``. One GPU per rank, never two ranks on one GPU."""
    if device not in (None, "cpu", "cuda"):
        raise bad_value("device", device, "cpu or cuda")
    mine = local_facts(0, local_rank, device)
    backend, _ = decide_backend([mine], device)
    return device_for(backend, local_rank, mine.visible)


def gpu_shortage(ranks_on_host: int, gpus: int) -> UsageError:
    if gpus == 0:
        return UsageError("device='cuda' is not allowed: no CUDA device is visible; expected cpu")
    return UsageError(
        f"device='cuda' is not allowed with {ranks_on_host} ranks on this host: it has {gpus} visible GPU(s) and "
        "each rank needs its own; expected at most that many ranks per host, or device cpu"
    )


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


def launch_shape() -> tuple[int, int]:
    """(nodes, ranks per node) of this torchrun / SLURM launch, for the command that relaunches it."""
    launched = launched_env()
    world = launched[1] if launched is not None else 1
    if launched is not None and launched[3] == "slurm":
        nodes = _leading_int(os.environ.get("SLURM_NNODES") or os.environ.get("SLURM_JOB_NUM_NODES"), 1)
        per_node = _leading_int(os.environ.get("SLURM_NTASKS_PER_NODE"), 0)  # "8", or absent
    else:
        nodes = _leading_int(os.environ.get("GROUP_WORLD_SIZE"), 1)
        per_node = _leading_int(os.environ.get("LOCAL_WORLD_SIZE"), 0)
    return nodes, per_node or max(1, world // max(nodes, 1))


def _leading_int(text: str | None, default: int) -> int:
    digits = "".join(itertools.takewhile(str.isdigit, (text or "").strip()))
    return int(digits) if digits else default


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def launch_store():
    """The launched group's key-value store (the rendezvous store torchrun or env:// made), for a word between
    ranks outside the collectives (which rank was signalled); None when there is none."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # not initialised, or a torch without it
        return None


def init_local(rank: int, world: int, store_path: str, timeout_s: float, device: str | None = None) -> DistEnv:
    """Join a local process group: rendezvous through ``store_path`` (a file), gloo bound to loopback. The ranks of
    a local run share one host and one environment, so each computes the group's decision from the same facts."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # local runs never listen beyond 127.0.0.1, whatever is inherited
    if device not in (None, "cpu", "cuda"):
        raise bad_value("device", device, "cpu or cuda")
    visible = 0 if device == "cpu" else local_gpu_count()
    if device == "cuda" and visible < world:
        raise gpu_shortage(world, visible)
    host = socket.gethostname()
    facts = [DeviceFacts(rank=r, host=host, local_rank=r, visible=visible,
                         gpu=None if gpu_index(r, visible) is None else f"#{gpu_index(r, visible)}")
             for r in range(world)]  # fmt: skip
    backend, note = decide_backend(facts, device)
    dev = device_for(backend, rank, visible)
    options = group_options(backend, group_timeout(timeout_s, backend))
    dist.init_process_group(
        backend,
        init_method=f"file://{store_path}",
        rank=rank,
        world_size=world,
        timeout=group_timeout(timeout_s, backend),
        **({"device_id": dev} if dev.type == "cuda" else {}),
        **options,
    )
    return DistEnv(rank=rank, world=world, local_rank=rank, backend=backend, device=dev, launcher="local",
                   backend_note=note, group_options=described_options(options))  # fmt: skip


def described_options(options: dict) -> tuple:
    pg_options = options.get("pg_options")
    if pg_options is None:
        return ()
    return (("is_high_priority_stream", bool(pg_options.is_high_priority_stream)),)


def init_launched(timeout_s: float, device: str | None = None) -> DistEnv | None:
    """Join the process group described by torchrun / SLURM variables; None when not launched that way. The ranks
    agree on one backend through the rendezvous store before the group is made (``agree_backend``)."""
    launched = launched_env()
    if launched is None:
        return None
    if device not in (None, "cpu", "cuda"):
        raise bad_value("device", device, "cpu or cuda")
    rank, world, local_rank, launcher = launched
    if dist.is_initialized():  # the user's program made the group: take what it chose
        backend = dist.get_backend()
        visible = local_gpu_count()
        dev = device_for("nccl", local_rank, visible) if backend == "nccl" else torch.device("cpu")
        return DistEnv(rank=rank, world=world, local_rank=local_rank, backend=backend, device=dev,
                       launcher=launcher)  # fmt: skip
    if launcher == "slurm":
        os.environ.setdefault("RANK", str(rank))
        os.environ.setdefault("WORLD_SIZE", str(world))
        os.environ.setdefault("MASTER_PORT", "29500")
    interface = gloo_interface(os.environ.get("NCCL_SOCKET_IFNAME"), [name for _, name in socket.if_nameindex()])
    if interface and not os.environ.get("GLOO_SOCKET_IFNAME"):
        os.environ["GLOO_SOCKET_IFNAME"] = interface  # the side group talks where NCCL is told to
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timedelta(seconds=timeout_s)))
    mine = local_facts(rank, local_rank, device)
    backend, note = agree_backend(store, mine, world, timeout_s, device)
    dev = device_for(backend, local_rank, mine.visible)
    options = group_options(backend, group_timeout(timeout_s, backend))
    dist.init_process_group(
        backend,
        store=store,
        timeout=group_timeout(timeout_s, backend),
        rank=rank,
        world_size=world,
        **({"device_id": dev} if dev.type == "cuda" else {}),
        **options,
    )
    return DistEnv(rank=rank, world=world, local_rank=local_rank, backend=backend, device=dev, launcher=launcher,
                   backend_note=note, group_options=described_options(options))  # fmt: skip


def maybe_init_dist(timeout_s: float = 60.0) -> DistEnv | None:
    """For use inside a user's program: join the launched group if there is one, else None (single process)."""
    return init_launched(timeout_s)
