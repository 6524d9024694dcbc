"""The stream timeline (the GPU timing path) driven on CPU by a fake runtime whose events complete late.

The real ring loop runs on gloo ranks with ``StreamTimeline(FakeRuntime())``: spans are marks (events) resolved
after the iteration; the tests assert the resolved spans and their order, that the compute stream waits on every
transfer's end mark before using the block, that nothing synchronises inside the loop, and that a transfer which
never completes is named (rank, phase, step) by the bounded settle and by the watchdog.
"""

import itertools
import math
import time

import pytest
import torch
from fake_streams import FakeRuntime, FakeStream

from ringbench.engine.api import build_context, reference_attention, ring_attention
from ringbench.engine.comm import RingComm, RingStall
from ringbench.engine.layout import shard
from ringbench.engine.recorder import ListRecorder
from ringbench.engine.spec import AttentionSpec, Runtime
from ringbench.engine.timeline import CudaRuntime, HostTimeline, StreamTimeline, timeline_for
from ringbench.kernels.spin import calibrate, spin
from ringbench.run.launch import launch_local


def test_marks_resolve_against_the_iteration_anchor_only_after_they_fire():
    runtime = FakeRuntime(lag_ms=5.0)
    timeline = StreamTimeline(runtime)
    anchor = timeline.begin_iteration()
    first = timeline.mark()
    time.sleep(0.002)
    second = timeline.mark("comm")
    assert not second.query()  # recorded, not yet fired: a GPU's event would not be either
    with pytest.raises(RuntimeError):
        timeline.resolve(second)
    assert timeline.settle(1.0) == []
    start, a, b = (timeline.resolve(m) for m in (anchor, first, second))
    assert start <= a < b and b - a >= 2_000_000
    assert second.stream is timeline.comm and first.stream is timeline.compute


def test_settle_is_bounded_and_returns_what_never_fired():
    runtime = FakeRuntime(lag_ms=0.0)
    timeline = StreamTimeline(runtime)
    timeline.begin_iteration()
    timeline.mark()
    runtime.stuck = {runtime.events_made}
    late = timeline.mark()
    started = time.monotonic()
    assert timeline.settle(0.05) == [late]
    assert time.monotonic() - started < 1.0


def test_host_timeline_marks_are_host_nanoseconds():
    timeline = HostTimeline()
    a = timeline.mark()
    b = timeline.mark("comm")
    assert isinstance(a, int) and a <= b and timeline.resolve(b) == b and timeline.settle(1.0) == []


def _ring_on_streams(worker_ctx, buffer: str, layout: str, device_timeline: bool = False):
    """One iteration of the real ring loop (forward and backward) on the stream timeline: fake events on CPU, or
    the rank's real device (a 1-rank NCCL ring exchanging with itself)."""
    env = worker_ctx.env
    world, rank = env.world, env.rank
    generator = torch.Generator().manual_seed(5)
    full = [torch.randn(1, 2, 8 * world, 4, generator=generator, dtype=torch.float64) for _ in range(4)]
    q, k, v, dout = (shard(t, layout, world, rank).to(env.device) for t in full)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    runtime = FakeRuntime(lag_ms=1.0)
    timeline = timeline_for(env.device) if device_timeline else StreamTimeline(runtime)
    recorder = ListRecorder(rank, rank, timeline=timeline)
    recorder.iteration = 0
    ctx = build_context(q, k, v, AttentionSpec(mask="causal", layout=layout, buffer=buffer),
                        Runtime(timeline=timeline, recorder=recorder, loopback=world == 1))  # fmt: skip
    start = timeline.begin_iteration()
    syncs_before = runtime.syncs
    if env.device.type == "cuda":
        torch.cuda.set_sync_debug_mode("error")  # any implicit host-device synchronisation in the loop raises
    out = ring_attention(q, k, v, context=ctx)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(env.device))
    end = timeline.mark()
    if env.device.type == "cuda":
        torch.cuda.set_sync_debug_mode("default")
    syncs_in_loop = runtime.syncs - syncs_before
    if ctx.comm is not None:
        ctx.comm.settle(10.0)
        ctx.comm.close()
    pending = timeline.settle(10.0)
    recv_marks = [row["end_ns"] for row in recorder.rows if row["kind"] == "recv"]
    # The fake streams keep the events the compute stream waited on; a real CUDA stream keeps no such list (there,
    # the exact result and the span order are what show the waits happened).
    waited = getattr(timeline.compute, "waited_events", None)
    all_recv_waited = None if waited is None else all(any(m is e for e in waited) for m in recv_marks)
    recorder.finish_iteration()
    reference = [t.detach().clone().requires_grad_() for t in full[:3]]
    ref_out = reference_attention(*reference, mask="causal")
    ref_grads = torch.autograd.grad(ref_out, reference, full[3])
    errors = [(out.cpu() - shard(ref_out.detach(), layout, world, rank)).abs().max().item()]
    errors += [
        (g.cpu() - shard(r, layout, world, rank)).abs().max().item() for g, r in zip(grads, ref_grads, strict=True)
    ]
    return {
        "rows": recorder.rows,
        "syncs_in_loop": syncs_in_loop,
        "pending": len(pending),
        "all_recv_waited": all_recv_waited,
        "window": (timeline.resolve(start), timeline.resolve(end)),
        "nccl": env.backend == "nccl",
        "errors": errors,
    }


