"""A seeded generator of mask cases for `ringbench run`: random document packs, windows, layouts, buffers and
kernels at odd and even worlds (tests/test_random_masks.py runs a sample of them).

Each draw is one `ringbench run` (one launch): a world of 1 to 8 ranks, a few rows per rank, one mask (documents,
a window, both, or causal), one pack of documents (one-token documents beside one that spans ranks), one layout,
a full ring and a short ring, and two kernels (emulated:auto in most draws: one rate and floor for the run).
What the draws hunt for: a plan that disagrees between ranks on which blocks travel (a stall), a kernel call
emulated:auto cannot pace (a collapsed rate), a sub-block the check finds wrong.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAST_KERNELS = ("torch", "math", "emulated:auto", "emulated:5")
SLOW_KERNELS = (*FAST_KERNELS, "triton")  # interpreted on the CPU: seconds per case
FULL_RINGS = ("sync", "double")
SHORT_RINGS = ("sync-short", "double-short")


@dataclass(frozen=True, slots=True)
class Draw:
    """One run of the sample: its axes, each a single value but the buffers and kernels (a small product)."""

    world: int
    seq: int
    mask: str
    docs: str
    layout: str
    buffers: tuple[str, ...]
    kernels: tuple[str, ...]
    order: str = "identity"

    def args(self, timeout_s: float = 30.0) -> list[str]:
        """`ringbench run` arguments: one timed iteration, checked against float64, a short stall timeout."""
        args = ["run", "--world", str(self.world), "--seq", str(self.seq), "--heads", "2", "--head-dim", "16",
                "--mask", self.mask, "--layout", self.layout, "--order", self.order, "--iters", "1", "--warmup", "0",
                "--check", "--timeout", f"{timeout_s:g}"]  # fmt: skip
        if self.docs != "none":
            args += ["--docs", self.docs]
        for buffer in self.buffers:
            args += ["--buffer", buffer]
        for kernel in self.kernels:
            args += ["--kernel", kernel]
        return args

    def __str__(self) -> str:
        return " ".join(self.args()[1:])


def pack(rng: random.Random, seq: int, rows: int) -> str:
    """A docs spec filling ``seq``: mostly one- to three-token documents, some a rank long, one across ranks."""
    lengths, total = [], 0
    while total < seq:
        pick = rng.random()
        if pick < 0.55:
            length = rng.randint(1, 3)
        elif pick < 0.85:
            length = rng.randint(rows // 2, rows + 3)
        else:
            length = rng.randint(rows, 3 * rows)
        length = min(length, seq - total)
        lengths.append(length)
        total += length
    return "lengths:" + ",".join(map(str, lengths))


def window(rng: random.Random, seq: int, rows: int) -> int:
    """Shorter than a token's rank block, about a block, a few blocks, or longer than the sequence."""
    return rng.choice([rng.randint(1, 3), rng.randint(rows // 2, rows + 2), rng.randint(rows, 3 * rows + 1),
                       rng.randint(seq, 2 * seq + 1)])  # fmt: skip


def draw(rng: random.Random, worlds, kernels) -> Draw:
    world = rng.choice(list(worlds))
    rows = 2 * rng.randint(3, 12)  # even: zigzag cuts each rank's rows in two
    seq = world * rows
    kind = rng.choice(["causal-document", "full-document", "window", "causal-document+window", "causal"])
    mask = kind.replace("window", f"window:{window(rng, seq, rows)}")
    documented = "document" in mask
    layouts = ["contiguous", "zigzag", "striped"] + (["doc-balanced"] if documented else [])
    chosen = rng.sample(list(kernels), 2)
    if "emulated:auto" not in chosen and rng.random() < 0.6:
        chosen[0] = "emulated:auto"
    if world > 4:  # interpreted Triton takes seconds per call on the CPU: the small worlds carry it
        chosen = ["torch" if kernel == "triton" else kernel for kernel in chosen]
    order = rng.choice(["identity", "reverse", "random:3"]) if world > 2 else "identity"
    return Draw(world=world, seq=seq, mask=mask, docs=pack(rng, seq, rows) if documented else "none",
                layout=rng.choice(layouts), buffers=(rng.choice(FULL_RINGS), rng.choice(SHORT_RINGS)),
                kernels=tuple(dict.fromkeys(chosen)), order=order)  # fmt: skip


def draws(seed: int, count: int, worlds=range(1, 9), kernels=FAST_KERNELS) -> list[Draw]:
    """``count`` seeded draws (the same list for the same arguments)."""
    rng = random.Random(seed)
    return [draw(rng, worlds, kernels) for _ in range(count)]


# Issue 30's case: a window beside documents down to one token; emulated:auto's rate collapsed on the one-token
# document's call and the ring stalled at its first step.
ISSUE_30 = Draw(world=5, seq=960, mask="causal-document+window:198", docs="lengths:383,142,110,109,30,62,124",
                layout="contiguous", buffers=("double",), kernels=("emulated:auto",))  # fmt: skip
