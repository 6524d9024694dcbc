"""Command options made from the axis registry (ringbench/scenario/axes.py): one definition per sweep axis.

    @with_axes("plan", panel="Workload", shown=lambda axis: PLAN_DEFAULTS.get(axis.name))
    def plan(topology: ..., axes: dict, ...) -> None:
        axes["seq"]          # one value (plan takes one), or a list where the command repeats the axis

The decorator replaces the ``axes`` parameter of a command function by one option per axis the command takes --
``--head-dim`` for ``head_dim`` -- with the registry's help text (the same in every command), repeatable or single
as the registry says, and hands the function their values as one dict. ``shown`` gives the default that --help
shows for an axis (None: none).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Optional

import typer

from ringbench.scenario.axes import Axis, axes_for


def axis_option(axis: Axis, command: str, panel: str, shown: str | None) -> inspect.Parameter:
    """The Typer option of one axis in one command (repeatable unless the command takes one value)."""
    single = command in axis.single
    annotation = Optional[axis.kind] if single else list[axis.kind]
    option = typer.Option(help=axis.help, rich_help_panel=panel, show_default=shown if shown is not None else False)
    return inspect.Parameter(axis.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None if single else [],
                             annotation=Annotated[annotation, option])  # fmt: skip


def with_axes(command: str, *, panel: str, shown: Callable[[Axis], str | None] = lambda axis: None):
    """Decorate a command function that takes ``axes: dict`` (module docstring)."""

    def decorate(func):
        signature = inspect.signature(func, eval_str=True)  # the modules' annotations are strings (PEP 563)
        params = list(signature.parameters.values())
        at = next(i for i, p in enumerate(params) if p.name == "axes")
        taken = axes_for(command)
        added = [axis_option(axis, command, panel, shown(axis)) for axis in taken]

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            axes = {axis.name: kwargs.pop(axis.name) for axis in taken}
            return func(*args, axes=axes, **kwargs)

        parameters = [*params[:at], *added, *params[at + 1 :]]
        wrapper.__signature__ = signature.replace(parameters=parameters)
        wrapper.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
        return wrapper

    return decorate


__all__ = ["axis_option", "with_axes"]
