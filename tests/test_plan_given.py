"""A class cost the topology file states is what the plan prices, and its line says so: GIVEN with the file's
figures, PRIOR only for what the file leaves out (text and --json)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import invoke

from ringbench.advise.planner import PlanRequest, make_plan
from ringbench.hardware import find_gpu
from ringbench.scenario.workload import Workload
from ringbench.simulate.priors import gpu_prior
from ringbench.topology import Topology, load_topology
from ringbench.topology.links import LinkKind

DGX_A100 = Path(__file__).parent / "data" / "topology" / "dgx_a100_nv12.txt"
WORKLOAD = Workload(world=16, seq=32768, heads=32, kv_heads=8, head_dim=128)


def _topology(tmp_path, class_costs: str):
    path = tmp_path / "two_hosts.yaml"
    path.write_text(f"name: two\nintra: SYS\ninter: NET\nhosts:\n  - name: node\n    count: 2\n    gpus: 8\n"
                    f"class_costs:\n{class_costs}")  # fmt: skip
    return path


def _links(plan) -> dict[str, object]:
    return {source.cost: source for source in plan.priors if source.cost.startswith("link.")}


def test_a_stated_net_is_given_with_its_figures_not_the_catalogue_prior(tmp_path):
    path = _topology(tmp_path, "  NET: {latency_us: 10, bandwidth_gbps: 100Gbps}\n")
    plan = make_plan(PlanRequest(workload=WORKLOAD, topology=path, gpu="l40s", detect=False))
    net = _links(plan)["link.NET"]
    assert net.given and net.how.startswith("GIVEN by the topology file")
    assert "12.5 GB/s (100 Gb/s) per NIC" in net.how and "10 us latency" in net.how
    assert "PRIOR" not in net.how and "48 GB/s" not in net.how
    assert _links(plan)["link.PCIe"].how.startswith("PRIOR")  # the classes the file leaves alone stay priors
    assert "NET as the topology file states (GIVEN)" in plan.confidence
    document = json.loads(json.dumps(plan.to_dict()))
    entry = next(p for p in document["priors"] if p["cost"] == "link.NET")
    assert entry["given"] is True and "12.5 GB/s" in entry["how"]
    assert all("given" not in p for p in document["priors"] if p["cost"] != "link.NET")


def test_a_figure_the_file_leaves_out_is_the_gpus_prior_and_says_so(tmp_path):
    path = _topology(tmp_path, "  NET: {bandwidth_gbps: 100Gbps}\n  SYS: {bandwidth_gbps: 20}\n")
    prior = gpu_prior(find_gpu("l40s"), "bfloat16")
    loaded = load_topology(path)
    priced = prior.price_links(loaded).cost_model.class_costs
    assert priced[LinkKind.NET].latency_us == prior.class_costs["NET"]["latency_us"]  # not the nominal 10 us
    assert priced[LinkKind.NET].bandwidth_gbps == 12.5
    ratio = prior.class_costs["SYS"]["alltoall_gbps"] / prior.class_costs["SYS"]["bandwidth_gbps"]
    assert priced[LinkKind.SYS].alltoall_gbps == 20 * ratio
    links = {s.cost: s for s in prior.for_topology(loaded).sources if s.cost.startswith("link.")}
    assert "12.5 GB/s" in links["link.NET"].how and "PRIOR (this GPU's class figures): 14 us latency" in links[
        "link.NET"].how  # fmt: skip
    assert links["link.SYS"].how.startswith("GIVEN by the topology file: 20 GB/s point to point; PRIOR")
    assert "SYS" not in links["link.PCIe"].how and "(PHB, NODE)" in links["link.PCIe"].how


def test_without_stated_classes_the_lines_stay_priors():
    prior = gpu_prior(find_gpu("a100-sxm"), "bfloat16")
    assert prior.for_topology(load_topology(DGX_A100)) is prior
    assert all(s.how.startswith("PRIOR") for s in prior.sources if s.cost.startswith("link."))


def test_what_the_file_states_survives_the_json_form(tmp_path):
    loaded = load_topology(_topology(tmp_path, "  NET: {bandwidth_gbps: 100Gbps}\n"))
    again = Topology.from_dict(json.loads(json.dumps(loaded.to_dict())), "meta.json:topology")
    assert again.cost_model.stated() == loaded.cost_model.stated() == {"NET": {"bandwidth_gbps": 12.5}}


def test_the_cli_prints_the_given_line(tmp_path):
    path = _topology(tmp_path, "  NET: {latency_us: 10, bandwidth_gbps: 100Gbps}\n")
    result = invoke("plan", "--topology", str(path), "--gpu", "l40s", "--no-detect", "--world", "16", "--seq",
                    "32768", "--heads", "32", "--kv-heads", "8", "--head-dim", "128")  # fmt: skip
    assert result.exit_code == 0, result.output
    line = next(text for text in result.stdout.splitlines() if "link.NET" in text)
    assert "GIVEN by the topology file: 12.5 GB/s (100 Gb/s) per NIC" in line and "PRIOR" not in line
