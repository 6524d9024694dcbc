"""The critical path and a straggler's cost on hand-built event tables whose path is known.

``_ring`` writes the events a ring records, exchange by exchange, with the posting and waiting order of
ringbench/record/schema.py for each buffer strategy and phase (the backward with its separate dK/dV exchange), and one
thing the simulator leaves out: every wait lasts at least a wake-up (``WAKE_MS``), as on a real machine, where a
rank always sits a few microseconds in a wait for an exchange that finished long before. That is what fooled the
walk: it followed such a wait back to the exchange's post and skipped the compute in between.

The checks: the path accounts for the whole iteration; a slow rank's compute is on the path all the time; a
named resource's cost equals what the fault adds to the step (the same table without the fault); exposed
communication is the wait time on the path.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ringbench.analysis.stragglers import culprits, straggler_table
from ringbench.figures import metrics
from ringbench.figures.critical_path import critical_path
from ringbench.record.schema import EVENT_COLUMNS

WAKE_MS = 0.05  # a wait lasts at least this long (a thread wakes up)
COMPUTE_MS, LINK_MS, WORLD, ITERATIONS = 2.0, 0.5, 4, 5


def _program(buffer: str, phase: str, n: int) -> list[tuple[str, str, int]]:
    """The ring loop as (op, exchange, step): post / wait an exchange, or compute (ring.py, schema.py)."""
    ops: list[tuple[str, str, int]] = []
    sync = buffer == "sync"
    for s in range(n):
        if sync and s > 0:
            ops += [("post", "kv", s), ("wait", "kv", s)]  # blocking: posted and waited for at once
        if not sync and s < n - 1:
            ops.append(("post", "kv", s))
        ops.append(("compute", "", s))
        if phase == "bwd":
            if not sync and s > 0:
                ops.append(("wait", "dkv", s - 1))  # the accumulator travelled while this step computed
            ops.append(("post", "dkv", s))
            if sync:
                ops.append(("wait", "dkv", s))
        if not sync and s < n - 1:
            ops.append(("wait", "kv", s))
    if phase == "bwd" and buffer != "sync":
        ops.append(("wait", "dkv", n - 1))
    return ops


def _ring(buffer: str, phases=("fwd",), *, compute=None, links=None, case_id="hand") -> pd.DataFrame:
    """Events of ITERATIONS iterations of a WORLD-rank ring (identity order); compute[r] ms per step on rank r
    (the backward takes twice as long), links[(src, dst)] ms per transfer (the dK/dV exchange: the same)."""
    n = WORLD
    compute = np.asarray(compute if compute is not None else [COMPUTE_MS] * n, float)
    link_in = np.array([(links or {}).get(((r - 1) % n, r), LINK_MS) for r in range(n)])  # into rank r
    ranks, pred, succ = np.arange(n), (np.arange(n) - 1) % n, (np.arange(n) + 1) % n
    rows: list[dict] = []

    def add(iteration, phase, step, kind, start, end, src, dst, nbytes=0, flops=0.0):
        for r in range(n):
            rows.append(
                {
                    "case_id": case_id, "repeat": 0, "iteration": iteration, "phase": phase, "rank": r,
                    "ring_position": r, "step": step, "kind": kind, "start_ns": round(start[r] * 1e6),
                    "end_ns": round(end[r] * 1e6), "src": int(src[r]), "dst": int(dst[r]), "bytes": nbytes,
                    "block": -1, "pair": "full" if kind == "compute" else "", "flops": flops,
                }
            )  # fmt: skip

    origin = 0.0
    for iteration in range(ITERATIONS):
        t = np.full(n, origin)
        for phase in phases:
            phase_start, posted = t.copy(), {}
            scale = 2.0 if phase == "bwd" else 1.0
            for op, exchange, step in _program(buffer, phase, n):
                if op == "compute":
                    add(iteration, phase, step, "compute", t, t + compute * scale, (ranks - step) % n, ranks,
                        flops=1e9 * scale)  # fmt: skip
                    t = t + compute * scale
                elif op == "post":
                    posted[exchange, step] = t.copy()
                else:
                    post = posted[exchange, step]
                    recv_done = np.maximum(post, post[pred]) + link_in  # both ends posted, then the link
                    send_done = recv_done[succ]  # our send completes when the successor has the block
                    blocking = buffer == "sync"
                    wait_start = post if blocking else t
                    wait_end = np.maximum(wait_start, np.maximum(recv_done, send_done)) + WAKE_MS
                    add(iteration, phase, step, "send", post, send_done, ranks, succ, nbytes=1 << 20)
                    add(iteration, phase, step, "recv", post, recv_done, pred, ranks, nbytes=1 << 20)
                    add(iteration, phase, step, "wait", wait_start, wait_end, pred, ranks)
                    t = wait_end
            add(iteration, phase, -1, "iteration", phase_start, t, ranks, ranks)
        origin = float(t.max()) + 0.2
    return pd.DataFrame(rows).reindex(columns=list(EVENT_COLUMNS))


def _step_ms(events: pd.DataFrame) -> float:
    return float(metrics.step_times(events)["step_ms"].median())


def _verdict(events: pd.DataFrame) -> pd.Series:
    return culprits(straggler_table(events)).iloc[0]


CASES = [(buffer, phases) for buffer in ("double", "sync") for phases in (("fwd",), ("fwd", "bwd"))]


@pytest.mark.parametrize(("buffer", "phases"), CASES)
def test_the_path_accounts_for_the_whole_iteration(buffer, phases):
    path = critical_path(_ring(buffer, phases))
    sums = path.groupby("iteration").agg(ms=("ms", "sum"), path=("path_ms", "first"))
    assert sums["ms"].to_numpy() == pytest.approx(sums["path"].to_numpy())


@pytest.mark.parametrize(("buffer", "phases"), CASES)
def test_a_slow_ranks_compute_is_on_the_path_and_its_cost_is_what_it_adds_to_the_step(buffer, phases):
    clean = _ring(buffer, phases)
    slow = _ring(buffer, phases, compute=[COMPUTE_MS, COMPUTE_MS, 1.5 * COMPUTE_MS, COMPUTE_MS])
    path = critical_path(slow)
    on_path = path[(path["resource"] == "rank") & (path["rank"] == 2)].groupby("iteration")["ms"].sum()
    busy = slow[(slow["kind"] == "compute") & (slow["rank"] == 2)]
    busy = ((busy["end_ns"] - busy["start_ns"]) / 1e6).groupby(busy["iteration"]).sum()
    assert on_path.to_numpy() == pytest.approx(busy.to_numpy(), rel=0.01)  # all of rank 2's compute
    row = _verdict(slow)
    assert (row["straggler_kind"], row["straggler_rank"]) == ("compute", 2)
    added = _step_ms(slow) - _step_ms(clean)
    assert row["cost_ms"] == pytest.approx(added, rel=0.05), (row["cost_ms"], added)


@pytest.mark.parametrize(("buffer", "phases"), CASES)
def test_a_slow_links_cost_is_what_it_adds_to_the_step(buffer, phases):
    # 2 ms more per transfer on 1 -> 2: longer than the compute beside it, so it shows with double buffering too.
    clean = _ring(buffer, phases)
    slow = _ring(buffer, phases, links={(1, 2): LINK_MS + 2.0})
    row = _verdict(slow)
    assert (row["straggler_kind"], row["slow_hop_src"], row["slow_hop_dst"]) == ("link", 1, 2)
    assert row["straggler_rank"] is None
    added = _step_ms(slow) - _step_ms(clean)
    assert row["cost_ms"] == pytest.approx(added, rel=0.1), (row["cost_ms"], added)


def test_a_link_hidden_behind_compute_costs_nothing():
    slow = _ring("double", links={(1, 2): LINK_MS + 1.0})  # 1.5 ms under 2 ms of compute
    path = critical_path(slow)
    assert path.loc[path["resource"] == "link", "ms"].sum() == 0.0
    assert _step_ms(slow) == pytest.approx(_step_ms(_ring("double")))
    row = _verdict(slow)
    assert row["straggler_kind"] in (None, "link") and (row["cost_ms"] or 0.0) < 0.01  # named, but free


@pytest.mark.parametrize("phases", [("fwd",), ("fwd", "bwd")])
def test_exposed_communication_is_the_wait_on_the_critical_path(phases):
    double = metrics.case_figures(_ring("double", phases)).iloc[0]
    # Every transfer hides behind compute, except the backward's last dK/dV exchange: nothing runs beside it.
    assert double["exposed_comm_ms"] == pytest.approx(0.0 if phases == ("fwd",) else LINK_MS)
    sync = metrics.case_figures(_ring("sync", phases)).iloc[0]
    # sync: every exchange is waited for while in flight, all on the path (the wake-up tail is not communication).
    exchanges = (WORLD - 1) if phases == ("fwd",) else (WORLD - 1) + (WORLD - 1) + WORLD  # + the dK/dV ones
    assert sync["exposed_comm_ms"] == pytest.approx(exchanges * LINK_MS)
    assert sync["exposed_comm_frac"] == pytest.approx(sync["exposed_comm_ms"] / sync["step_ms"])
    # A slow rank makes the others wait, but that is its compute on the path, not exposed communication.
    slow = _ring("double", phases, compute=[COMPUTE_MS, 3 * COMPUTE_MS, COMPUTE_MS, COMPUTE_MS])
    waited = slow.loc[slow["kind"] == "wait", "end_ns"] - slow.loc[slow["kind"] == "wait", "start_ns"]
    assert waited.sum() > 0
    assert metrics.case_figures(slow).iloc[0]["exposed_comm_ms"] == pytest.approx(double["exposed_comm_ms"])
