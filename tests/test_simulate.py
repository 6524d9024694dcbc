"""The simulator: schema, the ring's timing semantics, labels, faults, the critical path at scale, the record."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pyarrow as pa
import pytest
from support.given import SimConfig, simulate, simulate_run, write_simulated_run

from ringbench.errors import UsageError
from ringbench.figures import metrics
from ringbench.figures.critical_path import transfers
from ringbench.record.schema import CASE_COLUMNS, EVENT_COLUMNS, EVENTS_SCHEMA
from ringbench.record.store import load_run
from ringbench.scenario.workload import Workload
from ringbench.simulate import Costs, LinkCost, SimCase, simulate_case
from ringbench.simulate.case import Cluster

# Costs with visible communication: 0.1 ms + 2 MB/ms links, a slow compute rate, noise and a barrier spread.
NOISY = Costs(gflops=300.0, links={"local": LinkCost(latency_us=100, bandwidth_gbps=0.5)}, compute_cv=0.05,
              link_cv=0.1, start_skew_ms=(0.0, 0.3, 1.0))  # fmt: skip
QUIET = Costs(gflops=300.0, links={"local": LinkCost(latency_us=100, bandwidth_gbps=0.5)}, call_ms={"fwd": 0, "bwd": 0})


def _ms(rows):
    return (rows["end_ns"] - rows["start_ns"]) / 1e6


# -- SimConfig: a ring at given compute and link times ------------------------------------------------------------
def test_events_follow_the_schema_and_cases_have_every_column():
    events, cases = simulate(SimConfig.of(world=4, iterations=2))
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
    double, _ = simulate(SimConfig.of(buffer="double", **common))
    sync, _ = simulate(SimConfig.of(buffer="sync", **common))
    # double: the 1 ms transfer hides behind 2 ms of compute -> no exposed wait, 4 steps x 2 ms per iteration.
    assert _ms(double[double["kind"] == "wait"]).max() == pytest.approx(0.0)
    assert _ms(double[double["kind"] == "iteration"]).max() == pytest.approx(8.0)
    # sync: each of the 3 exchanges is waited for in full, then compute: 3 x 1 + 4 x 2 ms.
    assert _ms(sync[sync["kind"] == "wait"]).min() == pytest.approx(1.0)
    assert _ms(sync[sync["kind"] == "iteration"]).max() == pytest.approx(11.0)


def test_recv_cannot_complete_before_the_predecessor_posted_plus_the_link():
    events, _ = simulate(SimConfig.of(world=4, iterations=2, slow_rank=2, slow_factor=3.0, link_ms=0.5, backward=False))
    keys = ["iteration", "step", "src", "dst"]
    recv, send = events[events["kind"] == "recv"], events[events["kind"] == "send"]
    joined = recv.merge(send, on=keys, suffixes=("", "_send")).set_index(keys)
    earliest = np.maximum(joined["start_ns"], joined["start_ns_send"]) + 500_000
    assert (joined["end_ns"] >= earliest).all()
    late = joined.xs((2, 3), level=("src", "dst"))  # behind the slow rank 2, rank 3 waits on 2's late post
    assert ((late["start_ns_send"] - late["start_ns"]) > 0).any()


def test_causal_skip_pairs_have_no_compute_row():
    events, _ = simulate(SimConfig.of(world=4, iterations=1, mask="causal", layout="contiguous", backward=False))
    comp = events[events["kind"] == "compute"]
    assert comp.groupby("rank").size().to_dict() == {0: 1, 1: 2, 2: 3, 3: 4}  # r full pairs + its diagonal
    assert set(comp.loc[comp["src"] == comp["dst"], "pair"]) == {"causal"}


def test_simulated_run_is_labelled_with_canonical_fault_specs_and_round_trips(tmp_path):
    cfg = SimConfig.of(world=2, iterations=2, slow_rank=1, slow_factor=2.0, jitter=0.03, seed=3)
    run = simulate_run(cfg, run_id="r1")
    assert run.meta["simulated"] is True and run.meta["emulated"] is True
    assert run.meta["faults"] == ["slow-rank:1:2"]
    loaded = load_run(write_simulated_run(tmp_path / "sim", cfg))
    assert len(loaded.events) == len(run.events) and loaded.meta["simulated"] is True
    assert loaded.cases["faults"].iloc[0] == "slow-rank:1:2"


def test_seeded_noise_is_reproducible_and_validation_names_the_field():
    a, _ = simulate(SimConfig.of(world=3, iterations=2, jitter=0.05, seed=7))
    b, _ = simulate(SimConfig.of(world=3, iterations=2, jitter=0.05, seed=7))
    assert a.equals(b)
    with pytest.raises(UsageError, match="buffer"):
        SimConfig.of(buffer="triple")
    with pytest.raises(UsageError, match="slow_link"):
        SimConfig.of(world=4, slow_link=(0, 2))


# -- SimCase: the engine's backward, the critical path, bounded records --------------------------------------------
def test_backward_has_the_engines_two_exchanges_per_step():
    case = SimCase(workload=Workload(world=4, seq=1024, heads=2, head_dim=32, dtype="float32"), iterations=1)
    events = simulate_case(case, QUIET).events
    xfers = transfers(events)
    bwd = xfers[xfers["phase"] == "bwd"]
    assert set(bwd["exchange"]) == {"kv", "dkv"}
    assert (bwd["exchange"] == "kv").sum() == 4 * 3 and (bwd["exchange"] == "dkv").sum() == 4 * 4
    dkv = bwd[bwd["exchange"] == "dkv"]
    assert (dkv["bytes"] == 2 * 2 * 256 * 32 * 4).all()  # fp32 accumulators of K and V


@pytest.mark.parametrize(("buffer", "layout", "faults", "order"), [
    ("double", "contiguous", (), "identity"), ("sync", "zigzag", (), "stride:2"),
    ("double", "zigzag", ("slow-rank:2:2",), "identity"), ("sync", "contiguous", ("slow-link:1:2:1.5",), "identity"),
    ("double", "striped", ("jitter:0.5",), "stride:2"), ("sync", "striped", ("slow-host:1:1.5",), "reverse"),
])  # fmt: skip
def test_the_engines_walk_is_metrics_exposed_communication(buffer, layout, faults, order):
    workload = Workload(world=6, seq=6 * 240, heads=2, head_dim=32, dtype="float32", mask="causal", layout=layout,
                        buffer=buffer, order=order)  # fmt: skip
    case = SimCase(workload=workload, iterations=3, faults=faults)
    result = simulate_case(case, NOISY, Cluster(gpus_per_host=3))
    figures = metrics.iteration_figures(result.events)
    assert figures["exposed_comm_ms"].to_numpy() == pytest.approx(result.exposed_ms, abs=1e-3)
    assert result.row["exposed_comm_ms"] == pytest.approx(np.median(result.exposed_ms), abs=1e-3)


@pytest.mark.parametrize(("buffer", "faults"), [("double", ("slow-rank:7:2", "jitter:0.3")),
                                                ("sync", ("slow-link:30:31:1.5",))])  # fmt: skip
def test_a_bounded_record_has_the_full_records_figures(buffer, faults):
    workload = Workload(world=48, seq=48 * 16, heads=2, head_dim=32, dtype="float32", layout="contiguous",
                        buffer=buffer)  # fmt: skip
    case = SimCase(workload=workload, iterations=2, faults=faults)
    full = simulate_case(case, NOISY, max_events=10**8)
    bounded = simulate_case(case, NOISY, max_events=4000)
    assert not full.bounded and bounded.bounded
    assert bounded.exposed_ms == pytest.approx(full.exposed_ms, abs=1e-9)
    for name in ("step_ms", "fwd_ms", "bwd_ms", "exposed_comm_ms", "tflops", "tokens_per_s"):
        assert bounded.row[name] == pytest.approx(full.row[name], rel=1e-6, abs=1e-5), name  # ns rounding
    events = bounded.events
    iteration = events[events["kind"] == "iteration"]
    assert len(iteration) == 2 * 2 * 48  # every rank's iteration rows: step times stay exact
    assert len(events) < len(full.events) / 5
    assert metrics.step_times(events)["step_ms"].median() == pytest.approx(full.row["step_ms"])
    keys = ["iteration", "phase", "step", "kind", "rank", "start_ns", "end_ns", "src", "dst", "bytes", "pair"]
    found = events.merge(full.events, on=keys, how="left", indicator=True)["_merge"]
    assert (found == "both").all()  # every span a bounded record keeps is the full record's span


def test_faults_slow_the_right_ranks_and_links():
    costs = dataclasses.replace(QUIET, gflops=3.0)  # compute-bound: a pair takes ~0.7 ms, a transfer ~0.17 ms
    base = SimCase(workload=Workload(world=8, seq=8 * 64, heads=2, head_dim=32, dtype="float32", layout="zigzag"))
    healthy = simulate_case(base, costs).row["step_ms"]
    host = simulate_case(dataclasses.replace(base, faults=("slow-host:1:2",)), costs, Cluster(gpus_per_host=4))
    comp = host.events[host.events["kind"] == "compute"]
    per_rank = comp.assign(ms=_ms(comp)).groupby("rank")["ms"].sum()
    assert per_rank[[4, 5, 6, 7]].min() == pytest.approx(2 * per_rank[[0, 1, 2, 3]].max())  # host 1: ranks 4..7
    assert host.row["step_ms"] > 1.8 * healthy
    link = simulate_case(dataclasses.replace(base, faults=("slow-link:3:4:2",)), costs)
    xfers = transfers(link.events)
    slow = (xfers["src"] == 3) & (xfers["dst"] == 4)
    assert xfers.loc[slow, "transfer_ms"].min() >= 2.0 and xfers.loc[~slow, "transfer_ms"].max() < 1.0
    with pytest.raises(UsageError, match="crash"):
        SimCase(workload=Workload(world=4, seq=256), faults=("crash:1:0",))
    with pytest.raises(UsageError, match="slow-host"):
        simulate_case(dataclasses.replace(base, faults=("slow-host:5:2",)), costs, Cluster(gpus_per_host=4))


def test_emulated_links_are_the_topologys_cost_after_the_local_transfer():
    from pathlib import Path

    from ringbench.topology import load_topology

    topology = load_topology(Path(__file__).parent / "data" / "topology" / "two_host_slow_net.yaml")
    case = SimCase(workload=Workload(world=4, seq=4 * 128, heads=2, head_dim=32, dtype="float32"), backward=False)
    result = simulate_case(case, QUIET, Cluster(topology=topology, emulate_links=True))
    recv = result.events[result.events["kind"] == "recv"]
    net = recv[(recv["src"] == 1) & (recv["dst"] == 2)]  # node0 -> node1: 2 ms + bytes / 0.05 GB/s, alone
    nbytes = case.block_bytes("kv")
    expected = QUIET.links["local"].ms(nbytes) + 2.0 + nbytes / (0.05 * 1e6)
    assert _ms(net).min() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("mask", "layout"), list(itertools.product(("none", "causal"), ("contiguous", "zigzag"))))
def test_useful_flops_per_iteration_do_not_depend_on_the_record(mask, layout):
    case = SimCase(workload=Workload(world=5, seq=5 * 32, heads=2, head_dim=32, dtype="float32", mask=mask,
                                     layout=layout))  # fmt: skip
    full = simulate_case(case, QUIET)
    assert full.row["tflops"] == pytest.approx(simulate_case(case, QUIET, max_events=10).row["tflops"], rel=1e-6)


def test_synthetic_errors_are_labelled_in_the_record_itself(tmp_path):
    from support.given import SYNTHETIC_NOTE

    made_up = simulate_run(SimConfig.of(world=2, iterations=2, synthetic_errors=True, case_id="made-up"))
    row = made_up.cases.iloc[0]
    assert row["fwd_max_abs_err"] > 0 and row["check_note"] == SYNTHETIC_NOTE
    assert made_up.meta["simulation"]["synthetic_errors"] is True and made_up.meta["simulated"] is True
    plain = simulate_run(SimConfig.of(world=2, iterations=2, case_id="plain")).cases.iloc[0]
    assert np.isnan(plain["fwd_max_abs_err"]) and plain["check_note"] == "simulated: not checked"


def test_simconfig_runs_the_simulators_model_with_the_engines_backward():
    """SimConfig states given times for the one model: a K/V block in link_ms, the backward's dK/dV exchange too."""
    events, cases = simulate(SimConfig.of(world=4, iterations=1, compute_ms=2.0, link_ms=1.0, buffer="sync"))
    xfers = transfers(events)
    kv = xfers[(xfers["phase"] == "fwd")]
    assert kv["transfer_ms"].to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert set(xfers.loc[xfers["phase"] == "bwd", "exchange"]) == {"kv", "dkv"}
    assert cases["kernel"].eq("simulated").all()
