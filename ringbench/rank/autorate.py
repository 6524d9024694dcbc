"""``emulated:auto``: the highest emulated rate this machine can honour for a case, and the floor its small calls need.

An emulated block takes max(real arithmetic, modelled time); when the real arithmetic shows through (a *saturated*
block) every figure built on the model degrades. ``auto`` measures, before timing, the real arithmetic of each
kernel call this rank will make -- on the case's shapes, step by step with every rank computing the same ring step at
once (a barrier per step), so the contention of ranks per core is in the measurement. A call's modelled time is
honoured when it leaves MARGIN x the arithmetic, with room on a CPU for the scheduler:

    need(call) = MARGIN real(call) + SLACK,     modelled(call) = max(flops(call) / R, FLOOR) >= need(call)

real(call) is the 2nd fastest of ROUNDS timings: the arithmetic with the contention every round had, without the
rounds where the rank also waited for a core. That wait is what SLACK covers on a CPU: with more ranks than cores a
rank is preempted now and then for a scheduler time slice or two (measured here: 1 to 4 ms, most under 2 ms), and a
call modelled shorter than that would show the wait as saturation. On a GPU the call's arithmetic is queued on its
stream and nothing preempts it, so SLACK is 0 there.

Why a floor. SLACK is a fixed time per call, so a call with almost no arithmetic (a document one token long: a
1 x 1 block, 64 FLOP) honoured by the rate alone would need R <= 64 FLOP / 2 ms, and the pack's large calls would then
be modelled at minutes each (the ring stalls past its timeout). So the rate comes from the calls that carry the work
-- those of at least WORK_ENTRIES score entries, or of a WORK_SPREAD-th of the largest call of the ring when no call
is that large -- and every other call that rate cannot honour gets the FLOOR: the largest need among them. Each call
is then honoured (by the rate or by the floor), no call is modelled longer than the work calls allow, and a ring of
calls that are all alike keeps FLOOR = 0 (the rate alone, as before the floor).

R is the minimum over ranks of each rank's rate (all ranks must model the same machine), rounded down to two
significant digits; FLOOR the maximum over ranks, rounded up to a tenth of a millisecond. Both are printed and
recorded in meta.json (``emulated_auto_gflops``, ``emulated_auto_floor_ms``) and the rate in the case rows; the
case id keeps ``emulated:auto``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from ringbench.engine.bands import CALL_ENTRIES
from ringbench.kernels.base import block_flops
from ringbench.kernels.torch_sdpa import TorchSdpaKernel

MARGIN = 3.0  # real arithmetic stays under 1/MARGIN of the modelled time
CPU_SLACK_S = 2e-3  # room for a scheduler preemption on a CPU (none on a GPU): see the module docstring
ROUNDS = 7  # timings per call, each round in step with the other ranks
QUANTILE_INDEX = 1  # the 2nd fastest of 7: the contention every round had, not a round's wait for a core
WORK_ENTRIES = CALL_ENTRIES  # a call of a 128 x 128 tile carries work (the mask plan's cost of one call)
WORK_SPREAD = 4.0  # with no such call: calls within 4x of the ring's largest carry the work


@dataclass(frozen=True, slots=True)
class CallNeed:
    """One kernel call of this rank's ring, as measured."""

    flops: float
    entries: float
    """Score entries the kernel computes (a CAUSAL block counts half)."""
    need_s: float
    """MARGIN x its arithmetic + SLACK: the shortest modelled time this machine honours for it."""


@dataclass(frozen=True, slots=True)
class AutoModel:
    """What ``emulated:auto`` runs at: a rate, and the least time any call takes (0: none)."""

    gflops: float
    floor_ms: float = 0.0

    @staticmethod
    def combine(models: list[AutoModel]) -> AutoModel | None:
        """One model for several calibrations (cases, worlds): the lowest rate and the highest floor honour every
        call of each (a lower rate only lengthens the calls a floor was needed for)."""
        if not models:
            return None
        return AutoModel(min(m.gflops for m in models), max(m.floor_ms for m in models))


