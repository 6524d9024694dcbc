"""Clocks across hosts: the offset is measured before and after each case and fitted as a line (offset and drift),
shown on one machine by giving two local ranks different host names and one of them a skewed, drifting clock."""

from __future__ import annotations

import time

from ringbench.rank.clock import ClockAlignment, align_clocks, fit_drift
from ringbench.rank.collectives import GroupOps
from ringbench.run.launch import launch_local

SKEW_NS = 5_000_000  # rank 1's clock reads 5 ms ahead of rank 0's at the start ...
RATE = 0.02  # ... and runs 2% fast (far more than a real clock, so that 1 s of test shows it above the noise)


def test_the_fitted_line_passes_through_both_measurements():
    before = ClockAlignment(offset_ns=1_000, bound_ns=40, method="m", hosts=2, at_ns=10_000)
    after = ClockAlignment(offset_ns=3_000, bound_ns=60, method="m", hosts=2, at_ns=20_000)
    fit = fit_drift(before, after)
    assert fit.drift == 0.2 and fit.bound_ns == 60
    assert fit.offset_at(10_000) == 1_000 and fit.offset_at(20_000) == 3_000 and fit.offset_at(15_000) == 2_000
    assert fit.to_reference(15_000) == 13_000
    one_host = ClockAlignment(offset_ns=0, bound_ns=0, method="shared", hosts=1)
    assert fit_drift(one_host, one_host) is one_host and one_host.to_reference(123) == 123


def _skewed_worker(worker_ctx):
    rank = worker_ctx.env.rank
    ops = GroupOps(worker_ctx.env.device)
    start = time.perf_counter_ns()

    def now() -> int:
        real = time.perf_counter_ns()
        return real if rank == 0 else real + SKEW_NS + int(RATE * (real - start))

    host = f"host-{rank}"  # two "hosts": the clocks are measured, not assumed shared
    before = align_clocks(ops, now=now, host=host)
    time.sleep(1.0)
    after = align_clocks(ops, now=now, host=host)
    fit = fit_drift(before, after)
    probe = now()
    true_offset = probe - time.perf_counter_ns()  # rank 1's clock minus rank 0's, now
    return {"fit": fit, "before": before, "after": after, "probe": probe, "true": true_offset}


def test_offset_and_drift_are_recovered_from_pings_before_and_after():
    results = launch_local(2, _skewed_worker, timeout_s=60)
    reference, skewed = results
    assert reference["fit"].offset_ns == 0 and reference["fit"].drift == 0.0
    fit, before, after = skewed["fit"], skewed["before"], skewed["after"]
    assert before.hosts == 2 and "drift" in fit.method
    span = after.at_ns - before.at_ns
    allowed = 2 * (before.bound_ns + after.bound_ns) / span + 1e-4  # each end is exact to its bound
    assert abs(fit.drift - RATE / (1 + RATE)) <= allowed, (fit.drift, allowed)  # d(offset) per ns of rank 1's clock
    # Extrapolated a little past the second measurement, the line still finds the true offset (a single
    # measurement taken before the case would be off by RATE x elapsed: 20 ms here).
    assert abs(fit.offset_at(skewed["probe"]) - skewed["true"]) <= after.bound_ns + allowed * span + 200_000
    assert abs(before.offset_ns - skewed["true"]) > 10_000_000
