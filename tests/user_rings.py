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
* ``annotate``: the compute inside ``record_function(COMPUTE_RANGE)`` (import it with ``--compute-pattern``
  to count the range as compute, or without: the SDPA op inside it is the compute found by default).

Faults (``fault_rank`` F, ``delay_ms`` d, every ring step):

* ``before_post``: rank F sleeps d before it posts each exchange (outside every op and range).
* ``after_compute``: rank F sleeps d after its compute, before it waits (outside every op and range).
* ``in_compute``: rank F sleeps d inside its compute (inside the annotated range when ``annotate``).
* ``link_thread``: hop F -> F+1 is slow: F's sends are posted by a helper thread d after the exchange (the main
  thread posts its receives, computes, waits, and joins the helper).
* ``link_post``: hop F -> F+1 is slow: F posts its receives, then its sends d later (a delayed post on one hop).

Every program measures itself: ``step_ms`` is its own wall time per timed iteration (on each rank the median of
its iterations' durations, robust to the odd iteration a busy machine stretches; the slowest rank's; host clock,
the profiler's export excluded), so a verdict's cost can be checked against what the fault really added (the same
program without the fault). ``run_programs`` runs many programs in one launch of the ranks (the
spawn costs seconds; each program costs a few tenths).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

FAULTS = ("none", "before_post", "after_compute", "in_compute", "link_thread", "link_post")
RANK_FAULTS = ("before_post", "after_compute", "in_compute")
LINK_FAULTS = ("link_thread", "link_post")
BARRIERS = ("end", "start", "none")
APIS = ("isend", "batch")
COMPUTE_RANGE = "user_attn_block"
SHAPE = (1, 1, 16, 16)  # (B, H, S_local, D): a microsecond of real SDPA; the sleep models the rest


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
    block_ms: float = 4.0
    iters: int = 6

    def __post_init__(self) -> None:
        checks = (
            ("fault", self.fault in FAULTS, f"one of {', '.join(FAULTS)}"),
            ("barrier", self.barrier in BARRIERS, f"one of {', '.join(BARRIERS)}"),
            ("api", self.api in APIS, f"one of {', '.join(APIS)}"),
            ("kv_messages", self.kv_messages in (1, 2), "1 or 2"),
            ("iters", self.iters >= 1, ">= 1"),
            ("fault_rank", self.fault == "none" or self.fault_rank >= 0, ">= 0 with a fault"),
        )
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {allowed}")

    @property
    def culprit(self) -> tuple[str, object]:
        """What a right verdict names: ("compute", rank), ("link", [src, dst]) or (None, None)."""
        if self.fault in RANK_FAULTS:
            return "compute", self.fault_rank
        if self.fault in LINK_FAULTS:
            return "link", [self.fault_rank, None]  # the destination depends on the world
        return None, None


def _sleep(ms: float) -> None:
    if ms > 0:
        time.sleep(ms / 1e3)


def _post(dist, api: str, sends, recvs, succ: int, pred: int) -> list:
    """Post ``recvs`` (from pred) and ``sends`` (to succ): irecv / isend per message, or one batch."""
    if api == "batch":
        ops = [dist.P2POp(dist.irecv, t, pred) for t in recvs] + [dist.P2POp(dist.isend, t, succ) for t in sends]
        return list(dist.batch_isend_irecv(ops)) if ops else []
    return [dist.irecv(t, pred) for t in recvs] + [dist.isend(t, succ) for t in sends]


def _run_one(program: UserRing, rank: int, world: int, folder: Path) -> float:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from ringbench.markers import EMULATED_MARKER

    generator = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(SHAPE, generator=generator) for _ in range(3))
    succ, pred = (rank + 1) % world, (rank - 1) % world
    faulty = rank == program.fault_rank
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
                scope = record_function(COMPUTE_RANGE) if program.annotate else contextlib.nullcontext()
                with scope:
                    F.scaled_dot_product_attention(q, in_hand[0], in_hand[1])  # (B, H, S_local, D)
                    with record_function(f"{EMULATED_MARKER} pad"):
                        _sleep(program.block_ms)
                    if faulty and program.fault == "in_compute":
                        _sleep(program.delay_ms)
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
    durations = sorted(end - start for start, end in zip(starts[1:], ends, strict=True))
    return durations[len(durations) // 2] * 1e3


def _worker(worker_ctx, programs: list[dict], root: str) -> dict[str, float]:
    rank, world = worker_ctx.env.rank, worker_ctx.env.world
    out = {}
    for fields in programs:
        program = UserRing(**fields)
        out[program.name] = _run_one(program, rank, world, Path(root) / program.name)
    return out


def run_programs(programs: list[UserRing], root: Path, world: int, timeout_s: float = 300.0) -> dict[str, float]:
    """Run ``programs`` one after the other on one launch of ``world`` local gloo ranks; each writes its traces to
    ``root/<name>/rank<R>.json``. Returns each program's own step time (ms per iteration, the slowest rank's) and
    writes them, with the programs, to ``root/programs.json``."""
    from ringbench.run.launch import launch_local

    names = [p.name for p in programs]
    if len(set(names)) != len(names):
        raise ValueError("programs need distinct names")
    per_rank = launch_local(world, _worker, ([asdict(p) for p in programs], str(root)), timeout_s=timeout_s)
    measured = {name: max(result[name] for result in per_rank) for name in names}
    document = {"world": world, "programs": [asdict(p) | {"step_ms": measured[p.name]} for p in programs]}
    (Path(root) / "programs.json").write_text(json.dumps(document, indent=1))
    return measured


__all__ = ["APIS", "BARRIERS", "COMPUTE_RANGE", "FAULTS", "LINK_FAULTS", "RANK_FAULTS", "UserRing", "run_programs"]
