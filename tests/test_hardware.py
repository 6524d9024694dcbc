"""The hardware catalogue and the plan priced from it (issue: answers for real clusters).

The catalogue's figures carry their sources; its attention kernel model reproduces the published curves it was
fitted to; a plan for a named GPU prices compute by block shape and links by class, marks every figure PRIOR,
and refuses bad hardware input in one line. The validation against published tables is
benchmarks/validate_published.py (its whole run is in the slow tier).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ringbench.advise.planner import PlanRequest, make_plan, price_configurations
from ringbench.errors import UsageError
from ringbench.hardware import find_gpu, load_catalogue
from ringbench.hardware.kernel import benchmark_tflops
from ringbench.scenario.workload import Workload
from tests.cli_helpers import invoke

DATA = Path(__file__).parent / "data" / "topology"
DGX_A100 = DATA / "dgx_a100_nv12.txt"
A100_WORKLOAD = Workload(world=8, seq=32768, heads=32)
PCIE8 = DATA / "pcie8_dual_socket_pix_pxb_sys.txt"
ALIASES = ("a100-sxm", "a100-pcie", "h100-sxm", "h100-pcie", "h800", "h200", "l20", "l40s", "b200")


@pytest.mark.parametrize("name", ALIASES)
def test_every_alias_of_the_issue_resolves(name):
    gpu = find_gpu(name)
    rates = gpu.kernel_rates("bfloat16")
    assert rates.rate_tflops("fwd", False, 8192, 128) < gpu.peak_tflops("bfloat16").value


@pytest.mark.parametrize("product", ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L20", "nvidia  l40s"])
def test_nvml_product_names_resolve(product):
    assert find_gpu(product).names


def test_every_figure_names_its_source():
    catalogue = load_catalogue()
    for key, gpu in catalogue.gpus.items():
        for name, figure in gpu.figures.items():
            assert figure.source or figure.derived, f"{key}.{name} has neither a source nor a derivation"
    for group in catalogue.links.values():
        for name, figure in group.items():
            assert figure.source or figure.derived, name
    for name, figure in catalogue.overheads.items():
        assert figure.source or figure.derived, name


def test_an_unknown_gpu_is_one_line_naming_the_choices():
    with pytest.raises(UsageError) as caught:
        find_gpu("tesla-k80")
    message = str(caught.value)
    assert "\n" not in message and "tesla-k80" in message and "a100-sxm" in message and "l20" in message


def test_a_dtype_without_an_attention_rate_is_refused():
    with pytest.raises(UsageError, match="float32"):
        find_gpu("h100").kernel_rates("float32")


def test_the_stored_kernel_parameters_reproduce_their_curves():
    catalogue = load_catalogue()
    for family, arches in catalogue.kernels.items():
        for arch, entry in arches.items():
            if not isinstance(entry, dict) or "measured" not in entry:
                continue
            rates = catalogue.find(entry["fitted_on"]).kernel_rates("bfloat16", family)
            bound = 0.2 if arch == "blackwell" else 0.08  # the B200 curve is a noisy issue report
            for curve in entry["measured"]["curves"]:
                got = np.array(benchmark_tflops(rates, curve["pass"], curve["causal"], curve["head_dim"],
                                                entry["measured"]["seqlen"]))  # fmt: skip
                worst = np.max(np.abs(got / np.array(curve["tflops"], float) - 1))
                assert worst < bound, (family, arch, curve, got.round(0))


def test_the_kernel_runs_small_head_dims_short_blocks_and_causal_ones_slower():
    rates = find_gpu("a100").kernel_rates("bfloat16")
    assert rates.rate_tflops("fwd", False, 8192, 32) < 0.75 * rates.rate_tflops("fwd", False, 8192, 128)
    assert rates.rate_tflops("fwd", False, 512, 128) < rates.rate_tflops("fwd", False, 8192, 128)
    assert rates.rate_tflops("fwd", True, 8192, 128) < rates.rate_tflops("fwd", False, 8192, 128)


def _four(topology, gpu, heads, head_dim):
    request = PlanRequest(workload=Workload(world=8, seq=131072, heads=heads, head_dim=head_dim, batch=2),
                          topology=topology, backward=False, gpu=gpu, detect=False)  # fmt: skip
    configs = {"ulysses": {"strategy": "ulysses"}, "hybrid:4": {"strategy": "hybrid:4"},
               "hybrid:2": {"strategy": "hybrid:2"}, "ring": {"strategy": "ring"}}  # fmt: skip
    return {label: c.step_ms for label, c in price_configurations(request, configs).items()}


def test_nvlink_a100_puts_the_ring_behind_ulysses_and_the_hybrids():
    steps = _four(DGX_A100, "a100-sxm", 32, 32)
    assert max(steps, key=steps.get) == "ring", steps


def test_a_pcie_box_puts_ulysses_last():
    steps = _four(PCIE8, "l20", 32, 32)
    assert max(steps, key=steps.get) == "ulysses", steps
    assert steps["ulysses"] > 1.3 * min(steps.values())


def test_head_dims_of_the_same_flops_get_different_predictions():
    assert _four(DGX_A100, "a100-sxm", 32, 32)["ring"] > 1.2 * _four(DGX_A100, "a100-sxm", 8, 128)["ring"]


def test_a_plan_marks_every_catalogue_figure_prior():
    plan = make_plan(PlanRequest(workload=A100_WORKLOAD, topology=DGX_A100, gpu="a100", detect=False))
    assert plan.gpu == "a100-sxm"
    costs = {p.cost for p in plan.priors}
    assert {"compute.attention", "compute.merge", "host.step_gap", "strategy.alltoall", "overlap_penalty",
            "link.NV"} <= costs  # fmt: skip
    assert all(p.how.startswith("PRIOR") and not p.determined for p in plan.priors)
    assert "PRIOR" in plan.confidence


def test_a_gpu_that_contradicts_nvml_is_refused_and_says_which_wins():
    request = PlanRequest(workload=A100_WORKLOAD, topology=DGX_A100, gpu="h100")
    with pytest.raises(UsageError) as caught:
        make_plan(request, found_gpus=["NVIDIA A100-SXM4-80GB"] * 8)
    assert "found win" in str(caught.value) and "\n" not in str(caught.value)
    plan = make_plan(PlanRequest(workload=A100_WORKLOAD, topology=DGX_A100),
                     found_gpus=["NVIDIA A100-SXM4-80GB"] * 8)  # fmt: skip
    assert plan.gpu == "a100-sxm"  # NVML fills it in


def test_window_and_document_masks_plan_the_short_ring_and_doc_balanced():
    window = make_plan(PlanRequest(workload=Workload(world=8, seq=65536, heads=8, mask="window:4096"),
                                   topology=DGX_A100, gpu="a100", detect=False, strategies=("ring",)))  # fmt: skip
    assert any(c.buffer == "double-short" for c in window.candidates)
    short = next(c for c in window.candidates if c.buffer == "double-short")
    full = next(c for c in window.candidates if c.buffer == "double" and c.strategy == "ring")
    assert short.step_ms <= full.step_ms * 1.01
    packed = Workload(world=8, seq=65536, heads=8, mask="causal-document", docs="lognormal:4096:1.0:0")
    docs = make_plan(PlanRequest(workload=packed, topology=DGX_A100, gpu="a100", detect=False))
    assert any(c.layout == "doc-balanced" for c in docs.candidates)


def test_layers_sum_their_masks():
    def step(layers):
        plan = make_plan(PlanRequest(workload=Workload(world=8, seq=65536, heads=8, layers=layers), topology=DGX_A100,
                                     gpu="a100", detect=False, strategies=("ring",)))  # fmt: skip
        return next(c for c in plan.candidates if c.buffer == "double").step_ms

    one, mixed = step("1"), step("window:4096 x3, causal x1")
    assert one < mixed < 4 * one


def test_plan_cli_lists_the_catalogue_and_refuses_bad_hardware(tmp_path):
    listed = invoke(*["plan", "--list-gpus", "--json", "-q"])
    assert listed.exit_code == 0
    document = json.loads(listed.stdout)
    assert {"a100-sxm", "l20", "b200"} <= {g["gpu"] for g in document["gpus"]}
    assert document["sources"]["fa2-paper"]
    unknown = invoke(*["plan", "--topology", str(DGX_A100), "--world", "8", "--seq", "8192", "--heads", "8",
                      "--gpu", "nosuch", "--no-detect"])  # fmt: skip
    assert unknown.exit_code == 2 and "nosuch" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    fp32 = invoke(*["plan", "--topology", str(DGX_A100), "--world", "8", "--seq", "8192", "--heads", "8",
                   "--gpu", "h100", "--dtype", "float32", "--no-detect"])  # fmt: skip
    assert fp32.exit_code == 2 and "float32" in fp32.stderr and len(fp32.stderr.strip().splitlines()) == 1


def test_plan_cli_json_carries_the_priors():
    result = invoke(*["plan", "--topology", str(PCIE8), "--world", "8", "--seq", "65536", "--heads", "32",
                     "--gpu", "l20", "--no-detect", "--json", "-q"])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["gpu"] == "l20" and document["priors"]
    assert all(p["how"].startswith("PRIOR") for p in document["priors"])


def test_simulate_with_a_gpu_runs_its_kernels_dtype_unless_told(tmp_path):
    told = ["simulate", "--world", "4", "--seq", "8192", "--heads", "8", "--gpu", "h100", "--no-detect", "--out",
            str(tmp_path), "--json", "-q"]  # fmt: skip
    result = invoke(*told)
    assert result.exit_code == 0, result.stderr
    assert {case["dtype"] for case in json.loads(result.stdout)["cases"]} == {"bfloat16"}
    fp32 = invoke(*told, "--dtype", "float32")
    assert fp32.exit_code == 2 and "float32" in fp32.stderr and len(fp32.stderr.strip().splitlines()) == 1
