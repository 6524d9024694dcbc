"""A generator of ring-attention programs written the way users write them, profiled the way users profile them.

Each ``UserRing`` is one small program: plain ``torch.distributed`` over gloo on 127.0.0.1, a ring loop of
``world`` steps per iteration (post the exchange, compute on the block in hand, wait, swap), profiled with
``torch.profiler`` (a schedule, so iterations are ``ProfilerStep#N``), one Chrome trace per rank. The attention
is modelled: a tiny real SDPA call (the attention op a user's ring would show) and a sleep of ``block_ms`` standing
for its arithmetic, in a ``ringbench:emulated pad`` range (the marker of a modelled kernel: the import counts it as
compute, labels the record EMULATED and knows the cores were free), so the cores stay free and the timings mean
something on 2 cores. The faults are bare sleeps: time the profiler sees in no op, as a user's unprofiled code.

Variants (what users write):

* ``kv_messages`` 1: K and V stacked into one message; 2: K and V sent separately (two sends, two receives).
* ``api`` ``isend``: ``dist.irecv`` / ``dist.isend`` per message; ``batch``: ``dist.batch_isend_irecv``.
* ``barrier`` ``end``: a ``dist.barrier()`` after each iteration's ring loop; ``start``: before it; ``none``.
* ``annotate``: the compute inside ``record_function(range_name)`` (COMPUTE_RANGE unless named otherwise): the
  import finds it between each post and its wait, or ``--compute-pattern`` names it.
* ``compute`` ``emulated``: the modelled block above; ``matmul``: real arithmetic, the way a user without SDPA
  writes it (scores = q @ k^T, softmax, @ v, on blocks of ``block_size`` tokens), with no attention op and no
  emulated marker (on 2 cores: judgeable with one rank per core, 2 ranks).

Faults (``fault_rank`` F, ``delay_ms`` d, every ring step):

* ``before_post``: rank F sleeps d before it posts each exchange (outside every op and range).
* ``after_compute``: rank F sleeps d after its compute, before it waits (outside every op and range).
* ``in_compute``: rank F sleeps d inside its compute (inside the annotated range when ``annotate``).
* ``link_thread``: hop F -> F+1 is slow: F's sends are posted by a helper thread d after the exchange (the main
  thread posts its receives, computes, waits, and joins the helper).
* ``link_post``: hop F -> F+1 is slow: F posts its receives, then its sends d later (a delayed post on one hop:
  a send held back by the rank's own code).
* ``twice``: rank F computes every block twice (real work with ``matmul``; with ``emulated``, its pad twice).
* ``two_slow``: ranks F and F+2 (mod world) both sleep d inside their compute.
* ``jitter``: every rank sleeps a random 0..d (seeded per rank, iteration and step) inside its compute: noise, no
  culprit.
* ``causal``: causal attention over a contiguous layout, no other fault: rank r holds the block of rank r - s at
  step s, which is visible only while s <= r (the diagonal block, s = 0, half of it): rank r computes r + 1 of the
  world's blocks, the last rank all of them. Imbalance of the work, not slowness of a rank.
* ``balanced``: the same work as ``causal`` spread evenly (every rank computes half of every block, as a zigzag
  layout would): what removing the imbalance leaves.

Every program measures itself: ``step_ms`` is its own wall time per timed iteration (on each rank the median of
its iterations' durations, robust to the odd iteration a busy machine stretches; the slowest rank's; host clock,
the profiler's export excluded), so a verdict's cost can be checked against what the fault really added (the same
program without the fault); ``programs.json`` also keeps each timed iteration's time (the slowest rank's), for
spreads. ``run_programs`` runs many programs in one launch of the ranks (the
spawn costs seconds; each program costs a few tenths).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

FAULTS = (
    "none",
    "before_post",
    "after_compute",
    "in_compute",
    "link_thread",
    "link_post",
    "twice",
    "two_slow",
    "jitter",
    "causal",
    "balanced",
)
RANK_FAULTS = ("before_post", "after_compute", "in_compute", "twice")
NO_CULPRIT = ("none", "jitter", "causal", "balanced")  # faults whose right verdict names nobody
COMPUTES = ("emulated", "matmul")
LINK_FAULTS = ("link_thread", "link_post")
BARRIERS = ("end", "start", "none")
APIS = ("isend", "batch")
COMPUTE_RANGE = "user_attn_block"
SHAPE = (1, 1, 16, 16)  # (B, H, S_local, D): a microsecond of real SDPA; the sleep models the rest
MATMUL_HEADS, MATMUL_HEAD_DIM = 4, 64


@dataclass(frozen=True, kw_only=True, slots=True)
class UserRing:
    """One user program (see the module doc for each field's variants)."""

    name: str
    fault: str = "none"
    fault_rank: int = -1  # the slow rank, or the sending end of the slow hop
    delay_ms: float = 0.0
    barrier: str = "end"
    kv_messages: int = 1
    api: str = "isend"
    annotate: bool = True
    range_name: str = COMPUTE_RANGE
    compute: str = "emulated"
    block_ms: float = 4.0
    block_size: int = 256  # tokens per block of the ``matmul`` compute (heads 4, head_dim 64)
    iters: int = 6
    seed: int = 0

    def __post_init__(self) -> None:
        checks = (
            ("fault", self.fault in FAULTS, f"one of {', '.join(FAULTS)}"),
            ("barrier", self.barrier in BARRIERS, f"one of {', '.join(BARRIERS)}"),
            ("api", self.api in APIS, f"one of {', '.join(APIS)}"),
            ("compute", self.compute in COMPUTES, f"one of {', '.join(COMPUTES)}"),
            ("kv_messages", self.kv_messages in (1, 2), "1 or 2"),
            ("iters", self.iters >= 1, ">= 1"),
            ("fault_rank", self.fault in NO_CULPRIT or self.fault_rank >= 0, ">= 0 with a fault"),
        )
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {allowed}")

    @property
    def culprit(self) -> tuple[str, object]:
        """What a right verdict names: ("compute", rank), ("compute", [ranks]) for two slow ranks, ("link", [src,
        None]) or (None, None)."""
        if self.fault in RANK_FAULTS:
            return "compute", self.fault_rank
        if self.fault == "two_slow":
            return "compute", [self.fault_rank, None]  # the second depends on the world: slow_ranks(world)
        if self.fault in LINK_FAULTS:
            return "link", [self.fault_rank, None]  # the destination depends on the world
        return None, None

    def slow_ranks(self, world: int) -> list[int]:
        """The ranks this program's fault slows (empty for link faults and faults with no culprit)."""
        if self.fault in RANK_FAULTS:
            return [self.fault_rank]
        if self.fault == "two_slow":
            return sorted({self.fault_rank, (self.fault_rank + 2) % world})
        return []


def _sleep(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1e3)


def _post(dist, api: str, sends, recvs, succ: int, pred: int) -> list:
    """Post ``recvs`` (from pred) and ``sends`` (to succ): irecv / isend per message, or one batch."""
    if api == "batch":
        ops = [dist.P2POp(dist.irecv, t, pred) for t in recvs] + [dist.P2POp(dist.isend, t, succ) for t in sends]
        return list(dist.batch_isend_irecv(ops)) if ops else []
    return [dist.irecv(t, pred) for t in recvs] + [dist.isend(t, succ) for t in sends]


def _visible_share(program: UserRing, rank: int, step: int) -> float:
    """The share of the block in hand that is computed: all of it, or with ``causal`` (contiguous layout) the
    visible part of block rank - step: whole below the diagonal, half on it, none above."""
    if program.fault == "balanced":
        return 0.5
    if program.fault != "causal":
        return 1.0
    return 0.5 if step == 0 else (1.0 if step <= rank else 0.0)


def _block(program: UserRing, q, in_hand, share: float, F, record_function, marker: str) -> None:
    """One block's attention: a tiny SDPA and a modelled pad (``emulated``), or real matmuls (``matmul``)."""
    import torch

    if program.compute == "emulated":
        F.scaled_dot_product_attention(q, in_hand[0], in_hand[1])  # (B, H, S_local, D)
        with record_function(f"{marker} pad"):
            _sleep(program.block_ms * share)
        return
    keys = max(1, int(in_hand.shape[-2] * share))
    k, v = in_hand[0][..., :keys, :], in_hand[1][..., :keys, :]  # (B, H, keys, D)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, S_local, keys)
    torch.matmul(torch.softmax(scores, dim=-1), v)  # (B, H, S_local, D)


def _run_one(program: UserRing, rank: int, world: int, folder: Path) -> list[float]:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from ringbench.markers import EMULATED_MARKER

    generator = torch.Generator().manual_seed(rank)
    shape = SHAPE if program.compute == "emulated" else (1, MATMUL_HEADS, program.block_size, MATMUL_HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    succ, pred = (rank + 1) % world, (rank - 1) % world
    faulty = rank in program.slow_ranks(world) or (program.fault in LINK_FAULTS and rank == program.fault_rank)
    jitter = random.Random(f"{program.seed}-{rank}")
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / f"rank{rank}.json")
    plan = schedule(wait=0, warmup=1, active=program.iters, repeat=1)
    starts, stop = [], 0.0
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, schedule=plan,
                 on_trace_ready=lambda done: done.export_chrome_trace(path)) as prof:  # fmt: skip
        for iteration in range(program.iters + 1):
            starts.append(time.perf_counter())
            if program.barrier == "start":
                dist.barrier()
            blocks = [torch.stack([k, v])] if program.kv_messages == 1 else [k.clone(), v.clone()]
            for step in range(world):
                pending, helper, incoming = [], None, []
                if step < world - 1:
                    if faulty and program.fault == "before_post":
                        _sleep(program.delay_ms)
                    incoming = [torch.empty_like(b) for b in blocks]
                    if faulty and program.fault == "link_post":
                        pending = _post(dist, program.api, [], incoming, succ, pred)
                        _sleep(program.delay_ms)
                        pending += _post(dist, program.api, blocks, [], succ, pred)
                    elif faulty and program.fault == "link_thread":
                        pending = _post(dist, program.api, [], incoming, succ, pred)

                        def late_send(blocks=blocks):
                            _sleep(program.delay_ms)
                            for request in _post(dist, program.api, blocks, [], succ, pred):
                                request.wait()

                        helper = threading.Thread(target=late_send)
                        helper.start()
                    else:
                        pending = _post(dist, program.api, blocks, incoming, succ, pred)
                in_hand = blocks[0] if program.kv_messages == 1 else torch.stack(blocks)
                share = _visible_share(program, rank, step)
                scope = record_function(program.range_name) if program.annotate else contextlib.nullcontext()
                with scope:
                    for _ in range(2 if faulty and program.fault == "twice" else 1):
                        if share > 0:
                            _block(program, q, in_hand, share, F, record_function, EMULATED_MARKER)
                    if faulty and program.fault in ("in_compute", "two_slow"):
                        _sleep(program.delay_ms)
                    if program.fault == "jitter":
                        _sleep(jitter.uniform(0.0, program.delay_ms))
                if faulty and program.fault == "after_compute":
                    _sleep(program.delay_ms)
                for request in pending:
                    request.wait()
                if helper is not None:
                    helper.join()
                if incoming:
                    blocks = incoming
            if program.barrier == "end":
                dist.barrier()
            if iteration == program.iters:
                stop = time.perf_counter()  # before the last step(): it exports the trace
            prof.step()
    dist.barrier()
    ends = [*starts[2:], stop]  # iteration i runs from its start to the next one's (the last: to ``stop``)
    return [(end - start) * 1e3 for start, end in zip(starts[1:], ends, strict=True)]  # ms, timed iterations


