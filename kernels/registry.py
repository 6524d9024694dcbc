"""Kernels by name: ``get_kernel("torch")``, ``get_kernel("emulated:50")``."""

from __future__ import annotations

from collections.abc import Callable

from ringbench.errors import bad_value
from ringbench.kernels.base import BlockKernel

KERNEL_HELP = "torch, math, triton, emulated:GFLOPS (e.g. emulated:50) or modelled:GFLOPS (no arithmetic)"

_FACTORIES: dict[str, Callable[[str], BlockKernel]] = {}


def register_kernel(name: str, factory: Callable[[str], BlockKernel]) -> None:
    """Register ``factory(argument)``; the argument is what follows ``name:`` in the spec ('' if nothing)."""
    _FACTORIES[name] = factory


def available_kernels() -> list[str]:
    return sorted(_FACTORIES)


def get_kernel(spec: str | BlockKernel) -> BlockKernel:
    if isinstance(spec, BlockKernel):
        return spec
    if not isinstance(spec, str):
        raise bad_value("kernel", spec, KERNEL_HELP)
    name, _, argument = spec.partition(":")
    factory = _FACTORIES.get(name)
    if factory is None:
        raise bad_value("kernel", spec, KERNEL_HELP)
    return factory(argument)


def _plain(cls):
    def factory(argument: str) -> BlockKernel:
        if argument:
            raise bad_value("kernel", f"{cls.name}:{argument}", KERNEL_HELP)
        return cls()

    return factory


def _lazy(module: str, attr: str, *, plain: bool = True) -> Callable[[str], BlockKernel]:
    """A factory that imports its kernel's module (and torch) only when a kernel is made: naming and validating
    kernel specs (scenarios, the simulator, plan) needs no torch."""

    def factory(argument: str) -> BlockKernel:
        import importlib

        cls = getattr(importlib.import_module(f"ringbench.kernels.{module}"), attr)
        return _plain(cls)(argument) if plain else cls.from_argument(argument)

    return factory


def _register_builtins() -> None:
    register_kernel("torch", _lazy("torch_sdpa", "TorchSdpaKernel"))
    register_kernel("math", _lazy("torch_sdpa", "MathKernel"))
    register_kernel("emulated", _lazy("emulated", "EmulatedKernel", plain=False))
    register_kernel("modelled", _lazy("emulated", "ModelledKernel", plain=False))
    register_kernel("triton", _lazy("triton_attn", "TritonKernel"))


_register_builtins()
