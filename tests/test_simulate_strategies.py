"""The simulator's strategies and `ringbench plan`: consistency with the ring engine, the sharing rules the runs
use, the ranking, refusals, and one-line errors. (Accuracy against measurement: benchmarks/validate_strategies.py,
docs/simulate.md.)"""

import json
from pathlib import Path

import pytest

from ringbench.advise.planner import PlanRequest, make_plan
from ringbench.rank.injection import RankFaults
from ringbench.scenario.workload import Workload
from ringbench.simulate import DEFAULTS, Cluster, SimCase, simulate_case
from ringbench.simulate.flows import Prices
from ringbench.simulate.grouped import predicted_memory_mb
from ringbench.topology import load_topology
from tests.cli_helpers import assert_one_line_error, invoke

TOPOLOGY = Path(__file__).parent / "data" / "topology" / "two_host_4gpu_10x.yaml"


def _case(strategy: str, **axes) -> SimCase:
    base = dict(world=8, seq=4096, heads=8, head_dim=32, dtype="float32", layout="zigzag", buffer="double")
    return SimCase(workload=Workload(**(base | axes), strategy=strategy))


@pytest.fixture(scope="module")
def cluster():
    return Cluster(topology=load_topology(TOPOLOGY), emulate_links=True)


def test_degenerate_strategies_agree_with_their_twins(cluster):
    costs = DEFAULTS.with_rate(gflops=20.0)
    step = {s: simulate_case(_case(s), costs, cluster).row["step_ms"] for s in ("ulysses", "hybrid:8", "ring")}
    assert step["ulysses"] == pytest.approx(step["hybrid:8"], rel=1e-9)  # one group of eight: the same schedule
    one_inner = simulate_case(_case("double-ring:8"), costs, cluster).row["step_ms"]
    assert one_inner == pytest.approx(step["ring"], rel=0.01)  # one inner ring of N: the ring itself


def test_the_simulator_prices_an_exchange_as_the_run_injects_it(cluster):
    topology = cluster.topology
    flows = [(a, b) for a in range(8) for b in range(8) if a != b]
    model = {"net": [[topology.link(a, b).kind.value == "NET" if a != b else False for b in range(8)]
                     for a in range(8)], "hosts": [d.host for d in topology.devices],
             "latency_us": [[0.0] * 8] * 8, "bandwidth_gbps": [[1.0] * 8] * 8}  # fmt: skip
    faults = RankFaults(rank=0, link_model=model)
    pairs = [(0, 5), (0, 1), (6, 2)]
    shares = Prices(DEFAULTS, Cluster(topology=topology, emulate_links=True)).shares(pairs, flows)
    for (src, dst), share in zip(pairs, shares, strict=True):
        assert share == faults._flow_sharing(src, dst, flows)
    assert shares[0] == 16  # 4 x 4 transfers from host 0 to host 1 share its network link


def test_compute_bound_contexts_favour_rings_and_predicted_memory_orders_the_strategies(cluster):
    slow = DEFAULTS.with_rate(gflops=20.0)
    rows = {s: simulate_case(_case(s, seq=16384), slow, cluster).row for s in ("ring", "allgather", "hybrid:4")}
    assert rows["ring"]["step_ms"] < rows["allgather"]["step_ms"]
    assert all(0 <= r["exposed_comm_frac"] <= 1 for r in rows.values())
    memory = {s: predicted_memory_mb(_case(s)) for s in ("ring", "double-ring:4", "ulysses", "allgather")}
    assert memory["ring"] < memory["ulysses"] < memory["double-ring:4"] < memory["allgather"]


def test_the_plan_ranks_every_candidate_and_says_why(tmp_path):
    workload = Workload(world=8, seq=16384, heads=4, head_dim=32, dtype="float32")
    plan = make_plan(PlanRequest(workload=workload, topology=TOPOLOGY, memory_per_rank_gb=0.03))
    steps = [c.step_ms for c in plan.candidates]
    assert steps == sorted(steps) and len(plan.candidates) + len(plan.refused) == 11
    refused = {c.strategy: c.refused for c in plan.refused}
    assert refused["ulysses"] == "4 heads do not divide 8 ranks"  # and hybrid:8 is not a candidate of its own
    assert "exceeds --memory-per-rank 0.03" in refused["allgather"]
    assert all(c.why.startswith(c.label) for c in plan.candidates[1:])
    top = plan.candidates[0]
    assert f"--strategy {top.strategy}" in plan.command and plan.command.startswith("ringbench run --world 8")
    assert plan.confidence.startswith("PREDICTED from the documented default costs")
    assert {r["ring"] for c in plan.candidates if c.strategy == "hybrid:2" for r in c.rings} == {
        "all-to-all group", "ring across groups"}  # fmt: skip


def test_plan_json_and_its_one_line_errors():
    result = invoke("plan", "--topology", str(TOPOLOGY), "--world", "8", "--seq", "4096", "--heads", "8",
                    "--head-dim", "32", "--json", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["predicted"] and document["candidates"][0]["step_ms"] > 0
    for args, fragment in (
        (("--world", "16", "--seq", "4096", "--heads", "8"), "it has 8 devices"),
        (("--world", "8", "--seq", "4100", "--heads", "8"), "seq=4100"),
        (("--world", "8", "--seq", "4096", "--heads", "8", "--kv-heads", "3"), "kv_heads=3"),
        (("--world", "8", "--seq", "4096", "--heads", "8", "--layout", "spiral"), "layout='spiral'"),
    ):
        assert_one_line_error(invoke("plan", "--topology", str(TOPOLOGY), *args), fragment)


@pytest.mark.parametrize(
    ("buffer", "faults", "backward"),
    [
        ("double", (), True),
        ("sync", ("slow-rank:3:1.5", "jitter:0.01", "slow-link:1:2:0.2"), True),
        ("double", ("jitter:0.02",), False),
    ],
)
def test_the_compiled_whole_ring_pass_is_the_numpy_pass(monkeypatch, buffer, faults, backward):
    pytest.importorskip("numba")
    import dataclasses

    import numpy as np

    import ringbench.simulate.ring_timeline as timeline
    from ringbench.simulate import fastring
    from ringbench.simulate.simulated_record import kept_positions

    workload = Workload(world=96, seq=96 * 4, heads=2, head_dim=16, dtype="float32", layout="zigzag", buffer=buffer)
    case = SimCase(workload=workload, iterations=2, faults=faults, backward=backward)
    costs = dataclasses.replace(DEFAULTS, compute_cv=0.05, link_cv=0.1, start_skew_ms=(0.0, 0.02))
    keep = kept_positions(case, Cluster())
    runs = []
    for advance in (lambda engine, window: None, fastring.lean_advance):
        monkeypatch.setattr(timeline, "lean_advance", advance)
        runs.append(timeline.simulate_timeline(case, costs, Cluster(), bounded=True, keep=keep,
                                               keep_steps=np.arange(0, 97, 7), every=16))  # fmt: skip
    numpy_pass, compiled = runs
    for phase in case.phases:
        assert np.array_equal(numpy_pass.phase_end[phase], compiled.phase_end[phase])
    assert [p.exposed_ms for p in numpy_pass.paths] == [p.exposed_ms for p in compiled.paths]
