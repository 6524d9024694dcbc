"""What each rank posts, and whether the posts of all ranks can complete: the property NCCL needs.

NCCL matches point-to-point operations in posting order per (communicator, sender, receiver) and runs a
collective only when every member of its communicator entered it; a rank whose next operation waits for a peer
that is itself waiting for something else, posted later, hangs. So, for every strategy, mask and buffer, each
rank's sequence of (communicator, op, peer, bytes) is recorded and the ranks' sequences are checked together:

  * matched: the k-th send from a to b on a communicator meets the k-th receive at b from a on it, with the same
    bytes; every member enters the k-th collective of a communicator with the same op and bytes; every rank makes
    the same process groups in the same order (``new_group`` is collective over the world);
  * ordered: the ranks can run their posts to the end when each rank runs them one at a time, in its program
    order, each batch (``batch_isend_irecv``) or collective completing only together with every counterpart (all
    of them at the head of their ranks' sequences). That is stricter than NCCL (which runs batches
    asynchronously, and a batch's sends before its receives), so passing it means no order of posting can hang;
    the firing order it finds is one global order of every communicator's operations that every rank follows.

``recording(log)`` wraps torch.distributed's calls in a real process (a gloo rank) and records what goes through
them; ``simulated(world, rank, log)`` replaces them with a one-process stand-in that records and completes every
call at once (received buffers hold zeros: nothing the engine decides depends on their values), so one process
can run every rank of every combination in turn.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict, deque
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ringbench.kernels.base import BlockKernel, stats_dtype

WORLD = "world"


@dataclass(frozen=True, slots=True)
class Post:
    """One call of a rank: a batch of sends and receives, or a collective, on one communicator."""

    comm: str  # "world", or "g<k>:<ranks>" for the k-th group made
    kind: str  # "p2p", "all_gather", "all_reduce", "new_group"
    ops: tuple  # p2p: ((op, peer, nbytes), ...) with op "send" or "recv" and a global peer; else ((what, nbytes),)

    def __str__(self) -> str:
        if self.kind == "p2p":
            moves = ", ".join(f"{op} {'to' if op == 'send' else 'from'} {peer} {n} B" for op, peer, n in self.ops)
            return f"{self.comm} p2p [{moves}]"
        return f"{self.comm} {self.kind} {self.ops[0][0]} {self.ops[0][1]} B"


@dataclass
class PostLog:
    """One rank's posts, in program order; names the groups it made (the k-th made on every rank is the same)."""

    rank: int
    posts: list[Post] = field(default_factory=list)
    names: dict[int, str] = field(default_factory=dict)  # id(process group) -> its name
    made: int = 0

    def name(self, group) -> str:
        return WORLD if group is None else self.names.get(id(group), WORLD)

    def add_group(self, ranks, group) -> None:
        ranks = tuple(int(r) for r in ranks)
        self.posts.append(Post(WORLD, "new_group", (("-".join(map(str, ranks)), 0),)))
        if group is not None and not isinstance(group, int) and group is not dist.GroupMember.NON_GROUP_MEMBER:
            self.names[id(group)] = f"g{self.made}:{'-'.join(map(str, ranks))}"
        self.made += 1

    def add_batch(self, ops) -> None:
        by_comm: dict[str, list] = defaultdict(list)
        for op in ops:
            kind = "send" if op.op in (dist.isend, getattr(dist, "send", None)) else "recv"
            by_comm[self.name(op.group)].append((kind, int(op.peer), op.tensor.numel() * op.tensor.element_size()))
        for comm, entries in by_comm.items():
            self.posts.append(Post(comm, "p2p", tuple(entries)))

    def add_collective(self, what: str, group, nbytes: int) -> None:
        self.posts.append(Post(self.name(group), what, ((what, nbytes),)))


# -- recording a real rank ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def recording(log: PostLog):
    """Record every group made, batch posted and collective entered through torch.distributed while inside."""
    real = {name: getattr(dist, name) for name in ("new_group", "batch_isend_irecv", "all_gather", "all_reduce")}

    def new_group(ranks=None, *args, **kwargs):
        group = real["new_group"](ranks, *args, **kwargs)
        log.add_group(ranks, group)
        return group

    def batch_isend_irecv(ops):
        log.add_batch(ops)
        return real["batch_isend_irecv"](ops)

    def all_gather(parts, tensor, group=None, async_op=False):
        log.add_collective("all_gather", group, tensor.numel() * tensor.element_size())
        return real["all_gather"](parts, tensor, group=group, async_op=async_op)

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        log.add_collective("all_reduce", group, tensor.numel() * tensor.element_size())
        return real["all_reduce"](tensor, op=op, group=group, async_op=async_op)

    patched = {"new_group": new_group, "batch_isend_irecv": batch_isend_irecv, "all_gather": all_gather,
               "all_reduce": all_reduce}  # fmt: skip
    try:
        for name, fn in patched.items():
            setattr(dist, name, fn)
        yield log
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


