"""A planned candidate in the user's framework: the settings that run it, and how to launch its ranks.

    settings = framework_settings(candidate, world, heads, kv_heads, mask)   # per framework: flags or a reason
    launch = launcher_mapping(rank_order(candidate, world, topology), topology)

The frameworks and their own option names (checked against their public code):

  megatron     Megatron-LM with TransformerEngine's context parallelism: ``--context-parallel-size N``,
               ``--cp-comm-type p2p | all_gather | a2a | a2a+p2p`` and, for a2a+p2p,
               ``--hierarchical-context-parallel-sizes A R`` (A: the all-to-all degree, its groups adjacent ranks;
               R: the ring across them). Its batch is split zigzag (2N chunks); no double ring, no striped or
               contiguous ring, no ring for a sliding window (all_gather runs it), no Ulysses degree above the KV
               heads.
  usp          USP / yunchang: ``set_seq_parallel_pg(ulysses_degree, ring_degree, rank, world_size,
               use_ulysses_low)`` and ``LongContextAttention(ring_impl_type="basic" | "zigzag" | "strip")``
               (contiguous, zigzag, striped rings; the caller lays tokens out, e.g. with yunchang's
               EXTRACT_FUNC_DICT). use_ulysses_low=True: Ulysses groups of adjacent ranks; False: the ring's
               groups adjacent. No all-gather baseline, no double ring, no sliding window.
  torchtitan   torch's context parallelism through torchtitan: ``parallelism.context_parallel_degree``,
               ``parallelism.context_parallel_rotate_method`` ("alltoall": K/V passed around the ring;
               "allgather": gathered), ``parallelism.context_parallel_load_balancer`` ("headtail": zigzag; None:
               contiguous; "ptrr": FlexAttention's balancer for packed documents). No head (Ulysses) parallelism.

The framework's rank k runs on the topology's device ``rank_order[k]``: a ring's order, a grouped strategy's
placement (its groups are consecutive entries), read from where a launcher can start. A launcher mapping gives
torchrun's per-host ``--node_rank`` and ``CUDA_VISIBLE_DEVICES`` (ranks numbered host by host: possible only when
each host's ranks are consecutive) and SLURM's (``--distribution=arbitrary`` with a hostfile: one host per rank,
any order).
"""

from __future__ import annotations

from ringbench.vocab import MaskSpec, Strategy

FRAMEWORKS = ("megatron", "usp", "torchtitan")
_RING_IMPL = {"contiguous": "basic", "zigzag": "zigzag", "striped": "strip"}
_BALANCER = {"zigzag": "headtail", "contiguous": None, "doc-balanced": "ptrr"}


def framework_settings(candidate, world: int, heads: int, kv_heads: int, mask: str) -> dict[str, dict]:
    """Per framework: ``{"expresses": True, "settings": {...}, "args": "..."}`` or ``{"expresses": False,
    "reason": "..."}`` for ``candidate`` (a planner Candidate)."""
    strategy = Strategy.parse(candidate.strategy)
    spec = MaskSpec.parse(mask)
    window = spec.window is not None
    short = candidate.buffer in ("double-short", "sync-short")
    return {"megatron": _megatron(strategy, candidate.layout, world, kv_heads, window, short, spec.documents),
            "usp": _usp(strategy, candidate, world, window, short),
            "torchtitan": _torchtitan(strategy, candidate.layout, world, short)}  # fmt: skip


def _no(reason: str) -> dict:
    return {"expresses": False, "reason": reason}


def _yes(settings: dict, args: str, note: str = "") -> dict:
    return {"expresses": True, "settings": settings, "args": args, **({"note": note} if note else {})}


