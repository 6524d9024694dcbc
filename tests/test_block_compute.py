"""The block computation found from the ring's structure (ringbench/traces/block_compute.py), on small synthetic
host timelines: whatever the program calls it, it is the outermost work between a step's post and its wait."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ringbench.traces.block_compute import NONE, candidates, choose, describe, select, settle
from ringbench.traces.rank_view import DEFAULT_COMPUTE_PATTERNS

HINT = re.compile("|".join(f"(?:{p})" for p in DEFAULT_COMPUTE_PATTERNS))
TID = 7


def _host(spans: list[tuple[str, str, float, float]]) -> pd.DataFrame:
    """(category, name, start ms, end ms) on the ring thread."""
    return pd.DataFrame({
        "cat": [c for c, _, _, _ in spans], "name": [n for _, n, _, _ in spans],
        "start_ns": [int(s * 1e6) for _, _, s, _ in spans], "end_ns": [int(e * 1e6) for _, _, _, e in spans],
        "tid": TID, "input_dims": "",
    })  # fmt: skip


def _ring(step_body, steps: int = 4, iterations: int = 2, step_ms: float = 10.0):
    """A double-buffered ring: per step a post at +0, the body from +1, the wait observed at +9 (the last step of
    an iteration posts nothing); then a loss once per iteration. Returns (host, breaks)."""
    spans, posts, waits = [], [], []
    for i in range(iterations):
        base = i * (steps * step_ms + 5)
        for s in range(steps):
            t = base + s * step_ms
            if s < steps - 1:
                spans.append(("cpu_op", "c10d::send", t, t + 0.1))
                posts.append(t)
                waits.append(t + 9)
            spans += [(c, n, t + a, t + b) for c, n, a, b in step_body(s)]
        spans.append(("user_annotation", "loss", base + steps * step_ms, base + steps * step_ms + 4))
    breaks = {"post": np.array([int(p * 1e6) for p in posts]), "wait": np.array([int(w * 1e6) for w in waits]),
              "wait_op": np.empty(0, np.int64), "other": np.empty(0, np.int64)}  # fmt: skip
    period = int((steps * step_ms + 5) * 1e6)
    frame = candidates(_host(spans), TID, breaks, HINT, iteration_of=lambda t: np.asarray(t) // period)
    frame["iteration"] = (frame["start_ns"] // period).astype(int)
    return frame


def test_a_users_own_range_around_matmuls_is_the_block():
    frame = _ring(lambda s: [("user_annotation", f"my attn block {s}", 1, 8), ("cpu_op", "aten::matmul", 1.1, 4),
                             ("cpu_op", "aten::softmax", 4, 5), ("cpu_op", "aten::matmul", 5, 7.9)])  # fmt: skip
    choice = choose(frame, override=False)
    assert choice.families == ("my attn block #",) and choice.how == "record_function range", choice
    assert choice.where == "post-wait"
    taken = select(frame, choice)
    assert len(taken) == 8 and (taken["end_ns"] - taken["start_ns"]).min() == 7_000_000  # every step, loss not


def test_bare_aten_ops_are_taken_together_and_the_loss_is_not():
    frame = _ring(lambda s: [("cpu_op", "aten::matmul", 1, 4), ("cpu_op", "aten::softmax", 4, 5),
                             ("cpu_op", "aten::matmul", 5, 8), ("cpu_op", "aten::mul", 8, 8.1)])  # fmt: skip
    choice = choose(frame, override=False)
    assert choice.how == "ops" and set(choice.families) >= {"aten::matmul", "aten::softmax"}, choice
    assert "loss" not in choice.families


def test_attention_ops_are_hints_and_the_range_holding_them_counts():
    frame = _ring(lambda s: [("user_annotation", "blk", 1, 8),
                             ("cpu_op", "aten::_scaled_dot_product_flash_attention_for_cpu", 2, 5)])  # fmt: skip
    choice = choose(frame, override=False)
    assert choice.families == ("blk",) and choice.how == "attention ops", choice


def test_a_range_that_holds_a_post_is_no_block_its_work_is():
    frame = _ring(lambda s: [("user_annotation", "whole step", -0.5, 9.5), ("cpu_op", "aten::matmul", 1, 8)])
    choice = choose(frame, override=False)
    assert choice.families == ("aten::matmul",) and choice.where == "post-wait", choice


def test_nothing_between_posts_and_waits_is_no_choice():
    assert choose(_ring(lambda s: []), override=False) == NONE


def test_the_ranks_settle_on_the_most_common_choice_and_it_is_described():
    a = choose(_ring(lambda s: [("user_annotation", "blk", 1, 8)]), override=False)
    b = choose(_ring(lambda s: [("user_annotation", "blk", 1, 3), ("user_annotation", "sleepy", 3, 8)]), False)
    assert b.families == ("sleepy",) and settle([a, b, a]) == a and settle([NONE, NONE]) == NONE
    line = describe(a, {0: 4.0, 1: 4.0}, 0.62)
    assert line.startswith("compute taken: `blk` (a record_function range, found between each step's post and its")
    assert "4 per iteration on every rank; 62% of the step" in line


def test_on_a_gpu_the_block_is_the_kernels_its_range_launched():
    """A GPU trace: the block's time is its kernels' (on the device), named by the user's range that launched
    them; NCCL's kernels are communication, never compute."""
    host = _host([("cpu_op", "c10d::send", 0.0, 0.1), ("user_annotation", "blk", 1.0, 2.0),
                  ("cpu_op", "aten::mm", 1.1, 1.3), ("cpu_op", "aten::mm", 1.5, 1.7)])  # fmt: skip
    launches = pd.DataFrame({"tid": TID, "correlation": [11, 12, 13], "start_ns": [1_150_000, 1_550_000, 100_000]})
    kernels = pd.DataFrame({"name": ["ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn",
                                     "ncclDevKernel_SendRecv(ncclDevComm*)"], "correlation": [11, 12, 13],
                            "start_ns": [3_000_000, 6_000_000, 200_000], "end_ns": [5_000_000, 8_000_000, 9_000_000]})  # fmt: skip
    breaks = {"post": np.array([0]), "wait": np.array([9_000_000]), "wait_op": np.empty(0, np.int64),
              "other": np.empty(0, np.int64)}  # fmt: skip
    frame = candidates(host, TID, breaks, HINT, kernels=kernels, launches=launches)
    assert list(frame["family"]) == ["blk", "blk"] and list(frame["start_ns"]) == [3_000_000, 6_000_000], frame
    choice = choose(frame, override=False)
    assert choice.families == ("blk",) and choice.how == "record_function range", choice
