"""Strategies beyond one ring: their vocabulary, groups and block plans, their record, bad input, and (slow) the
whole exactness product at worlds 1-8. The default-tier exactness of every strategy is in tests/test_ring_exact.py
(same spawned worlds as the ring's)."""

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from support.selfcheck import run_selfcheck, strategy_cases, within_tolerance

from ringbench.engine.groups import Groups, block_plan
from ringbench.engine.layout import token_positions
from ringbench.errors import UsageError
from ringbench.figures.critical_path import critical_path_segments, transfers
from ringbench.kernels.base import MaskKind
from ringbench.orders import parse_placement
from ringbench.rank.injection import RankFaults
from ringbench.scenario.scenario import Case, Scenario
from ringbench.vocab import Layout, Mask, Strategy
from tests.cli_helpers import assert_one_line_error, invoke

TOPOLOGY = Path(__file__).parent / "data" / "topology" / "two_host_slow_net.yaml"


# -- vocabulary, groups, plans ------------------------------------------------------------------------------------
def test_strategy_specs_parse_and_check_their_degrees():
    assert [Strategy.parse(s).spec for s in ("ring", "ulysses", "hybrid:2", "double-ring:4", "allgather")] == [
        "ring", "ulysses", "hybrid:2", "double-ring:4", "allgather"]  # fmt: skip
    for bad in ("hybrid", "hybrid:x", "double-ring:0", "tree", ""):
        with pytest.raises(UsageError, match="strategy="):
            Strategy.parse(bad)
    with pytest.raises(UsageError, match="dividing world=8"):
        Strategy.parse("hybrid:3").check(8, 8)
    with pytest.raises(UsageError, match="heads divisible by 4"):
        Strategy.parse("ulysses").check(4, 6)
    Strategy.parse("double-ring:2").check(4, 3)  # the double ring shards no heads


def test_placements_cut_ranks_into_groups():
    assert parse_placement("heads-first", 8, 4) == list(range(8))
    assert parse_placement("interleaved", 8, 4) == [0, 2, 4, 6, 1, 3, 5, 7]
    groups = Groups(tuple(parse_placement("interleaved", 8, 2)), 2)  # groups {0,4} {1,5} {2,6} {3,7}
    assert groups.group_of(5) == (1, 5) and groups.cross_ring(5) == [4, 5, 6, 7]
    assert groups.inner_ring(6) == [2, 6]
    assert len(groups.alltoall_flows()) == 4 * 2 and len(groups.cross_flows()) == 2 * 4
    with pytest.raises(UsageError, match="not a permutation"):
        parse_placement("0-1-1-3", 4, 2)


