"""What the GPU check covers: world-1 equivalents of the strategies and masks on one GPU, and the summary's
coverage lines (every strategy and mask family: checked, not checked and why, or failed).

    python benchmarks/gpu_probe.py coverage [--dry-run]   # the world-1 equivalents (gpu_check.py runs it)

On one GPU a strategy's exchanges cannot run (NCCL refuses two ranks on one device), but its arithmetic can:
Ulysses at world 1 is its head transposes and its local attention over the whole sequence; the short ring at world
1 is its own block under the window plan; the document and window masks run through the Triton and torch kernels'
positional rules. Each runs forward and backward at a production shape (bf16, B=1 H=16 S=8192 D=128) against
float64 (heads in chunks), within ringbench's bf16 tolerances, absolute up to |value| 1 and relative above
(gpu_numerics.py: the kernels' final rounding is relative, and a long sequence has outputs of magnitude 2 to 5).
``--dry-run``: the same code on the CPU at a tiny shape (Triton interpreted).
"""

from __future__ import annotations

import json
import time

import torch

RESULT = "GPU_CHECK_RESULT "
WINDOW = 1024  # tokens: shorter than a 2-rank block at S=8192, as a real sliding window is
DOCS = "lognormal:1024:0.8:7:0.25"  # packed documents, the longest at most a quarter of the sequence
# name -> (strategy, mask, buffer, kernel, docs): what each world-1 equivalent runs.
CASES = {
    "ulysses": ("ulysses", "causal", "double", "torch", "none"),
    "short-ring": ("ring", f"window:{WINDOW}", "double-short", "torch", "none"),
    "window-triton": ("ring", f"window:{WINDOW}", "double", "triton", "none"),
    "document-torch": ("ring", "causal-document", "double", "torch", DOCS),
    "document-triton": ("ring", "causal-document", "double", "triton", DOCS),
    "full-document-triton": ("ring", "full-document", "double", "triton", DOCS),
    "document-window-triton": ("ring", f"causal-document+window:{WINDOW}", "double", "triton", DOCS),
}
CHECK_NAMES = [f"cover:{name}" for name in CASES]
SHAPE = (1, 16, 8192, 128)  # B, H, S, D on a GPU
DRY_SHAPE = (1, 2, 128, 16)  # on the CPU (the dry run)


def _emit(check: str, ok, facts: list[str], **data) -> None:
    print(RESULT + json.dumps({"check": check, "ok": ok, "facts": facts, "data": data}, default=str), flush=True)


def _reference(q, k, v, dout, mask: str, docs: str, head_chunk: int):
    """float64 attention and its gradients, heads in chunks (an S x S float64 score matrix per head)."""
    from ringbench.engine.api import reference_attention

    parts = []
    for h in range(0, q.shape[1], head_chunk):
        leaves = [t[:, h : h + head_chunk].double().requires_grad_() for t in (q, k, v)]
        out = reference_attention(*leaves, mask=mask, docs=docs)
        grads = torch.autograd.grad(out, leaves, dout[:, h : h + head_chunk].double())
        parts.append((out.detach(), *grads))
    return [torch.cat([p[i] for p in parts], dim=1) for i in range(4)]


