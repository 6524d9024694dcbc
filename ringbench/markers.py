"""The annotations ringbench puts in a profiler capture (`run --profile`), which the trace readers look for.

The capture (ringbench/rank/profiling.py) writes them with ``record_function``; check-timeline and the importer find
the profiled iteration and each ring step by them. They only say *which* iteration or step an op belongs to: the
times compared are always the profiler's own op and kernel timestamps.
"""

ITERATION_MARKER = "ringbench:iteration"  # + " K": the whole timed iteration K (forward and backward)
STEP_MARKER_PREFIX = "ringbench:"  # + "fwd step S" / "bwd step S": one ring step
EMULATED_MARKER = "ringbench:emulated"  # the emulated kernel's modelled time: "ringbench:emulated pad"
WARM_UP_MARKER = "ringbench:profiler warm-up"  # an empty range that absorbs the profiler's first-range cost


def iteration_marker(index: int) -> str:
    return f"{ITERATION_MARKER} {index}"


def step_marker(phase: str, step: int) -> str:
    return f"{STEP_MARKER_PREFIX}{phase} step {step}"