@pytest.mark.parametrize(("buffer", "layout"), [("double", "zigzag"), ("sync", "contiguous"), ("allgather", "striped")])
def test_the_ring_loop_on_fake_streams_resolves_ordered_spans_without_synchronising(buffer, layout):
    world = 3
    results = launch_local(world, _ring_on_streams, (buffer, layout), timeout_s=60)
    _assert_ordered_spans(results, buffer, world)


def _assert_ordered_spans(results, buffer: str, world: int) -> None:
    hops = max(world - 1, 1)  # a 1-rank ring exchanges with itself once per rotation
    for rank, result in enumerate(results):
        assert result["syncs_in_loop"] == 0, "something drained the device inside the ring loop"
        assert result["pending"] == 0
        assert max(result["errors"]) < 1e-12, result["errors"]
        rows = result["rows"]
        assert rows, "nothing recorded"
        first, last = result["window"]
        for row in rows:
            assert isinstance(row["start_ns"], int) and isinstance(row["end_ns"], int)
            assert first <= row["start_ns"] <= row["end_ns"] <= last, row
            if row["kind"] not in ("send", "recv") or not result["nccl"]:
                assert math.isnan(row["nccl_ms"])  # no NCCL figure: never a made-up one
        kinds = {row["kind"] for row in rows}
        if buffer == "allgather":
            assert "collective" in kinds
            continue
        assert {"compute", "send", "recv", "wait"} <= kinds
        assert result["all_recv_waited"] is not False, "the compute stream used a block without its transfer"
        computes = [row for row in rows if row["kind"] == "compute"]
        for phase in ("fwd", "bwd"):
            spans = [row for row in computes if row["phase"] == phase]
            steps = [row["step"] for row in spans]
            assert steps == sorted(steps), f"rank {rank} {phase}: compute out of step order"
            assert all(a["end_ns"] <= b["start_ns"] for a, b in itertools.pairwise(spans))
        fwd_end = max(r["end_ns"] for r in computes if r["phase"] == "fwd")
        assert all(r["start_ns"] >= fwd_end for r in computes if r["phase"] == "bwd")
        transfers = [row for row in rows if row["kind"] == "recv" and row["phase"] == "fwd"]
        assert len(transfers) == hops and all(r["bytes"] > 0 for r in transfers)


def _stuck_comm(timeout_s: float, on_stall=None):
    runtime = FakeRuntime(lag_ms=0.0, strict_threads=True)  # the watchdog must set its device before it queries
    timeline = StreamTimeline(runtime)
    comm = RingComm([0], 0, timeline=timeline, loopback=True, timeout_s=timeout_s, on_stall=on_stall)
    comm._ops = lambda send, recv: []  # no backend: the transfer's end mark is the fake's to withhold
    timeline.begin_iteration()
    runtime.stuck = {runtime.events_made + 1}  # the next post: its start mark fires, its end mark never does
    return comm


def test_a_transfer_that_never_ends_is_named_by_the_bounded_settle():
    comm = _stuck_comm(timeout_s=5.0)
    transfer = comm.post(torch.zeros(4), into=torch.zeros(4), phase="bwd", step=3)
    comm.wait(transfer)  # only orders the compute stream: returns at once
    with pytest.raises(RingStall, match=r"rank 0 stalled at bwd ring step 3: no block from rank 0"):
        comm.settle(0.1)
    comm.close()


def test_the_watchdog_reports_a_stall_while_the_host_is_elsewhere():
    reported = []
    comm = _stuck_comm(timeout_s=0.05, on_stall=reported.append)
    comm.post(torch.zeros(4), into=torch.zeros(4), phase="fwd", step=1)
    deadline = time.monotonic() + 10
    while not reported and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reported and "fwd ring step 1" in reported[0]
    comm.close()


def test_a_watchdog_that_cannot_query_says_so_instead_of_dying_silently(monkeypatch):
    monkeypatch.setattr(StreamTimeline, "bind_thread", lambda self: None)  # as before the fix: device never set
    comm = _stuck_comm(timeout_s=0.05)
    comm.post(torch.zeros(4), into=torch.zeros(4), phase="fwd", step=1)
    deadline = time.monotonic() + 10
    while comm.stalled is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "the transfer watchdog failed" in str(comm.stalled) and "never set its device" in str(comm.stalled)
    comm.close()


@pytest.mark.gpu
def test_cuda_marks_time_the_device_not_the_launch():
    device = torch.device("cuda", 0)
    calibrate(device)  # spin's first call would calibrate, inside the span, with kernels and a synchronize of its own
    timeline = StreamTimeline(CudaRuntime(device))
    timeline.begin_iteration()
    before = timeline.mark()
    spin(0.005, device)  # 5 ms of device time, enqueued in microseconds
    after = timeline.mark()
    launched = time.perf_counter_ns()
    assert timeline.settle(10.0) == []
    assert 4.0e6 < timeline.resolve(after) - timeline.resolve(before) < 8.0e6
    assert timeline.resolve(after) > launched  # the device finished after the host had moved on


