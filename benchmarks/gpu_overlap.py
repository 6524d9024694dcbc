"""The overlap check of the one-GPU check: what CUPTI sees of a 1-rank NCCL loopback ring, sync against double.

A shape is sized so that the loopback transfer of one block takes at least TARGET_MS, *measured at the shape
chosen* (larger messages move faster: a rate taken at another shape would mislead), and its forward attention
about 1.3 times that. Three cases then run one profiled iteration each, forward and backward: ``sync`` (the
transfer, then the compute), ``double`` (the transfer beside the compute) and ``double+spins`` (the emulated kernel
padding to a modelled time, and a 3 ms link delay held on the comm stream).

Judged, per phase, *relatively* (as ``--gpus N`` judges a node): sync must serialise (CUPTI overlap at most
SYNC_MAX) and each double case must hide at least GAIN more of the transfer than sync did. The loopback SendRecv
is an SM copy that competes with the attention for SMs and memory, so an absolute floor on double's share would
fail a correct engine on a busy GPU; what matters is the difference the buffer makes. In the backward, the share is
of the K/V transfer: its dK/dV go on a communicator of their own after the step's compute (on one rank nothing is
left to compute beside them). The forward's transfer must last at least FLOOR_MS; the backward's edges are
reported, not judged (no GPU has measured them yet).

The forward's edges: the recorder's marks (CUDA events) against the kernels CUPTI saw, after one shift for the whole
step (the two clocks differ by a constant) taken from the edges tied to a kernel beside their mark (gpu_timing's
TWO_SIDED: the compute span's start and end, the transfer's end). Each may be off by ``edge_tolerance_us``: the
larger of EDGE_FLOOR_US and EDGE_SHARE of the transfer measured. The floor is 100 times the resolution of CUDA
event timing (EVENT_RESOLUTION_US) and covers what separates a mark from the kernel beside it on the device (a
kernel's start after the event before it, one cross-stream dependency: microseconds each); the share bounds what an
edge may move the figures the recorder feeds (an edge off by 0.5% of the transfer moves the overlap share by at most
about one point), which matters once a transfer is longer than 10 ms. The transfer's *start* mark says when the
NCCL kernel could start (its stream was released): in ``sync`` nothing computes beside it and it is judged like the
others; beside the attention (the double cases) the NCCL kernel may wait for SMs the attention holds, so there it
must not start before its mark (an ordering fault) and its lag is reported. nccl_ms (NCCL's own start and end events
around its kernel, on its stream) must lie between the SendRecv kernel's CUPTI time and that time plus the lag,
within the edge tolerance at each end: its start event fires when the stream is released, before any wait for SMs.
"""

from __future__ import annotations

import contextlib
import math
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

TARGET_MS, FLOOR_MS = 8.0, 5.0  # the transfer sized for, and the least one judged
SYNC_MAX, GAIN = 0.2, 0.6  # sync's overlap at most; double's at least this much more than sync's
EVENT_RESOLUTION_US = 0.5  # CUDA's cudaEventElapsedTime resolves about half a microsecond
EDGE_FLOOR_US = 100 * EVENT_RESOLUTION_US
EDGE_SHARE = 0.005  # of the transfer: an edge off by this moves the overlap share by at most about a point
UNITS = 40  # q-sized bf16 buffers a fwd+bwd iteration holds at most (K/V stacks, fp32 dK/dV travelling, grads)
MEMORY_SHARE = 0.7  # of the free memory, for those buffers


def _event_ms(fn, repeats: int = 3) -> float:
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


def _measure(device, heads: int, length: int, head_dim: int) -> tuple[float, float]:
    """(loopback transfer ms of one block's K/V, flash forward ms) at exactly this shape."""
    import torch.distributed as dist

    from ringbench.kernels.torch_sdpa import flash_forward

    kv = torch.randn(2, 1, heads, length, head_dim, device=device, dtype=torch.bfloat16)
    recv = torch.empty_like(kv)
    q = torch.randn(1, heads, length, head_dim, device=device, dtype=torch.bfloat16)

    def exchange(kv=kv, recv=recv) -> None:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, 0), dist.P2POp(dist.irecv, recv, 0)]):
            work.wait()

    exchange()
    transfer_ms = _event_ms(exchange)
    attention_ms = _event_ms(lambda q=q, kv=kv: flash_forward(q, kv[0], kv[1], False, head_dim**-0.5))
    del kv, recv, q
    torch.cuda.empty_cache()
    return transfer_ms, attention_ms