@pytest.mark.parametrize("mask", ["none", "causal", "causal-naive"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_a_group_block_plan_covers_each_visible_entry_once(mask, layout):
    seq, world = 48, 4
    local = seq // world
    q_members, k_members = (2, 0), (3, 1)
    plan = block_plan(Mask.parse(mask), Layout.parse(layout), seq, world, q_members, k_members)
    q_pos = torch.cat([token_positions(layout, seq, world, r) for r in q_members])
    k_pos = torch.cat([token_positions(layout, seq, world, r) for r in k_members])
    want = torch.ones(len(q_pos), len(k_pos), dtype=torch.bool) if mask == "none" else k_pos[None] <= q_pos[:, None]
    covered = torch.zeros(len(q_pos), len(k_pos), dtype=torch.int32)
    seen = torch.zeros_like(want)
    for block in plan.blocks:
        rows, cols = slice(block.q_lo, block.q_hi), slice(block.k_lo, block.k_hi)
        covered[rows, cols] += 1
        if block.mask.kind is MaskKind.FULL:
            visible = torch.ones(block.q_hi - block.q_lo, block.k_hi - block.k_lo, dtype=torch.bool)
        elif block.mask.kind is MaskKind.CAUSAL:
            visible = torch.ones(block.q_hi - block.q_lo, block.k_hi - block.k_lo, dtype=torch.bool).tril()
        else:
            visible = block.mask.allowed
        seen[rows, cols] |= visible
    assert int(covered.max()) <= 1 and torch.equal(seen, want)
    assert len(plan.blocks) <= len(q_members) * len(k_members) * 4  # coalesced, not one call per entry row
    assert local == 12


def test_emulated_links_share_the_nic_and_the_port_by_the_exchange():
    # 2 hosts x 2 ranks; NET between hosts. A ring's exchange prices as the ring rule did; an all-to-all of all
    # four ranks has 4 transfers from host 0 to host 1 (share 4) and one intra-host peer per rank (share 1).
    net = [[(a // 2) != (b // 2) for b in range(4)] for a in range(4)]
    model = {"latency_us": [[0.0] * 4] * 4, "bandwidth_gbps": [[1.0] * 4] * 4, "net": net, "hosts": [0, 0, 1, 1]}
    ring = (0, 2, 1, 3)  # four hops cross hosts, two in each direction
    faults = RankFaults(rank=0, link_model=model, ring=ring)
    ring_flows = [(ring[p], ring[(p + 1) % 4]) for p in range(4)]
    assert faults._flow_sharing(0, 2, ring_flows) == faults._net_shares()[(0, 2)] == 2
    a2a = [(a, b) for a in range(4) for b in range(4) if a != b]
    assert faults._flow_sharing(0, 2, a2a) == 4 and faults._flow_sharing(0, 1, a2a) == 1
    delay = faults.link_delay()
    assert delay.accepts_flows and delay(0, 2, 1_000_000, flows=a2a) == pytest.approx(4e-3)


# -- cases: one per computation, ids kept -------------------------------------------------------------------------
def test_cases_normalise_to_one_per_computation_and_keep_the_rings_ids():
    ring = Case.from_axes(world=4, seq=64, heads=4, head_dim=8, batch=1, dtype="float32", mask="causal", layout="zigzag",
                buffer="double", order="identity", kernel="torch")  # fmt: skip
    slug = "w4-s64-h4x8-b1-float32-causal-zigzag-double-identity-torch-fb"  # the id before strategies existed
    assert ring.case_id == f"{slug}-{hashlib.sha1(slug.encode()).hexdigest()[:6]}"
    scenario = Scenario(world=(4,), heads=(4,), strategy=("ring", "ulysses", "hybrid:2", "allgather"),
                        buffer=("sync", "double", "allgather"), order=("identity", "reverse"),
                        placement=("heads-first", "interleaved")).validate()  # fmt: skip
    cases = scenario.cases()
    by = {}
    for case in cases:
        by.setdefault(case.strategy, []).append(case)
    assert len(by["ring"]) == 4  # sync/double x identity/reverse
    assert len(by["allgather"]) == 2 and {c.buffer for c in by["allgather"]} == {"allgather"}
    assert len(by["ulysses"]) == 1 and by["ulysses"][0].buffer == "sync" and not by["ulysses"][0].placement
    assert {(c.buffer, c.placement) for c in by["hybrid:2"]} == {
        (b, p) for b in ("sync", "double") for p in ("heads-first", "interleaved")}  # fmt: skip
    assert by["hybrid:2"][0].ring == [0, 1, 2, 3] and "hybrid_2" in by["hybrid:2"][0].case_id


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        ({"strategy": ("hybrid:3",)}, ("strategy='hybrid:3'", "dividing world=4")),
        ({"strategy": ("ulysses",), "heads": (6,)}, ("heads=6", "divisible by 4")),
        ({"strategy": ("double-ring:2",), "placement": ("0-1-1-3",)}, ("placement='0-1-1-3'", "permutation")),
        ({"strategy": ("tree",)}, ("strategy='tree'",)),
        ({"strategy": ("ulysses",), "impl": ("torch-ring",)}, ("impl='torch-ring'",)),
    ],
)
def test_bad_strategies_are_one_line_errors(overrides, fragments):
    with pytest.raises(UsageError) as error:
        Scenario(**({"world": (4,), "heads": (4,)} | overrides)).validate()
    assert "\n" not in str(error.value) and all(f in str(error.value) for f in fragments), str(error.value)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--strategy", "hybrid:3"), "dividing world=4"),
        (("--strategy", "ulysses", "--heads", "6"), "divisible by 4"),
        (("--strategy", "hybrid:2", "--placement", "0-1-2-2"), "not a permutation"),
        (("--strategy", "star"), "strategy='star'"),
        (("--strategy", "ulysses", "--world", "8", "--heads", "8", "--topology", str(TOPOLOGY)), "world=8"),
    ],
)
def test_the_cli_refuses_bad_strategies_in_one_line(args, fragment):
    result = invoke("run", "--world", "4", "--heads", "4", *args)
    assert_one_line_error(result, fragment)


# -- the record of an all-to-all ----------------------------------------------------------------------------------
def _span(rank, kind, start, end, src, dst, nbytes=0, step=0, exchange=""):
    return {"case_id": "c", "repeat": 0, "iteration": 0, "phase": "fwd", "rank": rank, "ring_position": rank,
            "step": step, "kind": kind, "start_ns": start, "end_ns": end, "src": src, "dst": dst, "bytes": nbytes,
            "block": -1, "pair": "", "flops": 0.0, "nccl_ms": np.nan, "exchange": exchange}  # fmt: skip


def test_the_critical_path_follows_the_all_to_all_pair_that_ended_the_wait():
    # Three ranks, one all-to-all posted at 1 us; rank 0 finishes last: its send to rank 2 completes at 15 us,
    # after every chunk it received (10, 12 us), so the wait it sat in is the 0 -> 2 transfer's.
    us = 1000
    rows = []
    for rank in range(3):
        rows.append(_span(rank, "compute", 0, 1 * us, rank, rank))
        for peer in range(3):
            if peer == rank:
                continue
            send_end = {(0, 1): 11, (0, 2): 15}.get((rank, peer), 5) * us
            recv_end = {(1, 0): 10, (2, 0): 12}.get((peer, rank), 5) * us
            rows.append(_span(rank, "send", 1 * us, send_end, rank, peer, 100, exchange="qkv"))
            rows.append(_span(rank, "recv", 1 * us, recv_end, peer, rank, 100, exchange="qkv"))
        last = 2 if rank == 0 else (1 if rank == 2 else 2)
        rows.append(_span(rank, "wait", 2 * us, (15 if rank == 0 else 6) * us, last, rank, exchange="qkv"))
    events = pd.DataFrame(rows)
    xfers = transfers(events)
    assert len(xfers) == 6 and set(xfers["exchange"]) == {"qkv"} and xfers["send_start_ns"].notna().all()
    _, segments = critical_path_segments(events, xfers, tol_ns=100)
    links = segments[segments["resource"] == "link"]
    assert list(zip(links["src"], links["dst"], strict=True)) == [(0, 2)], segments


def test_a_strategy_run_records_every_pair_on_emulated_two_host_links(tmp_path):
    """One run on 2 hosts x 2 ranks (links injected from the topology): every strategy's exchanges are matched
    send to recv with their bytes and labels, cross-host chunks of an all-to-all share the network link, and
    the case rows carry the attention's own peak memory."""
    from ringbench.record.store import load_run
    from ringbench.run.sweep import execute

    scenario = Scenario(
        name="strategies", world=(4,), seq=(512,), heads=(4,), head_dim=(16,), layout=("zigzag",),
        buffer=("double",), kernel=("emulated:50",), strategy=("ring", "ulysses", "hybrid:2", "double-ring:2",
        "allgather"), iters=1, warmup=1, check=False, topology=str(TOPOLOGY), emulate_links=True,
    )  # fmt: skip
    run = load_run(execute(scenario, out=tmp_path).run_dir)
    cases = run.cases.set_index("strategy")
    assert (cases["attn_mem_mb"] > 0).all()  # (exactness: tests/test_ring_exact.py, in the same engine)
    assert cases.loc["allgather", "attn_mem_mb"] > cases.loc["ring", "attn_mem_mb"]
    xfers = transfers(run.events)
    assert xfers["send_start_ns"].notna().all()  # every recv has its send
    by_case = {cid: part for cid, part in xfers.groupby("case_id")}
    ulysses = by_case[cases.loc["ulysses", "case_id"]]
    assert set(ulysses["exchange"]) == {"qkv", "out", "dout", "dqkv"}
    qkv = ulysses[(ulysses["exchange"] == "qkv")]
    chunk = 3 * 1 * 1 * 128 * 16 * 4  # (3, B, H/U, L, D) fp32 per pair
    assert set(qkv["bytes"]) == {chunk}
    # NET: 2 ms + bytes / 0.05 GB/s, the four cross-host pairs sharing it; inside a host: microseconds.
    cross = qkv[(qkv["src"] // 2) != (qkv["dst"] // 2)]["transfer_ms"]
    shared_ms = 2.0 + 4 * chunk / 0.05e6
    assert cross.median() > 0.8 * shared_ms, cross.describe()
    hybrid = by_case[cases.loc["hybrid:2", "case_id"]]
    assert {"qkv", "kv", "dkv"} <= set(hybrid["exchange"])  # all-to-alls in groups, the ring across them
    double = by_case[cases.loc["double-ring:2", "case_id"]]
    assert {"kv", "dkv"} <= set(double["exchange"])
    assert cases["exposed_comm_ms"].notna().all()
    from ringbench.analysis.hops_on_topology import placement

    traffic = {t.strategy: t for t in placement(run).traffic}  # which links each strategy's traffic crossed
    assert set(traffic) == {"ulysses", "hybrid:2", "double-ring:2"}
    assert {(r.exchange, r.link_class) for r in traffic["hybrid:2"].rows} >= {("qkv", "NV4"), ("kv", "NET")}
    assert ("qkv", "NET") not in {(r.exchange, r.link_class) for r in traffic["hybrid:2"].rows}  # heads-first
    assert ("qkv", "NET") in {(r.exchange, r.link_class) for r in traffic["ulysses"].rows}


def test_the_answers_name_the_fastest_strategy_per_context():
    from ringbench.analysis.strategies import strategy_winners

    cases = pd.DataFrame([
        {"case_id": "a", "seq": 1024, "strategy": "ring", "buffer": "double", "placement": "", "order": "identity"},
        {"case_id": "b", "seq": 1024, "strategy": "ring", "buffer": "sync", "placement": "", "order": "identity"},
        {"case_id": "c", "seq": 1024, "strategy": "hybrid:2", "buffer": "double", "placement": "heads-first",
         "order": "identity"},
        {"case_id": "d", "seq": 4096, "strategy": np.nan, "buffer": "double", "placement": np.nan, "order": "identity"},
        {"case_id": "e", "seq": 4096, "strategy": "ulysses", "buffer": "sync", "placement": "", "order": "identity"},
    ])  # fmt: skip
    step = pd.Series({"a": 10.0, "b": 12.0, "c": 8.0, "d": 20.0, "e": 25.0})
    winners = strategy_winners(cases, step).set_index("context")
    assert winners.loc["S=1024", "strategy"] == "hybrid:2" and winners.loc["S=1024", "margin"] == pytest.approx(1.25)
    assert winners.loc["S=4096", "strategy"] == "ring"  # a record from before strategies: null reads as the ring
    assert "hybrid:2 (double, heads-first) fastest, 8.0 ms; ring (double) 1.25× slower" in winners.loc["S=1024", "line"]


# -- the whole product (slow) -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7, 8])
def test_every_strategy_mask_layout_buffer_placement_and_dtype_is_exact(world):
    cases = strategy_cases(world, wide=True, seq_per_rank=4 if world > 4 else 8)
    results = run_selfcheck(world, cases, timeout_s=120)
    failures = [(c.name, results[c.name]) for c in cases if not within_tolerance(c, results[c.name])]
    assert not failures, failures[:10]