def _megatron(strategy, layout: str, world: int, kv_heads: int, window: bool, short: bool, documents) -> dict:
    kind = strategy.kind
    if kind == "double-ring":
        return _no("TransformerEngine has no double ring (its rings span the whole CP group)")
    if short:
        return _no("TransformerEngine's ring always makes N - 1 steps (no short ring for a window)")
    if kind in ("ring", "hybrid") and window:
        return _no("TransformerEngine's p2p ring does not run a sliding window (its all_gather does)")
    if kind in ("ring", "hybrid") and layout not in ("zigzag", "doc-balanced"):
        return _no(f"Megatron splits the sequence zigzag (2N chunks); a {layout} ring is not one of its layouts")
    if kind in ("ulysses", "hybrid") and kv_heads % strategy.ulysses_degree(world):
        return _no(f"TransformerEngine's all-to-all needs the {kv_heads} KV heads divisible by its degree "
                   f"{strategy.ulysses_degree(world)} (it does not repeat them)")  # fmt: skip
    comm = {"ring": "p2p", "allgather": "all_gather", "ulysses": "a2a", "hybrid": "a2a+p2p"}[kind]
    settings = {"--context-parallel-size": world, "--cp-comm-type": comm}
    if kind == "hybrid":
        settings["--hierarchical-context-parallel-sizes"] = f"{strategy.degree} {world // strategy.degree}"
    note = "THD (packed sequences) splits each document zigzag" if documents and kind != "allgather" else ""
    return _yes(settings, " ".join(f"{k} {v}" for k, v in settings.items()), note)


def _usp(strategy, candidate, world: int, window: bool, short: bool) -> dict:
    kind = strategy.kind
    if kind in ("allgather", "double-ring"):
        return _no(f"yunchang has no {'all-gather baseline' if kind == 'allgather' else 'double ring'}")
    if window or short:
        return _no("yunchang's rings do not run a sliding window")
    impl = _RING_IMPL.get(candidate.layout)
    if impl is None and kind != "ulysses":
        return _no(f"yunchang's rings are basic, zigzag or strip; a {candidate.layout} layout is none of them")
    degree = strategy.ulysses_degree(world)
    settings = {"ulysses_degree": degree, "ring_degree": world // degree, "ring_impl_type": impl or "zigzag",
                "use_ulysses_low": True}  # fmt: skip
    args = (f"set_seq_parallel_pg({degree}, {world // degree}, rank, world_size, use_ulysses_low=True); "
            f"LongContextAttention(ring_impl_type={settings['ring_impl_type']!r})")  # fmt: skip
    return _yes(settings, args, "lay the tokens out to match the ring (yunchang's EXTRACT_FUNC_DICT)")


def _torchtitan(strategy, layout: str, world: int, short: bool) -> dict:
    kind = strategy.kind
    if kind not in ("ring", "allgather"):
        return _no("torch's context parallelism has no head (Ulysses) parallelism and no double ring")
    if short:
        return _no("torch's context parallelism always rotates every K/V shard (no short ring)")
    if kind == "ring" and layout not in _BALANCER:
        return _no(f"torch's load balancers are head-tail (zigzag) and per-document; no {layout} layout")
    balancer = _BALANCER.get(layout, "headtail")
    settings = {"parallelism.context_parallel_degree": world,
                "parallelism.context_parallel_rotate_method": "alltoall" if kind == "ring" else "allgather",
                "parallelism.context_parallel_load_balancer": balancer}  # fmt: skip
    args = " ".join(f"--{k} {'None' if v is None else v}" for k, v in settings.items())
    return _yes(settings, args, "ptrr is FlexAttention's balancer" if balancer == "ptrr" else "")


def rank_order(candidate, world: int) -> list[int]:
    """The device that runs each framework rank: the ring's order, or the placement (groups consecutive)."""
    if candidate.placement:
        return list(candidate.placement)
    return list(candidate.order or range(world))