# -- a one-process stand-in for a rank of a world ------------------------------------------------------------------
class _Group:
    def __init__(self, ranks) -> None:
        self.ranks = tuple(int(r) for r in ranks)


class _Done:
    """A work that has completed."""

    def wait(self, timeout=None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


@dataclass
class _Op:
    op: object
    tensor: torch.Tensor
    peer: int
    group: object = None


@contextlib.contextmanager
def simulated(world: int, rank: int, log: PostLog):
    """torch.distributed as rank ``rank`` of ``world`` sees it, in this one process: every call is recorded in
    ``log`` and completes at once; received buffers are zeroed."""
    top = _Group(range(world))

    def members(group) -> tuple[int, ...]:
        return top.ranks if group is None else group.ranks

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None, **_):
        group = _Group(ranks) if rank in ranks else dist.GroupMember.NON_GROUP_MEMBER
        log.add_group(ranks, group)
        return group

    def batch_isend_irecv(ops):
        log.add_batch(ops)
        for op in ops:
            if op.op is dist.irecv:
                op.tensor.zero_()
        return [_Done() for _ in ops]

    def all_gather(parts, tensor, group=None, async_op=False):
        log.add_collective("all_gather", group, tensor.numel() * tensor.element_size())
        for part in parts:
            part.zero_()
        return _Done()

    def all_reduce(tensor, op=None, group=None, async_op=False):
        log.add_collective("all_reduce", group, tensor.numel() * tensor.element_size())
        return _Done()

    fakes = {
        "is_initialized": lambda: True,
        "get_world_size": lambda group=None: len(members(group)),
        "get_rank": lambda group=None: members(group).index(rank),
        "get_global_rank": lambda group, group_rank: members(group)[group_rank],
        "get_backend": lambda group=None: "gloo",
        "new_group": new_group,
        "P2POp": _Op,
        "batch_isend_irecv": batch_isend_irecv,
        "all_gather": all_gather,
        "all_reduce": all_reduce,
    }
    c10d = dist.distributed_c10d
    saved = {name: getattr(dist, name) for name in fakes}
    saved_default = c10d._get_default_group
    try:
        for name, fn in fakes.items():
            setattr(dist, name, fn)
        c10d._get_default_group = lambda: top
        yield log
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        c10d._get_default_group = saved_default


# -- the check -------------------------------------------------------------------------------------------------------
class PostOrderError(AssertionError):
    """The ranks' posts do not match, or cannot all complete in any order."""


def _members(comm: str, world: int) -> tuple[int, ...]:
    return tuple(range(world)) if comm == WORLD else tuple(int(r) for r in comm.split(":", 1)[1].split("-"))


def check_posts(logs: list[list[Post]]) -> list[tuple[int, int]]:
    """Raise PostOrderError naming the first unmatched post, or the posts every rank is stuck at; else return one
    global order of every post, as (rank, index) pairs, in which they complete."""
    world = len(logs)
    counterparts: dict[tuple[int, int], set[tuple[int, int]]] = defaultdict(set)
    # p2p: the k-th send a -> b on a communicator meets the k-th receive at b from a on it.
    sends: dict[tuple, deque] = defaultdict(deque)
    recvs: dict[tuple, deque] = defaultdict(deque)
    collectives: dict[tuple[str, int], list] = defaultdict(list)  # (comm, rank) -> [(index, post)]
    for rank, posts in enumerate(logs):
        for index, post in enumerate(posts):
            if post.kind == "p2p":
                for op, peer, nbytes in post.ops:
                    key = (post.comm, rank, peer) if op == "send" else (post.comm, peer, rank)
                    (sends if op == "send" else recvs)[key].append((rank, index, nbytes, post))
            else:
                collectives[(post.comm, rank)].append((index, post))
    for key in sorted(set(sends) | set(recvs)):
        comm, src, dst = key
        out, into = sends[key], recvs[key]
        for k in range(max(len(out), len(into))):
            if k >= len(out) or k >= len(into):
                side, (rank, index, nbytes, post) = ("send", out[k]) if k < len(out) else ("receive", into[k])
                other = "receive at" if side == "send" else "send from"
                raise PostOrderError(
                    f"{comm}: the {_nth(k)} {side} {src} -> {dst} ({nbytes} B; rank {rank}'s post "
                    f"{index}: {post}) has no matching {other} rank {dst if side == 'send' else src}"
                )
            (a, i, n_out, p_out), (b, j, n_in, p_in) = out[k], into[k]
            if n_out != n_in:
                raise PostOrderError(
                    f"{comm}: the {_nth(k)} transfer {src} -> {dst} sends {n_out} B (rank {a}'s post "
                    f"{i}: {p_out}) into {n_in} B (rank {b}'s post {j}: {p_in})"
                )
            counterparts[(a, i)].add((b, j))
            counterparts[(b, j)].add((a, i))
    for comm in sorted({c for c, _ in collectives}):
        members = _members(comm, world)
        sequences = {r: collectives.get((comm, r), []) for r in members}
        lengths = {r: len(s) for r, s in sequences.items()}
        for k in range(min(lengths.values())):
            entered = {r: sequences[r][k] for r in members}
            kinds = {str(post) for _, post in entered.values()}
            if len(kinds) > 1:
                raise PostOrderError(
                    f"{comm}: the {_nth(k)} collective differs between ranks: "
                    + "; ".join(f"rank {r} {post}" for r, (_, post) in entered.items())
                )
            for r, (index, _) in entered.items():
                counterparts[(r, index)] |= {(s, i) for s, (i, _) in entered.items() if s != r}
        if len(set(lengths.values())) > 1:
            raise PostOrderError(f"{comm}: its members enter different numbers of collectives: {lengths}")
    return _run_in_order(logs, counterparts)


