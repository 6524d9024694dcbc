"""End to end: `ringbench run --profile` on a real 4-rank gloo ring, then `ringbench check-timeline` on its record.

One run holds both kernels (each with the ``sync`` and ``double`` buffers of the default scenario): ``torch`` (real CPU flash attention) and ``emulated:2`` (the same arithmetic padded to
a modelled duration, the pad visible to the profiler as ``ringbench:emulated pad``). The profiler must find every
recorded compute and transfer span, and agree with the recorder within the check's tolerances, per case.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from cli_helpers import invoke

RING = ["--world", "4", "--seq", "2048", "--heads", "4", "--head-dim", "64", "--layout", "zigzag",
        "--iters", "2", "--warmup", "1", "--no-check"]  # fmt: skip


@pytest.mark.slow
def test_run_profile_then_check_timeline_agree_for_torch_and_emulated_kernels(tmp_path):
    result = invoke("run", *RING, "--kernel", "torch", "--kernel", "emulated:2", "--profile", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    (run_dir,) = tmp_path.iterdir()
    traces = sorted((run_dir / "profile").glob("*/r0-rank*.json.gz"))
    assert len(traces) == 4 * 4  # two kernels x two buffers (sync, double), four ranks

    checked = invoke("check-timeline", str(run_dir), "--json")
    document = json.loads(checked.stdout)
    by_case = pd.DataFrame(document["cases"])
    report = by_case.to_string()
    assert checked.exit_code == 0 and document["passed"], report
    events = pd.read_parquet(run_dir / "events.parquet")
    profiled = events[events["iteration"] == events["iteration"].max()]
    for case_id, rows in by_case.groupby("case_id"):
        expected = profiled[profiled["case_id"] == case_id]["kind"].value_counts()
        matched = rows.set_index("kind")["matched"]
        assert (matched == expected.reindex(matched.index)).all(), report  # every recorded span found its twin
        assert (rows["unmatched"] == 0).all() and rows["passed"].all(), report
    kernels = {"torch" if "torch" in case_id else "emulated" for case_id in by_case["case_id"]}
    assert kernels == {"torch", "emulated"}
