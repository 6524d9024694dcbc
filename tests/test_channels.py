"""One process group per ring (ringbench/engine/pgroups.py): exchanges in flight at once on one rank never share a
group, on gloo (real ranks) and on NCCL's code path (the stream timeline, a fake torch.distributed that says
"nccl", no GPU); and on emulated two-host links the double ring's outer transfer hides behind the inner steps, the
hop table charging it to the outer hop."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from support.channels import shared_channels

from ringbench.engine import alltoall, api, comm, pgroups
from ringbench.engine import spec as engine_spec
from ringbench.engine.recorder import ListRecorder
from ringbench.engine.spec import AttentionSpec, Runtime
from ringbench.engine.timeline import StreamTimeline
from ringbench.run.launch import launch_local
from tests.fake_streams import FakeRuntime

TOPOLOGY = Path(__file__).parent / "data" / "topology" / "two_host_slow_net.yaml"
CONFIGS = [  # (name, strategy, mask, buffer)
    ("ring", "ring", "causal", "double"),
    ("short", "ring", "window:8", "double-short"),
    ("double-ring", "double-ring:2", "none", "double"),
    ("hybrid", "hybrid:2", "causal", "double"),
]


def _run_configs(worker_ctx, policy: str) -> list[dict]:
    """Every config forward and backward on this rank, recorded, each exchange held 5 ms by an injected delay (so
    that exchanges overlap in time whenever the engine keeps two in flight)."""
    rank, rows = worker_ctx.env.rank, []
    for name, strategy, mask, buffer in CONFIGS:
        generator = torch.Generator().manual_seed(rank)
        q, k, v = (torch.randn(1, 4, 8, 8, generator=generator).requires_grad_() for _ in range(3))
        recorder = ListRecorder(rank, rank)
        recorder.iteration = 0
        spec = AttentionSpec(strategy=strategy, mask=mask, buffer=buffer, groups=policy)
        ctx = api.build_context(q, k, v, spec, Runtime(recorder=recorder, link_delay=lambda src, dst, nbytes: 0.005))
        try:
            out = api.attention(q, k, v, context=ctx)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        finally:
            api.close_context(ctx)
        recorder.finish_iteration()  # marks and NCCL durations resolved to plain numbers
        rows += [{**row, "case_id": name, "repeat": 0} for row in recorder.rows]
    return rows


@pytest.mark.parametrize("policy", ["own", "shared"])
def test_concurrent_rings_never_share_a_process_group_on_gloo(policy):
    events = pd.DataFrame([row for rows in launch_local(4, _run_configs, (policy,), timeout_s=120) for row in rows])
    exchanges = events[events["kind"].isin(("send", "recv"))]
    assert (exchanges["comm_group"] != "").all()  # every exchange says which group it used
    shared = shared_channels(events)
    if policy == "shared":  # the check has teeth: on one group the K/V and dK/dV (and the two rings) overlap
        assert {"ring", "double-ring", "hybrid"} <= set(shared["case_id"]), shared
        return
    assert shared.empty, shared.head(10).to_string()
    labels = exchanges.groupby("case_id")["comm_group"].agg(set)
    assert labels["ring"] == {"ring-kv:0-1-2-3", "ring-dkv:0-1-2-3"}
    assert labels["short"] == {"ring-kv:0-1-2-3", "ring-dkv:0-1-2-3"}
    assert labels["double-ring"] == {"inner-kv:0-1", "inner-kv:2-3", "inner-dkv:0-1", "inner-dkv:2-3",
                                     "outer-kv:0-2", "outer-kv:1-3", "outer-dkv:0-2", "outer-dkv:1-3"}  # fmt: skip
    assert labels["hybrid"] == {"a2a:0-1", "a2a:2-3", "cross-kv:0-2", "cross-kv:1-3", "cross-dkv:0-2",
                                "cross-dkv:1-3"}  # fmt: skip


def test_shared_channels_finds_overlapping_exchanges_of_one_group():
    def row(start, end, group, step=0):
        return {"case_id": "c", "repeat": 0, "iteration": 0, "layer": 0, "rank": 0, "phase": "bwd", "step": step,
                "kind": "recv", "start_ns": start, "end_ns": end, "exchange": "", "comm_group": group}  # fmt: skip

    events = pd.DataFrame([row(0, 10, "ring-kv:0-1"), row(5, 20, "ring-dkv:0-1"), row(12, 30, "ring-kv:0-1", 1),
                           row(40, 50, "shared:a2a"), row(45, 60, "shared:ring-kv")])  # fmt: skip
    shared = shared_channels(events)
    assert list(shared["channel"]) == ["shared"] and shared["overlap_ms"].iloc[0] == pytest.approx(5e-6)


# -- NCCL's code path, without a GPU --------------------------------------------------------------------------------
class _Runtime(FakeRuntime):
    """The fake streams, also saying which stream the host is posting from."""

    def __init__(self) -> None:
        super().__init__(lag_ms=0.0)
        self.current = None
        self.streams = []

    def new_stream(self, priority: int):
        stream = super().new_stream(priority)
        self.streams.append(stream)
        return stream

    @contextlib.contextmanager
    def stream(self, stream):
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous


class _Work:
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True


class _FakeNcclDist:
    """torch.distributed as rank ``rank`` of ``world`` sees it on NCCL: new groups and batches are logged."""

    def __init__(self, rank: int, world: int, runtime: _Runtime) -> None:
        self.rank, self.world, self.runtime = rank, world, runtime
        self.made: list[tuple[tuple[int, ...], bool]] = []  # (ranks, high-priority streams) per new_group call
        self.batches: list[tuple[object, object]] = []  # (group, stream posted from)
        self.distributed_c10d = SimpleNamespace(_get_default_group=lambda: "world")
        self.P2POp = lambda op, tensor, peer, group=None: SimpleNamespace(op=op, tensor=tensor, peer=peer, group=group)
        self.isend, self.irecv = "isend", "irecv"

        class Options:
            is_high_priority_stream = False

        self.ProcessGroupNCCL = SimpleNamespace(Options=Options)

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_world_size(self, group=None):
        return self.world if group is None else len(group.ranks)

    def get_rank(self, group=None):
        return self.rank if group is None else group.ranks.index(self.rank)

    def get_backend(self, group=None):
        return "nccl"

    def get_global_rank(self, group, rank):
        return group.ranks[rank]

    def new_group(self, ranks, timeout=None, pg_options=None):
        self.made.append((tuple(ranks), bool(pg_options and pg_options.is_high_priority_stream)))
        return SimpleNamespace(ranks=tuple(ranks)) if self.rank in ranks else "not a member"

    def batch_isend_irecv(self, ops):
        (group,) = {id(op.group): op.group for op in ops}.values()  # one batch, one group
        self.batches.append((group, self.runtime.current))
        for op in ops:
            if op.op == "irecv":
                op.tensor.zero_()
        return [_Work() for _ in ops]


def _nccl_rank(monkeypatch, rank: int, strategy: str, buffer: str = "double"):
    """One rank of 8 running ``strategy`` forward and backward on the stream timeline; returns the fake dist and
    every exchange's (group, lane) as it was posted, with the exchanges in flight at that moment."""
    runtime = _Runtime()
    fake = _FakeNcclDist(rank, 8, runtime)
    for module in (engine_spec, pgroups, comm, alltoall):
        monkeypatch.setattr(module, "dist", fake)
    pgroups.forget()
    inflight, clashes, widest = [], [], [0]

    def tracked(post_name: str, wait_name: str, cls):
        post, wait = getattr(cls, post_name), getattr(cls, wait_name)

        def posting(self, *args, **kwargs):
            clashes.extend((self.label, o.label) for o in inflight if o.pg is self.pg or o.lane == self.lane)
            handle = post(self, *args, **kwargs)
            inflight.append(self)
            widest[0] = max(widest[0], len(inflight))
            return handle

        def waiting(self, *args, **kwargs):
            inflight.remove(self)
            return wait(self, *args, **kwargs)

        monkeypatch.setattr(cls, post_name, posting)
        monkeypatch.setattr(cls, wait_name, waiting)

    tracked("post", "wait", comm.RingComm)
    tracked("post_all_to_all", "wait_all_to_all", alltoall.PeerComm)
    q, k, v = (torch.randn(1, 8, 4, 8).requires_grad_() for _ in range(3))
    spec = AttentionSpec(strategy=strategy, mask="causal", buffer=buffer)
    ctx = api.build_context(q, k, v, spec, Runtime(timeline=StreamTimeline(runtime)))
    out = api.attention(q, k, v, context=ctx)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    api.close_context(ctx)
    pgroups.forget()
    return fake, runtime, clashes, widest[0]


