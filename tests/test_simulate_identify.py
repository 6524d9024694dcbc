"""What a calibration can identify, the stated priors for what it cannot, and what a prediction extrapolates.

The records here are made by known costs and stored as if measured (emulated or real kernels), so the truth is
known: a single case gives one block size per mask kind, and the calibration must say so rather than fit a
per-call constant that makes half-size blocks cost as much as full ones (issue: 4.6x off at twice the world).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ringbench.advise.simulation import SimRequest, costs_by_case
from ringbench.calibration.calibrate import calibrate
from ringbench.calibration.coverage import extrapolation
from ringbench.calibration.identify import determined
from ringbench.cli.app import app
from ringbench.record.store import load_run
from ringbench.scenario.workload import Workload
from ringbench.simulate import Costs, LinkCost, SimCase, run_data, simulate_case, write_run

HOST = {"enter_ms": 0.1, "pre_ms": 0.05, "mid_ms": 0.07, "post_ms": 0.03}
TRUE = Costs(gflops=20.0, call_ms={"fwd": 0.4, "bwd": 0.6}, links={"local": LinkCost(latency_us=300, bandwidth_gbps=0.5)},
             host_ms={p: {b: dict(HOST) for b in ("sync", "double")} for p in ("fwd", "bwd")})  # fmt: skip


def _record(folder: Path, cases: list[SimCase], kernel: str, costs: Costs = TRUE) -> Path:
    """Cases simulated with ``costs`` and stored as a measured run of ``kernel`` (emulated:R or a real one)."""
    results = [simulate_case(case, costs) for case in cases]
    run = run_data(results, costs, run_id=folder.name)
    run.cases["kernel"] = kernel
    rate = float(kernel.split(":")[1]) if kernel.startswith("emulated:") else float("nan")
    run.cases["emulated_gflops"] = rate
    write_run(folder, run)
    meta = json.loads((folder / "meta.json").read_text())
    meta |= {
        "simulated": False,
        "kind": "run",
        "source": "ringbench",
        "device_kind": "cpu",
        "cpu_count": 8,
        "backend": "gloo",
    }
    meta.pop("simulation", None)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def _case(**axes) -> SimCase:
    base = dict(world=4, seq=2048, heads=2, head_dim=32, dtype="float32", mask="none", layout="contiguous",
                buffer="sync")  # fmt: skip
    return SimCase(workload=Workload(**(base | axes)), backward=False, iterations=2)


def _sources(calibration) -> dict:
    return {source.cost: source for source in calibration.sources}


def test_the_rank_test_of_the_design_matrix():
    one_size = np.array([[1.0, 4.0], [2.0, 8.0]])  # calls and GFLOP in proportion: one block size
    assert not determined(one_size).any()
    assert determined(np.array([[1.0, 4.0], [1.0, 1.0]])).all()  # two block sizes
    causal_one_size = np.array([[1.0, 4.0, 0.0], [1.0, 0.0, 4.0]])  # contiguous causal: a full and a causal block
    assert not determined(causal_one_size).any()
    assert determined(np.array([[1.0, 4.0, 0.0], [1.0, 1.0, 0.0]])).tolist() == [True, True, False]


def test_one_emulated_case_takes_the_nominal_rate_and_scales_to_twice_the_world(tmp_path):
    # issue 23's case: mask none, contiguous, sync, forward only, at 4 ranks; predict 8
    fast_link = Costs(
        gflops=TRUE.gflops,
        call_ms=TRUE.call_ms,
        host_ms=TRUE.host_ms,
        links={"local": LinkCost(latency_us=1.0, bandwidth_gbps=100.0)},
    )  # the compute is the question
    record = _record(tmp_path / "one", [_case()], "emulated:20", fast_link)
    calibration = calibrate(load_run(record))
    sources = _sources(calibration)
    assert sources["compute.fwd.call_ms"].determined  # with the rate known, the call cost is what is left
    efficiency = sources["compute.fwd.efficiency.full"]
    assert not efficiency.determined and "nominal rate" in efficiency.how and "--seq 1024" in efficiency.hint
    assert calibration.costs.call_ms["fwd"] == pytest.approx(0.4, rel=0.05)
    bigger = _case(world=8)
    truth = simulate_case(bigger, fast_link).row["step_ms"]
    predicted = simulate_case(bigger, calibration.costs).row["step_ms"]
    assert predicted == pytest.approx(truth, rel=0.03)
    link = sources["link.local"]  # one message size: latency 0, a stated prior
    assert not link.determined and link.how.startswith("latency 0") and "two message sizes" in link.hint
    assert not sources["compute.bwd.call_ms"].determined and "forward" in sources["compute.bwd.call_ms"].how


def test_one_real_case_cannot_separate_call_cost_from_rate_and_says_what_would(tmp_path):
    record = _record(tmp_path / "real", [_case()], "torch")
    calibration = calibrate(load_run(record))
    call = _sources(calibration)["compute.fwd.call_ms"]
    assert not call.determined and call.how.startswith("0") and "--seq 1024" in call.hint
    assert calibration.family == "real" and calibration.costs.call_ms["fwd"] == 0.0


def test_two_block_sizes_determine_call_cost_and_rate(tmp_path):
    record = _record(tmp_path / "two", [_case(seq=1024), _case(seq=2048)], "torch")
    calibration = calibrate(load_run(record))
    sources = _sources(calibration)
    assert sources["compute.fwd.call_ms"].determined and sources["compute.fwd.efficiency.full"].determined
    assert sources["link.local"].determined  # two message sizes: latency and bandwidth
    assert calibration.costs.call_ms["fwd"] == pytest.approx(0.4, rel=0.05)
    local = calibration.costs.links["local"]
    assert local.latency_us == pytest.approx(300, rel=0.05) and local.bandwidth_gbps == pytest.approx(0.5, rel=0.05)
    assert calibration.coverage["seqs"] == [1024, 2048] and calibration.coverage["phases"] == ["fwd"]


def test_a_run_of_real_and_emulated_kernels_calibrates_each_and_like_never_crosses(tmp_path):
    emulated = simulate_case(_case(), TRUE)
    real_costs = Costs(gflops=5.0, call_ms={"fwd": 1.0, "bwd": 1.0}, links=TRUE.links, host_ms=TRUE.host_ms)
    real = simulate_case(_case(layout="zigzag"), real_costs)
    run = run_data([emulated, real], TRUE, run_id="mixed")
    run.cases["kernel"] = ["emulated:20", "torch"]
    run.cases["emulated_gflops"] = [20.0, float("nan")]
    run.meta.update(simulated=False, kind="run")
    calibration = calibrate(run)
    assert calibration.family == "emulated" and set(calibration.families) == {"real"}
    targets = [SimCase(workload=Workload(world=8, seq=2048, heads=2, head_dim=32, dtype="float32", mask="none",
                                        layout=layout, buffer="sync"), backward=False, kernel=kernel, gflops=rate)
               for layout, kernel, rate in (("contiguous", "emulated:20", 20.0), ("zigzag", "torch", None))]  # fmt: skip
    pairs, notes = costs_by_case(targets, calibration.costs, calibration, SimRequest())
    assert [costs.source.endswith("(real kernels)") for _, costs in pairs] == [False, True] and not notes
    only_emulated = calibrate(load_run(_record(tmp_path / "emu", [_case()], "emulated:20")))
    pairs, notes = costs_by_case(targets, only_emulated.costs, only_emulated, SimRequest())
    assert len(pairs) == 1 and "not predicted" in notes[0] and "torch" in notes[0]


TWO_TIER = """name: two-tier
intra: NV18
inter: NET
class_costs:
  NET: {latency_us: 10.0, bandwidth_gbps: 50.0}
