"""The measurements of the one-GPU check, one subcommand each (benchmarks/gpu_check.py runs them as children).

    python benchmarks/gpu_probe.py kernels [--dry-run]      # cold Triton compile; kernels at realistic blocks
    python benchmarks/gpu_probe.py timing OUT [--dry-run]   # no host sync (sync debug mode); overlap and edges
    python benchmarks/gpu_probe.py drift [--dry-run]        # the spin rate before and after 30 s of attention
    python benchmarks/gpu_probe.py all OUT --dry-run        # the three in one process (the dry run's way)

Each finished measurement prints one line ``GPU_CHECK_RESULT {json}``: its name, ``ok`` (true, false, or null for
"could not check"), and ``facts``, sentences each of which states a number measured here or says plainly what was
not measured. A deadline that kills the child loses only what had not finished. ``--dry-run``: tiny shapes on the
CPU, through the same code, to exercise it; every GPU figure then says it was not measured.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULT = "GPU_CHECK_RESULT "
HERE = Path(__file__).resolve().parent


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


KERNEL_DTYPES = ("float16", "bfloat16", "float32")
KERNEL_CASES = (("causal-naive", "contiguous"), ("causal", "striped"))


def _pair_blocks(seq: int):
    """Every (mask, layout, rank, owner, plan) of a 2-rank ring over ``seq`` tokens, in the checks' order."""
    from ringbench.engine.plan import pair_plan
    from ringbench.vocab import Layout, Mask

    for mask, layout in KERNEL_CASES:
        for rank, owner in ((0, 0), (0, 1), (1, 0), (1, 1)):
            yield mask, layout, rank, owner, pair_plan(Mask.parse(mask), Layout.parse(layout), seq, 2, rank, owner)


def compile_one(dtype_name: str) -> None:
    """Child of ``compile_first``: every Triton variant the correctness check needs for one dtype, on blocks of
    the same shape classes (lengths divisible by 16 or not, the same masks) at seq 256: the cache it fills is the
    one the check then reads (TRITON_CACHE_DIR)."""
    from ringbench.engine.layout import shard
    from ringbench.kernels import get_kernel

    device, dtype = torch.device("cuda"), getattr(torch, dtype_name)
    kernel = get_kernel("triton")
    started = time.perf_counter()
    q, k, v, dout = (torch.randn(1, 2, 256, 128, device=device, dtype=dtype) for _ in range(4))
    for _, layout, rank, owner, plan in _pair_blocks(256):
        q_l, dout_l = shard(q, layout, 2, rank), shard(dout, layout, 2, rank)
        k_o, v_o = shard(k, layout, 2, owner), shard(v, layout, 2, owner)
        for block in plan.blocks:
            rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
            args = (q_l[:, :, rows].contiguous(), k_o[:, :, cols].contiguous(), v_o[:, :, cols].contiguous())
            out, lse = kernel.forward(*args, block.mask, 128**-0.5)
            kernel.backward(dout_l[:, :, rows].contiguous(), *args, out, lse, block.mask, 128**-0.5)
    torch.cuda.synchronize()
    print(json.dumps({"dtype": dtype_name, "seconds": time.perf_counter() - started}), flush=True)


def compile_first(dtypes: list[str]) -> None:
    """Compile the Triton variants of every dtype at once, one child each (Triton compiles on the host: the cold
    compile takes the longest dtype's time, not their sum), and report each dtype as it finishes."""
    import subprocess

    started = time.perf_counter()
    children = {name: subprocess.Popen([sys.executable, __file__, "compile", name], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True) for name in dtypes}  # fmt: skip
    seconds, problems = {}, []
    while children:
        for name, child in list(children.items()):
            if child.poll() is None:
                continue
            out, err = child.communicate()
            del children[name]
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if child.returncode == 0 and lines:
                seconds[name] = json.loads(lines[-1])["seconds"]
                print(f"gpu_probe: triton {name} compiled in {seconds[name]:.1f} s", file=sys.stderr, flush=True)
            else:
                problems.append(f"{name}: exit {child.returncode}: {(err.strip().splitlines() or ['?'])[-1][:200]}")
        time.sleep(0.2)
    wall = time.perf_counter() - started
    shown = ", ".join(f"{name} {sec:.1f} s" for name, sec in seconds.items())
    facts = [f"cold Triton compile (a fresh cache; every variant the correctness check needs, fwd + bwd at D=128, "
             f"the dtypes side by side): {shown or 'none finished'}; {wall:.1f} s in all"]  # fmt: skip
    facts += [f"compile failed: {problem}" for problem in problems]
    emit("triton-compile", not problems, facts, seconds=seconds, wall_s=wall)


