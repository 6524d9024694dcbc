"""A case's profiler captures (one per rank) as its events rows: how another implementation's per-step spans
reach the record (`run --impl NAME`), through the importer's reconstruction."""

from __future__ import annotations


def profile_events(trace_paths, case_id: str, *, compute_patterns: tuple[str, ...] = ()):
    """The events rows of a case from its ranks' profiler traces (one per rank): spans and iteration rows, times
    relative to the first profiled iteration, iterations numbered as in the ``ringbench:iteration K`` markers."""
    from ringbench.markers import ITERATION_MARKER
    from ringbench.traces.importer import reconstruct

    rebuilt = reconstruct(trace_paths, iteration_marker=ITERATION_MARKER, compute_patterns=compute_patterns)
    return rebuilt.events.assign(case_id=case_id)


def with_profile_rows(per_rank: list, case_id: str, repeat: int, *,
                      compute_patterns: tuple[str, ...] = ()) -> list:  # fmt: skip
    """The ranks' reports of one case with their rows replaced by the events of their profiler captures (spans
    and iteration rows on the captures' shared clock); unchanged when a rank has no capture. UsageError (one
    line) when the captures cannot be read as a ring (no attention op matched, ...)."""
    paths = [result.profile for result in per_rank]
    if not paths or not all(paths):
        return per_rank
    events = profile_events(paths, case_id, compute_patterns=compute_patterns).assign(repeat=repeat)
    by_rank = {int(rank): frame.to_dict("records") for rank, frame in events.groupby("rank")}
    return [result.replace(rows=by_rank.get(int(result.rank), [])) for result in per_rank]


__all__ = ["profile_events", "with_profile_rows"]