hosts:
  - name: node
    count: 2
    gpus: 8
"""


def test_simulate_from_says_what_it_extrapolates(tmp_path):
    """A forward-only float32 emulated calibration predicting a 16-rank bf16 ring on a two-tier topology."""
    record = _record(tmp_path / "cal", [_case(mask="causal", layout="zigzag", buffer="double")], "emulated:20")
    topology = tmp_path / "two_tier.yaml"
    topology.write_text(TWO_TIER)
    args = ["simulate", "--from", str(record), "--world", "16", "--seq", str(16 * 2048), "--heads", "8",
            "--head-dim", "128", "--dtype", "bfloat16", "--mask", "causal", "--layout", "zigzag", "--buffer", "double",
            "--topology", str(topology), "--out", str(tmp_path / "sim")]  # fmt: skip
    result = CliRunner().invoke(app, [*args, "--json"])  # the human output on stderr, the document on stdout
    assert result.exit_code == 0, result.output
    text = " ".join(result.stderr.split())
    for fragment in ("ASSUMED", "phases", "fwd + bwd", "link NET", "link NV18", "the topology's nominal",
                     "bfloat16", "caveat:", "TFLOP/s per rank"):  # fmt: skip
        assert fragment in text, fragment
    assert " min " in text or " h " in text or " s " in text  # long times in a unit that reads
    document = json.loads(result.stdout)
    aspects = {item["aspect"]: item for item in document["extrapolation"]}
    assert aspects["link NET"]["assumed"] and aspects["link NV18"]["assumed"] and aspects["phases"]["assumed"]
    assert any(item["cost"] == "compute.bwd.call_ms" for item in document["assumed"])
    meta = load_run(document["run_dir"]).meta["simulation"]
    assert meta["extrapolation"] and meta["calibration"]["sources"]
    predicted = extrapolation(calibrate(load_run(record)), [_case(mask="causal", layout="zigzag", buffer="double")])
    blocks = [item for item in predicted if item.aspect.endswith("blocks (GFLOP per call)")]
    assert blocks and all(item.treatment.startswith("within the measured sizes") for item in blocks)
    assert all("nominal rate" in item.treatment for item in blocks)  # still a prior, so still a caveat


def test_ringbench_calibrate_measures_what_a_single_case_cannot(tmp_path):
    """The calibration run (S/2 and S, sync and double, forward and backward): every compute, link and host cost
    of its mask kinds is determined, and meta.json keeps the calibration for simulate --from."""
    result = CliRunner().invoke(app, ["calibrate", "--world", "2", "--seq", "512", "--heads", "2", "--head-dim", "32",
                                      "--kernel", "torch", "--iters", "2", "--warmup", "0", "--out", str(tmp_path),
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    sources = {s["cost"]: s for s in document["calibration"]["sources"]}
    for cost in ("compute.fwd.call_ms", "compute.bwd.call_ms", "link.local", "host.fwd.sync", "host.bwd.double"):
        assert sources[cost]["determined"], sources[cost]
    for cost in ("compute.fwd.efficiency.full", "compute.bwd.efficiency.causal"):  # two block sizes of each kind
        assert "blocks measured" not in sources[cost]["how"], sources[cost]
    assert not sources["compute.fwd.efficiency.partial"]["determined"]  # causal-naive was not asked for
    run = load_run(document["run_dir"])
    assert run.meta["calibration"]["sources"] and sorted(run.cases["seq"].unique()) == [256, 512]
    assert "measured by this run" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--world", "0"], "world=0 is not allowed; expected an integer >= 1"),
    (["--world", "2", "--seq", "6"], "seq=6 is not allowed"),
    (["--heads", "0"], "heads=0 is not allowed"),
])  # fmt: skip
def test_ringbench_calibrate_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    from cli_helpers import assert_one_line_error

    result = CliRunner().invoke(app, ["calibrate", *args, "--out", str(tmp_path)])
    assert_one_line_error(result, message)
