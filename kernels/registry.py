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


def _register_builtins() -> None:
    from ringbench.kernels.emulated import EmulatedKernel, ModelledKernel
    from ringbench.kernels.torch_sdpa import MathKernel, TorchSdpaKernel

    register_kernel("torch", _plain(TorchSdpaKernel))
    register_kernel("math", _plain(MathKernel))
    register_kernel("emulated", EmulatedKernel.from_argument)
    register_kernel("modelled", ModelledKernel.from_argument)

    def triton_factory(argument: str) -> BlockKernel:
        from ringbench.kernels.triton_attn import TritonKernel

        return _plain(TritonKernel)(argument)

    register_kernel("triton", triton_factory)


_register_builtins()
