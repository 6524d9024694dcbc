"""Grouped-query attention (K and V of KV < H heads; query head h reads KV head h // (H / KV)) in ringbench's own
engine: the block kernels against float64 ``scaled_dot_product_attention(enable_gqa=True)``, every strategy against
float64 single-device attention forward and backward (worlds 1 to 4 here, 1 to 8 in the slow tier), K/V bytes on the
wire proportional to the KV heads, the sweep axis and its one-line errors, and `check --impl ringbench` taking it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():  # read when triton is first imported (tests/test_triton_kernel.py says why)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F
from support.selfcheck import gqa_cases, run_selfcheck, within_tolerance
from typer.testing import CliRunner

from ringbench.cli.app import app
from ringbench.errors import UsageError
from ringbench.kernels import get_kernel
from ringbench.kernels.base import BlockMask, MaskKind, PositionMask
from ringbench.scenario.workload import Case, Workload

KERNEL_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5}  # against float64, inputs exact in the dtype


def _mask(kind: str, length: int):
    """(BlockMask, the same visibility as an (L, L) bool for torch's reference)."""
    if kind == "full":
        return BlockMask(MaskKind.FULL), None
    if kind == "causal":
        return BlockMask(MaskKind.CAUSAL), torch.ones(length, length, dtype=torch.bool).tril()
    rule = PositionMask(torch.arange(length) + 5, torch.arange(length), causal=True, window=6)  # keys 5 back
    allowed = rule.allowed()
    return BlockMask.from_rule(rule, allowed.sum(1)), allowed


def _kernel_errors(name: str, kind: str, dtype: torch.dtype, kv_heads: int) -> list[float]:
    generator = torch.Generator().manual_seed(3)
    heads, length = 4, 24
    shapes = ((2, heads, length, 16), (2, kv_heads, length, 16), (2, kv_heads, length, 16))
    q, k, v = (torch.randn(s, generator=generator).to(dtype) for s in shapes)
    mask, allowed = _mask(kind, length)
    kernel = get_kernel(name)
    out, lse = kernel.forward(q, k, v, mask, 0.25)
    dout = torch.randn(q.shape, generator=generator).to(dtype)
    grads = kernel.backward(dout, q, k, v, out, lse, mask, 0.25)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*exact, attn_mask=allowed, scale=0.25, enable_gqa=True)
    want_grads = torch.autograd.grad(want, exact, dout.double())
    assert [tuple(g.shape) for g in grads] == [tuple(t.shape) for t in (q, k, v)]  # dK, dV per KV head
    return [float((got.double() - ref).abs().max().detach()) for got, ref in zip((out, *grads), (want, *want_grads),
                                                                        strict=True)]  # fmt: skip


