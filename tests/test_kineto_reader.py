"""The PyTorch profiler trace reader on real traces (GPU: NCCL job; CPU: a ringbench gloo ring) and on bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from ringbench.errors import UsageError
from ringbench.traces import kineto, kineto_fast, kineto_scan
from ringbench.traces.kineto import TRACE_EVENT_COLUMNS, read_kineto_trace

DATA = Path(__file__).parent / "data" / "kineto"
GPU_RANK0 = DATA / "gpu128_sampled_rank-0.json.gz"
GPU_RANK1 = DATA / "gpu128_sampled_rank-1.json.gz"
GLOO_RANK0 = DATA / "gloo_ring_w4" / "r0-rank0.json.gz"
SHARED = Path("/work/shared/fixtures/kineto")


def test_gpu_trace_kernels_streams_and_correlation_ids():
    trace = read_kineto_trace(GPU_RANK0)
    assert (trace.backend, trace.rank, trace.world_size) == ("nccl", 0, 128)
    assert trace.base_time_ns == 0 and trace.schema_version == 1
    events = trace.events
    assert list(events.columns) == list(TRACE_EVENT_COLUMNS)
    counts = events["cat"].value_counts()
    assert counts["kernel"] == 1154 and counts["cuda_runtime"] == 1204 and counts["cpu_op"] == 2329
    kernels = events[events["cat"] == "kernel"]
    assert (kernels["stream"] >= 0).all() and (kernels["correlation"] >= 0).all()
    assert {7, 23, 84} <= set(kernels["stream"])
    assert (events.loc[events["cat"] == "cpu_op", "stream"] == -1).all()
    # Every kernel's correlation id names exactly one host launch.
    launches = events[events["cat"] == "cuda_runtime"].set_index("correlation")
    linked = kernels.merge(launches[["start_ns"]], left_on="correlation", right_index=True, suffixes=("", "_launch"))
    assert len(linked) == len(kernels)
    assert (linked["start_ns_launch"] <= linked["start_ns"]).all()  # launched before it ran
    # ts are absolute microseconds here: 2023-04-29 in unix-epoch ns.
    assert events["start_ns"].between(1_682_725_897 * 10**9, 1_682_725_901 * 10**9).all()
    assert (events["end_ns"] - events["start_ns"] == events["dur_ns"]).all()


def test_gpu_trace_nccl_sendrecv_kernels_and_collective_bytes():
    events = read_kineto_trace(GPU_RANK0).events
    sendrecv = events[events["name"].str.startswith("ncclKernel_SendRecv")]
    assert len(sendrecv) == 10 and (sendrecv["cat"] == "kernel").all()
    assert set(sendrecv["stream"]) == {84, 203}  # NCCL's own streams, apart from the compute streams
    assert not set(sendrecv["stream"]) & set(events.loc[events["name"].str.contains("gemm"), "stream"])
    first = sendrecv.iloc[0]
    assert first["start_ns"] == 1682725898094377000 and first["dur_ns"] == 30_669_000
    reduce = events[events["name"] == "nccl:all_reduce"].iloc[0]
    assert reduce["input_dims"] == "[[19618307]]" and reduce["input_types"] == "float"
    assert reduce["bytes"] == 19618307 * 4
    memcpy = events[events["cat"] == "gpu_memcpy"]
    assert (memcpy["bytes"] >= 0).all()  # copies count their own bytes
    rank1 = read_kineto_trace(GPU_RANK1)
    assert rank1.rank == 1 and len(rank1.events[rank1.events["name"].str.contains("SendRecv")]) > 0


def test_cpu_gloo_trace_peers_tags_and_transfer_bytes():
    trace = read_kineto_trace(GLOO_RANK0)
    assert (trace.backend, trace.rank, trace.world_size) == ("gloo", 0, 4)
    assert trace.base_time_ns > 1_700_000_000 * 10**9 and trace.host_name
    assert trace.distributed_info["pg_config"][0]["ranks"] == [0, 1, 2, 3]
    events = trace.events
    sends, recvs = events[events["name"] == "c10d::send"], events[events["name"] == "c10d::recv_"]
    assert len(sends) == len(recvs) > 0
    assert set(sends["peer"]) == {1} and set(recvs["peer"]) == {3}  # ring successor / predecessor of rank 0
    assert (sends["tag"] >= 0).all() and (events.loc[events["name"] == "aten::empty", "peer"] == -1).all()
    gloo = events[events["name"].isin(["gloo:send", "gloo:recv"])]
    assert (gloo["cat"] == "user_annotation").all()
    # K/V blocks: (2, B=1, H=4, S/N=512, D=64) float32; the dK/dV accumulators move the same shape.
    assert (gloo["input_dims"] == "[[2,1,4,512,64]]").all() and (gloo["bytes"] == 2 * 4 * 512 * 64 * 4).all()
    markers = events[events["name"].str.startswith("ringbench:")]["name"]
    assert "ringbench:iteration 1" in set(markers) and "ringbench:bwd step 3" in set(markers)


def test_plain_json_and_gzip_and_every_reader_give_the_same_table(tmp_path, monkeypatch):
    plain = tmp_path / "rank0.json"
    plain.write_bytes(gzip.decompress(GLOO_RANK0.read_bytes()))
    whole = read_kineto_trace(GLOO_RANK0)
    assert whole.reader == "whole file (msgspec)"
    reference = whole.events
    pd.testing.assert_frame_equal(read_kineto_trace(plain).events, reference)
    seen = []
    streamed = read_kineto_trace(plain, memory_mb=0, progress=seen.append)  # over the budget: streamed
    assert streamed.reader.startswith("streamed") and sum(seen) == plain.stat().st_size
    pd.testing.assert_frame_equal(streamed.events, reference)
    monkeypatch.setattr(kineto, "CHUNK_MB", 1 / (1 << 20) * 997)  # cuts land everywhere, inside values too
    pd.testing.assert_frame_equal(read_kineto_trace(GLOO_RANK0, memory_mb=0).events, reference)
    careful = _careful(plain, monkeypatch)
    assert careful.reader == "careful (stdlib)"
    pd.testing.assert_frame_equal(careful.events, reference)
    monkeypatch.setattr(kineto_scan, "_CHUNK", 7)  # every value and multi-byte character straddles refills
    monkeypatch.setattr(kineto_scan, "_PACK", 10)
    pd.testing.assert_frame_equal(read_kineto_trace(plain).events, reference)


def _careful(path, monkeypatch):
    """Read with the careful reader (as for a file the fast decoder rejects)."""

    def reject(*args, **kwargs):
        raise kineto_fast.Unusual("test")

    monkeypatch.setattr(kineto_fast, "read", reject)
    return read_kineto_trace(path)


def test_an_unusual_field_type_falls_back_to_the_careful_reader(tmp_path):
    path = tmp_path / "odd.json"
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.5, "dur": 2, "pid": "host", "tid": 7,
               "args": {"External id": "x12"}}]  # fmt: skip
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    trace = read_kineto_trace(path)
    assert trace.reader == "careful (stdlib)"
    row = trace.events.iloc[0]
    assert (row["pid"], row["tid"], row["external_id"], row["dur_ns"]) == (-1, 7, -1, 2000)


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared fixtures absent")
def test_the_copies_match_the_shared_fixtures():
    for name in ("gpu128_sampled_rank-0.json.gz", "gpu128_sampled_rank-1.json.gz"):
        assert (DATA / name).read_bytes() == (SHARED / name).read_bytes()


def _one_line_error(path: Path, *fragments: str) -> None:
    with pytest.raises(UsageError) as info:
        read_kineto_trace(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        (b"hello, not json", ["not a PyTorch profiler trace", "text starting with 'h'"]),
        (b"", ["an empty file"]),
        (b'[{"ph": "X"}]', ["a JSON array"]),
        (b'{"a": 1}', ["no traceEvents", "found keys: a"]),
        (b'{"displayTimeUnit": "ms", "traceEvents": []}', ["no schemaVersion", "displayTimeUnit, traceEvents"]),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": 1}', ["ends early"]),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": 1} {"ph": "X"}]}', ["expected ','"]),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X" "ts": 1}]}', ["not valid JSON"]),
        (b'{"schemaVersion": 1, "traceEvents": [3]}', ["event 0 is a int"]),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "ts": "soon"}]}', ["ts or dur is not a number"]),
        (b'{"schemaVersion": 1, "baseTimeNanoseconds": "x", "traceEvents": []}', ["baseTimeNanoseconds"]),
        (b"\xff\xfe\x00garbage", ["not UTF-8"]),
    ],
    ids=[
        "text",
        "empty",
        "array",
        "no-events",
        "perfetto-like",
        "truncated",
        "no-comma",
        "bad-json",
        "non-object",
        "bad-ts",
        "bad-base",
        "binary",
    ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, content, fragments):
    path = tmp_path / "trace.json"
    path.write_bytes(content)
    _one_line_error(path, *fragments)


def test_truncated_and_corrupt_gzip_and_missing_paths(tmp_path):
    packed = GLOO_RANK0.read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    _one_line_error(cut, "truncated or corrupt gzip")
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(packed[:20] + bytes(64) + packed[84:])
    _one_line_error(corrupt, "gzip")
    named_gz = tmp_path / "plain.json.gz"  # the content decides, not the name
    named_gz.write_text(json.dumps({"schemaVersion": 1, "traceEvents": []}))
    assert read_kineto_trace(named_gz).events.empty
    _one_line_error(tmp_path / "absent.json.gz", "no such file")
    _one_line_error(tmp_path, "is a directory")
