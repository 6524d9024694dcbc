"""Emulated and modelled compute: a block takes the time its FLOPs would take at a given rate.

``emulated:GFLOPS`` does the real arithmetic (by the ``torch`` kernel), so every emulated run stays exact and
checkable, and then pads the block to the modelled duration. On 2-core machines real compute and gloo copies
compete for the same cores, so this is how overlap, stragglers and topology effects are exercised honestly there.

``emulated:auto`` picks, per run and before timing, the highest rate at which this machine's real arithmetic stays
under a third of the modelled time, with room for the CPU scheduler, and a floor for the calls too small to pace at
that rate (ringbench.rank.autorate): a call then takes max(FLOPs / rate, floor).

``modelled:GFLOPS`` skips the arithmetic altogether (outputs are zeros: nothing to check) and only takes the
modelled time, so scale and memory experiments (long S, many ranks) run on small machines.

Both are labelled emulated in every output. The padding acts where the work runs (``Pacer``):
  * CPU: the host sleeps until the modelled end (the host is the compute lane); a block whose arithmetic alone
    took longer than the modelled time is *saturated* (counted, reported).
  * CUDA: a spin is enqueued on the compute stream (ringbench.kernels.spin) for the modelled time minus the
    arithmetic's own time, measured with events in the previous iteration; after each iteration ``settle``
    resolves those events, updates the estimates and counts saturated blocks. The host never waits. Where the spin
    counts SM cycles (no nanosecond timer), each pad is measured too and ``settle`` hands the measurements to
    ``spin.correct``: clocks that dropped under load would otherwise stretch every pad by as much.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

import torch

from ringbench.errors import bad_value
from ringbench.kernels.base import BlockKernel, BlockMask, block_flops, stats_dtype
from ringbench.kernels.spin import correct, spin
from ringbench.kernels.torch_sdpa import TorchSdpaKernel

PAD_LABEL = "ringbench:emulated pad"  # the profiler sees the modelled wait under this name (check-timeline)


class Pacer:
    """Pads blocks to a target duration on the device that runs them, and counts saturated blocks.

    CUDA: each block's arithmetic is bracketed by two events, and a pad of SM cycles is followed by a third, taken
    from a pool and recorded again after ``settle`` resolved them (as the stream timeline pools its marks): making
    events per block would cost host time inside the compute spans being measured."""

    def __init__(self) -> None:
        self.saturated_blocks = 0
        self.blocks = 0
        self._estimate_s: dict[Hashable, float] = {}  # CUDA: the arithmetic's measured time per block shape
        # (key, begun, done, target s, cycles of the pad or 0, the event after the pad or None)
        self._pending: list[tuple[Hashable, object, object, float, int, object]] = []
        self._device: torch.device | None = None
        self._events: list = []  # the pool
        self._used = 0  # events of the pool recorded since the last settle

    def _event(self):
        if self._used == len(self._events):
            self._events.append(torch.cuda.Event(enable_timing=True))
        self._used += 1
        return self._events[self._used - 1]

    def begin(self, device: torch.device):
        """Mark the start of a block's arithmetic."""
        if device.type == "cuda":
            event = self._event()
            event.record()
            return event
        return time.perf_counter()

    def pad_to(self, device: torch.device, key: Hashable, begun, target_s: float) -> None:
        """Make the block that began at ``begun`` last ``target_s`` in all."""
        self.blocks += 1
        if device.type != "cuda":
            deadline = begun + target_s
            remaining = deadline - time.perf_counter()
            if remaining < 0:
                self.saturated_blocks += 1
            else:
                with torch.profiler.record_function(PAD_LABEL):
                    time.sleep(remaining)
            return
        self._pad(device, key, begun, target_s, target_s - self._estimate_s.get(key, 0.0))

    def _pad(self, device: torch.device, key: Hashable, begun, target_s: float, pad_s: float) -> None:
        done = self._event()
        done.record()
        cycles = spin(pad_s, device) or 0
        padded = None
        if cycles:  # SM cycles: measure the pad, so that settle can correct the cycle rate under load
            padded = self._event()
            padded.record()
        self._device = device
        self._pending.append((key, begun, done, target_s, cycles, padded))

    def stretch(self, device: torch.device, key: Hashable, begun, factor: float) -> None:
        """Make the block that began at ``begun`` last ``factor`` times its own arithmetic."""
        if device.type != "cuda":
            elapsed = time.perf_counter() - begun
            with torch.profiler.record_function(PAD_LABEL):
                time.sleep((factor - 1.0) * elapsed)
            return
        self._pad(device, key, begun, float("inf"), (factor - 1.0) * self._estimate_s.get(key, 0.0))

    def settle(self) -> None:
        """After an iteration (its events fired): update the per-shape estimates and count saturated blocks."""
        pads = []  # (cycles, device ms) of the pads of SM cycles
        for key, begun, done, target_s, cycles, padded in self._pending:
            elapsed_s = begun.elapsed_time(done) / 1e3
            self._estimate_s[key] = elapsed_s
            if elapsed_s > target_s:
                self.saturated_blocks += 1
            if padded is not None:
                pads.append((cycles, done.elapsed_time(padded)))
        if pads:
            correct(self._device, pads)
        self._pending.clear()
        self._used = 0  # every pooled event is resolved: record them again

    def reset_counts(self) -> None:
        self.saturated_blocks = 0
        self.blocks = 0


