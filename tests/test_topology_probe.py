"""`ringbench probe`: a ping-pong matrix on 3 local ranks, with an emulated slow pair; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_helpers import assert_one_line_error, invoke

from ringbench.experiments.probe import ProbeSpec, format_bytes, parse_sizes, summarize
from ringbench.record.atomic import write_json
from ringbench.record.folder import new_run_id
from ringbench.record.meta import META_FILE
from ringbench.record.schema import SCHEMA_VERSION
from ringbench.scenario.scenario import Scenario

DATA = Path(__file__).parent / "data" / "topology"
SLOW_PAIR = DATA / "three_rank_slow_pair.yaml"  # 1 <-> 2: 3 ms latency, 0.05 GB/s; the other pairs NV4


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    """One emulated probe on 3 ranks, through the CLI with --json (the slow part of this file: one launch)."""
    out = tmp_path_factory.mktemp("probe")
    result = invoke(
        "probe", "--world", "3", "--sizes", "8,16KiB", "--round-trips", "3", "--timeout", "30",
        "--out", str(out), "--topology", str(SLOW_PAIR), "--emulate-links", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    return Path(document["run_dir"]), document


def test_probe_shows_the_emulated_slow_pair(probe_run):
    _, document = probe_run
    latency = np.array([[np.nan if v is None else v for v in row] for row in document["latency_us"]])
    bandwidth = np.array([[np.nan if v is None else v for v in row] for row in document["bandwidth_gbps"]])
    slow = [(1, 2), (2, 1)]
    fast = [(0, 1), (1, 0), (0, 2), (2, 0)]
    # 3000 us each way on the slow pair; loopback gloo elsewhere (well under a millisecond on an idle machine; a
    # loaded 2-core runner can stretch one fast pair to a few ms, so the comparison is against their median).
    assert min(latency[p] for p in slow) > 2500, latency
    assert min(latency[p] for p in slow) > 2 * np.median([latency[p] for p in fast]), latency
    # The slow pair's bandwidth is the topology's (0.05 GB/s); the loopback pairs' is not compared with it: on a loaded
    # runner their 16 KB transfers measured as low as 0.004 GB/s (scheduling, not the link).
    assert 0.02 < bandwidth[1, 2] < 0.1, bandwidth
    assert document["world"] == 3 and document["sizes"] == [8, 16384] and document["emulated_links"]


def test_probe_run_directory_holds_meta_table_and_heatmap(probe_run):
    run_dir, _ = probe_run
    meta = json.loads((run_dir / META_FILE).read_text())
    assert meta["schema_version"] == SCHEMA_VERSION and meta["kind"] == "probe" and meta["world"] == 3
    assert meta["probe"]["latency_us"][0][0] is None and len(meta["probe"]["rtt_us"]) == 2
    assert meta["topology"]["source"].startswith("probe") and len(meta["topology"]["devices"]) == 3
    assert meta["topology"]["links"][1][2]["class"] == "NV4"  # emulated classes are kept, with measured costs
    samples = pd.read_parquet(run_dir / "probe.parquet")
    assert set(samples.columns) >= {"src", "dst", "size_bytes", "rtt_us"}
    assert len(samples) == 6 * 2 * 3  # ordered pairs x sizes x repeats
    assert (run_dir / "probe_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recommend_reads_a_probe_run(probe_run):
    run_dir, _ = probe_run
    result = invoke("recommend", str(run_dir), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert sorted(document["order"]) == [0, 1, 2] and "3 devices" in document["topology"]


def test_recommend_reads_a_run_made_with_topology(tmp_path):
    from ringbench.rank.metadata import collect_metadata

    scenario = Scenario(name="t", world=(4,), topology=str(DATA / "two_host_slow_net.yaml"), emulate_links=True)
    run_dir = tmp_path / new_run_id(scenario.name)
    meta = collect_metadata(scenario.validate(), command="test", trace=True) | {"run_id": run_dir.name}
    write_json(run_dir / META_FILE, {**meta, "schema_version": SCHEMA_VERSION})  # what `run` writes first
    result = invoke("recommend", str(run_dir), "--order", "stride:2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["order"] == [0, 1, 2, 3] and document["current_hop_classes"] == {"NET": 4}


def test_summarize_and_human_output():
    """The matrices from synthetic round trips: latency = rtt(small) / 2, bandwidth = extra bytes / extra time."""
    spec = ProbeSpec(sizes=(8, 1_000_008), repeats=1)
    samples = []
    for src, dst in ((0, 1), (1, 0)):
        samples += [(src, dst, 8, 0, 20_000), (src, dst, 1_000_008, 0, 20_000 + 1_000_000)]  # 1 MB in 1 ms
    result = summarize([{"rank": 0, "host": "h", "backend": "gloo", "launcher": "local", "samples": samples},
                        {"rank": 1, "host": "h", "backend": "gloo", "launcher": "local", "samples": []}],
                       spec, 2, 0.5)  # fmt: skip
    assert result.latency_us[0, 1] == pytest.approx(10.0) and result.bandwidth_gbps[1, 0] == pytest.approx(1.0)
    assert result.topology().link(0, 1).latency_us == pytest.approx(10.0)
    from ringbench.cli import probe_cmd
    from ringbench.cli.common import Output

    out = Output()
    with out.console.capture() as captured:
        probe_cmd._render(result, Path("results/x"), out)
    text = captured.get()
    assert "latency, us" in text and "bandwidth, GB/s" in text and "ringbench recommend results/x" in text


def test_sizes_parse():
    assert parse_sizes("64KiB, 8,1MiB,8") == (8, 65536, 1048576)
    assert parse_sizes("1kb") == (1000,) and format_bytes(65536) == "64KiB" and format_bytes(100) == "100B"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--sizes", "8,lots"], "sizes="),
        (["--sizes", "0"], "sizes="),
        (["--world", "1"], "world=1"),
        (["--round-trips", "0"], "round_trips=0"),
        (["--timeout", "0"], "timeout=0"),
        (["--topology", "no-such-topology.yaml", "--emulate-links"], "no-such-topology.yaml"),
        (["--topology", str(SLOW_PAIR), "--emulate-links", "--world", "4"], "world=4"),
        (["--emulate-links"], "emulate_links=True is not allowed; expected only together with --topology FILE"),
        (
            ["--topology", str(DATA / "perlmutter_a100_4gpu_nccl_graph_dump.xml"), "--emulate-links"],
            "perlmutter_a100_4gpu_nccl_graph_dump.xml",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, fragment):
    assert_one_line_error(invoke("probe", *args), fragment)


class _QueuedDist:
    """NCCL's batched P2P as the host sees it: the works' wait() returns at once (the work is queued on the device).
    Plain send / recv would make NCCL a two-rank communicator per pair: they are refused."""

    class P2POp:
        def __init__(self, op, tensor, peer):
            self.op, self.tensor, self.peer = op, tensor, peer

    class _Work:
        def wait(self):
            return True

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def isend(self, tensor, dst):
        raise AssertionError("called outside a batch")

    def irecv(self, tensor, src):
        raise AssertionError("called outside a batch")

    def batch_isend_irecv(self, ops):
        assert len(ops) == 1  # one message per batch: the ping-pong's order is the program's
        (op,) = ops
        self.calls.append(("send" if op.op == self.isend else "recv", op.peer, op.tensor.numel()))
        return [self._Work()]

    def send(self, tensor, dst):
        raise AssertionError("a plain send makes NCCL create a communicator for the pair")

    recv = send


def test_nccl_round_trips_are_a_batch_timed_by_device_events_without_a_host_wait():
    import torch
    from fake_streams import FakeRuntime

    from ringbench.experiments.probe import _DeviceWire

    runtime = FakeRuntime(lag_ms=2.0)  # events complete 2 ms after they are recorded, as a GPU's do
    spins = []
    runtime.spin = lambda stream, seconds: spins.append((stream, seconds))
    fake = _QueuedDist()
    model = {
        "latency_us": [[0.0, 50.0], [50.0, 0.0]],
        "bandwidth_gbps": [[1.0, 1.0], [1.0, 1.0]],
        "net": [[False, False], [False, False]],
        "hosts": ["a", "a"],
    }  # Scenario.link_model's form
    wire = _DeviceWire(0, runtime, timeout_s=5.0, link_model=None, dist=fake)
    message, answer = torch.zeros(1024, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8)
    rtt = wire.batch(message, answer, peer=1, initiator=True, count=10)
    assert fake.calls == [("send", 1, 1024), ("recv", 1, 8)] * 10  # back to back
    assert runtime.syncs == 0 and runtime.events_made == 2  # two events, no synchronise: the host never waited
    assert isinstance(rtt, int) and rtt >= 0
    assert wire.batch(message, answer, peer=1, initiator=False, count=3) is None
    assert fake.calls[-2:] == [("recv", 1, 1024), ("send", 1, 8)]  # the answering side
    delayed = _DeviceWire(0, runtime, timeout_s=5.0, link_model=model, dist=fake)
    delayed.batch(message, answer, peer=1, initiator=True, count=4)
    # An emulated link delays each arrival on the device (a busy-wait on the stream), never by a host sleep.
    lead, *arrivals = spins[-5:]
    assert lead == (runtime.compute, 4 * _DeviceWire.HOST_LEAD_S)  # the device waits while the host enqueues
    assert len(arrivals) == 4 and all(stream is runtime.compute and seconds > 50e-6 for stream, seconds in arrivals)


def test_a_batch_that_never_completes_is_a_bounded_failure():
    import torch
    from fake_streams import FakeRuntime

    from ringbench.errors import RunFailure
    from ringbench.experiments.probe import _DeviceWire

    runtime = FakeRuntime(lag_ms=0.0)
    runtime.hold = True  # the device never reaches the end event
    wire = _DeviceWire(1, runtime, timeout_s=0.1, link_model=None, dist=_QueuedDist())
    with pytest.raises(RunFailure, match=r"rank 1: 5 answers to rank 0 did not complete within 0.1 s"):
        wire.batch(torch.zeros(4), torch.zeros(1), peer=0, initiator=False, count=5)


def test_probe_rank_takes_one_sample_per_batch_on_nccl():
    from types import SimpleNamespace

    from ringbench.experiments.probe import probe_rank

    class _Wire:
        def __init__(self) -> None:
            self.batches = []

        def batch(self, message, answer, peer, initiator, count):
            self.batches.append((message.numel(), peer, initiator, count))
            return 1000 * message.numel() if initiator else None

    env = SimpleNamespace(rank=0, world=2, backend="nccl", device="cpu", launcher="local")
    spec = ProbeSpec(sizes=(8, 4096), repeats=3, warmup=1, batch=7)
    wire = _Wire()
    result = probe_rank(env, spec, wire=wire, barrier=lambda: None)
    assert result["timing"] == "cuda events"
    assert len(wire.batches) == 2 * 2 * 4 and {b[3] for b in wire.batches} == {7}  # 2 directions, 2 sizes, 1+3
    assert sorted({(s[2], s[4]) for s in result["samples"]}) == [(8, 8000), (4096, 4096000)]
    assert len(result["samples"]) == 2 * 3  # as the source: 2 sizes x 3 timed repeats
