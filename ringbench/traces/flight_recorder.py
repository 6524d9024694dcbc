"""Hangs: torch's flight-recorder dumps of a stuck job -> the stalled ring edge and the ranks that never posted.

    from ringbench.traces.flight_recorder import read_hang
    hang = read_hang(["dumps/"])        # one dump per rank: JSON, or torch's default pickled form
    hang.line, hang.document()         # sender -> receiver, ring step, process group, op; who never posted

The flight recorder (``TORCH_FR_BUFFER_SIZE`` / ``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries per process) keeps each
process's last collectives and point-to-point ops; torch writes one dump per rank on a timeout (NCCL's watchdog,
``TORCH_FR_DUMP_TEMP_FILE`` + rank, pickled) or on request (``torch._C._distributed_c10d._dump_fr_trace`` and
``_dump_fr_trace_json``). A dump is a dict: ``version``, ``pg_config`` (process group -> name, desc, ranks),
``pg_status``, ``entries``; each entry has ``profiling_name`` (``nccl:send 1->2``, ``nccl:recv 3<-0`` with the
group's ranks, ``gloo:all_to_all``, ...), ``process_group`` (name, desc), ``collective_seq_id``, ``p2p_seq_id``,
``record_id``, ``state`` (scheduled / started / completed), ``retired``, ``input_sizes``, ``input_dtypes``. This is
the format torch's own analyser reads (torch/distributed/flight_recorder/components/types.py, ``Op``;
loader.py, ``read_dump``). A pickled dump holds only dicts, lists, tuples, strings and numbers: it is read through
an unpickler that refuses every global, so no dump can run code.

What gloo records (torch 2.13): its collectives, not its sends and receives; so a gloo ring is seen when it rotates
its blocks by all-to-all (torch's own ring attention), and NCCL's dumps show point-to-point rings. The rank of a
dump is the number its file name ends with (torch names them ``<prefix><rank>``).

The stalled edge:

* point-to-point ring (each rank's sends go to one successor): per edge p -> r, the k-th receive on r pairs with
  the k-th send on p. The first receive not completed on any rank names the edge; its send missing from p's dump
  means p never posted it (it is stuck elsewhere: its last op is said), both present and pending means the
  transfer itself stalled (the link, or NCCL).
* all-to-all rotations (the same all-to-all, repeated): every rank that posted collective number n is waiting for
  the ranks whose dumps stop before it (they never posted it); a rank that never posted holds back the block its
  successor waits for, so the edge is that rank -> the next in rank order (the dump keeps no split sizes).
* the ring step: the stalled exchange's place among the edge's exchanges since the last other collective (an
  all-reduce, a barrier: the iteration's boundary).
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ringbench.errors import UsageError

P2P_NAME = re.compile(r"^(?P<lib>\w+):(?P<op>send|recv) (?P<a>\d+)(?P<arrow>->|<-)(?P<b>\d+)$")
ROTATIONS = ("all_to_all", "all_to_allv", "all_to_all_single", "alltoall", "alltoall_base")
RANK_IN_NAME = re.compile(r"(\d+)(?:\.json|\.pkl|\.pickle)?$")
DUMP_KEYS = {"entries", "version"}
MAX_DUMP_BYTES = 256 * 2**20  # a dump of 20,000 entries with stack frames is tens of MB


class _NoGlobals(pickle.Unpickler):
    """Dicts, lists, tuples, strings and numbers only: every global (a class, a function) is refused."""

    def find_class(self, module, name):
        raise UsageError(f"flight-recorder dump refers to {module}.{name}: a dump holds plain data only; refused")


def _load(path: Path) -> dict:
    data = path.read_bytes()
    document = None
    if data[:1] in (b"{", b"["):
        try:
            document = json.loads(data)
        except ValueError as exc:
            raise UsageError(f"{path}: not a flight-recorder dump (JSON: {exc})") from None
    else:
        try:
            document = _NoGlobals(io.BytesIO(data)).load()
        except UsageError as exc:
            raise UsageError(f"{path}: {exc}") from None
        except Exception as exc:  # any unpickling failure is bad input, said in one line
            raise UsageError(f"{path}: not a flight-recorder dump (pickle: {exc})") from None
    if not isinstance(document, dict) or not set(document) >= DUMP_KEYS:
        raise UsageError(f"{path}: not a flight-recorder dump (no 'entries' and 'version'); pass the files torch "
                         "wrote (TORCH_FR_DUMP_TEMP_FILE + rank, or _dump_fr_trace_json())")  # fmt: skip
    return document


def is_dump(path: Path) -> bool:
    """Whether ``path`` looks like a flight-recorder dump: a pickle (torch's default dump), or JSON with the dump's
    keys and not a profiler trace's (which is told from its first 64 kB)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(65536)
            if head[:1] == b"\x80":
                return True
            if head[:1] != b"{" or b'"traceEvents"' in head or b'"schemaVersion"' in head:
                return False
            data = head + stream.read(MAX_DUMP_BYTES)
    except OSError:
        return False
    return b'"entries"' in data and (b'"pg_config"' in data or b'"pg_status"' in data)


def dump_files(paths) -> list[Path]:
    """The dump files among ``paths`` (files or folders)."""
    out = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out += [p for p in sorted(path.rglob("*")) if p.is_file() and is_dump(p)]  # as traces are found
        elif path.is_file() and is_dump(path):
            out.append(path)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class _Op:
    rank: int  # global rank of the dump
    index: int  # position in the dump (record order)
    kind: str  # send | recv | a collective's name
    lib: str
    peer: int  # global peer rank (P2P), else -1
    group: str  # "name (desc)"
    seq: int  # collective_seq_id
    done: bool
    sizes: list
    dtypes: list


@dataclass(frozen=True, kw_only=True, slots=True)
class Hang:
    """A stuck job's dumps, read: the ring, the stalled edge and who never posted."""

    world: int
    ring: list[int]
    ring_source: str
    src: int
    dst: int
    step: int
    group: str
    op: str
    sizes: list
    dtypes: list
    never_posted: list[int]
    stalled_posted: bool  # both sides posted the stalled exchange (the transfer itself hangs)
    last_ops: dict[int, str] = field(default_factory=dict)  # rank -> its last op (for the ranks that never posted)
    files: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        shape = f" {self.sizes}" if self.sizes else ""
        dtype = f" {', '.join(map(str, self.dtypes))}" if self.dtypes else ""
        where = f"stalled ring edge {self.src} -> {self.dst} at ring step {self.step} (process group {self.group}, " \
                f"{self.op}{shape}{dtype})"  # fmt: skip
        if self.stalled_posted:
            why = "both ranks posted it and it never completed: the transfer itself hangs (the link, or the library)"
        else:
            lasts = "; ".join(f"rank {r}'s last op: {self.last_ops[r]}" for r in self.never_posted if r in
                              self.last_ops)  # fmt: skip
            who = ", ".join(map(str, self.never_posted))
            why = f"rank(s) {who} never posted it, so the ring stops there ({lasts or 'no op recorded'})"
        return f"{where}: {why}; ring {'-'.join(map(str, self.ring))} ({self.ring_source})"

    def document(self) -> dict:
        return {"world": self.world, "ring": self.ring, "ring_source": self.ring_source,
                "stalled_edge": {"src": self.src, "dst": self.dst, "ring_step": self.step,
                                 "process_group": self.group, "op": self.op, "sizes": self.sizes,
                                 "dtypes": self.dtypes, "posted_by_both": self.stalled_posted},
                "never_posted": self.never_posted, "last_ops": {str(k): v for k, v in self.last_ops.items()},
                "files": self.files, "line": self.line}  # fmt: skip


def _rank_of(path: Path, seen: set[int]) -> int:
    found = RANK_IN_NAME.search(path.name)
    if not found:
        raise UsageError(f"{path}: no rank in the file name (torch names a dump <prefix><rank>, e.g. "
                         "nccl_trace_rank_3); rename it so that it ends with its rank")  # fmt: skip
    rank = int(found.group(1))
    if rank in seen:
        raise UsageError(f"rank {rank} appears in two dumps ({path} is the second); pass one dump per rank")
    return rank


def _groups(document: dict) -> dict[str, list[int]]:
    """Process group name -> its global ranks (pg_config; ranks as a list or its text)."""
    out = {}
    for key, value in (document.get("pg_config") or {}).items():
        if not isinstance(value, dict):
            continue
        ranks = value.get("ranks", [])
        if isinstance(ranks, str):
            ranks = [int(r) for r in re.findall(r"\d+", ranks)]
        name = str(value.get("name") or key)
        if ranks:
            out[name] = [int(r) for r in ranks]
    return out


def _ops(rank: int, document: dict) -> list[_Op]:
    groups = _groups(document)
    ops = []
    entries = sorted(document.get("entries") or [], key=lambda e: e.get("record_id", 0))
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or "profiling_name" not in entry:
            continue
        name = str(entry["profiling_name"])
        pg = entry.get("process_group") or ["?", ""]
        group_name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
        members = groups.get(group_name) or (next(iter(groups.values())) if len(groups) == 1 else None)
        state = str(entry.get("state", ""))
        done = state == "completed" or bool(entry.get("retired", False))
        base = dict(rank=rank, index=index, group=f"{group_name} ({desc})" if desc else group_name,
                    seq=int(entry.get("collective_seq_id") or 0), done=done,
                    sizes=list(entry.get("input_sizes") or []), dtypes=list(entry.get("input_dtypes") or []))  # fmt: skip
        p2p = P2P_NAME.match(name)
        if p2p:
            local_peer = int(p2p["b"])  # "send a->b" and "recv a<-b" (group ranks): the peer is b either way
            peer = members[local_peer] if members and local_peer < len(members) else local_peer
            ops.append(_Op(kind=p2p["op"], lib=p2p["lib"], peer=peer, **base))
            continue
        lib, _, kind = name.partition(":")
        ops.append(_Op(kind=kind.split(" ")[0] or name, lib=lib, peer=-1, **base))
    return ops


def read_hang(paths) -> Hang:
    """Read one stuck job's dumps (files or folders, one per rank) and name where its ring stopped (module doc).
    Bad input, or dumps of a job with no ring: UsageError, one line."""
    files = dump_files(paths)
    if not files:
        raise UsageError("no flight-recorder dumps found; pass the files torch wrote (TORCH_FR_DUMP_TEMP_FILE + "
                         "rank, pickled, or _dump_fr_trace_json()), one per rank")  # fmt: skip
    dumps: dict[int, list[_Op]] = {}
    for path in files:
        rank = _rank_of(path, set(dumps))
        dumps[rank] = _ops(rank, _load(path))
    world = max(dumps) + 1
    missing = sorted(set(range(world)) - set(dumps))
    if missing:
        raise UsageError(f"dumps of rank(s) {', '.join(map(str, missing))} missing; pass one dump per rank")
    found = _p2p_hang(dumps, world, files) or _rotation_hang(dumps, world, files)
    if found is None:
        kinds = Counter(f"{op.lib}:{op.kind}" for ops in dumps.values() for op in ops)
        listed = ", ".join(f"{name} x{count}" for name, count in kinds.most_common(6)) or "no entries"
        raise UsageError(
            f"no ring in these flight-recorder dumps ({world} ranks; found {listed}): no send/recv "
            "ring and no repeated all-to-all rotation; pass the dumps of a job that ran ring attention"
        )
    return found


def _describe(op: _Op | None) -> str:
    if op is None:
        return "none recorded"
    state = "completed" if op.done else "not completed"
    peer = f" {'to' if op.kind == 'send' else 'from'} {op.peer}" if op.kind in ("send", "recv") else ""
    return f"{op.lib}:{op.kind}{peer} (collective #{op.seq}, {state})"


def _step(ops: list[_Op], upto: int, same) -> int:
    """How many ops like the stalled one (``same``) the rank completed since its last other collective."""
    count = 0
    for op in reversed(ops[:upto]):
        if same(op):
            count += 1
        elif op.kind not in ("send", "recv") and op.kind not in ROTATIONS:
            break
    return count


def _p2p_hang(dumps: dict[int, list[_Op]], world: int, files) -> Hang | None:
    sends = Counter((rank, op.peer) for rank, ops in dumps.items() for op in ops if op.kind == "send")
    successor = {}
    for (rank, peer), _ in sends.most_common():
        successor.setdefault(rank, peer)
    ring = _cycle(successor, world)
    if ring is None:
        return None
    candidates = []
    for dst, ops in dumps.items():
        src = ring[(ring.index(dst) - 1) % world]
        recvs = [op for op in ops if op.kind == "recv" and op.peer == src]
        for k, op in enumerate(recvs):
            if op.done:
                continue
            sent = [s for s in dumps[src] if s.kind == "send" and s.peer == dst]
            posted = k < len(sent)
            candidates.append((posted, k, dst, src, op, sent[k] if posted else None))
            break
    if not candidates:
        return None
    # A send never posted is the root; among several, the one whose receiver's stalled receive is earliest.
    posted, k, dst, src, op, _ = sorted(candidates, key=lambda c: (c[0], c[1]))[0]
    never = sorted({c[3] for c in candidates if not c[0]})
    step = _step(dumps[dst], op.index, lambda o: o.kind == "recv" and o.peer == src)
    lasts = {r: _describe(next((o for o in reversed(dumps[r]) if o.done), None)) for r in never}
    return Hang(world=world, ring=ring, ring_source="each rank's sends go to its successor", src=src, dst=dst,
                step=step, group=op.group, op=f"{op.lib}:send {src}->{dst} / recv {dst}<-{src}", sizes=op.sizes,
                dtypes=op.dtypes, never_posted=never, stalled_posted=posted, last_ops=lasts,
                files=[str(f) for f in files])  # fmt: skip


def _cycle(successor: dict[int, int], world: int) -> list[int] | None:
    if len(successor) != world:
        return None
    ring, rank = [0], successor.get(0)
    while rank is not None and rank != 0 and rank not in ring:
        ring.append(rank)
        rank = successor.get(rank)
    return ring if len(ring) == world and rank == 0 else None


def _rotation_hang(dumps: dict[int, list[_Op]], world: int, files) -> Hang | None:
    rotating = [op for ops in dumps.values() for op in ops if op.kind in ROTATIONS]
    if not rotating or max(Counter((op.rank, op.group) for op in rotating).values()) < 2:
        return None
    pending = [op for op in rotating if not op.done]
    if not pending:
        return None
    stalled = min(pending, key=lambda op: op.seq)
    posted = {rank for rank, ops in dumps.items() if any(o.kind in ROTATIONS and o.seq == stalled.seq
                                                           and o.group == stalled.group for o in ops)}  # fmt: skip
    never = sorted(set(range(world)) - posted)
    if not never:  # everyone posted it and it never completed: the collective itself hangs
        src = stalled.rank
        both = True
    else:
        src, both = never[0], False
    dst = (src + 1) % world
    waiter = dumps[dst] if dst in posted else dumps[stalled.rank]
    mine = next((o for o in waiter if o.kind in ROTATIONS and o.seq == stalled.seq), stalled)
    step = _step(waiter, mine.index, lambda o: o.kind in ROTATIONS)
    lasts = {r: _describe(next((o for o in reversed(dumps[r]) if o.done), None)) for r in never}
    return Hang(world=world, ring=list(range(world)), ring_source="rotations by all-to-all; the dump keeps no split "
                "sizes, so the ring is taken in rank order", src=src, dst=dst, step=step, group=stalled.group,
                op=f"{stalled.lib}:{stalled.kind} #{stalled.seq}", sizes=stalled.sizes, dtypes=stalled.dtypes,
                never_posted=never, stalled_posted=both, last_ops=lasts, files=[str(f) for f in files])  # fmt: skip


__all__ = ["Hang", "dump_files", "is_dump", "read_hang"]
