"""What the hardware costs when nothing measured it: the catalogue of GPUs, attention kernels and links.

Owns catalogue.yaml (every figure with its source) and the attention kernel's rate model (kernel.py). Imports only
the vocabulary (errors); the simulator and the advisers above price with it, and everything they derive from it
is marked PRIOR.
"""

from __future__ import annotations

from ringbench.hardware.catalogue import (
    ATTENTION_DTYPES,
    Catalogue,
    Figure,
    Framework,
    Gpu,
    find_framework,
    find_gpu,
    load_catalogue,
)
from ringbench.hardware.kernel import KernelRates, PassModel

__all__ = [
    "ATTENTION_DTYPES",
    "Catalogue",
    "Figure",
    "Framework",
    "Gpu",
    "KernelRates",
    "PassModel",
    "find_framework",
    "find_gpu",
    "load_catalogue",
]
