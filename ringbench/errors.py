"""Errors that cross the library/CLI boundary; the CLI maps them to exit codes."""

from __future__ import annotations


class RingbenchError(Exception):
    """Base class of the errors ringbench raises on purpose."""


class UsageError(RingbenchError, ValueError):
    """Bad input: one line naming the field, the value and what is allowed. The CLI exits with code 2."""


class RunFailure(RingbenchError):
    """A run could not finish (a rank crashed, stalled or failed its check). The CLI exits with code 1.
    ``run_dir``: the results folder that keeps the cases finished before the failure, when there is one."""

    def __init__(self, message: str, run_dir: str | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir


class Interrupted(RingbenchError):
    """A run was stopped by a signal (SIGTERM, SIGINT, SIGHUP). The cases finished before it are kept; the message
    says how many, which case was in flight and the command that resumes. The CLI exits with 128 + the signal."""

    def __init__(self, message: str, signum: int, run_dir: str | None = None) -> None:
        super().__init__(message)
        self.signum = signum
        self.run_dir = run_dir

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def bad_value(field: str, value: object, allowed: str) -> UsageError:
    """The standard one-line message: ``mask='foo' is not allowed; expected one of: none, causal``."""
    return UsageError(f"{field}={value!r} is not allowed; expected {allowed}")