@pytest.mark.parametrize("name", ["torch", "math", "emulated:5000"])
@pytest.mark.parametrize("kind", ["full", "causal", "rule"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_the_block_kernels_compute_grouped_query_attention(name, kind, dtype):
    for kv_heads in (2, 1):
        assert max(_kernel_errors(name, kind, dtype, kv_heads)) < KERNEL_TOLERANCE[dtype], (kv_heads,)


@pytest.mark.parametrize("kind", ["causal", "rule"])
def test_the_triton_kernel_reads_a_kv_head_per_group_and_sums_its_gradients(kind):
    pytest.importorskip("triton")
    for dtype, kv_heads in ((torch.float64, 2), (torch.float32, 1)):  # the interpreter: a few calls only
        assert max(_kernel_errors("triton", kind, dtype, kv_heads)) < KERNEL_TOLERANCE[dtype], (dtype, kv_heads)


# -- every strategy, float64 single-device attention, forward and backward -------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_strategy_is_exact_with_fewer_kv_heads(world):
    # ring (sync, double, short), allgather, ulysses (KV heads split, and repeated when fewer than the degree),
    # hybrid:2 and double-ring:2 at 4 ranks; fp64, fp32 and bf16 in turn.
    cases = gqa_cases(world) + (gqa_cases(world, dtypes=("float64",), kernels=("math",)) if world == 3 else [])
    results = run_selfcheck(world, cases)
    assert {c.strategy for c in cases} >= {"ring", "allgather", "ulysses"}
    failures = [(c.name, results[c.name]) for c in cases if not within_tolerance(c, results[c.name])]
    assert not failures, failures


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_strategy_kv_count_and_dtype_is_exact(world):
    cases = gqa_cases(world, wide=True, seq_per_rank=4 if world > 4 else 8)
    if world in (2, 3):  # the other kernels in the ring: emulated, math and triton (interpreted; head_dim 16)
        cases += gqa_cases(world, dtypes=("float64", "float32"), kernels=("math", "triton", "emulated:5000"),
                           head_dim=16)  # fmt: skip
    results = run_selfcheck(world, cases, timeout_s=120)
    failures = [(c.name, results[c.name]) for c in cases if not within_tolerance(c, results[c.name])]
    assert not failures, failures[:10]


# -- the engine's input checks ---------------------------------------------------------------------------------------


def test_the_engine_refuses_kv_heads_that_do_not_fit_in_one_line():
    from ringbench.engine.api import build_context
    from ringbench.engine.spec import AttentionSpec

    q = torch.randn(1, 4, 8, 8)
    with pytest.raises(UsageError, match=r"k\.shape=\(1, 3, 8, 8\).*KV heads dividing q's 4"):
        build_context(q, torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))
    with pytest.raises(UsageError) as caught:  # a Ulysses degree neither dividing nor a multiple of the KV heads
        Workload(world=4, seq=64, heads=12, kv_heads=6, strategy="ulysses").checked()
    assert "kv_heads=6" in str(caught.value) and "\n" not in str(caught.value)
    build_context(q, q[:, :2], q[:, :2], AttentionSpec(strategy="ulysses"))  # one rank: degree 1 divides


# -- the sweep axis, the record, bytes on the wire -------------------------------------------------------------------


def test_kv_heads_is_a_sweep_axis_whose_ids_keep_the_existing_cases():
    from ringbench.scenario.axes import axes_for

    assert "kv_heads" in {a.name for a in axes_for("run")} and "kv_heads" in {a.name for a in axes_for("check")}
    mha = Case(workload=Workload(world=4, seq=1024, heads=8, head_dim=32, dtype="float32"))
    assert Case(workload=mha.workload.replace(kv_heads=8)) == mha  # as many as heads: one spelling
    assert mha.case_id == "w4-s1024-h8x32-b1-float32-causal-zigzag-double-identity-torch-fb-78a01a"
    gqa = Case(workload=mha.workload.replace(kv_heads=2))
    assert gqa.case_id.startswith("w4-s1024-h8kv2x32-") and gqa.case_id != mha.case_id


@pytest.mark.parametrize(("args", "named"), [
    (("--heads", "8", "--kv-heads", "3"), "kv_heads=3"),
    (("--heads", "8", "--kv-heads", "-1"), "kv_heads=-1"),
    (("--heads", "12", "--kv-heads", "6", "--strategy", "ulysses"), "kv_heads=6"),  # 4 neither divides 6 nor is a multiple
])  # fmt: skip
def test_bad_kv_heads_are_one_line_and_exit_2(args, named):
    result = CliRunner().invoke(app, ["run", "--world", "4", "--seq", "256", *args, "--iters", "1"])
    assert result.exit_code == 2 and named in result.output, result.output
    assert "Traceback" not in result.output


def test_a_run_moves_kv_blocks_of_kv_heads_and_records_each_tensors_error(tmp_path):
    result = CliRunner().invoke(app, ["run", "--world", "2", "--seq", "64", "--heads", "4", "--kv-heads", "0",
                                      "--kv-heads", "1", "--head-dim", "8", "--layout", "zigzag", "--strategy", "ring",
                                      "--strategy", "ulysses", "--buffer", "double", "--kernel", "torch", "--iters",
                                      "1", "--warmup", "0", "--out", str(tmp_path), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    cases = pd.DataFrame(document["cases"])
    assert sorted(cases["kv_heads"]) == [0, 0, 1, 1] and cases["passed"].all()
    assert (cases[["out_err", "dq_err", "dk_err", "dv_err"]] < 1e-5).all().all() and cases["lse_err"].isna().all()
    events = pd.read_parquet(Path(document["run_dir"]) / "events.parquet")
    sends = events[events["kind"] == "send"].merge(cases[["case_id", "kv_heads", "strategy"]], on="case_id")
    ring = sends[(sends["strategy"] == "ring") & (sends["phase"] == "fwd")]
    block = {kv: int(b) for kv, b in ring.groupby("kv_heads")["bytes"].max().items()}
    assert block == {0: 2 * 4 * 32 * 8 * 4, 1: 2 * 1 * 32 * 8 * 4}  # (k, v) x KV heads x L x D x 4 bytes
    qkv = sends[(sends["strategy"] == "ulysses") & (sends["exchange"] == "qkv")]
    by_kv = {kv: int(b) for kv, b in qkv.groupby("kv_heads")["bytes"].max().items()}
    # a member's message: its 2 query heads and the KV heads they read (2 of 4; the one KV head, repeated to both)
    assert by_kv == {0: (2 + 2 * 2) * 32 * 8 * 4, 1: (2 + 2 * 1) * 32 * 8 * 4}


def test_check_takes_grouped_query_attention_for_ringbench():
    from ringbench.conformance.matrix import default_matrix
    from ringbench.rank.impls import get_adapter

    cases, _ = default_matrix(get_adapter("ringbench").support)
    assert any(case.key_value_heads < case.heads for case in cases)
    result = CliRunner().invoke(app, ["check", "--impl", "ringbench", "--world", "3", "--heads", "4", "--kv-heads",
                                      "1", "--mask", "causal", "--layout", "zigzag", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    (case,) = document["cases"]
    assert document["verdict"] == "pass" and case["kv_heads"] == 1 and case["lse"], case
