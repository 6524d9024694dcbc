"""`recommend`'s predicted speedup against what `run --emulate-links` measures on a two-host topology.

The user has a run on the order they launched with; `recommend RUN_DIR` prices the recommended order with the link
model (NIC sharing) and predicts both rings' step times with the simulator calibrated on that run. The recommended
ring is then measured too: predicted and measured speedups agree within 25 %. Emulated compute (``modelled``: no
arithmetic, so the cores stay free) and emulated links, small shapes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import invoke

from ringbench.record.store import load_run

COMMON = ["--seq", "2048", "--heads", "2", "--head-dim", "32", "--mask", "causal", "--layout", "zigzag",
          "--buffer", "double", "--no-backward", "--iters", "4", "--warmup", "1",
          "--no-check", "--emulate-links", "--json", "--quiet"]  # fmt: skip


def _run(tmp_path: Path, topology: Path, order: str, world: int, kernel: str) -> Path:
    result = invoke("run", "--world", str(world), "--order", order, "--topology", str(topology), *COMMON,
                    "--kernel", kernel, "--out", str(tmp_path / order.replace(":", "_")))  # fmt: skip
    assert result.exit_code == 0, result.output
    return Path(json.loads(result.stdout)["run_dir"])


def _step(run_dir: Path) -> float:
    return float(load_run(run_dir).cases["step_ms"].median())


def check_order(tmp_path: Path, topology: Path, current: str, world: int, kernel: str = "modelled:50") -> dict:
    """Measure ``current``, ask recommend about it, measure the recommended ring: the figures side by side."""
    measured_current = _run(tmp_path, topology, current, world, kernel)
    advice = invoke("recommend", str(measured_current), "--order", current, "--json")
    assert advice.exit_code == 0, advice.output
    document = json.loads(advice.stdout)
    # With a measured run, the headline is the step's speedup (the simulator's), not communication's alone.
    assert document["headline"]["covers"] == "step", document["headline"]
    assert document["headline"]["speedup"] == document["predicted_step"]["speedup"]
    text = " ".join(invoke("recommend", str(measured_current), "--order", current).output.split())
    assert text.split("Recommended ring: ")[1].split(" ", 1)[1].startswith("Predicted speedup of the step"), text
    recommended = _run(tmp_path, topology, document["order_arg"], world, kernel)
    return {
        "current": current, "recommended": document["order_arg"],
        "communication_speedup": document["predicted_speedup"],
        "predicted_step_speedup": document["predicted_step"]["speedup"],
        "measured_speedup": _step(measured_current) / _step(recommended),
    }  # fmt: skip


# 2 hosts x 2 GPUs, a network slow enough (31 ms per 256 KiB block alone) that the loopback transport's own cost and
# the shared cores' noise (a few ms) stay small beside it.
TWO_BY_TWO = """name: two-host-2x2-slow-net
intra: NV4
inter: NET
hosts:
  - name: node
    count: 2
    gpus: 2
class_costs:
  NET: {latency_us: 5000.0, bandwidth_gbps: 0.01}
"""


def test_recommend_predicts_what_emulated_links_measure(tmp_path):
    topology = tmp_path / "two_by_two.yaml"
    topology.write_text(TWO_BY_TWO)
    figures = check_order(tmp_path, topology, "stride:2", 4)
    assert figures["recommended"] == "0-1-2-3"
    measured = figures["measured_speedup"]
    assert measured > 1.15, figures  # the order matters here: two NET hops share each direction's link
    # The 25 % agreement is held by the slow tier's three two-host orders, run one test at a time; here the suite's
    # other worker shares the cores with both measured runs, so the check is that the prediction is of that size.
    assert figures["predicted_step_speedup"] == pytest.approx(measured, rel=0.4), figures
    # communication dominates this ring, so the link model's headline agrees with the step as well
    assert figures["communication_speedup"] == pytest.approx(measured, rel=0.4), figures


TWO_BY_FOUR = """name: two-host-4x2-slow-net
intra: NV4
inter: NET
hosts:
  - name: node
    count: 2
    gpus: 4
class_costs:
  NET: {{latency_us: {latency}, bandwidth_gbps: 0.02}}
"""


@pytest.mark.slow
@pytest.mark.timing(reason="measured step-time ratios of ring orders against predicted ones, within a quarter")
@pytest.mark.parametrize("current", ["0-4-1-5-2-6-3-7", "stride:2", "0-4-1-5-2-3-6-7"])
@pytest.mark.parametrize(("latency", "kernel"), [(100.0, "modelled:50"), (200.0, "modelled:1000000")],
                         ids=["compute", "near-zero-compute"])  # fmt: skip
def test_three_two_host_orders_predicted_within_a_quarter(tmp_path, current, latency, kernel):
    """2 hosts x 4 GPUs: NET hops shared 4, 2 and 3 ways (benchmarks/validate_recommend.py prints the figures); with
    the modelled kernel's compute, and with next to none (a huge rate: the step is the links and the transport)."""
    topology = tmp_path / "two_by_four.yaml"
    topology.write_text(TWO_BY_FOUR.format(latency=latency))
    figures = check_order(tmp_path, topology, current, 8, kernel)
    assert figures["predicted_step_speedup"] == pytest.approx(figures["measured_speedup"], rel=0.25), figures
