"""The measurements of the one-GPU check, one subcommand each (benchmarks/gpu_check.py runs them as children).

    python benchmarks/gpu_probe.py kernels OUT [--dry-run]  # cold Triton compile (gpu_compile.py); kernels at blocks
    python benchmarks/gpu_probe.py timing OUT [--dry-run]   # no host sync (sync debug mode); overlap and edges
    python benchmarks/gpu_probe.py drift [--dry-run]        # pads at idle clocks and after 20 s of attention
    python benchmarks/gpu_probe.py all OUT --dry-run        # the three in one process (the dry run's way)

Each finished measurement prints one line ``GPU_CHECK_RESULT {json}``: its name, ``ok`` (true, false, or null for
"could not check"), and ``facts``, sentences each of which states a number measured here or says plainly what was
not measured. A deadline that kills the child loses only what had not finished. ``--dry-run``: tiny shapes on the
CPU, through the same code, to exercise it; every GPU figure then says it was not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULT = "GPU_CHECK_RESULT "
HERE = Path(__file__).resolve().parent
DRIFT_S = 20.0  # seconds of attention before the pads are measured under load
PAD_MS, DRIFT_ROUNDS = 5.0, 3  # the pads measured under load
DRIFT_LIMIT = 0.05  # how far a pad may run from its duration under load (the spin-drift check)


def emit(check: str, ok: bool | None, facts: list[str], **data) -> None:
    print(RESULT + json.dumps({"check": check, "ok": ok, "facts": facts, "data": data}, default=str), flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_inputs(batch, heads, seq, head_dim, dtype, device, seed, count: int = 4):
    """Inputs made on the device itself (large timing shapes: no host tensors, no float64 copies)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, heads, seq, head_dim, generator=generator, device=device, dtype=dtype)
            for _ in range(count)]  # fmt: skip


def _inputs(batch, heads, seq, head_dim, dtype, device, seed):
    """q, k, v, dout in ``dtype`` on ``device`` and their exact float64 copies (values representable in dtype)."""
    generator = torch.Generator().manual_seed(seed)
    host = [torch.randn(batch, heads, seq, head_dim, generator=generator).to(dtype) for _ in range(4)]
    return [t.to(device) for t in host], [t.double().to(device) for t in host]


# -- kernels: cold compile and correctness at realistic blocks -----------------------------------------------------
def _reference(q, k, v, dout, mask, scale, head_chunk: int):
    """float64 math kernel, heads in chunks (a 4k x 4k float64 score matrix is 128 MiB per head)."""
    from ringbench.kernels.torch_sdpa import MathKernel

    math_kernel = MathKernel()
    parts = []
    for h in range(0, q.shape[1], head_chunk):
        sl = slice(h, h + head_chunk)
        out, lse = math_kernel.forward(q[:, sl], k[:, sl], v[:, sl], mask, scale)
        grads = math_kernel.backward(dout[:, sl], q[:, sl], k[:, sl], v[:, sl], out, lse, mask, scale)
        parts.append((out, lse, *grads))
    return [torch.cat([p[i] for p in parts], dim=1) for i in range(5)]


def kernels(dry: bool, out: Path) -> None:
    """Correctness at realistic blocks, one result per dtype as each finishes (a deadline keeps those done); on a
    GPU every Triton variant of this check and of coverage is compiled first, side by side (gpu_compile.py)."""
    from gpu_compile import KERNEL_DTYPES, CacheWatch, compile_first

    from ringbench.kernels import get_kernel
    from ringbench.kernels.torch_sdpa import fused_ops_problem

    device = torch.device("cpu" if dry else "cuda")
    batch, heads, head_dim, seq = (1, 1, 16, 128) if dry else (1, 32, 128, 8192)  # world 2: blocks of seq / 2
    names, missing = [], {}
    no_torch = fused_ops_problem() if device.type == "cuda" else None
    if no_torch:
        missing["torch"] = no_torch
    else:
        names.append("torch")
    try:
        get_kernel("triton").check(head_dim, torch.float32, device)
        names.append("triton")
    except Exception as exc:
        missing["triton"] = str(exc).splitlines()[0]
    if "triton" in names:  # (the dry run: the same children, interpreted)
        compile_first([*KERNEL_DTYPES, "coverage"], out / "compile", emit, dry)
    else:
        emit("triton-compile", None, [f"not measured: cold Triton compile time ({missing['triton']})"])
    cache = CacheWatch() if "triton" in names and not dry else None
    for dtype_name in KERNEL_DTYPES:
        _dtype_correctness(dtype_name, names, device, (batch, heads, head_dim, seq), dry, missing, cache)