def _run_in_order(logs, counterparts) -> list[tuple[int, int]]:
    heads = [0] * len(logs)
    order: list[tuple[int, int]] = []
    while True:
        progressed = False
        for rank, posts in enumerate(logs):
            if heads[rank] >= len(posts):
                continue
            closure, todo = set(), [(rank, heads[rank])]
            while todo:
                node = todo.pop()
                if node in closure:
                    continue
                closure.add(node)
                todo += counterparts.get(node, ())
            if all(heads[r] == i for r, i in closure):
                for r, i in sorted(closure):
                    heads[r] += 1
                    order.append((r, i))
                progressed = True
        if all(heads[r] >= len(posts) for r, posts in enumerate(logs)):
            return order
        if not progressed:
            stuck = "; ".join(f"rank {r} at post {heads[r]}: {logs[r][heads[r]]}" for r in range(len(logs))
                              if heads[r] < len(logs[r]))  # fmt: skip
            raise PostOrderError(
                f"the posts cannot all complete (each waits for a peer that waits for something else): {stuck}"
            )


def _nth(k: int) -> str:
    return f"{k + 1}{'st' if k == 0 else 'nd' if k == 1 else 'rd' if k == 2 else 'th'}"


# -- running cases ---------------------------------------------------------------------------------------------------
class NoArithmetic(BlockKernel):
    """A block kernel that computes nothing (zeros): what is posted never depends on the values."""

    name = "no-arithmetic"

    def forward(self, q, k, v, mask, scale):
        return torch.zeros_like(q), torch.zeros(q.shape[:-1], dtype=stats_dtype(q.dtype), device=q.device)

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


@dataclass(frozen=True, slots=True)
class Case:
    strategy: str
    mask: str
    buffer: str
    layout: str = "contiguous"
    docs: str = "none"


def run_case(case: Case, world: int, *, local: int = 4, head_dim: int = 1) -> None:
    """One forward and backward of ``case`` on this rank (B=1, H=world heads, ``local`` tokens, no arithmetic)."""
    from ringbench.engine.api import attention, build_context, close_context
    from ringbench.engine.spec import AttentionSpec

    q, k, v = (torch.zeros(1, world, local, head_dim, requires_grad=True) for _ in range(3))
    spec = AttentionSpec(strategy=case.strategy, mask=case.mask, layout=case.layout, buffer=case.buffer,
                         kernel=NoArithmetic(), docs=case.docs, groups="own")  # fmt: skip
    ctx = build_context(q, k, v, spec)
    try:
        out = attention(q, k, v, context=ctx)
        torch.autograd.grad(out, (q, k, v), torch.zeros_like(out))
    finally:
        close_context(ctx)


def simulated_posts(cases: list[Case], world: int, **shape) -> list[list[Post]]:
    """Every rank's posts for ``cases`` run one after another (as a sweep runs them), each rank in turn here."""
    from ringbench.engine import pgroups

    logs = []
    for rank in range(world):
        log = PostLog(rank)
        pgroups.forget()
        try:
            with simulated(world, rank, log):
                for case in cases:
                    run_case(case, world, **shape)
        finally:
            pgroups.forget()
        logs.append(log.posts)
    return logs


__all__ = [
    "Case",
    "NoArithmetic",
    "Post",
    "PostLog",
    "PostOrderError",
    "check_posts",
    "recording",
    "run_case",
    "simulated",
    "simulated_posts",
]