def _scaled(spec, seq: int, production: bool):
    """(mask, docs) of a case at ``seq`` tokens: as given at the production shape; else the window an eighth of the
    sequence and three documents across it (the same positional rules, so the same Triton variants)."""
    _, mask, _, _, docs = spec
    if production:
        return mask, docs
    mask = mask.replace(str(WINDOW), str(seq // 8))
    docs = f"lengths:{3 * seq // 8},{seq - 6 * seq // 8},{3 * seq // 8}" if docs != "none" else docs
    return mask, docs


def _run(spec, device, shape, production: bool):
    """One world-1 forward and backward of a case: (inputs, output, gradients, mask, docs, seconds)."""
    from ringbench.engine.api import attention, build_context
    from ringbench.engine.spec import AttentionSpec

    strategy, _, buffer, kernel, _ = spec
    batch, heads, seq, head_dim = shape
    mask, docs = _scaled(spec, seq, production)
    generator = torch.Generator(device=device).manual_seed(11)
    q, k, v, dout = (torch.randn(batch, heads, seq, head_dim, generator=generator, device=device,
                                 dtype=torch.bfloat16) for _ in range(4))  # fmt: skip
    started = time.perf_counter()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ctx = build_context(*leaves, AttentionSpec(strategy=strategy, mask=mask, buffer=buffer, kernel=kernel, docs=docs))
    out = attention(*leaves, context=ctx)
    grads = torch.autograd.grad(out, leaves, dout)
    return (q, k, v, dout), out, grads, mask, docs, time.perf_counter() - started


def warm_triton(device, dry: bool = False) -> None:
    """Run every Triton case once at the check's shape, without the reference: the pre-compile's coverage child
    (the documents' short sub-blocks take smaller tiles, so the same blocks, not a smaller sequence)."""
    for spec in CASES.values():
        if spec[3] == "triton":
            _run(spec, device, DRY_SHAPE if dry else SHAPE, production=not dry)


def _one(name: str, spec, device, shape, dry: bool, cache) -> None:
    from gpu_numerics import max_error, scaled_error

    from ringbench.vocab import TOLERANCE

    strategy, _, buffer, kernel, _ = spec
    batch, heads, seq, head_dim = shape
    (q, k, v, dout), out, grads, mask, docs, seconds = _run(spec, device, shape, production=not dry)
    compiled = cache.new() if cache is not None and kernel == "triton" else None
    want = _reference(q, k, v, dout, mask, docs, head_chunk=4)
    pairs = list(zip(grads, want[1:], strict=True))
    fwd, bwd = scaled_error(out, want[0]), max(scaled_error(g, w) for g, w in pairs)
    fwd_abs, bwd_abs = max_error(out, want[0]), max(max_error(g, w) for g, w in pairs)
    fwd_tol, bwd_tol = TOLERANCE["bfloat16"]
    passed = fwd <= fwd_tol and bwd <= bwd_tol
    where = "CPU stand-in (dry run)" if dry else "GPU"
    fact = (f"{strategy} {mask} {buffer} {kernel}{' ' + docs if docs != 'none' else ''} on the {where}, world 1, bf16 "
            f"B={batch} H={heads} S={seq} D={head_dim}: error fwd {fwd:.2e} (tol {fwd_tol:g}; max |err| "
            f"{fwd_abs:.2e}), bwd {bwd:.2e} (tol {bwd_tol:g}; max |err| {bwd_abs:.2e}) {'pass' if passed else 'FAIL'}, "
            f"fwd+bwd {seconds:.2f} s (first call)")  # fmt: skip
    facts = [fact]
    if kernel == "triton":
        from gpu_compile import cache_fact

        facts.append(cache_fact(compiled))
    _emit(f"cover:{name}", passed if not dry else (None if passed else False), facts, compiled_here=compiled)


def coverage(dry: bool) -> None:
    """Each world-1 equivalent in turn, one result each as it finishes (a deadline keeps those done)."""
    from gpu_compile import CacheWatch

    from ringbench.kernels import get_kernel
    from ringbench.kernels.torch_sdpa import fused_ops_problem

    device = torch.device("cpu" if dry else "cuda")
    shape = DRY_SHAPE if dry else SHAPE
    try:
        get_kernel("triton").check(shape[-1], torch.bfloat16, device)
        no_triton = ""
    except Exception as exc:
        no_triton = str(exc).splitlines()[0]
    no_torch = fused_ops_problem() if device.type == "cuda" else None
    cache = CacheWatch() if device.type == "cuda" and not no_triton else None
    for name, spec in CASES.items():
        if spec[3] == "triton" and no_triton:
            _emit(f"cover:{name}", None, [f"not checked: {no_triton}"])
            continue
        if spec[3] == "torch" and no_torch:
            _emit(f"cover:{name}", None, [f"not checked: {no_torch}"])
            continue
        try:
            _one(name, spec, device, shape, dry, cache)
        except Exception as exc:  # a kernel that raises is a finding, said in one line
            _emit(f"cover:{name}", False, [f"{spec}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"])
        if device.type == "cuda":
            torch.cuda.empty_cache()


# -- the summary's coverage lines -----------------------------------------------------------------------------------
NEEDS_NODE = "not checked on one GPU: its exchanges need 2 or more ranks (run with --gpus N)"
ONE_GPU = {  # strategy or mask family -> the checks that cover it on one GPU (none: the reason it is not checked)
    "strategy ring": ["correctness-float16", "correctness-bfloat16", "correctness-float32", "no-host-sync", "overlap"],
    "strategy ulysses": ["cover:ulysses"],
    "strategy hybrid:U": NEEDS_NODE,
    "strategy double-ring:W": NEEDS_NODE,
    "strategy allgather": NEEDS_NODE,
    "buffer short ring": ["cover:short-ring"],
    "mask none": ["overlap", "adapters"],
    "mask causal": ["correctness-float16", "correctness-bfloat16", "correctness-float32", "cover:ulysses"],
    "mask causal-naive": ["correctness-float16", "correctness-bfloat16", "correctness-float32"],
    "mask causal-document": ["cover:document-torch", "cover:document-triton"],
    "mask full-document": ["cover:full-document-triton"],
    "mask window": ["cover:window-triton", "cover:short-ring"],
    "mask causal-document+window": ["cover:document-window-triton"],
}


LIMITS = {  # what a pass on one GPU does not show, said on the item's line
    "strategy ring": "world-1 loopback only: multi-step merging, block owners and the travelling dK/dV need --gpus N",
}


def coverage_lines(results: dict[str, tuple[bool | None, str]], plan: dict | None = None) -> list[tuple]:
    """(item, ok, line) per strategy and mask family from the checks' (ok, first fact): checked when every covering
    check passed; partly checked (x of y sources ran) when some passed and the others did not run; failed when one
    failed; else not checked, with the reason."""
    lines = []
    for item, sources in (plan or ONE_GPU).items():
        if isinstance(sources, str):
            lines.append((item, None, sources))
            continue
        seen = {name: results[name] for name in sources if name in results}
        failed = [name for name, (ok, _) in seen.items() if ok is False]
        passed = [name for name, (ok, _) in seen.items() if ok]
        limit = f" ({LIMITS[item]})" if item in LIMITS else ""
        if failed:
            lines.append((item, False, f"FAILED in {', '.join(failed)}"))
        elif passed and len(passed) == len(sources):
            lines.append((item, True, f"checked by {', '.join(passed)}{limit}"))
        elif passed:
            absent = [name for name in sources if name not in passed]
            lines.append((item, True, f"partly checked ({len(passed)} of {len(sources)} sources ran): checked by "
                                      f"{', '.join(passed)}; not run: {', '.join(absent)}{limit}"))  # fmt: skip
        else:
            why = next((fact for _, fact in seen.values() if fact), "its checks did not run")
            why = why.removeprefix("not checked: ")
            lines.append((item, None, f"not checked on a GPU: {why[:160]}"))
    return lines


__all__ = ["CASES", "CHECK_NAMES", "LIMITS", "ONE_GPU", "coverage", "coverage_lines", "warm_triton"]