def _dtype_correctness(dtype_name: str, names, device, shape, dry: bool, missing: dict, cache) -> None:
    from gpu_compile import cache_fact, pair_blocks
    from gpu_numerics import max_error, scaled_error

    from ringbench.engine.layout import shard
    from ringbench.kernels import get_kernel
    from ringbench.vocab import TOLERANCE

    batch, heads, head_dim, seq = shape
    dtype, scale = getattr(torch, dtype_name), head_dim**-0.5
    worst: dict[str, list[float]] = {}  # kernel -> [fwd, bwd] scaled errors (judged), then [fwd, bwd] max |err|
    blocks_seen = 0
    (q, k, v, dout), exact = _inputs(batch, heads, seq, head_dim, dtype, device, seed=19)
    for _, layout, rank, owner, plan in pair_blocks(seq):
        q_l, dout_l = shard(q, layout, 2, rank), shard(dout, layout, 2, rank)
        k_o, v_o = shard(k, layout, 2, owner), shard(v, layout, 2, owner)
        q64, dout64 = shard(exact[0], layout, 2, rank), shard(exact[3], layout, 2, rank)
        k64, v64 = shard(exact[1], layout, 2, owner), shard(exact[2], layout, 2, owner)
        for block in plan.blocks:
            rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
            want = _reference(q64[:, :, rows], k64[:, :, cols], v64[:, :, cols], dout64[:, :, rows], block.mask,
                              scale, head_chunk=8)  # fmt: skip
            blocks_seen += 1
            for name in names:
                kernel = get_kernel(name)
                args = (q_l[:, :, rows].contiguous(), k_o[:, :, cols].contiguous(), v_o[:, :, cols].contiguous())
                out, _lse = kernel.forward(*args, block.mask, scale)
                grads = kernel.backward(dout_l[:, :, rows].contiguous(), *args, want[0].to(dtype), want[1].float(),
                                        block.mask, scale)  # fmt: skip
                pairs = list(zip(grads, want[2:], strict=True))
                found = (scaled_error(out, want[0]), max(scaled_error(g, w) for g, w in pairs),
                         max_error(out, want[0]), max(max_error(g, w) for g, w in pairs))  # fmt: skip
                entry = worst.setdefault(name, [0.0] * 4)
                entry[:] = [max(a, b) for a, b in zip(entry, found, strict=True)]
            del want
    compiled = cache.new() if cache is not None else None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    where = "CPU stand-in (dry run), " if dry else ""
    facts = [f"{where}{dtype_name}: {blocks_seen} blocks of {seq // 2}x{seq // 2} tokens (every pair of a 2-rank ring, "
             f"causal-naive contiguous and causal striped: full, causal and partial masks, an empty row), B={batch} "
             f"H={heads} D={head_dim}, against float64 (ringbench's tolerances, absolute up to |value| 1 and "
             f"relative above: gpu_numerics.py)"]  # fmt: skip
    ok = True
    fwd_tol, bwd_tol = TOLERANCE[dtype_name]
    for name, (fwd, bwd, fwd_abs, bwd_abs) in sorted(worst.items()):
        passed = fwd <= fwd_tol and bwd <= bwd_tol
        ok = ok and passed
        facts.append(f"{name} {dtype_name}: error fwd {fwd:.2e} (tol {fwd_tol:g}; max |err| {fwd_abs:.2e}), bwd "
                     f"{bwd:.2e} (tol {bwd_tol:g}; max |err| {bwd_abs:.2e}) {'pass' if passed else 'FAIL'}")  # fmt: skip
    facts += [f"{name} not checked: {why}" for name, why in missing.items()]
    if "triton" in names:
        facts.append(cache_fact(compiled))
    if dry:
        facts.append("not measured: kernels on a GPU (dry run: the CPU flash op and Triton's interpreter stand in)")
    judged = ok if worst else None  # no kernel could run here: not checked, and said why above
    emit(f"correctness-{dtype_name}", judged if not dry else None, facts, compiled_here=compiled,
         worst={f"{name} {dtype_name}": v for name, v in worst.items()})  # fmt: skip


