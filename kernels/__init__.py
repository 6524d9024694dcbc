"""Block kernels: attention of one query block against one key/value block, returning (out, lse).

Kernels know nothing of rings. Each is registered by name so that the ring, the CLI and scenario files pick one
with a string: ``torch`` (SDPA ops that return the log-sum-exp), ``math`` (plain matmuls, any dtype and device),
``triton`` (a Triton kernel; runs on CPU under TRITON_INTERPRET=1) and ``emulated:GFLOPS`` (real arithmetic, then
sleep until the time the FLOPs would take at that rate: for exercising overlap on machines where compute and
communication compete for the same cores).
"""

from ringbench.kernels.base import BlockKernel, BlockMask, MaskKind, block_flops
from ringbench.kernels.registry import KERNEL_HELP, available_kernels, get_kernel, register_kernel

__all__ = [
    "KERNEL_HELP",
    "BlockKernel",
    "BlockMask",
    "MaskKind",
    "available_kernels",
    "block_flops",
    "get_kernel",
    "register_kernel",
]
