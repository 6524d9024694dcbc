"""Implementation families (plan --framework): the host's own time for an attention call is the least a phase
takes, a PRIOR per family (fitted on the dev set), printed among the priors and replaced by a calibration."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import assert_one_line_error, invoke

from ringbench.advise.planner import PlanRequest, make_plan, price_configurations
from ringbench.errors import UsageError
from ringbench.hardware import find_framework, find_gpu
from ringbench.scenario.workload import Workload
from ringbench.simulate.case import SimCase
from ringbench.simulate.costs import Costs, CostSource
from ringbench.simulate.host_floor import host_events
from ringbench.simulate.priors import gpu_prior

DGX_A100 = Path(__file__).parent / "data" / "topology" / "dgx_a100_nv12.txt"
SMALL = Workload(world=8, seq=8192, heads=32, head_dim=32, batch=2)


def _ulysses(framework: str | None) -> float:
    request = PlanRequest(workload=SMALL, topology=DGX_A100, gpu="a100-sxm", detect=False, framework=framework,
                          backward=False)  # fmt: skip
    return price_configurations(request, {"u": {"strategy": "ulysses"}}, found_gpus=[])["u"].fwd_ms


def test_a_family_with_a_host_floor_bounds_short_phases():
    usp = find_framework("yunchang")
    assert usp.key == "usp" and usp.host_call_us.value > 0 and usp.fitted
    engine, floored = _ulysses(None), _ulysses("usp")
    assert engine < usp.host_call_us.value / 1e3 <= floored  # the kernels alone are shorter than USP's Python


def test_the_family_is_printed_among_the_priors_and_carried_by_json():
    request = PlanRequest(workload=SMALL, topology=DGX_A100, gpu="a100-sxm", detect=False, framework="usp",
                          backward=False)  # fmt: skip
    plan = make_plan(request)
    line = next(p for p in plan.priors if p.cost == "host.framework")
    assert line.how.startswith("PRIOR framework usp") and "fitted on" in line.how
    assert plan.to_dict()["framework"] == "usp"
    result = invoke("plan", "--topology", str(DGX_A100), "--gpu", "a100-sxm", "--no-detect", "--world", "8",
                    "--seq", "8192", "--heads", "32", "--framework", "rfa", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["framework"] == "ring-flash-attn"


def test_an_unknown_family_is_one_line_naming_the_choices():
    with pytest.raises(UsageError, match=r"framework=.deepspeed. is not allowed; expected one of .*ringbench"):
        PlanRequest(workload=Workload(world=8, seq=8192, heads=8), topology=DGX_A100, framework="deepspeed")
    result = invoke("plan", "--topology", str(DGX_A100), "--world", "8", "--seq", "8192", "--heads", "8",
                    "--no-detect", "--framework", "deepspeed")  # fmt: skip
    assert_one_line_error(result, "framework='deepspeed'", "usp", "te")


def test_a_calibration_that_measured_host_times_replaces_the_family():
    prior = gpu_prior(find_gpu("a100-sxm"), "bfloat16", framework="usp")
    assert prior.costs.host_floor_ms["call"] > 0
    calibration = SimpleNamespace(costs=Costs(), costs_for=lambda family: None,
                                  sources=[CostSource(cost="host.fwd.double", determined=True, how="measured")])  # fmt: skip
    costs, sources = prior.with_calibration(calibration)
    assert costs.host_floor_ms == {} and not any(s.cost.startswith("host.") for s in sources)


@pytest.mark.parametrize(
    ("strategy", "placement", "events"),
    [("ring", "", (8, 0)), ("ulysses", "heads-first", (0, 2)), ("hybrid:2", "heads-first", (4, 2)),
     ("double-ring:4", "heads-first", (8, 2))],
)  # fmt: skip
def test_the_host_runs_a_strategys_steps_and_all_to_alls(strategy, placement, events):
    case = SimCase(workload=Workload(world=8, seq=8 * 64, heads=8, strategy=strategy, placement=placement))
    assert host_events(case, "fwd") == events
    allgather = SimCase(workload=Workload(world=8, seq=8 * 64, heads=8, buffer="allgather"))
    assert host_events(allgather, "fwd") == (0, 1) and host_events(allgather, "bwd") == (0, 2)