def kernels(dry: bool) -> None:
    """Correctness at realistic blocks, one result per dtype as each finishes (a deadline keeps those done); on a
    GPU the Triton variants are compiled first, all dtypes at once."""
    from ringbench.kernels import get_kernel

    device = torch.device("cpu" if dry else "cuda")
    batch, heads, head_dim, seq = (1, 1, 16, 128) if dry else (1, 32, 128, 8192)  # world 2: blocks of seq / 2
    names = ["torch"]
    try:
        get_kernel("triton").check(head_dim, torch.float32, device)
        names.append("triton")
        triton_missing = ""
    except Exception as exc:
        triton_missing = str(exc).splitlines()[0]
    if "triton" in names and not dry:
        compile_first(list(KERNEL_DTYPES))
    else:
        emit("triton-compile", None, ["not measured: cold Triton compile time ("
                                      + ("dry run: Triton's interpreter does not compile" if dry else
                                         triton_missing) + ")"])  # fmt: skip
    for dtype_name in KERNEL_DTYPES:
        _dtype_correctness(dtype_name, names, device, (batch, heads, head_dim, seq), dry, triton_missing)


def _dtype_correctness(dtype_name: str, names, device, shape, dry: bool, triton_missing: str) -> None:
    from ringbench.engine.layout import shard
    from ringbench.kernels import get_kernel
    from ringbench.vocab import TOLERANCE

    batch, heads, head_dim, seq = shape
    dtype, scale = getattr(torch, dtype_name), head_dim**-0.5
    worst: dict[str, list[float]] = {}
    blocks_seen = 0
    (q, k, v, dout), exact = _inputs(batch, heads, seq, head_dim, dtype, device, seed=19)
    for _, layout, rank, owner, plan in _pair_blocks(seq):
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
                fwd = (out.double() - want[0]).abs().max().item()
                bwd = max((g.double() - w).abs().max().item() for g, w in zip(grads, want[2:], strict=True))
                entry = worst.setdefault(name, [0.0, 0.0])
                entry[0], entry[1] = max(entry[0], fwd), max(entry[1], bwd)
            del want
    if device.type == "cuda":
        torch.cuda.empty_cache()
    where = "CPU stand-in (dry run), " if dry else ""
    facts = [f"{where}{dtype_name}: {blocks_seen} blocks of {seq // 2}x{seq // 2} tokens (every pair of a 2-rank ring, "
             f"causal-naive contiguous and causal striped: full, causal and partial masks, an empty row), B={batch} "
             f"H={heads} D={head_dim}, against float64 (ringbench's check tolerances)"]  # fmt: skip
    ok = True
    fwd_tol, bwd_tol = TOLERANCE[dtype_name]
    for name, (fwd, bwd) in sorted(worst.items()):
        passed = fwd <= fwd_tol and bwd <= bwd_tol
        ok = ok and passed
        facts.append(f"{name} {dtype_name}: max |err| fwd {fwd:.2e} (tol {fwd_tol:g}), bwd {bwd:.2e} (tol {bwd_tol:g})"
                     f" {'pass' if passed else 'FAIL'}")  # fmt: skip
    if triton_missing:
        facts.append(f"triton not checked: {triton_missing}")
    if dry:
        facts.append("not measured: kernels on a GPU (dry run: the CPU flash op and Triton's interpreter stand in)")
    emit(f"correctness-{dtype_name}", ok if not dry else None, facts,
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
    try:
        get_kernel("triton").check(head_dim, dtype, device)
    except Exception as exc:
        configs = [c for c in configs if c[0] != "triton"]
        triton_note = f"; triton not in it ({str(exc).splitlines()[0]})"
    else:
        triton_note = ""
    timeline = timeline_for(device)
    q, k, v, dout = _device_inputs(batch, heads, seq, head_dim, dtype, device, seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    delay = lambda src, dst, nbytes: 0.0005  # noqa: E731 -- a 0.5 ms link delay: a spin on the comm stream
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


def _event_ms(device, fn, repeats: int = 3) -> float:
    """Median device time of ``fn`` in ms (CUDA events around it)."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _size_overlap_case(device: torch.device) -> dict:
    """A shape whose loopback transfer takes at least 5 ms and whose attention takes about 1.3 times that.

    Per hop 2 B H L D x 2 bytes move; attention over the block (mask none) costs 4 B H L^2 D FLOPs, so compute /
    transfer = L x bandwidth / FLOP rate: L sets the ratio, B H the length. Both rates are measured here, at the
    shape chosen, and the choice is refined once."""
    import torch.distributed as dist

    from ringbench.kernels.torch_sdpa import flash_forward

    head_dim, heads, length = 128, 64, 4096
    free, _ = torch.cuda.mem_get_info(device)
    for _ in range(2):
        kv = torch.randn(2, 1, heads, length, head_dim, device=device, dtype=torch.bfloat16)
        recv = torch.empty_like(kv)

        def exchange(kv=kv, recv=recv) -> None:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, 0), dist.P2POp(dist.irecv, recv, 0)]):
                work.wait()

        q = torch.randn(1, heads, length, head_dim, device=device, dtype=torch.bfloat16)
        exchange()
        transfer_ms = _event_ms(device, exchange)
        attention_ms = _event_ms(device, lambda q=q, kv=kv: flash_forward(q, kv[0], kv[1], False, head_dim**-0.5))
        bandwidth = kv.numel() * kv.element_size() / (transfer_ms / 1e3)  # bytes/s
        rate = 4 * heads * length**2 * head_dim / (attention_ms / 1e3)  # FLOP/s
        length = int(min(32768, max(512, round(1.3 * rate / bandwidth / 128) * 128)))
        # The ring holds about ten q-sized buffers (q, k, v, the K/V stack and its spare, the fp32 accumulator, out):
        # at most half the free memory.
        most = int(0.5 * free / (10 * length * head_dim * 2))
        heads = int(min(most, max(8, math.ceil(6e-3 * bandwidth / (4 * length * head_dim)))))
        del kv, recv, q
        torch.cuda.empty_cache()
    return {"heads": heads, "length": length, "head_dim": head_dim, "bandwidth_gbps": bandwidth / 1e9,
            "attention_tflops": rate / 1e12}  # fmt: skip


def overlap_check(device: torch.device, out: Path, dry: bool) -> None:
    sys.path.insert(0, str(HERE))
    from gpu_timing import edge_residuals, overlap, profiled_edges, recorded_edges, step_kernels

    from ringbench.engine.api import build_context, ring_attention
    from ringbench.engine.spec import AttentionSpec, Runtime
    from ringbench.engine.timeline import timeline_for
    from ringbench.kernels import BlockMask, MaskKind, get_kernel, spin
    from ringbench.markers import step_marker
    from ringbench.rank.injection import RankFaults
    from ringbench.rank.profiling import ProfileCapture
    from ringbench.rank.runner import RunRecorder
    from ringbench.traces.kineto import read_kineto_trace

    if dry:
        shape = {"heads": 1, "length": 128, "head_dim": 16, "bandwidth_gbps": math.nan, "attention_tflops": math.nan}
    else:
        shape = _size_overlap_case(device)
    heads, length, head_dim = shape["heads"], shape["length"], shape["head_dim"]
    timeline = timeline_for(device)
    q, k, v = _device_inputs(1, heads, length, head_dim, torch.bfloat16, device, seed=7, count=3)
    full = BlockMask(MaskKind.FULL)
    attention_ms = math.nan if dry else _event_ms(device, lambda: get_kernel("torch").forward(q, k, v, full, 0.1))
    flops = 4 * heads * length**2 * head_dim
    modelled_rate = flops / (1.5 * attention_ms / 1e3) / 1e9 if not dry else 50.0  # GFLOP/s: 1.5x the real time
    cases = {
        "sync": dict(buffer="sync", kernel="torch", link_delay=None),
        "double": dict(buffer="double", kernel="torch", link_delay=None),
        "double+spins": dict(
            buffer="double", kernel=f"emulated:{modelled_rate:.6g}", link_delay=lambda src, dst, nbytes: 0.003
        ),
    }
    results, facts, ok = {}, [], True
    for name, settings in cases.items():
        recorder = RunRecorder(0, 0, None, RankFaults(rank=0), trace=True, timeline=timeline)
        kernel = get_kernel(settings["kernel"])
        ctx = build_context(q, k, v, AttentionSpec(mask="none", layout="contiguous", buffer=settings["buffer"],
                                                   kernel=kernel),
                            Runtime(recorder=recorder, timeline=timeline, loopback=True,
                                    link_delay=settings["link_delay"]))  # fmt: skip
        path = out / f"overlap-{name}.json.gz"
        try:
            with torch.no_grad():
                for iteration in (-2, -1, 0):
                    recorder.iteration = iteration
                    capture = ProfileCapture(path, device) if iteration == 0 else None
                    with capture if capture is not None else _null():
                        recorder.capture = capture
                        timeline.begin_iteration()
                        if device.type == "cuda":
                            spin.spin(0.002, device)  # queued ahead: the host stays ahead of the device, as in a loop
                        ring_attention(q, k, v, context=ctx)
                        ctx.comm.settle(60.0)
                        timeline.settle(60.0)
                        recorder.capture = None
                    recorder.finish_iteration()
                    if hasattr(kernel, "settle"):
                        kernel.settle()
        finally:
            ctx.comm.close()
        rows = [row for row in recorder.rows if row["iteration"] == 0]
        events = read_kineto_trace(path).events
        kernels = step_kernels(events, step_marker("fwd", 0))
        recorded, profiled = recorded_edges(rows), profiled_edges(kernels)
        residuals, shift_us = edge_residuals(recorded, profiled)
        share = overlap(kernels)
        nccl_ms = [row["nccl_ms"] for row in rows if row["kind"] == "recv" and not math.isnan(row["nccl_ms"])]
        results[name] = {"overlap": share, "residuals_us": residuals, "shift_us": shift_us, "nccl_ms": nccl_ms,
                         "sendrecv_ms": sum(b - a for a, b, _ in kernels.nccl) / 1e6,
                         "kernels": {"compute": len(kernels.compute), "nccl": len(kernels.nccl),
                                     "comm_spins": len(kernels.comm_spins)},
                         "transfer_ms": (kernels.transfer_span[1] - kernels.transfer_span[0]) / 1e6
                         if kernels.transfer_span else None,
                         "compute_ms": (kernels.compute_span[1] - kernels.compute_span[0]) / 1e6
                         if kernels.compute_span else None,
                         "recorded_recv_ms": (recorded["transfer end"] - recorded["transfer start"]) / 1e6
                         if "transfer start" in recorded else None}  # fmt: skip
    if dry:
        parsed = ", ".join(f"{n}: {r['kernels']['compute']} compute / {r['kernels']['nccl']} NCCL kernels"
                           for n, r in results.items())  # fmt: skip
        emit("overlap", None, [f"not checked: a CPU trace has no CUDA kernels (dry run: 3 profiled loopback "
                               f"iterations were captured and parsed; {parsed})"], results=results)  # fmt: skip
        return
    facts.append(f"sizing (measured): loopback SendRecv {shape['bandwidth_gbps']:.0f} GB/s, flash {shape['attention_tflops']:.0f} "
                 f"TFLOP/s -> B=1 H={heads} L={length} D={head_dim} bf16, mask none, forward; a 2 ms spin queued "
                 "ahead of each profiled iteration")  # fmt: skip
    expected = {"sync": (0.0, 0.1), "double": (0.8, 1.0), "double+spins": (0.8, 1.0)}
    for name, result in results.items():
        share, low_high = result["overlap"], expected[name]
        if share is None or result["transfer_ms"] is None or result["compute_ms"] is None:
            ok = False
            facts.append(f"{name}: the profiler showed {result['kernels']} in the step: nothing to measure overlap on")
            continue
        judged = low_high[0] <= share <= low_high[1]
        long_enough = result["transfer_ms"] >= 5.0
        worst = max(result["residuals_us"].values()) if result["residuals_us"] else math.nan
        edges_ok = worst <= 50.0
        ok = ok and judged and long_enough and edges_ok
        facts.append(f"{name}: CUPTI overlap {share:.2f} (expected {low_high[0]:g}-{low_high[1]:g}) "
                     f"{'pass' if judged else 'FAIL'}; transfer {result['transfer_ms']:.2f} ms "
                     f"({'>= 5 ms' if long_enough else 'under 5 ms: FAIL'}), compute {result['compute_ms']:.2f} ms")  # fmt: skip
        shown = ", ".join(f"{edge} {us:.1f}" for edge, us in result["residuals_us"].items())
        facts.append(f"{name}: recorder vs profiler edges after one shift ({result['shift_us']:.1f} us): {shown} us; "
                     f"worst {worst:.1f} us {'pass' if edges_ok else 'FAIL'} (limit 50 us)")  # fmt: skip
        if result["nccl_ms"]:
            nccl, kernel_ms = result["nccl_ms"][0], result["sendrecv_ms"]
            agree = abs(nccl - kernel_ms) <= max(0.05, 0.05 * kernel_ms)
            ok = ok and agree
            facts.append(f"{name}: nccl_ms {nccl:.3f} ms against the SendRecv kernel {kernel_ms:.3f} ms "
                         f"({'agree' if agree else 'DISAGREE'} within max(50 us, 5%)) and the recorded receive span "
                         f"{result['recorded_recv_ms']:.3f} ms")  # fmt: skip
        else:
            facts.append(f"{name}: nccl_ms not measured (TORCH_NCCL_ENABLE_TIMING unset, or NCCL gave no duration)")
    emit("overlap", ok, facts, results=results, shape=shape)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


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
        overlap_check(device, out, dry)
    except Exception as exc:
        emit("overlap", False if not dry else None, [f"could not run ({backend}): {str(exc).splitlines()[0][:300]}"])
    import torch.distributed as dist

    dist.destroy_process_group()


# -- drift: the spin rate before and after sustained attention --------------------------------------------------------
def _nvml_clock() -> tuple[int, int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))  # fmt: skip
    except Exception:
        return None


def drift(seconds: float, dry: bool) -> None:
    if dry:
        emit("spin-drift", None, ["not measured: the spin rate is a GPU's (dry run)"])
        return
    from ringbench.kernels import spin
    from ringbench.kernels.torch_sdpa import flash_backward, flash_forward

    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    before = spin.calibrate(device)
    clock_before = _nvml_clock()
    q, k, v, dout = _device_inputs(1, 32, 8192, 128, torch.bfloat16, device, seed=3)
    started, calls = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        for _ in range(4):
            out, lse = flash_forward(q, k, v, True, 128**-0.5)
            flash_backward(dout, q, k, v, out, lse, True, 128**-0.5)
            calls += 1
        torch.cuda.synchronize(device)  # bounded queue; the clock is read after
    busy = time.monotonic() - started
    after = spin.calibrate(device)
    clock_after = _nvml_clock()
    change = (after - before) / before
    facts = [f"spin rate {before:,.0f} cycles/ms before and {after:,.0f} after {busy:.1f} s of attention "
             f"({calls} fwd+bwd calls, bf16 B=1 H=32 S=8192 D=128): {100 * change:+.2f}%"]  # fmt: skip
    if clock_before and clock_after:
        facts.append(f"SM clock {clock_before[0]} -> {clock_after[0]} MHz, temperature {clock_before[1]} -> "
                     f"{clock_after[1]} C (NVML)")  # fmt: skip
    else:
        facts.append("SM clock and temperature not read (NVML unavailable)")
    facts.append("a modelled duration calibrated before the load is off by that much after it"
                 + ("" if abs(change) <= 0.05 else ": more than 5%, FAIL"))  # fmt: skip
    emit("spin-drift", abs(change) <= 0.05, facts, before=before, after=after)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["kernels", "timing", "drift", "all", "compile", "coverage"])
    parser.add_argument("out", nargs="?", default=tempfile.gettempdir())
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--seconds", type=float, default=30.0, help="drift: seconds of attention")
    args = parser.parse_args(argv)
    if args.what == "compile":  # a child of compile_first: ``out`` is the dtype
        compile_one(str(args.out))
        return 0
    if args.what == "coverage":
        from gpu_coverage import coverage

        coverage(args.dry_run)
        return 0
    if args.what in ("kernels", "all"):
        kernels(args.dry_run)
    if args.what in ("timing", "all"):
        timing(Path(args.out), args.dry_run)
    if args.what in ("drift", "all"):
        drift(args.seconds, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
