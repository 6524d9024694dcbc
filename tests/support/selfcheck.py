"""Exactness harness: every ring variant against float64 single-device attention, forward and backward.

Each rank builds the same full Q, K, V (same seed, small shapes), computes the float64 reference and its gradients,
runs the ring on its own shard and reports the largest absolute errors of its rows. The test suite drives it
(tests/test_ring_exact.py); from Python: ``run_selfcheck(world, all_cases(world))``. Tolerances per dtype are
ringbench.vocab.TOLERANCE (ringbench.vocab.tolerance: the backward's grows with a KV group), the same the runs are
checked against.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ringbench.engine.api import attention, build_context, close_context, reference_attention
from ringbench.engine.layout import shard
from ringbench.engine.masks import mask_rule
from ringbench.engine.spec import AttentionSpec, Runtime
from ringbench.fmt import ring_text
from ringbench.scenario.workload import Workload, reads_workload
from ringbench.vocab import tolerance


@reads_workload
@dataclass(frozen=True, kw_only=True, slots=True)
class CheckCase:
    """One exactness case: a small workload (it reads the workload's axes as its own) and the kernel."""

    workload: Workload
    kernel: str = "torch"

    @classmethod
    def of(cls, world: int, *, seq_per_rank: int = 8, kernel: str = "torch", **axes) -> CheckCase:
        """A case on ``world`` ranks of ``seq_per_rank`` tokens each; the other axes small unless given."""
        small = dict(heads=2, head_dim=8, batch=1, dtype="float64", mask="causal", layout="contiguous")
        return cls(workload=Workload(world=world, seq=seq_per_rank * world, **(small | axes)), kernel=kernel)

    @property
    def seq_per_rank(self) -> int:
        return self.seq // self.world

    @property
    def name(self) -> str:
        docs = f"/{self.docs}" if self.docs != "none" else ""
        shape = "" if self.seq_per_rank == 8 else f"/L{self.seq_per_rank}"
        shape += f"/h{self.heads}kv{self.key_value_heads}" if self.key_value_heads != self.heads else ""
        base = f"{self.mask}/{self.layout}/{self.buffer}/{self.order}/{self.dtype}/{self.kernel}{docs}{shape}"
        if self.strategy in ("ring", "allgather"):
            return base
        placement = self.placement or "heads-first"
        return f"{self.strategy}@{placement}/{base}/b{self.batch}h{self.heads}d{self.head_dim}l{self.seq_per_rank}"


def all_cases(world: int, dtypes=("float64", "float32"), kernels=("torch",), **shape) -> list[CheckCase]:
    orders = ["identity", "reverse", "random:7"]
    if world >= 4:
        orders.append("stride:2")  # below 4 ranks every stride order is the identity or the reverse ring
    if world >= 3:
        orders.append(ring_text([0, *range(2, world), 1]))  # an explicit ring
    combos = itertools.product(
        ("none", "causal", "causal-naive"),
        ("contiguous", "zigzag", "striped"),
        ("sync", "double", "allgather"),
        orders,
        dtypes,
        kernels,
    )
    return [
        CheckCase.of(world, mask=m, layout=lay, buffer=b, order=o, dtype=d, kernel=k, **shape)
        for m, lay, b, o, d, k in combos
    ]


def strategy_specs(world: int, degenerate: bool = False) -> list[str]:
    """The strategies whose degrees divide ``world``: ulysses, hybrid:U and double-ring:W for 1 < U, W < N (with
    ``degenerate``, also U, W = 1 and N: a ring, Ulysses, one inner ring)."""
    low, high = (1, world + 1) if degenerate else (2, world)
    divisors = [d for d in range(low, high) if world % d == 0]
    return ["ulysses", *(f"hybrid:{u}" for u in divisors), *(f"double-ring:{w}" for w in divisors)]


def strategy_cases(world: int, dtypes=("float64", "float32"), *, wide: bool = False, masks=None, layouts=None,
                   **shape) -> list[CheckCase]:  # fmt: skip
    """Every strategy of ``world`` (ringbench/engine/strategy.py) in every mask and layout, heads divisible by
    its Ulysses degree. The default set cycles placement (heads-first, interleaved), buffer and dtype over the
    mask x layout grid, so that each combination of them appears for each strategy; ``wide`` takes the whole
    product, adds a random placement and the degenerate degrees."""
    from ringbench.vocab import Strategy

    grid = list(itertools.product(masks or ("none", "causal", "causal-naive"),
                                  layouts or ("contiguous", "zigzag", "striped")))  # fmt: skip
    cases = []
    for spec in strategy_specs(world, degenerate=wide):
        strategy = Strategy.parse(spec)
        placements = ("heads-first", "interleaved", "random:5") if wide else ("heads-first", "interleaved")
        placements = placements if strategy.grouped else ("heads-first",)
        axes = (placements, strategy.buffers(), tuple(dtypes))
        if wide:
            combos = [(m, lay, *rest) for (m, lay) in grid for rest in itertools.product(*axes)]
        else:  # cell i takes the i-th combination of (placement, buffer, dtype), in mixed radix
            combos = []
            for i, (m, lay) in enumerate(grid):
                p, b, d = (len(a) for a in axes)
                combos.append((m, lay, axes[0][i % p], axes[1][(i // p) % b], axes[2][(i // (p * b)) % d]))
        heads = 2 * strategy.ulysses_degree(world)
        cases += [
            CheckCase.of(
                world, strategy=spec, placement=pl, mask=m, layout=lay, buffer=b, dtype=d, **({"heads": heads} | shape)
            )
            for m, lay, pl, b, d in combos
        ]
    return cases


MASK_BUFFERS = ("sync", "double", "allgather", "sync-short", "double-short")


def document_pack(seq: int, seed: int = 0) -> str:
    """A docs spec of random lengths filling ``seq``: documents shorter than a chunk, one spanning several ranks."""
    import random

    rng = random.Random(seed)
    lengths, total = [], 0
    while total < seq:
        length = rng.choice([1, 2, 3, 5, 7, 11]) if rng.random() < 0.8 else rng.randint(seq // 4, seq // 2)
        length = min(length, seq - total)
        lengths.append(length)
        total += length
    return "lengths:" + ",".join(map(str, lengths))


def mask_cases(world: int, *, full: bool = False, dtypes=("float64", "float32"), seq_per_rank: int = 8,
               kernels=("torch",)) -> list[CheckCase]:  # fmt: skip
    """Exactness cases of the document and window masks: every mask x layout x buffer (the short ring included)
    with ``full``; otherwise a covering set (every mask with every layout and every buffer at least once, orders
    and dtypes in turn). Windows shorter than a rank's block (1, 3), between, and longer than S; a random document
    pack with documents shorter than one chunk and one across ranks."""
    seq = seq_per_rank * world
    docs = document_pack(seq, seed=world)
    masks = ("causal-document", "full-document", "window:1", "window:3", f"window:{seq_per_rank + 2}",
             f"window:{2 * seq + 1}", "causal-document+window:5")  # fmt: skip
    orders = ["identity", "reverse", "random:5"] + ([ring_text([0, *range(2, world), 1])] if world >= 3 else [])
    orders = orders if world > 1 else ["identity"]  # one rank: every order is the same ring
    out = []
    for index, mask in enumerate(masks):
        documented = "document" in mask
        layouts = ["contiguous", "zigzag", "striped"] + (["doc-balanced"] if documented else [])
        shape = dict(seq_per_rank=seq_per_rank, docs=docs if documented else "none")
        if full:
            for lay, buf, order, dtype, kernel in itertools.product(layouts, MASK_BUFFERS, orders[:2], dtypes,
                                                                    kernels):  # fmt: skip
                out.append(CheckCase.of(world, mask=mask, layout=lay, buffer=buf, order=order, dtype=dtype,
                                        kernel=kernel, **shape))  # fmt: skip
            continue
        for n in range(max(len(layouts), len(MASK_BUFFERS))):
            out.append(CheckCase.of(world, mask=mask, layout=layouts[(n + index) % len(layouts)],
                                    buffer=MASK_BUFFERS[n % len(MASK_BUFFERS)], order=orders[(n + index) % len(orders)],
                                    dtype=dtypes[(n + index) % len(dtypes)], kernel=kernels[n % len(kernels)],
                                    **shape))  # fmt: skip
    return out


def check_case(case: CheckCase, rank: int = 0, group=None, device=None) -> tuple[float, float]:
    """(forward max abs error, backward max abs error) of this rank's rows for one case."""
    dtype = getattr(torch, case.dtype)
    device = device or torch.device("cpu")
    generator = torch.Generator().manual_seed(1234)
    world, seq = case.world, case.seq
    heads = (case.heads, case.key_value_heads, case.key_value_heads, case.heads)  # q, k, v, dO: K/V of KV heads
    full = [torch.randn(case.batch, h, seq, case.head_dim, generator=generator, dtype=torch.float64) for h in heads]
    q, k, v, grad = (t.to(dtype).to(torch.float64).to(device) for t in full)  # values exactly representable
    q_ref, k_ref, v_ref = (t.clone().requires_grad_() for t in (q, k, v))
    rule = mask_rule(case.mask, case.docs, seq)
    ref = reference_attention(q_ref, k_ref, v_ref, mask=rule)  # causal-naive computes the causal function
    ref_grads = torch.autograd.grad(ref, (q_ref, k_ref, v_ref), grad)

    def local(t: torch.Tensor) -> torch.Tensor:
        return shard(t, case.layout, world, rank, rule=rule)

    q_l, k_l, v_l = (local(t).to(dtype).requires_grad_() for t in (q, k, v))
    spec = AttentionSpec(strategy=case.strategy, placement=case.placement or "heads-first", mask=rule,
                         layout=case.layout, buffer=case.buffer, order=case.order, kernel=case.kernel)  # fmt: skip
    ctx = build_context(q_l, k_l, v_l, spec, Runtime(group=group))
    out = attention(q_l, k_l, v_l, context=ctx)
    grads = torch.autograd.grad(out, (q_l, k_l, v_l), local(grad).to(dtype))
    fwd_err = (out.double() - local(ref.detach())).abs().max().item()
    bwd_err = max((g.double() - local(r)).abs().max().item() for g, r in zip(grads, ref_grads, strict=True))
    close_context(ctx)
    return fwd_err, bwd_err


def exactness_worker(worker_ctx, cases: list[CheckCase]) -> dict[str, tuple[float, float]]:
    """Runs inside each launched rank: every case, this rank's errors."""
    env = worker_ctx.env
    errors = {}
    for index, case in enumerate(cases):
        worker_ctx.progress.set_case(index)
        errors[case.name] = check_case(case, env.rank, device=env.device)
    return errors


def run_selfcheck(world: int, cases: list[CheckCase], timeout_s: float = 60.0) -> dict[str, tuple[float, float]]:
    """Launch ``world`` local ranks; return the worst errors over ranks for each case."""
    from ringbench.errors import bad_value
    from ringbench.run.launch import launch_local

    for case in cases:
        if case.world != world:
            raise bad_value("world", case.world, f"{world} for every case of this check ({case.name})")
    if world == 1:
        return {case.name: check_case(case) for case in cases}
    per_rank = launch_local(world, exactness_worker, (cases,), timeout_s=timeout_s, case_names=[c.name for c in cases])
    return {name: (max(r[name][0] for r in per_rank), max(r[name][1] for r in per_rank)) for name in per_rank[0]}


def within_tolerance(case: CheckCase, errors: tuple[float, float]) -> bool:
    fwd_tol, bwd_tol = tolerance(case.dtype, case.heads // case.key_value_heads)
    return errors[0] <= fwd_tol and errors[1] <= bwd_tol


def gqa_cases(world: int, *, dtypes=("float64", "float32", "bfloat16"), wide: bool = False, seq_per_rank: int = 8,
              kernels=("torch",), **shape) -> list[CheckCase]:  # fmt: skip
    """Grouped-query attention (K, V of fewer heads than Q) in every strategy of ``world``: the ring (sync, double
    and the short ring), allgather, ulysses, hybrid:U and double-ring:W, with H four times the Ulysses degree U and
    KV heads H/2, H/4, 1 and U's largest proper divisor above 1 where it has one (fewer than U: the KV heads
    repeated across the Ulysses group; a U/2 that does not divide U is no GQA the strategy runs). Each strategy's
    KV counts cycle through dtypes, masks, layouts, buffers, placements and ``kernels``; ``wide`` takes
    every KV count x dtype. ``shape``: head_dim, batch."""
    from ringbench.vocab import Strategy

    seq = seq_per_rank * world
    cells = (("causal", "zigzag"), ("causal-naive", "striped"), ("none", "contiguous"), ("window:3", "contiguous"),
             ("causal-document", "doc-balanced"), ("full-document", "striped"))  # fmt: skip
    out, n = [], 0
    for spec in ("ring", "allgather", *strategy_specs(world)):
        strategy = Strategy.parse(spec)
        degree = strategy.ulysses_degree(world)
        heads = 4 * degree
        fewer = [d for d in range(degree - 1, 1, -1) if degree % d == 0][:1]  # KV heads repeated in the group
        kv_counts = sorted({heads // 2, heads // 4, 1, *fewer}, reverse=True)
        buffers = ("double", "sync", "double-short") if spec == "ring" else strategy.buffers()
        combos = (itertools.product(kv_counts, dtypes) if wide else
                  [(kv, dtypes[(i + world) % len(dtypes)]) for i, kv in enumerate(kv_counts)])  # fmt: skip
        for kv_heads, dtype in combos:
            strategy.check(world, heads, kv_heads=kv_heads)  # a case the strategy refuses is the generator's fault
            mask, layout = cells[n % len(cells)]
            placement = "interleaved" if strategy.grouped and n % 2 else "heads-first"
            out.append(CheckCase.of(world, strategy=spec, placement=placement, mask=mask, layout=layout,
                                    buffer=buffers[n % len(buffers)], dtype=dtype, heads=heads, kv_heads=kv_heads,
                                    kernel=kernels[n % len(kernels)], seq_per_rank=seq_per_rank,
                                    docs=document_pack(seq, seed=world) if "document" in mask else "none",
                                    **shape))  # fmt: skip
            n += 1
    return out


def strategy_mask_cases(world: int, *, full: bool = False, dtypes=("float64", "float32"),
                        seq_per_rank: int = 8) -> list[CheckCase]:  # fmt: skip
    """The strategies (ulysses, hybrid, double ring) under the document and window masks: every strategy of
    ``world`` with each of them, on the layouts that make sense (doc-balanced for the document masks); ``full``
    takes every strategy x mask x layout x dtype, otherwise each strategy cycles through them."""
    from ringbench.vocab import Strategy

    seq = seq_per_rank * world
    docs = document_pack(seq, seed=world + 1)
    masks = ("causal-document", "full-document", "window:3", f"window:{seq_per_rank + 2}", "causal-document+window:5")
    cells = []
    for mask in masks:
        layouts = ("contiguous", "zigzag", "striped") + (("doc-balanced",) if "document" in mask else ())
        cells += [(mask, layout) for layout in layouts]
    out = []
    for n, spec in enumerate(strategy_specs(world)):
        strategy = Strategy.parse(spec)
        heads = 2 * strategy.ulysses_degree(world)
        chosen = cells if full else [cells[(n + i) % len(cells)] for i in range(0, len(cells), 3)]
        for i, (mask, layout) in enumerate(chosen):
            for dtype in dtypes if full else (dtypes[(n + i) % len(dtypes)],):
                out.append(CheckCase.of(world, strategy=spec, placement="interleaved" if (n + i) % 2 and
                                        strategy.grouped else "heads-first", mask=mask, layout=layout,
                                        buffer=strategy.buffers()[i % len(strategy.buffers())], dtype=dtype,
                                        heads=heads, seq_per_rank=seq_per_rank,
                                        docs=docs if "document" in mask else "none"))  # fmt: skip
    return out