def _rate(name: str, argument: str) -> float:
    try:
        gflops = float(argument)
    except ValueError:
        raise bad_value("kernel", f"{name}:{argument}", f"{name}:GFLOPS with a number GFLOPS > 0") from None
    if not gflops > 0 or gflops == float("inf"):
        raise bad_value("kernel", f"{name}:{argument}", f"{name}:GFLOPS with a finite number GFLOPS > 0")
    return gflops


class EmulatedKernel(BlockKernel):
    emulated = True
    computes = True  # real arithmetic: results can be checked

    def __init__(self, gflops: float, slowdown: float = 1.0, floor_ms: float = 0.0) -> None:
        if not gflops > 0:
            raise bad_value("kernel", f"emulated:{gflops}", "emulated:GFLOPS with GFLOPS > 0")
        self.gflops = float(gflops)
        self.slowdown = float(slowdown)  # set by the slow-rank fault on the affected rank
        # The least time a call takes: emulated:auto's floor for calls too small to pace at its rate (0: none).
        self.floor_s = float(floor_ms) / 1e3
        self.name = f"emulated:{gflops:g}"
        self._inner = TorchSdpaKernel()
        self.pacer = Pacer()

    @classmethod
    def from_argument(cls, argument: str) -> BlockKernel:
        if argument == "auto":
            return AutoRate()
        return cls(_rate("emulated", argument))

    @property
    def saturated_blocks(self) -> int:
        return self.pacer.saturated_blocks

    def modelled_seconds(self, q, k, mask: BlockMask, backward: bool) -> float:
        batch, heads, q_len, head_dim = q.shape
        return self.flops_seconds(block_flops(batch, heads, q_len, k.shape[-2], head_dim, mask.work_fraction, backward))

    def flops_seconds(self, flops: float) -> float:
        """The modelled time of a call of ``flops``: at the rate, at least the floor (a slow rank stretches both)."""
        return max(flops / (self.gflops * 1e9), self.floor_s) * self.slowdown

    def _key(self, q, k, mask: BlockMask, backward: bool) -> tuple:
        return (tuple(q.shape), k.shape[-2], mask.kind, backward)

    def forward(self, q, k, v, mask, scale):
        begun = self.pacer.begin(q.device)
        result = self._inner.forward(q, k, v, mask, scale)
        self.pacer.pad_to(q.device, self._key(q, k, mask, False), begun, self.modelled_seconds(q, k, mask, False))
        return result

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        begun = self.pacer.begin(q.device)
        result = self._inner.backward(dout, q, k, v, out, lse, mask, scale)
        self.pacer.pad_to(q.device, self._key(q, k, mask, True), begun, self.modelled_seconds(q, k, mask, True))
        return result

    def settle(self) -> None:
        self.pacer.settle()


class AutoRate(BlockKernel):
    """``emulated:auto`` before calibration: the runner measures this machine and replaces it with
    ``EmulatedKernel(rate)`` (ringbench.rank.autorate); it computes nothing itself."""

    name = "emulated:auto"
    emulated = True
    auto = True

    def forward(self, q, k, v, mask, scale):
        raise RuntimeError("emulated:auto must be calibrated (ringbench.rank.autorate) before it computes")

    backward = forward


class ModelledKernel(EmulatedKernel):
    """Takes the modelled time and computes nothing: outputs are zeros (a run with it cannot be checked)."""

    computes = False

    def __init__(self, gflops: float, slowdown: float = 1.0, floor_ms: float = 0.0) -> None:
        super().__init__(gflops, slowdown, floor_ms)
        self.name = f"modelled:{gflops:g}"

    @classmethod
    def from_argument(cls, argument: str) -> ModelledKernel:
        return cls(_rate("modelled", argument))

    def forward(self, q, k, v, mask, scale):
        begun = self.pacer.begin(q.device)
        out = torch.zeros((), dtype=q.dtype, device=q.device).expand(q.shape)  # (B, H, Lq, D), no memory
        lse = torch.zeros((), dtype=stats_dtype(q.dtype), device=q.device).expand(q.shape[:-1])
        self.pacer.pad_to(q.device, self._key(q, k, mask, False), begun, self.modelled_seconds(q, k, mask, False))
        return out, lse

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        begun = self.pacer.begin(q.device)
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        grads = (zero.expand(q.shape), zero.expand(k.shape), zero.expand(v.shape))
        self.pacer.pad_to(q.device, self._key(q, k, mask, True), begun, self.modelled_seconds(q, k, mask, True))
        return grads
