"""Deadlock freedom on CPU: every strategy, mask and buffer at N = 2..8 posts what its peers expect, in an order
every rank can follow (tests/post_order.py says what is checked and why it is what NCCL needs).

The matrix runs each rank in turn in this process through a recording stand-in for torch.distributed (about a
second per world size); one real gloo run shows that the stand-in records exactly what real ranks post.
"""

import pytest
from post_order import Case, Post, PostLog, PostOrderError, check_posts, recording, run_case, simulated_posts

from ringbench.errors import UsageError
from ringbench.run.launch import launch_local

BUFFERS = {"ring": ("sync", "double", "sync-short", "double-short"), "allgather": ("allgather",)}


def _masks(seq: int) -> list[tuple[str, str]]:
    """(mask, docs): full, causal, a window, and the document masks, with documents that cut across shards."""
    docs = f"lengths:{seq // 3},{seq - 2 * (seq // 3)},{seq // 3}"
    window = max(2, seq // 4)
    return [("none", "none"), ("causal", "none"), (f"window:{window}", "none"), ("causal-document", docs),
            ("full-document", docs), (f"causal-document+window:{window}", docs)]  # fmt: skip


def _strategies(world: int) -> list[str]:
    grouped = [f"{kind}:{d}" for d in range(2, world) if world % d == 0 for kind in ("hybrid", "double-ring")]
    return ["ring", "allgather", "ulysses", *grouped]


def matrix(world: int, local: int = 4) -> list[Case]:
    cases = []
    for strategy in _strategies(world):
        layouts = ("contiguous", "zigzag") if strategy == "ring" else ("contiguous",)  # the short route follows it
        for buffer in BUFFERS.get(strategy, ("sync", "double")):
            for mask, docs in _masks(world * local):
                cases += [Case(strategy=strategy, mask=mask, buffer=buffer, layout=layout, docs=docs)
                          for layout in layouts]  # fmt: skip
    return cases


@pytest.mark.parametrize("world", range(2, 9))
def test_every_strategy_mask_and_buffer_posts_in_an_order_every_rank_can_follow(world):
    checked = 0
    for case in matrix(world):
        try:
            logs = simulated_posts([case], world)
        except UsageError as exc:  # a combination the engine refuses is not posted at all
            pytest.fail(f"{case} at N={world} was refused: {exc}")
        try:
            order = check_posts(logs)
        except PostOrderError as exc:
            raise AssertionError(f"{case} at N={world}: {exc}") from None
        assert len(order) == sum(len(posts) for posts in logs)
        if not case.buffer.endswith("short"):  # a short ring may need no exchange at all (documents in one shard)
            assert any(post.kind == "p2p" or post.kind.startswith("all_") for post in logs[0]), case
        checked += 1
    assert checked == len(matrix(world))


# -- the checker finds what it must ------------------------------------------------------------------------------------
def _ring_logs(world: int = 3, buffer: str = "double") -> list[list[Post]]:
    return simulated_posts([Case(strategy="ring", mask="causal", buffer=buffer)], world)


def test_a_rank_that_posts_the_dkv_before_the_kv_is_caught():
    logs = _ring_logs()
    rank1 = logs[1]
    i = next(i for i in range(len(rank1) - 1) if rank1[i].comm != rank1[i + 1].comm and rank1[i].kind == "p2p")
    rank1[i], rank1[i + 1] = rank1[i + 1], rank1[i]  # the backward's two communicators in the other order
    with pytest.raises(PostOrderError, match="cannot all complete"):
        check_posts(logs)


def test_bytes_that_differ_and_a_missing_receive_are_named():
    logs = _ring_logs()
    first = next(i for i, p in enumerate(logs[2]) if p.kind == "p2p")
    post = logs[2][first]
    logs[2][first] = Post(
        post.comm, "p2p", tuple((op, peer, n // 2 if op == "recv" else n) for op, peer, n in post.ops)
    )
    with pytest.raises(PostOrderError, match=r"sends \d+ B .* into \d+ B"):
        check_posts(logs)
    logs = _ring_logs()
    post = logs[0][first]
    logs[0][first] = Post(post.comm, "p2p", tuple(op for op in post.ops if op[0] == "send"))  # the receive left out
    with pytest.raises(PostOrderError, match=r"send 2 -> 0 .* has no matching receive at rank 0"):
        check_posts(logs)


def test_groups_made_in_another_order_and_collectives_that_differ_are_caught():
    logs = _ring_logs()
    groups = [i for i, p in enumerate(logs[1]) if p.kind == "new_group"]
    assert len(groups) == 2  # ring-kv and ring-dkv, over the whole world
    logs[1][groups[0]] = Post("world", "new_group", (("0-1", 0),))  # a group the other ranks never make
    with pytest.raises(PostOrderError, match=r"the 1st collective differs between ranks: .*rank 1 world new_group 0-1"):
        check_posts(logs)
    del logs[1][groups[0]]
    with pytest.raises(PostOrderError, match=r"different numbers of collectives: \{0: 2, 1: 1, 2: 2\}"):
        check_posts(logs)
    logs = simulated_posts([Case(strategy="allgather", mask="causal", buffer="allgather")], 3)
    gather = next(i for i, p in enumerate(logs[0]) if p.kind == "all_gather")
    logs[0][gather] = Post(logs[0][gather].comm, "all_reduce", (("all_reduce", 8),))
    with pytest.raises(PostOrderError, match="collective differs"):
        check_posts(logs)


# -- the stand-in records what real ranks post -------------------------------------------------------------------------
REAL = [Case(strategy="ring", mask="causal", buffer="double", layout="zigzag"),
        Case(strategy="ring", mask="window:4", buffer="double-short"),
        Case(strategy="allgather", mask="causal", buffer="allgather"),
        Case(strategy="hybrid:2", mask="causal", buffer="sync"),
        Case(strategy="double-ring:2", mask="causal", buffer="double")]  # fmt: skip


def _real_posts(worker_ctx, cases):
    log = PostLog(worker_ctx.env.rank)
    with recording(log):
        for case in cases:
            run_case(case, worker_ctx.env.world, head_dim=8)
    return log.posts


def test_the_stand_in_records_exactly_what_real_gloo_ranks_post():
    world = 4
    real = launch_local(world, _real_posts, (REAL,), timeout_s=120)
    simulated = simulated_posts(REAL, world, head_dim=8)
    for rank in range(world):
        assert real[rank] == simulated[rank], f"rank {rank}"
    check_posts(real)
    kinds = {post.kind for posts in real for post in posts}
    assert kinds == {"new_group", "p2p", "all_gather", "all_reduce"}
    assert len({post.comm for post in real[0]}) >= 6  # world, ring-kv/dkv, a2a, cross, inner and outer rings