def size_case(device) -> dict:
    """A shape whose loopback transfer takes at least TARGET_MS and whose attention about 1.3 times that.

    Per hop 2 B H L D x 2 bytes move; attention over the block (mask none) costs 4 B H L^2 D FLOPs, so compute /
    transfer = L x bandwidth / FLOP rate: L sets the ratio, H the length. Both rates are measured, the choice is
    refined once, then the chosen shape itself is measured and its heads grown until the transfer is long enough
    (within memory)."""
    head_dim, heads, length = 128, 64, 4096
    free, _ = torch.cuda.mem_get_info(device)
    for _ in range(2):
        transfer_ms, attention_ms = _measure(device, heads, length, head_dim)
        bandwidth = 2 * 2 * heads * length * head_dim / (transfer_ms / 1e3)  # bytes/s
        rate = 4 * heads * length**2 * head_dim / (attention_ms / 1e3)  # FLOP/s
        length = int(min(32768, max(512, round(1.3 * rate / bandwidth / 128) * 128)))
        most = int(MEMORY_SHARE * free / (UNITS * length * head_dim * 2))
        heads = int(min(most, max(8, math.ceil(1.1 * TARGET_MS / 1e3 * bandwidth / (4 * length * head_dim)))))
    for _ in range(3):  # the final shape, measured: larger messages move faster than the rate taken above
        transfer_ms, attention_ms = _measure(device, heads, length, head_dim)
        if transfer_ms >= TARGET_MS or heads >= most:
            break
        heads = int(min(most, math.ceil(heads * 1.1 * TARGET_MS / transfer_ms)))
    return {"heads": heads, "length": length, "head_dim": head_dim, "transfer_ms": transfer_ms,
            "memory_bound": transfer_ms < TARGET_MS and heads >= most,
            "attention_ms": attention_ms, "bandwidth_gbps": 4 * heads * length * head_dim / (transfer_ms / 1e3) / 1e9,
            "attention_tflops": 4 * heads * length**2 * head_dim / (attention_ms / 1e3) / 1e12}  # fmt: skip


def _phase(events, rows: list[dict], phase: str) -> dict:
    """What the profiler and the recorder saw of one phase's step 0."""
    sys.path.insert(0, str(HERE))
    from gpu_timing import TWO_SIDED, edge_offsets, overlap, profiled_edges, recorded_edges, step_kernels

    from ringbench.markers import step_marker

    kernels = step_kernels(events, step_marker(phase, 0))
    recorded, profiled = recorded_edges(rows, phase), profiled_edges(kernels)
    offsets, shift_us = edge_offsets(recorded, profiled, anchors=TWO_SIDED)
    judged = kernels.first_comm() if phase == "bwd" else kernels
    span = kernels.transfer_span
    nccl_ms = [
        r["nccl_ms"] for r in rows if r["kind"] == "recv" and r["phase"] == phase and not math.isnan(r["nccl_ms"])
    ]
    return {"overlap": overlap(judged), "offsets_us": offsets, "shift_us": shift_us, "nccl_ms": nccl_ms,
            "sendrecv_ms": sum(b - a for a, b, _ in judged.nccl) / 1e6,
            "kernels": {"compute": len(kernels.compute), "nccl": len(kernels.nccl),
                        "comm_spins": len(kernels.comm_spins)},
            "transfer_ms": (span[1] - span[0]) / 1e6 if span else None,
            "compute_ms": (kernels.compute_span[1] - kernels.compute_span[0]) / 1e6 if kernels.compute_span else None,
            "recorded_recv_ms": (recorded["transfer end"] - recorded["transfer start"]) / 1e6
            if "transfer start" in recorded else None}  # fmt: skip


def _run(name: str, settings: dict, inputs, device, timeline, out: Path) -> dict:
    """Two unprofiled iterations, then one profiled, forward and backward; the phases of the profiled one."""
    from ringbench.engine.api import build_context, ring_attention
    from ringbench.engine.spec import AttentionSpec, Runtime
    from ringbench.kernels import get_kernel, spin
    from ringbench.rank.injection import RankFaults
    from ringbench.rank.profiling import ProfileCapture
    from ringbench.rank.runner import RunRecorder
    from ringbench.traces.kineto import read_kineto_trace

    q, k, v, dout = inputs
    recorder = RunRecorder(0, 0, None, RankFaults(rank=0), trace=True, timeline=timeline)
    kernel = get_kernel(settings["kernel"])
    spec = AttentionSpec(mask="none", layout="contiguous", buffer=settings["buffer"], kernel=kernel)
    runtime = Runtime(recorder=recorder, timeline=timeline, loopback=True, link_delay=settings["link_delay"])
    ctx = build_context(q, k, v, spec, runtime)
    path = out / f"overlap-{name}.json.gz"
    try:
        for iteration in (-2, -1, 0):
            recorder.iteration = iteration
            capture = ProfileCapture(path, device) if iteration == 0 else None
            with capture if capture is not None else contextlib.nullcontext():
                recorder.capture = capture
                timeline.begin_iteration()
                if device.type == "cuda":
                    spin.spin(0.002, device)  # queued ahead: the host stays ahead of the device, as in a loop
                result = ring_attention(q, k, v, context=ctx)
                torch.autograd.grad(result, (q, k, v), dout)
                for comm in ctx.comms():
                    comm.settle(60.0)
                timeline.settle(60.0)
                recorder.capture = None
            recorder.finish_iteration()
            if hasattr(kernel, "settle"):
                kernel.settle()
    finally:
        for comm in ctx.comms():
            comm.close()
    rows = [row for row in recorder.rows if row["iteration"] == 0]
    events = read_kineto_trace(path).events
    return {phase: _phase(events, rows, phase) for phase in ("fwd", "bwd")}


