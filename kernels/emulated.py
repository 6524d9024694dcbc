"""The emulated-compute kernel: exact arithmetic, then sleep until the modelled duration has passed.

``emulated:GFLOPS`` makes each block take the time its useful FLOPs would take at GFLOPS. The arithmetic is still
done (by the ``torch`` kernel) so every emulated run stays exact and checkable; the remaining time is spent
sleeping, which leaves the cores free for communication. On 2-core machines real compute and gloo copies compete
for the same cores, so this is how overlap, stragglers and topology effects are exercised honestly there. Runs
with this kernel are labelled emulated in every output.
"""

from __future__ import annotations

import time

from ringbench.errors import bad_value
from ringbench.kernels.base import BlockKernel, BlockMask, block_flops
from ringbench.kernels.torch_sdpa import TorchSdpaKernel


def _sleep_until(deadline: float) -> None:
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class EmulatedKernel(BlockKernel):
    emulated = True

    def __init__(self, gflops: float, slowdown: float = 1.0) -> None:
        if not gflops > 0:
            raise bad_value("kernel", f"emulated:{gflops}", "emulated:GFLOPS with GFLOPS > 0")
        self.gflops = float(gflops)
        self.slowdown = float(slowdown)  # set by the slow-rank fault on the affected rank
        self.name = f"emulated:{gflops:g}"
        self._inner = TorchSdpaKernel()
        self.saturated_blocks = 0  # blocks whose real arithmetic took longer than the modelled time

    @classmethod
    def from_argument(cls, argument: str) -> EmulatedKernel:
        try:
            return cls(float(argument))
        except ValueError:
            raise bad_value("kernel", f"emulated:{argument}", "emulated:GFLOPS with a number GFLOPS > 0") from None

    def modelled_seconds(self, q, k, mask: BlockMask, backward: bool) -> float:
        batch, heads, q_len, head_dim = q.shape
        flops = block_flops(batch, heads, q_len, k.shape[-2], head_dim, mask.work_fraction, backward)
        return flops / (self.gflops * 1e9) * self.slowdown

    def _finish(self, start: float, seconds: float) -> None:
        deadline = start + seconds
        if time.perf_counter() > deadline:
            self.saturated_blocks += 1
        _sleep_until(deadline)

    def forward(self, q, k, v, mask, scale):
        start = time.perf_counter()
        result = self._inner.forward(q, k, v, mask, scale)
        self._finish(start, self.modelled_seconds(q, k, mask, backward=False))
        return result

    def backward(self, dout, q, k, v, out, lse, mask, scale):
        start = time.perf_counter()
        result = self._inner.backward(dout, q, k, v, out, lse, mask, scale)
        self._finish(start, self.modelled_seconds(q, k, mask, backward=True))
        return result