@pytest.mark.parametrize("strategy", ["ring", "double-ring:4", "hybrid:2"])
def test_on_nccls_code_path_each_exchange_in_flight_has_its_own_group_and_stream(monkeypatch, strategy):
    fake, runtime, clashes, widest = _nccl_rank(monkeypatch, 5, strategy)
    assert not clashes, clashes  # no exchange was posted on a group or a lane another one still had in flight
    assert widest >= 2  # and some were in flight together (the dK/dV beside the next K/V; outer beside inner)
    streams_of: dict[int, set] = {}
    for group, stream in fake.batches:
        streams_of.setdefault(id(group), set()).add(id(stream))
    assert all(len(s) == 1 for s in streams_of.values())  # each group posts from one comm lane ...
    lanes = [next(iter(s)) for s in streams_of.values()]
    assert len(set(lanes)) == len(lanes)  # ... of its own
    assert all(stream.priority == -1 for stream in runtime.streams)  # high-priority comm streams
    assert fake.made and all(high for _, high in fake.made)  # NCCL groups with high-priority streams
    other, *_ = _nccl_rank(monkeypatch, 0, strategy)
    assert [ranks for ranks, _ in other.made] == [ranks for ranks, _ in fake.made]  # the same order on every rank


def test_a_sub_group_of_the_world_shares_its_group_unless_told_otherwise(monkeypatch):
    from ringbench.errors import UsageError

    monkeypatch.setattr(pgroups, "dist", SimpleNamespace(is_initialized=lambda: True,
                                                         get_world_size=lambda group=None: 4 if group else 8))  # fmt: skip
    assert pgroups.resolve_policy("auto", object(), 4) == "shared"
    assert pgroups.resolve_policy("auto", None, 8) == "own"
    with pytest.raises(UsageError, match="groups='own' is not allowed with a group of 4"):
        pgroups.resolve_policy("own", object(), 4)
    with pytest.raises(UsageError, match="groups='mine'"):
        pgroups.resolve_policy("mine", None, 8)