def launcher_mapping(order: list[int], topology, ring: bool = False) -> dict:
    """torchrun and SLURM forms of ``order`` (framework rank -> device). ``ring``: a ring may start anywhere,
    so each rotation is tried for one that torchrun can launch (host by host)."""
    devices = topology.devices
    starts = [0]
    if ring:  # a ring host by host (cyclically) reads so from any run's start: the first host boundary is one
        starts += [p for p in range(1, len(order)) if devices[order[p]].host != devices[order[p - 1]].host][:1]
    blocked = None
    for start in starts:
        rotated = order[start:] + order[:start]
        hosts = _host_runs(rotated, devices)
        if hosts is not None:
            blocked = (rotated, hosts)
            break
    out: dict = {}
    if blocked is not None:
        rotated, hosts = blocked
        per_host = []
        for node_rank, host in enumerate(hosts):
            local = [devices[rank].local_index for rank in rotated if devices[rank].host == host]
            per_host.append({"host": host, "node_rank": node_rank, "CUDA_VISIBLE_DEVICES": ",".join(map(str, local))})
        out["torchrun"] = {"expresses": True, "hosts": per_host, "env": "CUDA_DEVICE_ORDER=PCI_BUS_ID"}
        order = rotated
    else:
        out["torchrun"] = {"expresses": False, "reason": "torchrun numbers ranks host by host, and this order "
                           "alternates between hosts: launch with SLURM's arbitrary distribution"}  # fmt: skip
    hostfile = [devices[rank].host for rank in order]
    visible = {}
    for rank in order:
        visible.setdefault(devices[rank].host, []).append(str(devices[rank].local_index))
    out["slurm"] = {"expresses": True, "distribution": "arbitrary", "hostfile": hostfile,
                    "CUDA_VISIBLE_DEVICES": {host: ",".join(local) for host, local in visible.items()},
                    "env": "SLURM_HOSTFILE=<file with one host per line, the hostfile above>"}  # fmt: skip
    out["rank_order"] = list(order)
    return out


def _host_runs(order: list[int], devices) -> list[str] | None:
    """The hosts in the order their ranks come, when each host's ranks are consecutive (else None)."""
    runs: list[str] = []
    for rank in order:
        host = devices[rank].host
        if not runs or runs[-1] != host:
            if host in runs:
                return None
            runs.append(host)
    return runs


def _usp_strided(candidate, world: int, topology) -> list[int] | None:
    """For a hybrid whose Ulysses groups are strided over a host-by-host order (the interleaved placement): that
    order, which yunchang's use_ulysses_low=False runs with ranks numbered host by host; else None."""
    strategy = Strategy.parse(candidate.strategy)
    if strategy.kind != "hybrid" or not candidate.placement:
        return None
    size = strategy.degree
    count = world // size
    order = [0] * world
    for g in range(count):
        for i in range(size):
            order[g + count * i] = candidate.placement[g * size + i]
    if _host_runs(candidate.placement, topology.devices) is None and _host_runs(order, topology.devices) is not None:
        return order
    return None


def plan_settings(candidates: list, chosen, world: int, heads: int, kv_heads: int, mask: str, topology) -> dict:
    """The settings that run ``chosen`` in each framework, with its launcher mapping; where a framework cannot,
    its reason and its best expressible candidate of ``candidates`` (ranked), with that one's settings."""
    frameworks = {}
    for candidate in candidates:
        if not getattr(candidate, "frameworks", None):
            candidate.frameworks = framework_settings(candidate, world, heads, kv_heads, mask)
    for name in FRAMEWORKS:
        entry = dict(chosen.frameworks[name])
        target = chosen
        if not entry["expresses"]:
            best = next((c for c in candidates if c.frameworks[name]["expresses"]), None)
            if best is not None:
                target = best
                entry["best"] = {"candidate": best.label, "step_ms": best.step_ms,
                                 "vs_first_choice": best.step_ms / chosen.step_ms if chosen.step_ms else None,
                                 **best.frameworks[name]}  # fmt: skip
            else:
                target = None
        if target is not None:
            order, settings = rank_order(target, world), None
            if name == "usp":
                strided = _usp_strided(target, world, topology)
                if strided is not None:
                    order = strided
                    settings = dict((entry.get("best") or entry)["settings"], use_ulysses_low=False)
            launch = launcher_mapping(order, topology, ring=Strategy.parse(target.strategy).ordered)
            if settings is not None:
                (entry.get("best") or entry)["settings"] = settings
                holder = entry.get("best") or entry
                holder["args"] = holder["args"].replace("use_ulysses_low=True", "use_ulysses_low=False")
            entry["launch"] = launch
        frameworks[name] = entry
    return frameworks


def short_text(name: str, entry: dict) -> str:
    """One line for the terminal: the framework's settings, or why it cannot run the candidate."""
    if entry["expresses"]:
        note = f" ({entry['note']})" if entry.get("note") else ""
        return f"{name}: {entry['args']}{note}"
    return f"{name}: cannot express it: {entry['reason']}"


__all__ = ["FRAMEWORKS", "framework_settings", "launcher_mapping", "plan_settings", "rank_order", "short_text"]
