"""What runs inside a measured compute span stays small: the merge's elementwise kernels, no Event made per step
(they are pooled across iterations), and the backward's layout conversion of dout and out once per call."""

from __future__ import annotations

import torch
from fake_streams import FakeRuntime
from torch.utils._python_dispatch import TorchDispatchMode

from ringbench.engine.api import build_context, ring_attention
from ringbench.engine.merge import merge_into
from ringbench.engine.recorder import ListRecorder
from ringbench.engine.spec import AttentionSpec, Runtime
from ringbench.engine.timeline import StreamTimeline
from ringbench.kernels.torch_sdpa import TorchSdpaKernel, _bmhk


class _Ops(TorchDispatchMode):
    """The aten ops a block of code dispatches, views and metadata left out (they launch no kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)
        if not view:
            self.ops.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_merge_is_six_elementwise_kernels_in_place_and_exact():
    generator = torch.Generator().manual_seed(3)
    acc_out = torch.randn(2, 3, 16, 8, generator=generator)
    acc_lse = torch.randn(2, 3, 16, generator=generator)
    out = torch.randn(2, 3, 16, 8, generator=generator)
    lse = torch.randn(2, 3, 16, generator=generator)
    acc_lse[0, 0, :4] = float("-inf")  # rows nothing merged into yet (the identity) ...
    acc_out[0, 0, :4] = 0.0
    lse[0, 0, 2:6] = float("-inf")  # ... and rows the block saw no key for (two of them both)
    out[0, 0, 2:6] = 0.0
    full = torch.logaddexp(acc_lse, lse)
    wa = torch.exp(acc_lse - full).nan_to_num(0.0)[..., None]
    wb = torch.exp(lse - full).nan_to_num(0.0)[..., None]
    want_out, want_lse = wa * acc_out + wb * out, full
    with _Ops() as seen:
        merge_into(acc_out, acc_lse, out, lse)
    computed = seen.ops
    assert len(computed) == 6 and not any(name.startswith("copy") for name in computed), computed
    torch.testing.assert_close(acc_out, want_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(acc_lse, want_lse)
    assert torch.isneginf(acc_lse[0, 0, 2:4]).all() and not acc_out[0, 0, 2:4].any()  # the identity stays


def _iterate(timeline: StreamTimeline, recorder: ListRecorder, q, k, v, dout) -> None:
    spec = AttentionSpec(mask="causal", layout="zigzag", buffer="double")
    ctx = build_context(q, k, v, spec, Runtime(timeline=timeline, recorder=recorder))
    timeline.begin_iteration()
    out = ring_attention(q, k, v, context=ctx)
    torch.autograd.grad(out, (q, k, v), dout)
    assert timeline.settle(5.0) == []
    recorder.finish_iteration()
    recorder.iteration += 1


def test_marks_reuse_their_events_from_iteration_to_iteration():
    runtime = FakeRuntime(lag_ms=0.0)
    timeline = StreamTimeline(runtime)
    recorder = ListRecorder(0, 0, timeline=timeline)
    recorder.iteration = 0
    q, k, v, dout = (torch.randn(1, 2, 32, 8, dtype=torch.float64) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    _iterate(timeline, recorder, q, k, v, dout)
    made, rows = runtime.events_made, len(recorder.rows)
    for _ in range(3):
        _iterate(timeline, recorder, q, k, v, dout)
    assert runtime.events_made == made  # no Event object made inside the later iterations' spans
    assert len(recorder.rows) == 4 * rows and all(isinstance(r["start_ns"], int) for r in recorder.rows)
    first, last = recorder.rows[:rows], recorder.rows[-rows:]
    assert all(b["start_ns"] > a["end_ns"] for a, b in zip(first, last, strict=True))  # re-recorded, not stale


def test_a_row_slice_of_bmhk_memory_is_handed_over_without_a_copy():
    bmhk = torch.randn(2, 64, 4, 16).transpose(1, 2)  # (B, H, M, K) view of (B, M, H, K) memory
    rows = bmhk[:, :, 8:40]
    assert _bmhk(rows) is rows and _bmhk(bmhk) is bmhk
    plain = torch.randn(2, 4, 64, 16)  # (B, H, M, K) contiguous: converted
    converted = _bmhk(plain)
    assert converted.stride() == (64 * 4 * 16, 16, 4 * 16, 1) and torch.equal(converted, plain)


class _Counting(TorchSdpaKernel):
    def __init__(self) -> None:
        super().__init__()
        self.prepared = 0
        self.blocks = 0

    def prepare_backward(self, dout, out):
        self.prepared += 1
        return super().prepare_backward(dout, out)

    def backward(self, *args):
        self.blocks += 1
        return super().backward(*args)


def test_the_backward_prepares_dout_and_out_once_per_call_not_per_block():
    kernel = _Counting()
    q, k, v, dout = (torch.randn(1, 2, 32, 8, dtype=torch.float64) for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = ring_attention(q, k, v, mask="causal", layout="zigzag", kernel=kernel)  # 1 rank: 3 blocks
    torch.autograd.grad(out, (q, k, v), dout)
    assert kernel.prepared == 1 and kernel.blocks == 3
