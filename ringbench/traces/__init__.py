"""Readers for traces made by other instruments (the PyTorch profiler), as DataFrames of their own events."""

from ringbench.traces.kineto import TRACE_EVENT_COLUMNS, KinetoTrace, read_kineto_trace

__all__ = ["TRACE_EVENT_COLUMNS", "KinetoTrace", "read_kineto_trace"]
