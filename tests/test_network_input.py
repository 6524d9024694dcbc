"""The network as users describe it: bandwidths with units, NICs per host or per GPU, and the bad inputs that are
one line and exit 2 (a multi-host plan without a NET cost, no NIC, a bandwidth <= 0, an unknown unit, a rail
layout that leaves a GPU out)."""

from __future__ import annotations

import json

import pytest
import yaml
from cli_helpers import assert_one_line_error, invoke

from ringbench.errors import UsageError
from ringbench.topology import topology_from_spec
from ringbench.topology.units import parse_bandwidth


@pytest.mark.parametrize(
    ("text", "gbps"),
    [("100Gbps", 12.5), ("100 Gb/s", 12.5), ("12.5GB/s", 12.5), ("400Gbit", 50.0), ("100GbE", 12.5), (12.5, 12.5),
     ("12.5", 12.5), ("800 Mbps", 0.1), ("1.6Tbps", 200.0), ("12.5 GBps", 12.5), ("400 Gbit/s", 50.0)],
)  # fmt: skip
def test_bandwidth_units(text, gbps):
    assert parse_bandwidth(text) == pytest.approx(gbps)


@pytest.mark.parametrize("text", ["100 furlongs", "fast", "0", "-3", "0Gbps", "100Gib/s", "nan", True, None, [1]])
def test_a_bandwidth_that_is_no_bandwidth_names_the_field_and_the_forms(text):
    with pytest.raises(UsageError, match=r"class_costs\.NET\.bandwidth_gbps=.*100Gbps, 100 Gb/s, 400Gbit"):
        parse_bandwidth(text, "class_costs.NET.bandwidth_gbps")


def _spec(**extra) -> dict:
    return {"intra": "NV8", "inter": "NET", "hosts": [{"name": "node", "count": 2, "gpus": 4}], **extra}


def test_a_bare_number_keeps_meaning_gb_per_s_and_units_convert():
    bare = topology_from_spec(_spec(class_costs={"NET": {"latency_us": 5, "bandwidth_gbps": 12.5}}))
    unit = topology_from_spec(_spec(class_costs={"NET": {"latency_us": 5, "bandwidth_gbps": "100Gbps"}}))
    link = bare.link(0, 4)
    assert bare.cost_model.latency_bandwidth(link) == unit.cost_model.latency_bandwidth(link) == (5.0, 12.5)
    measured = topology_from_spec(_spec(links=[{"from": 0, "to": 4, "latency_us": 3, "bandwidth_gbps": "8Gbit"}]))
    assert measured.link(0, 4).bandwidth_gbps == pytest.approx(1.0)


def test_nics_per_host_per_gpu_and_rails():
    default = topology_from_spec(_spec())
    assert list(default.nic_ids()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "not stated: the default" in default.describe_nics()
    rails = topology_from_spec(_spec(nics="per-gpu"))
    assert len(set(rails.nic_ids())) == 8 and "rail-optimised" in rails.describe_nics()
    pairs = topology_from_spec(_spec(hosts=[{"name": "node", "count": 2, "gpus": 4, "nics": [[0, 2], [1, 3]]}]))
    assert list(pairs.nic_ids()) == [0, 1, 0, 1, 2, 3, 2, 3]
    again = type(pairs).from_dict(json.loads(json.dumps(pairs.to_dict())))  # a run's meta.json keeps them
    assert list(again.nic_ids()) == list(pairs.nic_ids())


def _write(tmp_path, spec) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


PLAN = ("plan", "--world", "8", "--seq", "8192", "--heads", "8", "--no-detect")


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        (_spec(), ("class_costs.NET is missing", "bandwidth per NIC")),
        (_spec(nics=0, class_costs={"NET": {"bandwidth_gbps": 5}}), ("nics=0", "a NIC count from 1")),
        (_spec(class_costs={"NET": {"bandwidth_gbps": 0}}), ("class_costs.NET.bandwidth_gbps=0", "100Gbps")),
        (_spec(class_costs={"NET": {"bandwidth_gbps": -4}}), ("bandwidth_gbps=-4", "a bandwidth > 0")),
        (_spec(class_costs={"NET": {"bandwidth_gbps": "100 Gbaud"}}), ("bandwidth_gbps='100 Gbaud'", "400Gbit")),
        (_spec(class_costs={"NET": {"bandwidth_gbps": 5}}, hosts=[{"name": "n", "count": 2, "gpus": 4,
                                                                   "nics": [[0, 1], [2]]}]),
         ("nics=[[0, 1], [2]]", "GPU 3 under none")),
    ],
)  # fmt: skip
def test_bad_network_input_is_one_line_and_exit_2(tmp_path, spec, fragments):
    result = invoke(*PLAN, "--topology", _write(tmp_path, spec))
    assert_one_line_error(result, *fragments)


def test_topo_shows_the_nics_and_the_network_cost(tmp_path):
    spec = _spec(nics="per-gpu", class_costs={"NET": {"latency_us": 5, "bandwidth_gbps": "400Gbps"}})
    result = invoke("topo", "--topology", _write(tmp_path, spec))
    assert result.exit_code == 0, result.output
    assert "8 NICs each" not in result.output and "4 NICs each, one per GPU" in result.output
    assert "50 GB/s (400 Gb/s) per NIC" in result.output
    default = invoke("topo", "--topology", _write(tmp_path, _spec()), "--json")
    document = json.loads(default.stdout)
    assert document["nics"][0] == {"host": "node0", "stated": False, "nics": [[0, 1, 2, 3]]}
    assert "not stated" in default.stderr


def test_a_multi_host_plan_with_a_net_cost_runs(tmp_path):
    spec = _spec(
        nics=2, class_costs={"NET": {"latency_us": 10, "bandwidth_gbps": "100 Gb/s"}}
    )  # = the nominal row: given
    result = invoke(*PLAN, "--topology", _write(tmp_path, spec), "--json")
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout)["candidates"][0]
    assert first["mib_per_rank_by_class"] and first["net_mb_per_rank"] == first["mib_per_rank_by_class"].get("NET", 0)


def test_a_plan_without_world_takes_every_device_of_the_topology(tmp_path):
    spec = _spec(class_costs={"NET": {"bandwidth_gbps": "100Gbps"}})
    result = invoke("plan", "--seq", "8192", "--heads", "8", "--no-detect", "--topology", _write(tmp_path, spec),
                    "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["world"] == 8  # 2 hosts x 4 GPUs
    missing = invoke("plan", "--seq", "8192", "--heads", "8", "--no-detect")
    assert_one_line_error(missing, "--topology is missing")