# -- the double ring on emulated two-host links -------------------------------------------------------------------
def test_the_double_rings_outer_transfer_hides_behind_the_inner_steps(tmp_path):
    """2 hosts x 2 ranks, inner rings inside a host (NV4), the outer ring across the slow network (2 ms + 0.05 GB/s):
    each outer K/V transfer runs while the inner steps compute, and the hop table charges its time to the outer
    hop, not to an inner one."""
    from ringbench.analysis.hops import hop_table
    from ringbench.figures.critical_path import transfers
    from ringbench.record.store import load_run
    from ringbench.run.sweep import execute
    from ringbench.scenario.scenario import Scenario

    scenario = Scenario(name="double-ring-overlap", world=(4,), seq=(512,), heads=(2,), head_dim=(32,),
                        mask=("none",), layout=("contiguous",), buffer=("double",), kernel=("emulated:0.2",),
                        strategy=("double-ring:2",), iters=2, warmup=1, check=False, topology=str(TOPOLOGY),
                        emulate_links=True)  # fmt: skip
    run = load_run(execute(scenario, out=tmp_path).run_dir)
    events = run.events
    fwd = events[(events["phase"] == "fwd") & (events["layer"] == 0)]
    outer = fwd[fwd["comm_group"].str.startswith("outer-kv", na=False)]
    recvs, waits = outer[outer["kind"] == "recv"], outer[outer["kind"] == "wait"].set_index(["rank", "iteration"])
    assert len(recvs) == 4 * 2  # one outer hop per rank and iteration (posted as rotation 0 starts)
    overlapped = 0
    for row in recvs.itertuples():
        inner = fwd[(fwd["rank"] == row.rank) & (fwd["iteration"] == row.iteration) & (fwd["kind"] == "compute")
                    & (fwd["step"] < 2)]  # rotation 0's inner steps  # fmt: skip
        span_ms = (row.end_ns - row.start_ns) / 1e6
        wait = waits.loc[(row.rank, row.iteration)]
        assert span_ms > 2.0  # the network's 2 ms latency at least
        assert row.end_ns < inner["end_ns"].max()  # in hand before the inner steps were done
        assert (wait.end_ns - wait.start_ns) / 1e6 < 0.1 * span_ms  # so the rank never waited for it
        overlapped += row.end_ns > inner["start_ns"].min()  # in flight while an inner step computed
    # Posting the inner exchange first takes the host a millisecond or more on 2 shared cores; the outer transfer
    # (about 6 ms) is still in flight when the inner compute starts on most ranks.
    assert overlapped >= len(recvs) // 2
    hops = hop_table(transfers(events)).query("phase == 'fwd' and exchange == 'kv'").set_index(["src", "dst"])
    outer_ms = hops.loc[[(0, 2), (2, 0), (1, 3), (3, 1)], "transfer_ms"]
    inner_ms = hops.loc[[(0, 1), (1, 0), (2, 3), (3, 2)], "transfer_ms"]
    # The outer hops carry the network's 2 ms latency and the inner ones do not (loopback gloo with four ranks on
    # two shared cores adds a millisecond or a few to any hop, so the hops are compared, not bounded).
    assert outer_ms.min() > 2.0 and inner_ms.median() < 0.75 * outer_ms.median(), hops[["transfer_ms"]]
    assert shared_channels(events).empty


