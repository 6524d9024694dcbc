"""Readers for traces made by other instruments (the PyTorch profiler), as DataFrames of their own events.

Also turns them into a record (``importer``). May import: the vocabulary, the record, the figures and the
scenario (an imported case is a ``Workload``).
"""

from ringbench.traces.kineto import TRACE_EVENT_COLUMNS, KinetoTrace, read_kineto_trace

__all__ = ["TRACE_EVENT_COLUMNS", "KinetoTrace", "read_kineto_trace"]