@pytest.mark.gpu
@pytest.mark.parametrize("buffer", ["sync", "double", "allgather"])
def test_one_rank_nccl_loopback_ring_on_the_device_timeline(buffer):
    results = launch_local(1, _ring_on_streams, (buffer, "contiguous", True), timeout_s=120, device="cuda")
    _assert_ordered_spans(results, buffer, 1)


def test_the_compute_stream_is_the_callers_current_one_not_the_one_at_construction():
    runtime = FakeRuntime(lag_ms=0.0)
    timeline = StreamTimeline(runtime)  # built while the default stream is current
    side = FakeStream("side")
    timeline.begin_iteration()
    with runtime.stream(side):
        assert timeline.compute is side
        compute_mark = timeline.mark()
        timeline.comm_after_compute("comm:ring-kv:0-1")
        with timeline.on_comm("comm:ring-kv:0-1"):
            end = timeline.mark("comm:ring-kv:0-1")
        timeline.compute_after(end)
    assert compute_mark.stream is side and end.stream is timeline.lanes["comm:ring-kv:0-1"]
    assert timeline.lanes["comm:ring-kv:0-1"].waited_streams == [side] and side.waited_events == [end]
    assert runtime.compute.waited_events == [] and timeline.compute is runtime.compute  # back on the default


def _reused_under_a_side_stream(worker_ctx):
    """One context, built on the default stream, called on it and then under a side stream (as FSDP and Megatron
    call attention): each call's compute marks, waits and comm-lane orderings act on the stream it ran on."""
    env = worker_ctx.env
    world, rank = env.world, env.rank
    generator = torch.Generator().manual_seed(9)
    full = [torch.randn(1, 2, 8 * world, 4, generator=generator, dtype=torch.float64) for _ in range(4)]
    q, k, v, dout = (shard(t, "zigzag", world, rank) for t in full)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    runtime = FakeRuntime(lag_ms=0.5)
    timeline = StreamTimeline(runtime)
    recorder = ListRecorder(rank, rank, timeline=timeline)
    spec = AttentionSpec(mask="causal", layout="zigzag", buffer="double")
    ctx = build_context(q, k, v, spec, Runtime(timeline=timeline, recorder=recorder))
    reference = [t.detach().clone().requires_grad_() for t in full[:3]]
    ref_out = reference_attention(*reference, mask="causal")
    ref_grads = torch.autograd.grad(ref_out, reference, full[3])
    want = [shard(t.detach(), "zigzag", world, rank) for t in (ref_out, *ref_grads)]
    report = {}
    for iteration, stream in enumerate((runtime.compute, FakeStream("side"))):
        lanes = list(timeline.lanes.values())
        before = {id(s): (len(s.waited_events), len(s.waited_streams)) for s in (runtime.compute, *lanes)}
        recorder.iteration = iteration
        with runtime.stream(stream):
            timeline.begin_iteration()
            out = ring_attention(q, k, v, context=ctx)
            grads = torch.autograd.grad(out, (q, k, v), dout)
        marks = list(timeline._events)
        ctx.comm.settle(10.0)
        ctx.dkv.settle(10.0)
        assert timeline.settle(10.0) == []
        recorder.finish_iteration()
        lanes = list(timeline.lanes.values())
        lane_marks = {id(m) for m in marks if m.stream in lanes}
        compute_marks = [m for m in marks if m.stream not in lanes]
        waited = stream.waited_events[before[id(runtime.compute)][0] if stream is runtime.compute else 0 :]
        received = [row for row in recorder.rows if row["iteration"] == iteration and row["kind"] == "recv"]
        new_lane_waits = [s for lane in lanes for s in lane.waited_streams[before.get(id(lane), (0, 0))[1] :]]
        report[iteration] = {
            "errors": [(a - b).abs().max().item() for a, b in zip((out, *grads), want, strict=True)],
            "compute_marks_on_stream": all(m.stream is stream for m in compute_marks) and len(compute_marks) > 2,
            "waited_every_transfer": len(waited) == len(received) > 0 and all(id(e) in lane_marks for e in waited),
            "lanes_waited_on_stream": bool(new_lane_waits) and all(s is stream for s in new_lane_waits),
            "default_untouched": stream is runtime.compute
            or len(runtime.compute.waited_events) == before[id(runtime.compute)][0],
        }
    ctx.comm.close()
    ctx.dkv.close()
    return report


def test_a_context_reused_under_another_current_stream_orders_its_work_on_that_stream():
    for rank, report in enumerate(launch_local(2, _reused_under_a_side_stream, timeout_s=60)):
        for iteration, facts in report.items():
            assert max(facts.pop("errors")) < 1e-12, (rank, iteration)
            assert all(facts.values()), (rank, iteration, facts)