def judge(results: dict[str, dict[str, dict]], memory_bound: bool = False) -> tuple[bool, list[str]]:
    """(passed, facts) from each case's phases (``_phase``): module docstring. ``memory_bound``: the sizing could
    not make the transfer longer within memory (a fast loopback): the floor is then stated, not judged."""
    ok, facts = True, []
    for phase in ("fwd", "bwd"):
        shares = {name: phases[phase]["overlap"] for name, phases in results.items()}
        missing = [name for name, phases in results.items() if shares[name] is None
                   or phases[phase]["compute_ms"] is None]  # fmt: skip
        if missing:
            ok = False
            facts += [f"{phase} {name}: the profiler showed {results[name][phase]['kernels']} in the step: nothing to "
                      "measure overlap on" for name in missing]  # fmt: skip
            continue
        sync = shares["sync"]
        serial = sync <= SYNC_MAX
        gains = {name: share - sync for name, share in shares.items() if name != "sync"}
        hidden = all(gain >= GAIN for gain in gains.values())
        ok = ok and serial and hidden
        what = "the K/V transfer's" if phase == "bwd" else "the transfer's"
        facts.append(f"{phase}: CUPTI overlap ({what} share under compute): sync {sync:.2f} (at most {SYNC_MAX:g}: "
                     f"{'pass' if serial else 'FAIL'}); " + "; ".join(
                         f"{name} {shares[name]:.2f}, {gain:+.2f} over sync (at least +{GAIN:g}: "
                         f"{'pass' if gain >= GAIN else 'FAIL'})" for name, gain in gains.items()))  # fmt: skip
    for name, phases in results.items():
        fwd = phases["fwd"]
        if fwd["transfer_ms"] is not None:
            long_enough = fwd["transfer_ms"] >= FLOOR_MS
            ok = ok and (long_enough or memory_bound)
            floor = (f">= {FLOOR_MS:g} ms" if long_enough else f"under {FLOOR_MS:g} ms: the memory allows no larger "
                     "block, not judged" if memory_bound else f"under {FLOOR_MS:g} ms: FAIL")  # fmt: skip
            facts.append(f"fwd {name}: transfer {fwd['transfer_ms']:.2f} ms ({floor}), compute {fwd['compute_ms']:.2f} "
                         "ms")  # fmt: skip
        edges_ok, edge_facts = judge_edges(name, phases)
        ok = ok and edges_ok
        facts += edge_facts
    return ok, facts


def edge_tolerance_us(transfer_ms: float | None) -> float:
    """How far a judged edge may be off, in us (module docstring): the floor, or a share of a long transfer."""
    return max(EDGE_FLOOR_US, EDGE_SHARE * 1e3 * (transfer_ms or 0.0))


