"""The GPU check's Triton pre-compile, and whether the checks after it found their variants in the cache.

    python benchmarks/gpu_compile.py float16|bfloat16|float32|coverage [--dry-run]   # one child of compile_first

Triton compiles a kernel variant on its first call, for seconds, on the host. The kernels and coverage checks run
many variants (3 dtypes x 4 kernels x the mask kinds; the coverage cases' positional rules in bf16) serially in one
process, which would spend their share compiling. So ``compile_first`` compiles them all first, one child per dtype
(and one for the coverage cases) side by side, into the check's fresh cache (TRITON_CACHE_DIR): a cold compile then
costs the slowest child, not the sum. The variants are the ones the checks run: the children launch the checks'
blocks themselves (without the float64 reference), and the kernels leave heads, block lengths and the mask argument
unspecialised anyway (kernels/triton_attn.py, RUNTIME_INTS). ``CacheWatch`` counts the cache's entries, so each check
says whether it compiled anything itself (a variant the pre-compile missed).

Each child writes its output to a file in the check's folder, never to a pipe the parent would have to drain while
it waits: a child that prints more than a pipe holds (repeated compiler warnings, a long traceback) cannot stall.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
KERNEL_DTYPES = ("float16", "bfloat16", "float32")
KERNEL_CASES = (("causal-naive", "contiguous"), ("causal", "striped"))
SHAPE = {"heads": 32, "head_dim": 128, "seq": 8192}  # the kernels check's (benchmarks/gpu_probe.py)
DRY_SHAPE = {"heads": 1, "head_dim": 16, "seq": 128}  # the dry run's, on the CPU (the interpreter compiles nothing)


def cache_dir() -> Path:
    """The Triton cache the kernels compile into (TRITON_CACHE_DIR, else Triton's default)."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    try:
        import triton

        return Path(triton.knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path.home() / ".triton" / "cache"


class CacheWatch:
    """How many entries (one folder per compiled kernel or launcher) the Triton cache gained since the last look."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else cache_dir()
        self.seen = self.entries()

    def entries(self) -> int:
        return sum(1 for p in self.folder.iterdir() if p.is_dir()) if self.folder.is_dir() else 0

    def new(self) -> int:
        now = self.entries()
        added, self.seen = now - self.seen, now
        return added


def cache_fact(compiled: int | None) -> str:
    """The sentence a check adds about the cache (None: Triton did not compile here, e.g. the interpreter)."""
    if compiled is None:
        return "Triton cache: not used (the interpreter compiles nothing)"
    if compiled == 0:
        return "Triton cache: hit (every variant came from the pre-compile; no compile time in this share)"
    return (f"Triton cache: {compiled} new entr{'y' if compiled == 1 else 'ies'} compiled during this check (missed "
            "by the pre-compile: their compile time is inside this share)")  # fmt: skip


def pair_blocks(seq: int):
    """Every (mask, layout, rank, owner, plan) of a 2-rank ring over ``seq`` tokens, in the kernels check's order."""
    from ringbench.engine.plan import pair_plan
    from ringbench.vocab import Layout, Mask

    for mask, layout in KERNEL_CASES:
        for rank, owner in ((0, 0), (0, 1), (1, 0), (1, 1)):
            yield mask, layout, rank, owner, pair_plan(Mask.parse(mask), Layout.parse(layout), seq, 2, rank, owner)


def compile_one(what: str, dry: bool = False) -> None:
    """Child of ``compile_first``: every Triton variant one check needs, by running the check's own blocks once
    without its float64 reference: a dtype's kernels check (B=1 H=32 S=8192 D=128), or ``coverage``'s Triton
    cases in bf16 at their shape. (Heads and lengths are not specialised anyway; the same blocks make it plain.)"""
    from ringbench.engine.layout import shard
    from ringbench.kernels import get_kernel

    device = torch.device("cpu" if dry else "cuda")
    started = time.perf_counter()
    if what == "coverage":
        sys.path.insert(0, str(HERE))
        from gpu_coverage import warm_triton

        warm_triton(device, dry)
    else:
        shape = DRY_SHAPE if dry else SHAPE
        dtype, kernel, scale = getattr(torch, what), get_kernel("triton"), shape["head_dim"] ** -0.5
        q, k, v, dout = (torch.randn(1, shape["heads"], shape["seq"], shape["head_dim"], device=device, dtype=dtype)
                         for _ in range(4))  # fmt: skip
        for _, layout, rank, owner, plan in pair_blocks(shape["seq"]):
            q_l, dout_l = shard(q, layout, 2, rank), shard(dout, layout, 2, rank)
            k_o, v_o = shard(k, layout, 2, owner), shard(v, layout, 2, owner)
            for block in plan.blocks:
                rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
                args = (q_l[:, :, rows].contiguous(), k_o[:, :, cols].contiguous(), v_o[:, :, cols].contiguous())
                out, lse = kernel.forward(*args, block.mask, scale)
                kernel.backward(dout_l[:, :, rows].contiguous(), *args, out, lse, block.mask, scale)
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(json.dumps({"what": what, "seconds": time.perf_counter() - started}), flush=True)


def run_side_by_side(commands: dict[str, list[str]], folder: Path, poll_s: float = 0.2):
    """Run every command at once, each one's stdout and stderr into files in ``folder``; yield (name, exit code,
    its last JSON line or None, its last stderr line) as each ends."""
    folder.mkdir(parents=True, exist_ok=True)
    running = {}
    for name, command in commands.items():
        out, err = folder / f"{name}.out", folder / f"{name}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            running[name] = (subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True), out, err)
    while running:
        for name, (child, out, err) in list(running.items()):
            if child.poll() is None:
                continue
            del running[name]
            lines = [line for line in out.read_text(errors="replace").splitlines() if line.startswith("{")]
            last_error = (err.read_text(errors="replace").strip().splitlines() or ["?"])[-1][:200]
            yield name, child.returncode, json.loads(lines[-1]) if lines else None, last_error
        time.sleep(poll_s)


def compile_first(names: list[str], folder: Path, emit, dry: bool = False) -> None:
    """Compile every variant of ``names`` (dtypes, and ``coverage``) at once, one child each, and report each as it
    finishes (``emit``: gpu_probe's result line). ``dry``: the same children on the CPU under Triton's interpreter,
    at a tiny shape (their code runs; nothing is compiled or measured)."""
    started = time.perf_counter()
    commands = {name: [sys.executable, str(HERE / "gpu_compile.py"), name, *(["--dry-run"] if dry else [])]
                for name in names}  # fmt: skip
    seconds, problems = {}, []
    for name, code, result, last_error in run_side_by_side(commands, folder):
        if code == 0 and result is not None:
            seconds[name] = result["seconds"]
            print(f"gpu_probe: triton {name} compiled in {seconds[name]:.1f} s", file=sys.stderr, flush=True)
        else:
            problems.append(f"{name}: exit {code}: {last_error}")
    wall = time.perf_counter() - started
    shown = ", ".join(f"{name} {sec:.1f} s" for name, sec in seconds.items())
    facts = [f"cold Triton compile (a fresh cache; every variant the kernels and coverage checks run, fwd + bwd at "
             f"D=128, side by side; logs in {folder}): {shown or 'none finished'}; {wall:.1f} s in all"]  # fmt: skip
    if dry:
        facts = [f"not measured: cold Triton compile time (dry run: the {len(names)} pre-compile children ran side by "
                 f"side under Triton's interpreter, which compiles nothing, in {wall:.1f} s; logs in {folder})"]  # fmt: skip
    facts += [f"compile failed: {problem}" for problem in problems]
    emit("triton-compile", (None if dry else True) if not problems else False, facts, seconds={} if dry else seconds,
         wall_s=wall)  # fmt: skip


if __name__ == "__main__":
    compile_one(sys.argv[1], dry="--dry-run" in sys.argv[2:])
