"""Window masks on the full and the short ring: what the short ring would move (predicted from the plan's route, said
in the answers), and, in the slow tier, a window's step against causal's on the full ring and the bytes measured."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from typer.testing import CliRunner

from ringbench.analysis.short_ring_bytes import short_ring_lines
from ringbench.cli.app import app
from ringbench.run.results import case_plan, short_ring_bytes
from ringbench.scenario.scenario import Case

runner = CliRunner()


def _case(**axes) -> Case:
    base = dict(world=8, seq=4096, heads=2, head_dim=32, batch=1, dtype="float32", mask="window:512",
                layout="contiguous", buffer="double", order="identity", kernel="emulated:auto")  # fmt: skip
    return Case.from_axes(**(base | axes))


def _full_ring_bytes(case: Case) -> float:
    """What the full ring moves per iteration (all ranks): N - 1 K/V hops per rank forward, N - 1 K/V hops and N
    dK/dV hops backward (the accumulator's last hop takes it home). 46,137,344 B measured for _case()."""
    block = 2 * case.batch * case.heads * (case.seq // case.world) * case.head_dim * 4  # float32 K and V
    return case.world * ((case.world - 1) * 2 * block + case.world * block)


def test_the_short_ring_moves_under_a_third_of_the_full_rings_bytes_at_a_window_of_s_over_8():
    case = _case()
    assert _full_ring_bytes(case) == 46_137_344
    short = short_ring_bytes(case, case_plan(case))
    assert short <= 0.3 * _full_ring_bytes(case)
    assert short == 7 * 2 * 262_144  # 7 blocks one hop forward, 7 accumulators one hop home (3.67 MB)
    assert case_plan(case)["layers"][0]["short_depth"] == 1
    assert math.isnan(short_ring_bytes(_case(strategy="ulysses"), case_plan(_case(strategy="ulysses"))))


def _cases(rows: list[dict]) -> pd.DataFrame:
    base = dict(world=8, seq=4096, heads=2, head_dim=32, batch=1, dtype="float32", docs="none", layers="1")  # fmt: skip
    return pd.DataFrame([base | row for row in rows])


def test_the_answers_say_what_the_short_ring_would_move_and_how_to_ask_for_it():
    cases = _cases([
        {"case_id": "w", "mask": "window:512", "layout": "contiguous", "buffer": "double", "bytes_moved": 46_137_344.0,
         "short_ring_bytes": 3_670_016.0},
        {"case_id": "z", "mask": "causal", "layout": "zigzag", "buffer": "double", "bytes_moved": 46_137_344.0,
         "short_ring_bytes": 44_000_000.0},  # a saving under a tenth: no line
    ])  # fmt: skip
    plans = {"w": {"layers": [{"short_depth": 1}]}}
    (line,) = short_ring_lines(cases, plans)
    assert line == (
        "short ring: window:512 (8 ranks, contiguous): --buffer double-short would move 3.67 MB per iteration "
        "instead of 46.14 MB (0.08×; double), 2 ring steps instead of 8; a rank keeps up to 1 K/V block for the "
        "backward"
    )
    ran_short = pd.concat([cases, _cases([{"case_id": "s", "mask": "window:512", "layout": "contiguous",
                                           "buffer": "double-short", "bytes_moved": 3_670_016.0,
                                           "short_ring_bytes": 3_670_016.0}])])  # fmt: skip
    assert short_ring_lines(ran_short, plans) == ()  # the buffer comparison says it
    assert short_ring_lines(cases.drop(columns="short_ring_bytes")) == ()  # records before the column


@pytest.mark.slow
@pytest.mark.timing(reason="a window's measured step against causal's")
def test_a_window_steps_no_slower_than_causal_and_its_short_ring_moves_under_a_third(tmp_path):
    # One run, one emulated:auto model for both masks. The window of S/8 sees an eighth of what causal sees at its
    # busiest rank; before its plan lost the one-key FULL sliver, emulated:auto's rate collapsed on it (39x causal).
    result = runner.invoke(app, [
        "run", "--world", "8", "--seq", "2048", "--heads", "2", "--head-dim", "32", "--mask", "causal",
        "--mask", "window:256", "--layout", "contiguous", "--buffer", "double", "--buffer", "double-short",
        "--kernel", "emulated:auto", "--iters", "5", "--warmup", "1", "--no-check", "--out", str(tmp_path), "--json",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    cases = {(c["mask"], c["buffer"]): c for c in document["cases"]}
    window, causal = cases[("window:256", "double")], cases[("causal", "double")]
    assert window["step_ms"] <= causal["step_ms"]
    short = cases[("window:256", "double-short")]
    assert short["bytes_moved"] <= 0.3 * window["bytes_moved"]
    assert short["bytes_moved"] == window["short_ring_bytes"]