def judge_edges(name: str, phases: dict) -> tuple[bool, list[str]]:
    """(passed, facts) of one case's recorder edges and nccl_ms (module docstring): the forward's judged, the
    backward's reported."""
    sys.path.insert(0, str(HERE))
    from gpu_timing import TWO_SIDED

    ok, facts = True, []
    for phase, judged in (("fwd", True), ("bwd", False)):
        result = phases[phase]
        offsets = result["offsets_us"]
        tol = edge_tolerance_us(result["transfer_ms"])
        beside = name != "sync"  # the transfer ran beside the attention: its start is one-sided
        two_sided = [e for e in (*TWO_SIDED, *(() if beside else ("transfer start",))) if e in offsets]
        bad = [e for e in two_sided if abs(offsets[e]) > tol]
        lag = offsets.get("transfer start")
        if beside and lag is not None and lag < -tol:
            bad.append("transfer start")
        shown = ", ".join(f"{edge} {offsets[edge]:+.1f}" for edge in two_sided)
        start = (f"; transfer start {lag:+.1f} us (the NCCL kernel may wait for SMs the attention holds: judged "
                 "only not before its mark)" if beside and lag is not None else "")  # fmt: skip
        if judged:
            ok = ok and not bad
            verdict = "pass" if not bad else f"FAIL: {', '.join(bad)}"
        else:
            verdict = "reported, not judged"
        facts.append(f"{phase} {name}: recorder vs profiler edges after one shift ({result['shift_us']:.1f} us): "
                     f"{shown} us within +-{tol:.0f} us{start} ({verdict})")  # fmt: skip
    fwd = phases["fwd"]
    if not fwd["nccl_ms"]:
        facts.append(f"fwd {name}: nccl_ms not measured (TORCH_NCCL_ENABLE_TIMING unset, or NCCL gave no duration)")
        return ok, facts
    nccl, kernel_ms = fwd["nccl_ms"][0], fwd["sendrecv_ms"]
    tol_ms = edge_tolerance_us(fwd["transfer_ms"]) / 1e3
    wait_ms = max(0.0, fwd["offsets_us"].get("transfer start", 0.0)) / 1e3
    low, high = kernel_ms - tol_ms, kernel_ms + wait_ms + tol_ms
    agree = low <= nccl <= high
    ok = ok and agree
    facts.append(f"fwd {name}: nccl_ms {nccl:.3f} ms against the SendRecv kernel {kernel_ms:.3f} ms "
                 f"({'agree' if agree else 'DISAGREE'}: allowed {low:.3f}-{high:.3f} ms, the kernel plus its wait "
                 f"after the mark of {1e3 * wait_ms:.0f} us, +-{1e3 * tol_ms:.0f} us) and the recorded receive span "
                 f"{fwd['recorded_recv_ms']:.3f} ms")  # fmt: skip
    return ok, facts


def overlap_check(device, out: Path, dry: bool, emit) -> None:
    from ringbench.engine.timeline import timeline_for
    from ringbench.kernels import spin
    from ringbench.kernels.torch_sdpa import fused_ops_problem

    missing = (fused_ops_problem() or spin.missing()) if device.type == "cuda" else None
    if missing:
        emit("overlap", None, [f"not checked: {missing}"])
        return
    if dry:
        shape = {"heads": 1, "length": 128, "head_dim": 16}
    else:
        shape = size_case(device)
    heads, length, head_dim = shape["heads"], shape["length"], shape["head_dim"]
    timeline = timeline_for(device)
    generator = torch.Generator(device=device).manual_seed(7)
    inputs = [torch.randn(1, heads, length, head_dim, generator=generator, device=device, dtype=torch.bfloat16)
              for _ in range(4)]  # fmt: skip
    for t in inputs[:3]:
        t.requires_grad_()
    attention_ms = shape.get("attention_ms", math.nan)
    modelled_rate = 4 * heads * length**2 * head_dim / (1.5 * attention_ms / 1e3) / 1e9 if not dry else 50.0
    cases = {  # GFLOP/s of the emulated kernel: its forward takes 1.5 times the real attention
        "sync": dict(buffer="sync", kernel="torch", link_delay=None),
        "double": dict(buffer="double", kernel="torch", link_delay=None),
        "double+spins": dict(
            buffer="double", kernel=f"emulated:{modelled_rate:.6g}", link_delay=lambda src, dst, nbytes: 0.003
        ),
    }
    results = {name: _run(name, settings, inputs, device, timeline, out) for name, settings in cases.items()}
    if dry:
        parsed = ", ".join(f"{n} {p}: {r[p]['kernels']['compute']} compute / {r[p]['kernels']['nccl']} NCCL kernels"
                           for n, r in results.items() for p in r)  # fmt: skip
        emit("overlap", None, [f"not checked: a CPU trace has no CUDA kernels (dry run: 3 profiled loopback "
                               f"iterations, forward and backward, were captured and parsed; {parsed})"],
             results=results)  # fmt: skip
        return
    ok, facts = judge(results, shape["memory_bound"])
    facts.insert(0, f"sizing (measured at the shape used): loopback SendRecv {shape['transfer_ms']:.2f} ms "
                    f"({shape['bandwidth_gbps']:.0f} GB/s), flash forward {shape['attention_ms']:.2f} ms "
                    f"({shape['attention_tflops']:.0f} TFLOP/s) -> B=1 H={heads} L={length} D={head_dim} bf16, mask "
                    "none, forward and backward; a 2 ms spin queued ahead of each profiled iteration")  # fmt: skip
    emit("overlap", ok, facts, results=results, shape=shape)


__all__ = ["edge_tolerance_us", "judge", "judge_edges", "overlap_check", "size_case"]
