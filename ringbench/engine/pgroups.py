"""One process group per ring and per group: the channel each exchange travels on, and its name in the record.

With NCCL a process group is one communicator, and a communicator runs its point-to-point work on one stream per
device, in posting order. Rings that share one group therefore queue behind each other: the double ring's outer
K/V exchange, posted when a rotation starts, would run ahead of inner step 0's and could not hide behind the inner
steps; the inner hops' receive spans would include the outer link's time, and the hop tables would charge an
inter-host transfer to an NVLink hop. So every ring that can be in flight beside another gets a group of its own:

  ring-kv / ring-dkv       the ring's K/V rotation, and its backward's dK/dV (or the short ring's way home)
  inner-kv / inner-dkv     the double ring's inner rings (one group per inner ring)
  outer-kv / outer-dkv     the double ring's outer ring (one group per outer ring)
  cross-kv / cross-dkv     the hybrid's ring across its Ulysses groups
  a2a                      the hybrid's (and Ulysses') all-to-all group

``torch.distributed.new_group`` must be entered by every rank of the world, in the same order. A role's
*partition* (all of its groups, from the strategy's placement) is the same on every rank, so every rank makes
every group of it, in sorted order, and keeps its own. Groups are kept for the process (keyed by role and
partition): a sweep's cases reuse them. NCCL groups get high-priority streams (``is_high_priority_stream``) and the
same timeout rule as the world group (``group_timeout``).

Policy (``groups`` of the AttentionSpec, engine/spec.py): ``own`` (the rule above), ``shared`` (every ring on
the given group, as before), ``auto`` (own when the given group spans the world; shared otherwise: a sub-group's
ranks cannot make groups without the rest of the world entering too). A shared channel is recorded as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from ringbench.errors import UsageError, bad_value

ROLES = ("ring-kv", "ring-dkv", "inner-kv", "inner-dkv", "outer-kv", "outer-dkv", "cross-kv", "cross-dkv", "a2a")
POLICIES = ("auto", "own", "shared")
_MADE: dict[tuple, object] = {}  # (world group id, role, partition) -> this rank's group (None: not a member)


@dataclass(frozen=True, slots=True)
class Channel:
    """The process group one ring or group exchanges on (None: the base group itself) and its label."""

    group: object
    label: str  # "<role>:<ranks>", e.g. "outer-kv:1-3"; "shared:<role>" when it rides on the base group


def group_timeout(timeout_s: float, backend: str) -> timedelta:
    """A process group's own timeout. NCCL's watchdog aborts the whole job when it expires, so it is set above
    ringbench's bound: ringbench names the stalled hop first. gloo's bounds the harness's own barriers."""
    if backend == "nccl":
        return timedelta(seconds=timeout_s + max(30.0, 0.5 * timeout_s))
    return timedelta(seconds=timeout_s)


def group_options(backend: str, timeout: timedelta, nccl=None) -> dict:
    """Backend options of a process group: NCCL's P2P and collectives on high-priority streams (as production
    frameworks configure them). ``nccl``: the ProcessGroupNCCL class (injectable: a CPU build has none)."""
    nccl = nccl if nccl is not None else getattr(dist, "ProcessGroupNCCL", None)
    if backend != "nccl" or nccl is None:
        return {}
    options = nccl.Options()
    options.is_high_priority_stream = True
    if hasattr(options, "_timeout"):  # private: a torch without it takes the timeout argument alone
        options._timeout = timeout  # the group's own (else torch warns that the timeout argument overrides it)
    return {"pg_options": options}


def resolve_policy(policy: str, group, world: int) -> str:
    """``own`` or ``shared`` for a ring over ``group`` of ``world`` ranks (module docstring)."""
    if policy not in POLICIES:
        raise bad_value("groups", policy, " or ".join(POLICIES))
    if world <= 1 or not dist.is_initialized():
        return "shared" if policy == "shared" else "own"
    spans_world = group is None or dist.get_world_size(group) == dist.get_world_size()
    if policy == "own" and not spans_world:
        raise UsageError(f"groups='own' is not allowed with a group of {dist.get_world_size(group)} of the world's "
                         f"{dist.get_world_size()} ranks (every rank of the world must make the groups); expected "
                         "'shared' or 'auto'")  # fmt: skip
    if policy == "auto":
        return "own" if spans_world else "shared"
    return policy


def _global(group, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def channel(base, role: str, partition, rank: int, *, timeout_s: float, policy: str = "own",
            new_group=None, nccl=None) -> Channel:  # fmt: skip
    """This rank's channel for ``role``: ``partition`` holds every group of the role (ranks of ``base``), the one
    with ``rank`` among them. Collective under ``own``: every rank of the world calls it at the same point.
    ``new_group`` / ``nccl``: injectable (tests check the calls without a second process or a GPU)."""
    if role not in ROLES:
        raise ValueError(f"unknown channel role {role!r}")
    groups = tuple(sorted(tuple(int(r) for r in members) for members in partition))
    mine = next(members for members in groups if rank in members)
    if policy == "shared" or (not dist.is_initialized() and new_group is None):
        return Channel(None, f"shared:{role}" if policy == "shared" else f"{role}:{_ranks(mine)}")
    make = new_group if new_group is not None else dist.new_group
    world_id = id(dist.distributed_c10d._get_default_group()) if dist.is_initialized() else 0
    key = (world_id, make, role, groups)
    if key not in _MADE:
        backend = dist.get_backend(base) if dist.is_initialized() else "gloo"
        timeout = group_timeout(timeout_s, backend)
        made = None
        for members in groups:  # every rank, every group, the same order: new_group is collective over the world
            # Fresh options per group: torch writes the group's name, colour and ranks into the options it is
            # given, and ProcessGroupNCCL keeps them; one shared object would show every group the last one's.
            options = group_options(backend, timeout, nccl)
            group = make(ranks=[_global(base, r) for r in members], timeout=timeout, **options)
            if members == mine:
                made = group
        _MADE[key] = made
    return Channel(_MADE[key], f"{role}:{_ranks(mine)}")


def _ranks(members: tuple[int, ...]) -> str:
    return "-".join(map(str, members))


def ring_partition(world: int) -> tuple[tuple[int, ...], ...]:
    """The one group of a ring over the whole world."""
    return (tuple(range(world)),)


def forget() -> None:
    """Drop the kept groups (a test that makes a new world in the same process)."""
    _MADE.clear()


__all__ = ["POLICIES", "ROLES", "Channel", "channel", "forget", "group_options", "group_timeout", "resolve_policy",
           "ring_partition"]  # fmt: skip
