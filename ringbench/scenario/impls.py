"""The names of the ring-attention implementations a scenario may sweep (the ``impl`` axis), checked without
loading any of them: ringbench/rank/impls/ builds the adapters behind these names."""

from __future__ import annotations

from ringbench.errors import UsageError

DEFAULT_IMPL = "ringbench"
IMPL_NAMES = ("ringbench", "torch-ring", "torch-ring:allgather", "torch-ring:alltoall", "ring-attention-pytorch",
              "ring-flash-attn", "transformer-engine")  # fmt: skip
"""The built-in implementations; a user's ``module:function`` is accepted too."""


def is_user_impl(name: str) -> bool:
    """``module:function``: a user's implementation."""
    module, sep, function = str(name).partition(":")
    return bool(sep and module and function and module.replace(".", "").replace("_", "").isalnum())


def check_impl(name: str) -> str:
    """``name`` when it names an implementation; otherwise one line naming the choices."""
    if name in IMPL_NAMES or is_user_impl(name):
        return name
    raise UsageError(f"impl={name!r} is not known; expected one of: {', '.join(IMPL_NAMES)}, or module:function")


__all__ = ["DEFAULT_IMPL", "IMPL_NAMES", "check_impl", "is_user_impl"]
