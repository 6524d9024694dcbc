"""Peak memory of one rank over one case: what ring attention promises to keep at O(S/N).

CPU: the process's peak resident set (VmHWM), reset before each case through /proc/self/clear_refs (Linux; where
that is not possible the peak is the process's lifetime peak, ru_maxrss, and says so). CUDA: the caching
allocator's peak of allocated bytes on the rank's device (``torch.cuda.max_memory_allocated``), reset per case.
"""

from __future__ import annotations

import resource
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak(device: torch.device) -> str:
    """Start a new peak; returns how the peak is measured (recorded with the run)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda max_memory_allocated per case"
    try:
        _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS
        return "peak RSS per case (VmHWM)"
    except OSError:
        return "peak RSS of the process so far (ru_maxrss)"


def peak_mb(device: torch.device) -> float:
    """The peak since ``reset_peak``, in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
