"""The sweep axes, each defined once: name, type, help text, and the commands that take it.

    axes_for("plan")            # the Axis records `ringbench plan` takes, in --help order
    axis("mask").help           # the one help text every command shows for --mask

The scenario schema (scenario/scenario.py: AXES, INT_AXES), the options of `run`, `simulate`, `plan` and `calibrate`
(cli/axis_options.py builds them from these records), the run summary's shown axes and docs/scenarios.md's axis table
(written by docs/scenarios_table.py) all read this list; tests/test_cli_conventions.py holds them to it. A command
that takes one value of an axis (``plan``, ``calibrate``) says so in ``single``; the others repeat it, and the
cartesian product runs.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN, SIMULATE, PLAN, CALIBRATE, CHECK = "run", "simulate", "plan", "calibrate", "check"


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis:
    """One sweep axis."""

    name: str
    """The scenario key and the option's name (``head_dim`` -> ``--head-dim``)."""
    kind: type
    """int or str."""
    help: str
    """The help text, the same in every command."""
    commands: tuple[str, ...]
    """The commands that take it."""
    single: tuple[str, ...] = ()
    """The commands that take one value of it (the others repeat it)."""
    shown: int = 0
    """Its place in a run summary's case label (the registry's own order is the sweep's: the cartesian product
    varies the last axis fastest)."""
    doc: str = ""
    """Its values as docs/scenarios.md describes them, where the help text is too short to say what each does
    (Markdown; empty: the help text)."""


MASK_HELP = ("none, causal, causal-naive, causal-document, full-document, window:W (a causal sliding window), "
             "causal-document+window:W; document masks take --docs.")  # fmt: skip
DOCS_HELP = ("Packed documents of the document masks: lengths:L1,L2,..., file:PATH[:COLUMN], "
             "lognormal:MEAN:SIGMA:SEED[:CAP], uniform:MIN:MAX:SEED[:CAP].")  # fmt: skip
_ALL = (RUN, SIMULATE, PLAN, CALIBRATE)
_CHECKED = (*_ALL, CHECK)