def _worker(worker_ctx, programs: list[dict], root: str) -> dict[str, list[float]]:
    rank, world = worker_ctx.env.rank, worker_ctx.env.world
    out = {}
    for fields in programs:
        program = UserRing(**fields)
        out[program.name] = _run_one(program, rank, world, Path(root) / program.name)
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def run_programs(programs: list[UserRing], root: Path, world: int, timeout_s: float = 300.0) -> dict[str, float]:
    """Run ``programs`` one after the other on one launch of ``world`` local gloo ranks; each writes its traces to
    ``root/<name>/rank<R>.json``. Returns each program's own step time (ms per iteration, the slowest rank's) and
    writes them, with the programs, to ``root/programs.json``."""
    from ringbench.run.launch import launch_local

    names = [p.name for p in programs]
    if len(set(names)) != len(names):
        raise ValueError("programs need distinct names")
    per_rank = launch_local(world, _worker, ([asdict(p) for p in programs], str(root)), timeout_s=timeout_s)
    measured = {name: max(_median(result[name]) for result in per_rank) for name in names}
    # Per timed iteration, the slowest rank's time (the ranks run the iterations in step: a barrier or the ring).
    iteration_ms = {name: [max(times) for times in zip(*(result[name] for result in per_rank), strict=True)]
                    for name in names}  # fmt: skip
    document = {
        "world": world,
        "programs": [asdict(p) | {"step_ms": measured[p.name], "iteration_ms": iteration_ms[p.name]} for p in programs],
    }
    (Path(root) / "programs.json").write_text(json.dumps(document, indent=1))
    return measured


__all__ = [
    "APIS",
    "BARRIERS",
    "COMPUTES",
    "COMPUTE_RANGE",
    "FAULTS",
    "LINK_FAULTS",
    "NO_CULPRIT",
    "RANK_FAULTS",
    "UserRing",
    "run_programs",
]
