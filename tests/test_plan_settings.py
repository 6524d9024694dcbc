"""The plan in the user's framework: Megatron-LM / TransformerEngine flags, USP / yunchang's degrees, torchtitan's
context-parallel options, and a launcher mapping (torchrun per host, or SLURM's arbitrary distribution); where a
framework cannot express the choice, the reason and its best expressible candidate with its predicted cost."""

from __future__ import annotations

import json

import pytest
import yaml
from cli_helpers import invoke

from ringbench.advise.planner import Candidate, PlanRequest, make_plan
from ringbench.advise.settings import framework_settings, launcher_mapping
from ringbench.scenario.workload import Workload
from ringbench.topology import topology_from_spec

SPEC = {"intra": "PXB", "inter": "NET", "hosts": [{"name": "node", "count": 2, "gpus": 4}],
        "class_costs": {"NET": {"latency_us": 10, "bandwidth_gbps": "100Gbps"}}}  # fmt: skip


def _settings(strategy: str, layout: str = "zigzag", kv_heads: int = 8, mask: str = "causal", **extra) -> dict:
    candidate = Candidate(strategy=strategy, layout=layout, **extra)
    return framework_settings(candidate, 8, 32, kv_heads, mask)


def test_each_strategy_maps_to_the_frameworks_own_options():
    hybrid = _settings("hybrid:4", placement=list(range(8)))
    assert hybrid["megatron"]["settings"] == {"--context-parallel-size": 8, "--cp-comm-type": "a2a+p2p",
                                              "--hierarchical-context-parallel-sizes": "4 2"}  # fmt: skip
    assert hybrid["usp"]["settings"] == {"ulysses_degree": 4, "ring_degree": 2, "ring_impl_type": "zigzag",
                                         "use_ulysses_low": True}  # fmt: skip
    assert not hybrid["torchtitan"]["expresses"] and "Ulysses" in hybrid["torchtitan"]["reason"]
    ring = _settings("ring", order=list(range(8)))
    assert ring["megatron"]["settings"]["--cp-comm-type"] == "p2p"
    assert ring["torchtitan"]["settings"] == {"parallelism.context_parallel_degree": 8,
                                              "parallelism.context_parallel_rotate_method": "alltoall",
                                              "parallelism.context_parallel_load_balancer": "headtail"}  # fmt: skip
    assert _settings("allgather")["megatron"]["settings"]["--cp-comm-type"] == "all_gather"
    assert _settings("ulysses")["megatron"]["settings"]["--cp-comm-type"] == "a2a"
    assert _settings("ring", layout="striped")["usp"]["settings"]["ring_impl_type"] == "strip"


@pytest.mark.parametrize(
    ("strategy", "extra", "framework", "why"),
    [("double-ring:4", {}, "megatron", "no double ring"), ("double-ring:4", {}, "usp", "no double ring"),
     ("allgather", {}, "usp", "no all-gather"), ("ring", {"layout": "striped"}, "megatron", "zigzag"),
     ("ulysses", {"kv_heads": 2}, "megatron", "KV heads"), ("ring", {"mask": "window:512"}, "megatron", "window"),
     ("ring", {"buffer": "double-short", "layout": "contiguous", "mask": "window:512"}, "torchtitan", "short ring")],
)  # fmt: skip
def test_what_a_framework_cannot_express_is_said(strategy, extra, framework, why):
    kv_heads = extra.pop("kv_heads", 8)
    mask = extra.pop("mask", "causal")
    entry = _settings(strategy, kv_heads=kv_heads, mask=mask, **extra)[framework]
    assert not entry["expresses"] and why in entry["reason"], entry


def test_launcher_mappings_torchrun_when_hosts_are_blocks_else_slurm():
    topology = topology_from_spec(SPEC)
    blocked = launcher_mapping([4, 5, 6, 7, 0, 1, 2, 3], topology)
    assert [h["host"] for h in blocked["torchrun"]["hosts"]] == ["node1", "node0"]
    interleaved = launcher_mapping([0, 4, 1, 5, 2, 6, 3, 7], topology)
    assert not interleaved["torchrun"]["expresses"]
    assert interleaved["slurm"]["hostfile"] == ["node0", "node1"] * 4
    assert interleaved["slurm"]["CUDA_VISIBLE_DEVICES"] == {"node0": "0,1,2,3", "node1": "0,1,2,3"}
    ring = launcher_mapping([2, 3, 4, 5, 6, 7, 0, 1], topology, ring=True)  # a ring may start where a host does
    assert ring["torchrun"]["expresses"] and ring["rank_order"][0] == 4


def test_the_plan_gives_settings_a_best_expressible_candidate_and_json(tmp_path):
    topology = topology_from_spec(SPEC)
    workload = Workload(world=8, seq=8 * 4096, heads=32, kv_heads=8)
    request = PlanRequest(workload=workload, topology=topology, gpu="l40s", detect=False,
                          strategies=("double-ring:4", "hybrid:4"))  # fmt: skip
    plan = make_plan(request)
    first = plan.candidates[0]
    megatron = plan.settings["megatron"]
    if first.strategy.startswith("double-ring"):
        best = megatron["best"]
        assert best["candidate"].startswith("hybrid:4") and best["step_ms"] >= first.step_ms
        assert best["settings"]["--cp-comm-type"] == "a2a+p2p" and "launch" in megatron
    interleaved = next(c for c in plan.candidates if c.label == "hybrid:4 @interleaved")
    usp = make_plan(PlanRequest(workload=workload, topology=topology, gpu="l40s", detect=False, strategies=("hybrid:4",),
                                settings_for=plan_rank(plan, interleaved, "hybrid:4"))).settings["usp"]  # fmt: skip
    assert usp["settings"]["use_ulysses_low"] is False and usp["launch"]["torchrun"]["expresses"]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    result = invoke("plan", "--topology", str(path), "--world", "8", "--seq", "32768", "--heads", "32",
                    "--kv-heads", "8", "--gpu", "l40s", "--no-detect", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document["settings"]) == {"megatron", "usp", "torchtitan"} and document["settings_for"] == 1
    assert all("frameworks" in c for c in document["candidates"])
    text = invoke("plan", "--topology", str(path), "--world", "8", "--seq", "32768", "--heads", "32",
                  "--kv-heads", "8", "--gpu", "l40s", "--no-detect", "--settings-for", "2")  # fmt: skip
    assert "Run #2" in text.output and "launch:" in text.output


def plan_rank(plan, candidate, strategy: str) -> int:
    """The rank ``candidate`` has among the plan's candidates of ``strategy``."""
    kept = [c for c in plan.candidates if c.strategy == strategy]
    return kept.index(candidate) + 1