def _device_time(device: torch.device, call) -> float:
    """Seconds ``call()`` takes on ``device`` (synchronises: calibration runs before any timed iteration)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _ring_calls(ctx, q, k, v, backward: bool) -> list[list[tuple[float, float, object]]]:
    """Per ring step: (flops, entries, call) of each of this rank's kernel calls, forward then backward."""
    kernel = TorchSdpaKernel()  # the emulated kernel's own arithmetic
    batch, heads, _, head_dim = q.shape
    out = torch.zeros_like(q)
    lse = torch.zeros(q.shape[:-1], dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    steps = []
    for step in range(ctx.world):
        calls = []
        for block in ctx.plan(ctx.owner_at(step)).blocks:
            rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
            args = (q[:, :, rows], k[:, :, cols], v[:, :, cols])
            shape = (block.q_hi - block.q_lo, block.k_hi - block.k_lo, head_dim, block.mask.work_fraction)
            entries = block.work_pairs()
            calls.append((block_flops(batch, heads, *shape, False), entries,
                          lambda a=args, b=block: kernel.forward(*a, b.mask, ctx.scale)))  # fmt: skip
            if backward:
                back = (out[:, :, rows], *args, out[:, :, rows], lse[:, :, rows])
                calls.append((block_flops(batch, heads, *shape, True), entries,
                              lambda a=back, b=block: kernel.backward(*a, b.mask, ctx.scale)))  # fmt: skip
        steps.append(calls)
    return steps


def rank_needs(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool,
               barrier=None) -> list[CallNeed]:  # fmt: skip
    """Every kernel call of this rank's ring with the modelled time it needs.

    Each of ROUNDS rounds walks the ring's steps as the run does: ``barrier()`` (every rank's), then this rank's
    calls of that step, each timed. All ranks compute step s at the same moment, so every timing carries the
    contention the timed run will see at that step (ranks with less work wait at the next barrier, as in a ring).
    """
    steps = _ring_calls(ctx, q, k, v, backward)
    for calls in steps:  # warm-up (allocations, first-call costs)
        for *_, call in calls:
            call()
    seconds = [[[] for _ in calls] for calls in steps]
    for _ in range(ROUNDS):
        for step, calls in enumerate(steps):
            if barrier is not None:
                barrier()
            for index, (*_, call) in enumerate(calls):
                seconds[step][index].append(_device_time(q.device, call))
    slack_s = 0.0 if q.device.type == "cuda" else CPU_SLACK_S
    needs = []
    for step, calls in enumerate(steps):
        for (flops, entries, _), timings in zip(calls, seconds[step], strict=True):
            real_s = max(sorted(timings)[QUANTILE_INDEX], 1e-7)
            needs.append(CallNeed(flops=flops, entries=entries, need_s=MARGIN * real_s + slack_s))
    return needs


def work_entries(largest_entries: float) -> float:
    """The size from which a call carries work (sets the rate), given the largest call of the whole ring."""
    return min(WORK_ENTRIES, largest_entries / WORK_SPREAD)


def rank_rate(needs: list[CallNeed], work: float = 0.0) -> float:
    """The highest rate (GFLOP/s) that honours every call of at least ``work`` entries (inf when there is none)."""
    bounds = [n.flops / n.need_s / 1e9 for n in needs if n.entries >= work and n.flops > 0]
    return min(bounds, default=math.inf)


def floor_ms(needs: list[CallNeed], gflops: float) -> float:
    """The least modelled time (ms) that honours every call ``gflops`` does not (0 when it honours them all)."""
    short = [n.need_s for n in needs if n.flops / (gflops * 1e9) < n.need_s]
    return 1e3 * max(short, default=0.0)


def round_down(rate: float) -> float:
    """Two significant digits, rounded down (never above what was measured)."""
    if not math.isfinite(rate) or rate <= 0:
        return rate
    scale = 10 ** (math.floor(math.log10(rate)) - 1)
    return math.floor(rate / scale) * scale


def round_up_ms(ms: float) -> float:
    """A tenth of a millisecond, rounded up (never below what was measured)."""
    return math.ceil(round(ms * 10, 6)) / 10 if ms > 0 else 0.0


def agree(needs: list[CallNeed], ops) -> AutoModel:
    """The one model of every rank: the largest call of the ring, the lowest work rate, the highest floor
    (``ops``: the group's collectives; three reductions, every rank calls it at the same point)."""
    largest = -ops.min_float(-max((n.entries for n in needs), default=0.0))
    gflops = round_down(ops.min_float(rank_rate(needs, work_entries(largest))))
    floor = -ops.min_float(-floor_ms(needs, gflops))
    return AutoModel(gflops, round_up_ms(floor))


def measure_rate(session, cases, settings) -> AutoModel | None:
    """``emulated:auto``'s one model for these cases (None without such a case): the lowest rate and the highest
    floor any of them needs (AutoModel.combine).

    One model for a whole run, so that every case models the same machine and comparing two cases compares the
    ring, not two calibrations. Every rank measures its own calls of each case at once (contention included), on
    the ring of each distinct layer mask (the strategies run the ring's rate). Collective: every rank calls it.
    """
    from ringbench.engine.api import build_context, close_context
    from ringbench.engine.inputs import ShardSpec, rank_shards
    from ringbench.engine.layout import resolve_layout
    from ringbench.engine.spec import AttentionSpec, Runtime
    from ringbench.kernels import get_kernel
    from ringbench.rank.layer_checks import layer_rules

    models, seen = [], set()
    for case in cases:
        if not getattr(get_kernel(case.kernel), "auto", False) or case.impl != "ringbench":
            continue
        # Cases that differ only in buffer strategy (or anything else the calls do not depend on) make the same
        # calls: calibrated once.
        calls = (case.batch, case.heads, case.head_dim, case.seq, case.dtype, case.layout, case.mask,
                 tuple(case.ring), case.backward, case.docs, case.layers)  # fmt: skip
        if calls in seen:
            continue
        seen.add(calls)
        env = session.env
        rules = layer_rules(case)
        layout = resolve_layout(case.layout, case.seq, env.world, tuple(rules))
        shard = ShardSpec.of(case, seed=settings.seed, rank=env.rank, layout=layout)
        q, k, v, _ = rank_shards(shard, device=env.device)
        needs = []
        for rule in dict.fromkeys(rules):  # each distinct mask once, in layer order
            spec = AttentionSpec(mask=rule, layout=layout, buffer="sync", order=case.ring, kernel="torch")
            ctx = build_context(q, k, v, spec, Runtime(timeout_s=settings.timeout, timeline=session.timeline))
            try:
                session.ops.barrier()
                with torch.no_grad():
                    needs += rank_needs(ctx, q, k, v, case.backward, barrier=session.ops.barrier)
            finally:
                close_context(ctx)
        models.append(agree(needs, session.ops))
    return AutoModel.combine(models)


PACING_SHARE = 0.5  # one ring step's modelled compute may take at most this share of the distributed timeout


def check_pacing(kernel, contexts, q: torch.Tensor, timeout_s: float, backward: bool) -> None:
    """Refuse (one line, exit 2) an emulated kernel whose modelled ring step would outlast half the timeout.

    A peer waits for this rank's next block while it computes a step; a modelled step near the timeout would be
    reported as a stall far from its cause (a rate pinned too low, or a model that collapsed). Any emulated kernel,
    on the ring contexts whose plan the calls follow (a strategy's contexts plan differently: not checked here).
    """
    from ringbench.errors import bad_value

    seconds = getattr(kernel, "flops_seconds", None)
    if seconds is None:
        return
    batch, heads, _, head_dim = q.shape
    for ctx in contexts:
        if not hasattr(ctx, "owner_at"):
            continue
        for step in range(ctx.world):
            blocks = ctx.plan(ctx.owner_at(step)).blocks
            for phase in ("fwd", "bwd") if backward else ("fwd",):
                flops = [block_flops(batch, heads, b.q_hi - b.q_lo, b.k_hi - b.k_lo, head_dim, b.mask.work_fraction,
                                     phase == "bwd") for b in blocks]  # fmt: skip
                step_s = sum(seconds(f) for f in flops)
                if step_s > PACING_SHARE * timeout_s:
                    floor = f" (calls at least {kernel.floor_s * 1e3:g} ms)" if getattr(kernel, "floor_s", 0) else ""
                    raise bad_value("kernel", getattr(kernel, "name", "emulated"),
                                    f"a rate at which one ring step's modelled compute fits in half of --timeout "
                                    f"({timeout_s:g} s): at {kernel.gflops:g} GFLOP/s{floor} rank {ctx.rank}'s "
                                    f"{phase} step {step} would take {step_s:.3g} s; pin a higher emulated:GFLOPS "
                                    f"or raise --timeout")  # fmt: skip