# -- timing: sync debug mode, and the overlap and edges seen by CUPTI -----------------------------------------------
def _one_rank_group(device: torch.device, folder: Path):
    import torch.distributed as dist

    from ringbench.rank.dist import group_options

    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    from datetime import timedelta

    timeout = timedelta(seconds=120)
    dist.init_process_group(backend, init_method=f"file://{folder / 'store'}", rank=0, world_size=1, timeout=timeout,
                            **({"device_id": device} if device.type == "cuda" else {}),
                            **group_options(backend, timeout))  # fmt: skip
    return backend


def sync_debug(device: torch.device, dry: bool) -> None:
    from ringbench.engine.api import build_context, ring_attention
    from ringbench.engine.spec import AttentionSpec, Runtime
    from ringbench.engine.timeline import timeline_for
    from ringbench.kernels import get_kernel
    from ringbench.rank.injection import RankFaults
    from ringbench.rank.runner import RunRecorder

    batch, heads, seq, head_dim = (1, 1, 64, 16) if dry else (1, 32, 8192, 128)
    dtype = torch.bfloat16
    configs = [("torch", "causal", "zigzag"), ("torch", "causal-naive", "contiguous"),
               ("triton", "causal-naive", "striped"), ("emulated:200000", "causal", "zigzag")]  # fmt: skip
    if dry:
        configs[-1] = ("emulated:50", "causal", "zigzag")
    from ringbench.kernels import spin
    from ringbench.kernels.torch_sdpa import fused_ops_problem

    notes = []
    try:
        get_kernel("triton").check(head_dim, dtype, device)
    except Exception as exc:
        configs = [c for c in configs if c[0] != "triton"]
        notes.append(f"triton not in it ({str(exc).splitlines()[0]})")
    no_torch = fused_ops_problem() if device.type == "cuda" else None
    no_spin = spin.missing() if device.type == "cuda" else None
    if no_torch:  # the emulated kernel computes with the torch kernel too
        configs = [c for c in configs if c[0] == "triton"]
        notes.append(f"torch and emulated not in it ({no_torch})")
    if no_spin:
        configs = [c for c in configs if not c[0].startswith("emulated")]
        notes.append(f"no link-delay spins and no emulated pads ({no_spin})")
    if not configs:
        emit("no-host-sync", None, [f"not checked: {'; '.join(notes)}"])
        return
    triton_note = "".join(f"; {note}" for note in notes)
    timeline = timeline_for(device)
    q, k, v, dout = _device_inputs(batch, heads, seq, head_dim, dtype, device, seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    delay = None if no_spin else (lambda src, dst, nbytes: 0.0005)  # a 0.5 ms link delay: a comm-stream spin
    checked, problems = [], []
    for name, mask, layout in configs:
        recorder = RunRecorder(0, 0, None, RankFaults(rank=0), trace=True, timeline=timeline)
        kernel = get_kernel(name)
        ctx = build_context(
            q,
            k,
            v,
            AttentionSpec(mask=mask, layout=layout, buffer="double", kernel=kernel),
            Runtime(recorder=recorder, timeline=timeline, loopback=True, link_delay=delay),
        )
        try:
            for iteration in (0, 1):  # the first compiles, fills the caches, makes NCCL's communicator
                recorder.iteration = iteration
                timeline.begin_iteration()
                strict = iteration == 1 and device.type == "cuda"
                if strict:
                    torch.cuda.set_sync_debug_mode("error")
                try:
                    out = ring_attention(q, k, v, context=ctx)
                    torch.autograd.grad(out, (q, k, v), dout)
                finally:
                    if strict:
                        torch.cuda.set_sync_debug_mode("default")
                ctx.comm.settle(60.0)
                if timeline.settle(60.0):
                    raise RuntimeError("the device did not finish the iteration within 60 s")
                recorder.finish_iteration()
                if hasattr(kernel, "settle"):
                    kernel.settle()
            checked.append(f"{name} {mask} {layout}")
        except Exception as exc:
            problems.append(f"{name} {mask} {layout}: {str(exc).strip().splitlines()[0][:200]}")
        finally:
            ctx.comm.close()
    what = (f"bf16, B={batch} H={heads} S={seq} D={head_dim}, 1-rank loopback, double buffer, 0.5 ms link-delay "
            f"spins, tracing on{triton_note}")  # fmt: skip
    if dry:
        emit(
            "no-host-sync",
            None,
            [
                f"not checked: torch.cuda.set_sync_debug_mode needs a GPU (dry run: the same "
                f"{len(checked)} iteration(s) ran on the host timeline: {what})",
                *problems,
            ],
        )
        return
    facts = [f"one fwd+bwd iteration under torch.cuda.set_sync_debug_mode('error') without a host sync: "
             f"{'; '.join(checked) or 'none'} ({what})"]  # fmt: skip
    facts += [f"host sync or error in {p}" for p in problems]
    emit("no-host-sync", not problems and bool(checked), facts)


def timing(out: Path, dry: bool) -> None:
    device = torch.device("cpu") if dry else torch.device("cuda", 0)
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="ringbench-gpu-probe-"))
    backend = _one_rank_group(device, folder)
    try:
        sync_debug(device, dry)
    except Exception as exc:
        emit("no-host-sync", False if not dry else None, [f"could not run: {str(exc).splitlines()[0][:300]}"])
    try:
        from gpu_overlap import overlap_check

        overlap_check(device, out, dry, emit)
    except Exception as exc:
        emit("overlap", False if not dry else None, [f"could not run ({backend}): {str(exc).splitlines()[0][:300]}"])
    import torch.distributed as dist

    dist.destroy_process_group()