def test_blocks_over_one_emulated_hop_take_turns_on_it():
    """The backward's K/V and dK/dV lanes receive over the same hop: on emulated links they queue on it, as on a
    real link, instead of each arriving one hop price after the other was posted; another hop is not held."""
    import threading
    import time

    clock = comm.LinkClock()
    hold_s = 0.2  # upper bounds below leave 0.2 s for a busy machine's scheduling
    started = time.perf_counter()
    ended: dict[str, float] = {}

    def lane(name: str, hop: tuple[int, int]) -> None:
        clock.hold(hop, hold_s)
        ended[name] = time.perf_counter() - started

    lanes = [threading.Thread(target=lane, args=(name, hop)) for name, hop in
             (("kv", (3, 4)), ("dkv", (3, 4)), ("other hop", (2, 3)))]  # fmt: skip
    for thread in lanes:
        thread.start()
    for thread in lanes:
        thread.join()
    assert max(ended["kv"], ended["dkv"]) >= 2 * hold_s
    assert min(ended["kv"], ended["dkv"]) < 2 * hold_s <= max(ended["kv"], ended["dkv"])
    assert ended["other hop"] < 2 * hold_s


class _Options:
    def __init__(self) -> None:
        self.is_high_priority_stream = False
        self._timeout = None


class _OptionsWithoutTimeout:
    __slots__ = ("group_name", "is_high_priority_stream")  # a torch whose options lack the private _timeout


def test_every_nccl_group_is_made_with_options_of_its_own(monkeypatch):
    """torch writes each group's name, colour and ranks into the options it is given and ProcessGroupNCCL keeps
    them: a shared object would show every group the last one's."""
    fake = SimpleNamespace(is_initialized=lambda: True, get_backend=lambda group=None: "nccl",
                           get_global_rank=lambda group, rank: rank,
                           distributed_c10d=SimpleNamespace(_get_default_group=lambda: "world"))  # fmt: skip
    monkeypatch.setattr(pgroups, "dist", fake)
    for options_class in (_Options, _OptionsWithoutTimeout):
        made = []

        def new_group(ranks, timeout, pg_options, made=made):
            pg_options.group_name = f"group {len(made)}"  # what torch does with them
            made.append(pg_options)
            return SimpleNamespace(ranks=tuple(ranks))

        pgroups.forget()
        pgroups.channel(None, "inner-kv", [(0, 1), (2, 3)], 0, timeout_s=10, new_group=new_group,
                        nccl=SimpleNamespace(Options=options_class))  # fmt: skip
        assert len(made) == 2 and made[0] is not made[1]
        assert [o.group_name for o in made] == ["group 0", "group 1"]
        assert all(o.is_high_priority_stream for o in made)
    pgroups.forget()
