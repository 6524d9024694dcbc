"""`ringbench topo` and `ringbench recommend` through Typer's CliRunner: output, JSON, and one-line errors."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error as _assert_one_line_error
from cli_helpers import invoke

from ringbench.record.schema import SCHEMA_VERSION
from ringbench.topology import load_topology

DATA = Path(__file__).parent / "data" / "topology"
PCIE8 = str(DATA / "pcie8_dual_socket_pix_pxb_sys.txt")


assert_one_line_error = partial(_assert_one_line_error, stdout_empty=True)


def write_run(tmp_path: Path, **meta) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "meta.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, **meta}))
    return run_dir


# -- topo ------------------------------------------------------------------------------------------------------------


def test_topo_prints_the_gpu_matrix():
    result = invoke("topo", "--topology", PCIE8)
    assert result.exit_code == 0, result.output
    assert "GPU7" in result.output and "SYS" in result.output and "NIC" not in result.output


def test_topo_json_has_the_class_matrix():
    result = invoke("topo", "--topology", str(DATA / "dgx_a100_nv12.txt"), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["format"] == "ringbench-topology" and len(document["devices"]) == 8
    assert document["classes"][0][:2] == ["X", "NV12"]


def test_topo_without_nvml_says_so_and_exits_2():
    result = invoke("topo")
    if result.exit_code == 0:
        pytest.skip("NVML works on this machine")
    assert_one_line_error(result, "NVML is unavailable", "--topology")


# -- recommend -------------------------------------------------------------------------------------------------------


def test_recommend_json_fields():
    result = invoke("recommend", "--topology", PCIE8, "--order", "stride:2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    for key in ("order", "worst_hop_class", "current_worst_hop_class", "predicted_speedup", "all_equivalent"):
        assert key in document
    assert document["all_equivalent"] is False
    assert document["hop_classes"]["SYS"] == 2 and document["current_hop_classes"]["SYS"] == 4
    assert document["order_arg"] == "-".join(map(str, document["order"]))
    assert document["cuda_visible_devices"] == {"localhost": ",".join(map(str, document["order"]))}


def test_recommend_human_output_shows_hops_and_launch_forms():
    result = invoke("recommend", "--topology", PCIE8, "--order", "0-4-1-5-2-6-3-7")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "Recommended ring: 0-1-2-3-4-5-6-7" in text
    assert "ringbench run --order 0-1-2-3-4-5-6-7" in text and "CUDA_VISIBLE_DEVICES=" in text
    assert "Predicted speedup of communication per ring step" in text and "Model:" in text
    # A topology prices links, not compute: the headline says that it covers communication only.
    assert "communication only" in text.split("Predicted speedup", 1)[1].split(")", 1)[0]


def test_recommend_headline_from_a_topology_covers_communication_only():
    document = json.loads(invoke("recommend", "--topology", PCIE8, "--order", "0-4-1-5-2-6-3-7", "--json").stdout)
    assert document["headline"]["covers"] == "communication"
    assert document["headline"]["speedup"] == document["predicted_speedup"]


@pytest.mark.parametrize("name", ["dgx_a100_nv12.txt", "hgx_h200_nv18.txt"])
def test_recommend_nvswitch_says_every_order_is_equivalent(name):
    result = invoke("recommend", "--topology", str(DATA / name))
    assert result.exit_code == 0, result.output
    assert "Every ring order is equivalent" in " ".join(result.output.split())
    document = json.loads(invoke("recommend", "--topology", str(DATA / name), "--json").stdout)
    assert document["all_equivalent"] is True and document["predicted_speedup"] == 1.0


def test_recommend_from_a_run_directory(tmp_path):
    topology = load_topology(DATA / "two_host_pcie.yaml")
    run_dir = write_run(tmp_path, world=16, topology=topology.to_dict())
    result = invoke("recommend", str(run_dir), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["order"]) == 16 and document["worst_hop_class"] == "NET"


def test_recommend_message_size_changes_costs_not_order():
    small = json.loads(invoke("recommend", "--topology", PCIE8, "--message-mib", "1", "--json").stdout)
    large = json.loads(invoke("recommend", "--topology", PCIE8, "--json").stdout)
    assert small["worst_hop_us"] < large["worst_hop_us"] and small["order"] == large["order"]


# -- bad input: one line, exit 2 -------------------------------------------------------------------------------------


def test_bad_inputs_exit_2_with_one_line(tmp_path):
    not_matrix = tmp_path / "notes.txt"
    not_matrix.write_text("just some words\n")
    unknown_class = tmp_path / "unknown.txt"
    unknown_class.write_text("\tGPU0\tGPU1\nGPU0\t X \tNV2\nGPU1\tWARP\t X \n")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("intra: FAST\nhosts: [{gpus: 4}]\n")
    cases = [
        (("topo", "--topology", str(not_matrix)), ("not a topology",)),
        (("recommend", "--topology", str(not_matrix)), ("not a topology",)),
        (("recommend", "--topology", str(unknown_class)), ("GPU1 -> GPU0", "WARP")),
        (("topo", "--topology", str(bad_yaml)), ("intra='FAST'",)),
        (("recommend", "--topology", PCIE8, "--order", "0-1-2"), ("not a permutation",)),
        (("recommend", "--topology", PCIE8, "--order", "0-1-2-3-4-5-6-6"), ("not a permutation",)),
        (("recommend", "--topology", PCIE8, "--order", "sideways"), ("order",)),
        (("recommend", "--topology", str(tmp_path / "missing.txt")), ("missing.txt",)),
        (("recommend",), ("no topology",)),
        (("recommend", "--topology", PCIE8, "--message-mib", "0"), ("message_mib",)),
    ]
    for args, fragments in cases:
        assert_one_line_error(invoke(*args), *fragments)


def test_topology_of_the_wrong_size_for_the_run(tmp_path):
    run_dir = write_run(tmp_path, world=4)
    assert_one_line_error(invoke("recommend", str(run_dir), "--topology", PCIE8), "8 devices", "world=4")
    assert_one_line_error(invoke("recommend", str(run_dir)), "has no 'topology'")
