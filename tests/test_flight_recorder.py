"""Hangs from torch's flight-recorder dumps (ringbench/traces/flight_recorder.py, through `ringbench import`).

Two kinds of dumps:

* real ones, made on CPU with torch 2.13's recorder (tests/fr_dumps.py; tests/data/flight_recorder/README.md):
  gloo records collectives, not sends and receives, so the ring rotates by all-to-all; one rank stops before a
  ring step and the others block there.
* point-to-point dumps (NCCL's ``nccl:send 1->2`` / ``nccl:recv 2<-1`` entries), which gloo does not record and no
  single GPU can make (an NCCL ring needs a GPU per rank): built here from the documented format, the one torch's
  own analyser reads (torch/distributed/flight_recorder/components/types.py, ``Op``: "nccl:send 1->2",
  "nccl:recv 3<-0"; loader.py ``read_dump``: a dict with ``entries``, ``version``, ``pg_config``).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import invoke

from ringbench.errors import UsageError
from ringbench.traces.flight_recorder import read_hang

DATA = Path(__file__).parent / "data" / "flight_recorder"
STUCK = DATA / "gloo_alltoall_w4_stuck"


def test_real_gloo_dumps_name_the_stalled_edge_in_json_and_pickled_form(tmp_path):
    for form in ("json", "pickle"):
        result = invoke("import", str(STUCK / form), "--json")
        assert result.exit_code == 0, result.output
        document = json.loads(result.stdout)
        edge = document["stalled_edge"]
        assert (edge["src"], edge["dst"], edge["ring_step"]) == (2, 3, 1), document
        assert edge["process_group"] == "0 (default_pg)" and "all_to_all" in edge["op"], document
        assert document["never_posted"] == [2] and document["ring"] == [0, 1, 2, 3], document
    line = invoke("import", str(STUCK / "json")).stdout.strip()
    assert "\n" not in line and line.startswith("stalled ring edge 2 -> 3 at ring step 1"), line
    assert "rank(s) 2 never posted" in line, line


def test_dumps_of_a_job_with_no_ring_are_one_line_exit_2():
    result = invoke("import", str(DATA / "gloo_no_ring_w4"))
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "no ring in these flight-recorder dumps" in line and "all_reduce" in line, line


def _entry(record: int, name: str, seq: int, p2p_seq: int, done: bool, sizes) -> dict:
    """One entry with the documented fields (types.py EntryState / Op)."""
    return {"record_id": record, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
            "p2p_seq_id": p2p_seq, "op_id": record, "profiling_name": name, "time_created_ns": 1_000_000 * record,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": ["BFloat16"],
            "output_sizes": [list(s) for s in sizes], "output_dtypes": ["BFloat16"],
            "state": "completed" if done else "started", "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": done, "timeout_ms": 600000, "is_p2p": "->" in name
            or "<-" in name, "frames": []}  # fmt: skip


def p2p_dumps(world: int, stuck: int, stuck_step: int, posted_by_stuck: bool = False) -> dict[int, dict]:
    """NCCL-style dumps of a ring of ``world`` ranks, 2 iterations of world - 1 exchanges with an all-reduce
    between. At iteration 1, step ``stuck_step``, rank ``stuck`` never posts (or, ``posted_by_stuck``, posts and its
    send to the next rank never completes); the others post that step, and what depends on the stuck rank stays
    pending: the next rank's receive, the previous rank's send. Nobody goes further."""
    dumps = {}
    for rank in range(world):
        succ, pred = (rank + 1) % world, (rank - 1) % world
        entries: list[dict] = []

        def add(name: str, seq: int, done: bool, sizes=((2, 8, 128, 64),), entries=entries) -> None:
            p2p = sum(1 for e in entries if e["is_p2p"]) + 1 if "->" in name or "<-" in name else 0
            entries.append(_entry(len(entries), name, seq, p2p, done, sizes))

        for iteration in range(2):
            add("nccl:all_reduce", iteration + 1, True, sizes=((1,),))
            for step in range(world - 1):
                stall = iteration == 1 and step == stuck_step
                if stall and rank == stuck and not posted_by_stuck:
                    break
                add(f"nccl:recv {rank}<-{pred}", 0, not (stall and pred == stuck))
                add(f"nccl:send {rank}->{succ}", 0, not (stall and (succ == stuck or rank == stuck)))
                if stall:
                    break
        dumps[rank] = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg",
                       "ranks": str(list(range(world)))}}, "pg_status": {}, "entries": entries}  # fmt: skip
    return dumps


def _write(folder: Path, dumps: dict[int, dict], pickled: bool) -> Path:
    folder.mkdir(parents=True)
    for rank, document in dumps.items():
        if pickled:
            (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(document))
        else:
            (folder / f"rank{rank}.json").write_text(json.dumps(document))
    return folder


@pytest.mark.parametrize("world", [2, 3, 5])
def test_documented_p2p_dumps_name_the_sender_that_never_posted(tmp_path, world):
    stuck = world - 1
    for pickled in (False, True):
        folder = _write(tmp_path / f"p{int(pickled)}", p2p_dumps(world, stuck=stuck, stuck_step=world - 2), pickled)
        hang = read_hang([folder])
        assert (hang.src, hang.dst, hang.step) == (stuck, 0, world - 2), hang.line
        assert hang.never_posted == [stuck] and not hang.stalled_posted, hang.line
        assert hang.group == "0 (default_pg)" and "send" in hang.op and hang.sizes == [[2, 8, 128, 64]], hang.line
    posted = _write(tmp_path / "posted", p2p_dumps(4, stuck=1, stuck_step=0, posted_by_stuck=True), False)
    hang = read_hang([posted])
    assert hang.stalled_posted and hang.never_posted == [] and (hang.src, hang.dst) == (1, 2), hang.line


class _Runs:
    def __reduce__(self):
        return (subprocess.call, (["touch", "/tmp/ringbench-fr-pwned"],))


def test_a_pickled_dump_with_any_global_is_refused_and_runs_nothing(tmp_path):
    marker = Path("/tmp/ringbench-fr-pwned")
    marker.unlink(missing_ok=True)
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in range(2):
        document = p2p_dumps(2, stuck=1, stuck_step=0)[rank] | {"payload": _Runs()}
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(document))
    result = invoke("import", str(folder))
    assert result.exit_code == 2 and not marker.exists(), result.output
    line = result.output.strip()
    assert "\n" not in line and "refers to subprocess.call" in line and "refused" in line, line


def test_dumps_are_found_in_subfolders_and_a_rank_dumped_twice_is_one_line():
    # the parent holds the same job's dumps twice (json/ and pickle/): found, and refused by the rank seen twice
    result = invoke("import", str(STUCK))
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "rank 0 appears in two dumps" in line and "nccl_trace_rank_0" in line, line


def test_bad_dump_sets_are_one_line():
    with pytest.raises(UsageError, match="rank"):
        read_hang([STUCK / "json" / "rank0.json", STUCK / "json" / "rank1.json", STUCK / "json" / "rank3.json"])


@pytest.mark.slow
def test_fresh_gloo_dumps_of_a_stuck_ring(tmp_path):
    """Made now with this torch (tests/fr_dumps.py), not the checked-in ones: the recorder still records gloo's
    all-to-all and the import still reads it."""
    script = Path(__file__).parent / "fr_dumps.py"
    subprocess.run([sys.executable, str(script), str(tmp_path), "--world", "3", "--stuck-rank", "0",
                    "--stuck-step", "0", "--port", "29771"], check=True, timeout=120)  # fmt: skip
    for form in ("rank*.json", "nccl_trace_rank_*"):
        hang = read_hang(sorted(tmp_path.glob(form)))
        assert (hang.src, hang.dst, hang.step, hang.never_posted) == (0, 1, 0, [0]), hang.line