# -- drift: pads at idle clocks and under load -------------------------------------------------------------------
def _nvml_clock() -> tuple[int, int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))  # fmt: skip
    except Exception:
        return None


def _timed(launch) -> tuple[object, object]:
    """Two events around what ``launch()`` enqueues (read after a synchronise)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    return start, end


def drift_error(clock: str, pads: list[float]) -> float:
    """How far the judged pads ran from their duration (measured / requested - 1, the worst): every pad of the
    nanosecond timer; of SM cycles, those after the first (which ran at the idle rate, before any correction)."""
    judged = pads if clock == "globaltimer" else pads[1:]
    return max(abs(p - 1.0) for p in judged)


def drift(seconds: float, dry: bool) -> None:
    """Pads as an emulated run enqueues them: right behind power-limited attention, after ``seconds`` of it.

    The cycle spin's rate is calibrated at idle clocks (as a run does at start-up) and measured again under load:
    the SM clock's drop is reported, not judged. Judged: the pads of the clock this device uses (spin.clock) last
    what they are asked for under load, within DRIFT_LIMIT: the nanosecond timer by construction; SM cycles once the
    rate is corrected from the previous pads, as the emulated kernel corrects it after every iteration."""
    if dry:
        emit("spin-drift", None, ["not measured: the spin rate is a GPU's (dry run)"])
        return
    from ringbench.kernels import spin
    from ringbench.kernels.torch_sdpa import flash_backward, flash_forward

    if spin.missing():
        emit("spin-drift", None, [f"not checked: {spin.missing()}"])
        return
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    idle = spin.calibrate(device)
    clock = spin.clock(device)
    clock_idle = _nvml_clock()
    q, k, v, dout = _device_inputs(1, 32, 8192, 128, torch.bfloat16, device, seed=3)

    def attention(calls: int = 4) -> None:
        for _ in range(calls):
            out, lse = flash_forward(q, k, v, True, 128**-0.5)
            flash_backward(dout, q, k, v, out, lse, True, 128**-0.5)

    started, calls, clock_loaded = time.monotonic(), 0, None
    while time.monotonic() - started < seconds:
        attention()
        calls += 4
        if time.monotonic() - started > 0.8 * seconds and clock_loaded is None:
            clock_loaded = _nvml_clock()  # read while the attention runs
        torch.cuda.synchronize(device)  # bounded queue
    busy = time.monotonic() - started
    cycles = round(PAD_MS * idle)
    loaded_rates, pads = [], []
    for _ in range(DRIFT_ROUNDS):  # each pad queued right behind attention, as a pad follows a block's arithmetic
        attention(2)
        probe = _timed(lambda: torch.cuda._sleep(cycles))
        attention(2)
        used = _timed(lambda: spin.spin(PAD_MS / 1e3, device))
        torch.cuda.synchronize(device)
        probe_ms = probe[0].elapsed_time(probe[1])
        loaded_rates.append(cycles / probe_ms)
        pads.append(used[0].elapsed_time(used[1]) / PAD_MS)
        if clock == spin.SM_CYCLES:  # what the emulated kernel's settle does after each iteration
            spin.correct(device, [(cycles, probe_ms)])
    loaded = statistics.median(loaded_rates)
    change = (loaded - idle) / idle
    worst = drift_error(clock, pads)
    facts = [f"pads by {clock}" + ("" if clock == spin.GLOBALTIMER else
                                   f" ({spin.status(device).get('spin_timer_unused', '')})") + f": {PAD_MS:g} ms "
             f"pads queued right behind attention after {busy:.1f} s of it ({calls} fwd+bwd calls, bf16 B=1 H=32 "
             f"S=8192 D=128) lasted {', '.join(f'{p:.3f}' for p in pads)} times their duration"
             + ("" if clock == spin.GLOBALTIMER else " (the first at the idle rate, then corrected)")
             + f"; judged within {100 * DRIFT_LIMIT:g}%: {'pass' if worst <= DRIFT_LIMIT else 'FAIL'}",
             f"SM-cycle spin rate {idle:,.0f} cycles/ms at idle and {loaded:,.0f} under load: {100 * change:+.2f}% "
             "(a pad counted in cycles calibrated at idle is off by that much under load)"]  # fmt: skip
    if clock_idle and clock_loaded:
        facts.append(f"SM clock {clock_idle[0]} MHz at idle, {clock_loaded[0]} MHz under load; temperature "
                     f"{clock_idle[1]} -> {clock_loaded[1]} C (NVML)")  # fmt: skip
    else:
        facts.append("SM clock and temperature not read (NVML unavailable)")
    emit("spin-drift", worst <= DRIFT_LIMIT, facts, clock=clock, idle=idle, loaded=loaded, pads=pads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["kernels", "timing", "drift", "all", "coverage"])
    parser.add_argument("out", nargs="?", default=tempfile.gettempdir())
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seconds", type=float, default=DRIFT_S, help="drift: seconds of attention")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "coverage":
        from gpu_coverage import coverage

        coverage(args.dry_run)
        return 0
    if args.what in ("kernels", "all"):
        kernels(args.dry_run, out)
    if args.what in ("timing", "all"):
        timing(out, args.dry_run)
    if args.what in ("drift", "all"):
        drift(args.seconds, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
