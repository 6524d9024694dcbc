"""Peak memory of one rank over one case: what ring attention promises to keep at O(S/N).

CPU: the process's peak resident set (VmHWM), reset before each case through /proc/self/clear_refs (Linux; where
that is not possible the peak is the process's lifetime peak, ru_maxrss, and says so). CUDA: the caching
allocator's peak of allocated bytes on the rank's device (``torch.cuda.max_memory_allocated``), reset per case.
"""

from __future__ import annotations

import contextlib
import math
import resource
import weakref
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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


class TensorPeak:
    """The peak of the tensors one attention call holds on a rank, inputs included, in MiB (``peak_mb``).

    What each strategy trades for speed: the ring holds two K/V blocks, the all-gather baseline all of them, Ulysses
    the whole sequence for H/N heads. CUDA: the caching allocator's peak of allocated bytes over the counted
    iteration (``max_memory_allocated``, reset at its start), plus nothing (the inputs are allocated). CPU: a
    dispatch mode sees every tensor an operator returns and counts each storage once while any tensor on it is
    alive (at operator boundaries: a kernel's internal workspace is not seen), on top of the inputs' storages.
    """

    def __init__(self, device, *inputs) -> None:
        self.device = torch.device(device)
        self.peak_mb = math.nan
        self._inputs = sum(_storage_bytes(t) for t in {id(t): t for t in inputs}.values())

    @contextlib.contextmanager
    def counting(self, active: bool = True):
        if not active:
            yield
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            torch.cuda.synchronize(self.device)
            extra = torch.cuda.max_memory_allocated(self.device) - base
            self.peak_mb = (self._inputs + max(extra, 0)) / 2**20
            return
        mode = _LiveTensors()
        with mode:
            yield
        self.peak_mb = (self._inputs + mode.peak) / 2**20


def _storage_bytes(tensor) -> int:
    return int(tensor.untyped_storage().nbytes()) if isinstance(tensor, torch.Tensor) else 0


class _LiveTensors(TorchDispatchMode):
    """Bytes of the storages that operator outputs live on, while any tensor on them lives; and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # data pointer -> [bytes, live tensors on it]
        self.bytes = 0
        self.peak = 0

    def _release(self, key: int) -> None:
        entry = self.live.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                self.bytes -= entry[0]
                del self.live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key == 0:
                continue
            entry = self.live.get(key)
            if entry is None:
                entry = self.live[key] = [int(storage.nbytes()), 0]
                self.bytes += entry[0]
                self.peak = max(self.peak, self.bytes)
            entry[1] += 1
            weakref.finalize(tensor, self._release, key)
        return out
