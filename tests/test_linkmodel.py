"""The one link model (ringbench.topology.linkmodel): emulated links, the simulator, the placement section and
`recommend` price every hop with it, NIC sharing included, and `recommend` only names links the topology has."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import invoke

from ringbench.analysis.hops_on_topology import shared_hop_costs
from ringbench.rank.injection import RankFaults
from ringbench.scenario.scenario import Scenario
from ringbench.scenario.workload import Workload
from ringbench.simulate import Costs, SimCase
from ringbench.simulate.case import Cluster, phase_models
from ringbench.topology import load_topology, recommend, topology_from_spec
from ringbench.topology.linkmodel import net_shares, ring_links, transfer_us

# Two hosts x 4 GPUs, NVLink inside, a 1 GB/s network between them (issue: the order the user brought crossed it 8 times).
SPEC = {"intra": "NV4", "inter": "NET", "hosts": [{"name": "node", "count": 2, "gpus": 4}],
        "class_costs": {"NET": {"latency_us": 10.0, "bandwidth_gbps": 1.0}}}  # fmt: skip
INTERLEAVED = [0, 4, 1, 5, 2, 6, 3, 7]


def _topology():
    return topology_from_spec(SPEC)


def test_net_hops_between_two_hosts_share_the_link_in_one_step():
    topology = _topology()
    interleaved, identity = ring_links(topology, INTERLEAVED), ring_links(topology, list(range(8)))
    assert interleaved.labels == ("NET",) * 8 and list(interleaved.shares) == [4] * 8  # 4 hops each way
    assert list(identity.shares) == [1] * 8 and identity.labels.count("NET") == 2
    nbytes = 1 << 20
    assert interleaved.step_us(nbytes) == pytest.approx(transfer_us(10.0, 1.0, nbytes, 4))
    assert identity.step_us(nbytes) == pytest.approx(transfer_us(10.0, 1.0, nbytes))
    assert list(net_shares([0, 0, 1], [False, True, True], [0, 1, 2])) == [1, 1, 1]


def test_emulated_links_the_simulator_and_placement_price_a_hop_alike(tmp_path):
    topology = _topology()
    links = ring_links(topology, INTERLEAVED)
    path = _write(topology, tmp_path)
    matrices = Scenario(world=(8,), topology=path, emulate_links=True).link_model()  # what a run ships to its ranks
    nbytes = 262_144
    expected = links.transfer_us(nbytes)
    for rank in range(8):
        delay = RankFaults(rank=rank, link_model=matrices, ring=tuple(INTERLEAVED)).link_delay()
        for p in range(8):
            if int(links.dst[p]) == rank:
                assert delay(int(links.src[p]), rank, nbytes) * 1e6 == pytest.approx(expected[p])
    # the simulator's emulated delay into each position is the hop from the position before
    workload = Workload(world=8, seq=8 * 512, heads=2, head_dim=32, dtype="float32", order="0-4-1-5-2-6-3-7")
    case = SimCase(workload=workload, backward=False)
    lane = phase_models(case, Costs(), Cluster(topology=topology, emulate_links=True), np.random.default_rng(0))[
        "fwd"
    ].lanes["kv"]
    assert lane.delay_ms * 1e3 == pytest.approx(links.into(links.transfer_us(case.block_bytes("kv"))))
    shares, costs = shared_hop_costs(topology, INTERLEAVED)
    assert shares == [4] * 8 and costs == pytest.approx(list(links.transfer_us(topology.cost_model.message_bytes)))


def test_recommend_prices_the_step_with_nic_sharing_and_names_only_the_topologys_links(tmp_path):
    topology = _topology()
    result = recommend(topology, INTERLEAVED)
    assert result.order == tuple(range(8))
    message = topology.cost_model.message_bytes
    assert result.predicted_speedup == pytest.approx(transfer_us(10, 1, message, 4) / transfer_us(10, 1, message))
    assert result.predicted_speedup > 3.9  # the worst hop alone said x1.00
    assert [hop.share for hop in result.current_hops] == [4] * 8
    output = " ".join(invoke("recommend", "--topology", _write(topology, tmp_path), "--order", "0-4-1-5-2-6-3-7")
                      .output.split())  # fmt: skip
    assert "×4.00" in output and "inter-socket" not in output and "network link between two hosts" in output
    pcie = " ".join(invoke("recommend", "--topology", "tests/data/topology/pcie8_dual_socket_pix_pxb_sys.txt",
                           "--order", "stride:2").output.split())  # fmt: skip
    assert "inter-socket" in pcie and "×1.00" in pcie  # its worst hop stays SYS; four crossings become two


def test_recommend_never_picks_a_ring_slower_per_step_than_the_current_one():
    topology = load_topology("tests/data/topology/two_host_slow_net.yaml")
    for current in ("identity", "stride:2", "reverse", "0-2-3-1"):
        result = recommend(topology, current)
        assert result.step_us <= result.current_step_us * (1 + 1e-9)


def _write(topology, folder) -> str:
    path = folder / "topology.json"
    path.write_text(json.dumps(topology.to_dict()))
    return str(path)
