"""The simulator: schema, the ring's timing semantics, labels, and a stored run that load_run reads back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from ringbench.errors import UsageError
from ringbench.schema import CASE_COLUMNS, EVENT_COLUMNS, EVENTS_SCHEMA
from ringbench.simulate import SimConfig, simulate, simulate_run, write_simulated_run
from ringbench.store import load_run


def _ms(rows):
    return (rows["end_ns"] - rows["start_ns"]) / 1e6


def test_events_follow_the_schema_and_cases_have_every_column():
    events, cases = simulate(SimConfig(world=4, iterations=2))
    assert tuple(events.columns) == EVENT_COLUMNS
    table = pa.Table.from_pandas(events, schema=EVENTS_SCHEMA, preserve_index=False)  # what write_events does
    assert table.num_rows == len(events)
    assert events["start_ns"].dtype == np.int64 and events["rank"].dtype == np.int32
    assert set(events["kind"]) == {"iteration", "compute", "send", "recv", "wait"}
    assert set(events["phase"]) == {"fwd", "bwd"}
    assert tuple(cases.columns) == CASE_COLUMNS
    assert bool(cases["emulated"].all()) and cases["kernel"].eq("simulated").all()


def test_double_buffering_overlaps_and_sync_does_not():
    common = dict(world=4, iterations=3, compute_ms=2.0, link_ms=1.0, backward=False)
    double, _ = simulate(SimConfig(buffer="double", **common))
    sync, _ = simulate(SimConfig(buffer="sync", **common))
    # double: the 1 ms transfer hides behind 2 ms of compute -> no exposed wait, 4 steps x 2 ms per iteration.
    assert _ms(double[double["kind"] == "wait"]).max() == pytest.approx(0.0)
    it = double[double["kind"] == "iteration"]
    assert _ms(it).max() == pytest.approx(8.0)
    # sync: each of the 3 exchanges is waited for in full, then compute: 3 x 1 + 4 x 2 ms.
    assert _ms(sync[sync["kind"] == "wait"]).min() == pytest.approx(1.0)
    assert _ms(sync[sync["kind"] == "iteration"]).max() == pytest.approx(11.0)


def test_recv_cannot_complete_before_the_predecessor_posted_plus_the_link():
    events, _ = simulate(SimConfig(world=4, iterations=2, slow_rank=2, slow_factor=3.0, link_ms=0.5, backward=False))
    keys = ["iteration", "step", "src", "dst"]
    recv, send = events[events["kind"] == "recv"], events[events["kind"] == "send"]
    joined = recv.merge(send, on=keys, suffixes=("", "_send")).set_index(keys)
    earliest = np.maximum(joined["start_ns"], joined["start_ns_send"]) + 500_000
    assert (joined["end_ns"] >= earliest).all()
    # Behind the slow rank 2, rank 3's recv waits on rank 2's late post, not on the link.
    late = joined.xs((2, 3), level=("src", "dst"))
    assert ((late["start_ns_send"] - late["start_ns"]) > 0).any()


def test_causal_skip_pairs_have_no_compute_row():
    events, _ = simulate(SimConfig(world=4, iterations=1, mask="causal", layout="contiguous", backward=False))
    comp = events[events["kind"] == "compute"]
    counts = comp.groupby("rank").size().to_dict()
    assert counts == {0: 1, 1: 2, 2: 3, 3: 4}  # rank r: r full pairs + its causal diagonal
    assert set(comp.loc[comp["src"] == comp["dst"], "pair"]) == {"causal"}


def test_simulated_run_is_labelled_and_round_trips(tmp_path):
    cfg = SimConfig(world=2, iterations=2, slow_rank=1, slow_factor=2.0, jitter=0.03, seed=3)
    run = simulate_run(cfg, run_id="r1")
    assert run.meta["simulated"] is True and run.meta["emulated"] is True
    assert run.meta["faults"] == ["slow_rank:rank=1,factor=2"]
    path = write_simulated_run(tmp_path / "sim", cfg)
    loaded = load_run(path)
    assert len(loaded.events) == len(run.events) and loaded.meta["simulated"] is True
    assert loaded.cases["faults"].iloc[0] == "slow_rank:rank=1,factor=2"


def test_seeded_jitter_is_reproducible_and_validation_names_the_field():
    a, _ = simulate(SimConfig(world=3, iterations=2, jitter=0.05, seed=7))
    b, _ = simulate(SimConfig(world=3, iterations=2, jitter=0.05, seed=7))
    assert a.equals(b)
    with pytest.raises(UsageError, match="buffer"):
        SimConfig(buffer="triple")
    with pytest.raises(UsageError, match="slow_link"):
        SimConfig(world=4, slow_link=(0, 2))