AXES: tuple[Axis, ...] = (
    Axis(name="world", shown=0, kind=int, help="Ranks N.", commands=_CHECKED, single=(PLAN, CALIBRATE)),
    Axis(
        name="seq",
        shown=1,
        kind=int,
        help="Total sequence length S (tokens).",
        commands=_CHECKED,
        single=(PLAN, CALIBRATE),
    ),
    Axis(name="heads", shown=2, kind=int, help="Attention (query) heads.", commands=_CHECKED, single=(PLAN, CALIBRATE)),
    Axis(
        name="kv_heads",
        shown=2,  # beside heads (a stable sort keeps the registry's order)
        kind=int,
        help="Key/value heads (grouped-query attention: dividing --heads; 0, the default: as many as --heads).",
        commands=(RUN, CHECK),
        doc=(
            "key/value heads, grouped-query attention: `0` (as many as `heads`, the default) or a divisor of `heads`;"
            " K and V travel at that many heads in every strategy ([strategies.md](strategies.md))"
        ),
    ),
    Axis(name="head_dim", shown=3, kind=int, help="Head dimension.", commands=_CHECKED, single=(PLAN, CALIBRATE)),
    Axis(name="batch", shown=4, kind=int, help="Batch size.", commands=_CHECKED, single=(PLAN, CALIBRATE)),
    Axis(
        name="dtype",
        shown=5,
        kind=str,
        help="float32 (fp32), float64 (fp64), bfloat16 (bf16), float16 (fp16).",
        commands=_CHECKED,
        single=(PLAN, CALIBRATE),
    ),
    Axis(
        name="mask",
        shown=8,
        kind=str,
        help=MASK_HELP,
        commands=_CHECKED,
        single=(PLAN,),
        doc=(
            "`none`, `causal` (fully masked block pairs skipped), `causal-naive` (every pair computed with its mask),"
            " `causal-document` / `full-document` (a token sees only its own document, causally or fully), `window:W`"
            " (causal sliding window: query t sees keys t-W+1..t), `causal-document+window:W`"
        ),
    ),
    Axis(
        name="layout",
        shown=9,
        kind=str,
        help="contiguous, zigzag, striped, doc-balanced (document masks).",
        commands=_CHECKED,
        single=(PLAN, CALIBRATE),
        doc=(
            "`contiguous`, `zigzag` (rank i owns chunks i and 2N-1-i), `striped` (token t on rank t mod N), "
            "`doc-balanced` (equal chunks given to ranks by their visible work; document masks)"
        ),
    ),
    Axis(
        name="buffer",
        shown=10,
        kind=str,
        help="sync, double, allgather, sync-short, double-short (the short ring stops when no rank needs more blocks).",
        commands=(RUN, SIMULATE),
        doc=(
            "`sync` (exchange, then compute), `double` (compute while the next block travels), `allgather` (O(S) "
            "memory baseline), `sync-short` / `double-short` (the short ring: a block travels only as far as some "
            "rank sees it, the ring stops when the window is covered, dK/dV go home along the same path; never chosen"
            " for you: [strategies.md](strategies.md#window-masks-and-the-short-ring))"
        ),
    ),
    Axis(
        name="order",
        shown=11,
        kind=str,
        help="identity, reverse, random:SEED, stride:K, or 0-3-1-2.",
        commands=(RUN, SIMULATE),
        doc="`identity`, `reverse`, `random:SEED`, `stride:K` (topology-hostile), explicit `0-3-1-2`",
    ),
    Axis(
        name="kernel",
        shown=12,
        kind=str,
        help="torch, math, triton, emulated:GFLOPS, emulated:auto, modelled:GFLOPS.",
        commands=(RUN, CALIBRATE),
        single=(CALIBRATE,),
        doc=(
            "`torch` (SDPA ops with log-sum-exp), `math`, `triton`, `emulated:GFLOPS`, `emulated:auto`, "
            "`modelled:GFLOPS` ([results.md](results.md#emulated-compute))"
        ),
    ),
    Axis(
        name="impl",
        shown=13,
        kind=str,
        help="ringbench, torch-ring[:alltoall|:allgather], ring-attention-pytorch, "
        "ring-flash-attn, transformer-engine, or module:function.",
        commands=(RUN,),
        doc=(
            "`ringbench` (this engine), `torch-ring[:alltoall\\|:allgather]`, `ring-attention-pytorch`, "
            "`ring-flash-attn`, `transformer-engine` (CUDA), `module:function` "
            "([implementations.md](implementations.md))"
        ),
    ),
    Axis(
        name="strategy",
        shown=6,
        kind=str,
        help="ring, ulysses, hybrid:U, double-ring:W, allgather.",
        commands=(RUN, SIMULATE, PLAN),
        doc=(
            "`ring` (the engine's ring), `ulysses` (all-to-all to head shards, local attention), `hybrid:U` (Ulysses "
            "of degree U in groups, a ring across them), `double-ring:W` (inner rings of W ranks, an outer ring "
            "across them), `allgather` ([strategies.md](strategies.md))"
        ),
    ),
    Axis(
        name="placement",
        shown=7,
        kind=str,
        help="The groups of a hybrid or double ring: heads-first, interleaved, or ranks "
        "in placement order such as 0-2-1-3.",
        commands=(RUN, SIMULATE),
        doc=(
            "grouped strategies: `heads-first` (groups of consecutive ranks), `interleaved`, or ranks in placement "
            "order `0-2-4-6-1-3-5-7`"
        ),
    ),
    Axis(
        name="docs",
        shown=14,
        kind=str,
        help=DOCS_HELP,
        commands=(RUN, SIMULATE, PLAN, CHECK),
        single=(PLAN,),
        doc=(
            "the packed documents of the document masks: `lengths:8192,1024,...` (summing to S), `file:PATH[:COLUMN]`"
            " (one length per line, or a CSV / Parquet column; packed until S), `lognormal:MEAN:SIGMA:SEED[:CAP]`, "
            "`uniform:MIN:MAX:SEED[:CAP]` (seeded; CAP: the longest document as a share of S)"
        ),
    ),
    Axis(
        name="layers",
        shown=15,
        kind=str,
        help="Attention layers per iteration: a count, or masks with repeats, e.g. 'window:4096 x5, causal x1'.",
        commands=(RUN, PLAN),
        single=(PLAN,),
        doc=(
            "attention layers per iteration, each a ring with its own mask: `4`, or `window:4096 x5, causal x1` "
            "(`mask` in a pattern stands for the case's mask)"
        ),
    ),
)
AXIS_NAMES: tuple[str, ...] = tuple(a.name for a in AXES)
INT_AXES: tuple[str, ...] = tuple(a.name for a in AXES if a.kind is int)
_BY_NAME = {a.name: a for a in AXES}


SHOWN_AXES: tuple[str, ...] = tuple(a.name for a in sorted(AXES, key=lambda a: a.shown))
"""The run summary's axes, in the order a case's label shows them."""


def axis(name: str) -> Axis:
    return _BY_NAME[name]


def axes_for(command: str) -> tuple[Axis, ...]:
    """The axes ``command`` takes, in --help order."""
    return tuple(a for a in AXES if command in a.commands)


__all__ = ["AXES", "AXIS_NAMES", "CALIBRATE", "CHECK", "DOCS_HELP", "INT_AXES", "MASK_HELP", "PLAN", "RUN", "SHOWN_AXES",
           "SIMULATE", "Axis", "axes_for", "axis"]  # fmt: skip
