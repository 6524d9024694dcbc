"""One backend for the whole group, decided from every rank's facts (faked GPU environments, on CPU); the gloo side
group's interface from NCCL's; NCCL groups on high-priority streams, recorded in meta.json."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from ringbench.errors import UsageError
from ringbench.rank.dist import DeviceFacts, agree_backend, decide_backend, gloo_interface, gpu_index, group_options


def _node(host: str, gpus_seen: list[int], uuids: list[str | None], first_rank: int = 0) -> list[DeviceFacts]:
    """One host's ranks: rank i sees gpus_seen[i] GPUs and would take the GPU named uuids[i]."""
    return [DeviceFacts(rank=first_rank + i, host=host, local_rank=i, visible=seen, gpu=uuid)
            for i, (seen, uuid) in enumerate(zip(gpus_seen, uuids, strict=True))]  # fmt: skip


def test_the_gpu_a_rank_takes():
    assert gpu_index(0, 8) == 0 and gpu_index(5, 8) == 5  # all GPUs visible: the local rank's
    assert [gpu_index(r, 1) for r in range(8)] == [0] * 8  # one GPU bound per task: cuda:0 in each
    assert gpu_index(3, 2) is None and gpu_index(0, 0) is None


DECISIONS = {
    "8 ranks, every GPU visible to each": (_node("a", [8] * 8, [f"GPU-{i}" for i in range(8)]), ("nccl", "")),
    "SLURM binding: one GPU per task": (_node("a", [1] * 8, [f"GPU-{i}" for i in range(8)]), ("nccl", "")),
    "rank 0 sees 8, ranks 1-7 one each (mixed binding)": (
        _node("a", [8] + [1] * 7, [f"GPU-{i}" for i in range(8)]), ("nccl", "")),
    "two hosts bound one GPU per task (the same UUIDs appear on each host's own board)": (
        _node("a", [1, 1], ["GPU-0", "GPU-1"]) + _node("b", [1, 1], ["GPU-0", "GPU-1"], first_rank=2), ("nccl", "")),
    "a CPU machine": (_node("a", [0, 0], [None, None]), ("gloo", "")),
}  # fmt: skip


@pytest.mark.parametrize("name", list(DECISIONS))
def test_decisions_where_every_rank_has_its_own_gpu_or_none_has_any(name):
    facts, expected = DECISIONS[name]
    assert decide_backend(facts) == expected
    assert decide_backend(list(reversed(facts))) == expected  # the order facts arrive in does not matter


def test_ranks_without_a_gpu_of_their_own_make_the_whole_group_gloo_or_a_usage_error():
    facts = _node("a", [2, 2, 2], ["GPU-0", "GPU-1", None])  # 3 ranks on a host with 2 GPUs
    backend, note = decide_backend(facts)
    assert backend == "gloo" and "rank 2 see(s) 2 GPU(s)" in note
    with pytest.raises(UsageError, match=r"device='cuda' is not allowed: rank 2 .*expected one GPU per rank"):
        decide_backend(facts, "cuda")
    assert decide_backend(_node("a", [8] * 2, ["GPU-0", "GPU-1"]), "cpu") == ("gloo", "")


def test_two_ranks_that_would_share_a_gpu_are_caught_by_its_uuid():
    facts = _node("a", [1, 1], ["GPU-7", "GPU-7"])  # no binding: both tasks see the host's one GPU
    backend, note = decide_backend(facts)
    assert backend == "gloo" and "ranks 0, 1 would share one GPU (GPU-7) on host a" in note
    with pytest.raises(UsageError, match="NCCL refuses"):
        decide_backend(facts, "cuda")


def test_every_rank_reads_the_one_decision_rank_0_takes_through_the_store():
    facts = _node("a", [1] * 4, ["GPU-0", "GPU-1", "GPU-2", "GPU-2"])  # ranks 2 and 3 would share
    decisions, errors = {}, {}

    def ranks_agree(device) -> None:
        store = dist.HashStore()  # the rendezvous store every rank of one launch shares

        def rank(fact: DeviceFacts) -> None:
            try:
                decisions[(device, fact.rank)] = agree_backend(store, fact, 4, timeout_s=30, device=device)
            except UsageError as exc:
                errors[fact.rank] = str(exc)

        threads = [threading.Thread(target=rank, args=(fact,)) for fact in facts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    ranks_agree(None)
    assert len(decisions) == 4 and len(set(decisions.values())) == 1 and decisions[(None, 0)][0] == "gloo"
    ranks_agree("cuda")
    assert len(errors) == 4 and len(set(errors.values())) == 1  # every rank refuses, in the same line


def test_a_rank_waits_for_the_others_only_as_long_as_the_timeout():
    mine = DeviceFacts(rank=0, host="a", local_rank=0, visible=1, gpu="GPU-0")
    with pytest.raises(TimeoutError, match="did not publish"):
        agree_backend(dist.HashStore(), mine, world=2, timeout_s=0.2)


@pytest.mark.parametrize(
    ("nccl", "interfaces", "expected"),
    [
        ("eth0", ["lo", "eth0", "eth1"], "eth0"),
        ("=ib0", ["lo", "ib0", "ib01"], "ib0"),
        ("ib", ["lo", "eth0", "ib1", "ib0"], "ib1"),  # a prefix: the first interface it selects
        ("^docker,lo", ["lo", "docker0", "enp5s0"], "enp5s0"),
        ("eth2,eth0", ["lo", "eth0"], "eth0"),
        ("bond", ["lo", "eth0"], None),
        (None, ["lo", "eth0"], None),
    ],
)
def test_the_side_group_talks_on_the_interface_nccl_is_told_to(nccl, interfaces, expected):
    assert gloo_interface(nccl, interfaces) == expected


class _FakeNccl:
    class Options:
        def __init__(self) -> None:
            self.is_high_priority_stream = False
            self._timeout = None


def test_nccl_groups_get_high_priority_streams_and_the_record_says_so():
    from ringbench.rank.rank_report import RankReport
    from ringbench.run.results import device_meta

    timeout = timedelta(seconds=90)
    options = group_options("nccl", timeout, nccl=_FakeNccl)["pg_options"]
    assert options.is_high_priority_stream is True and options._timeout == timeout
    assert group_options("gloo", timeout, nccl=_FakeNccl) == {}
    info = {"type": "cuda", "name": "H200", "group_options": {"is_high_priority_stream": True}}
    meta = device_meta([RankReport(case_id="c", rank=r, device_info=info) for r in range(2)])
    assert meta["nccl_options"] == {"is_high_priority_stream": True} and meta["backend"] == "nccl"


def test_a_session_puts_the_group_options_into_the_device_info(monkeypatch):
    import torch

    import ringbench.rank.runner as runner

    env = SimpleNamespace(device=torch.device("cpu"), group_options=(("is_high_priority_stream", True),),
                          backend_note="")  # fmt: skip

    class _Ops:
        def __init__(self, device) -> None:
            pass

        def all_objects(self, obj):
            return [obj]

    monkeypatch.setattr(runner, "GroupOps", _Ops)
    session = runner.open_session(env)
    assert session.device_info["group_options"] == {"is_high_priority_stream": True}
