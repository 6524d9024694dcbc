"""One rank's communication found in a profiler trace: its P2P messages grouped into exchanges, the rotations run as
collectives, and the other collectives (barriers, all-reduces) as sync points.

* Messages, one row per P2P op (MESSAGE_COLUMNS): ``c10d::send`` / ``c10d::recv_`` (peer and tag in their concrete
  inputs when shapes are recorded), or ``record_param_comms`` of a send / recv (its "Dst Rank" / "Src Rank"); bytes
  from the recorded shapes and dtypes. ``obs_ns`` is when *this rank* saw it complete: on CPU the end of the
  ``gloo:send`` / ``gloo:recv`` span of the op (gloo ends it when the op's ``wait()`` returns, so it is the later
  of the true completion and the moment the rank came to take it); on a GPU the end of the
  ``nccl(Dev)Kernel_SendRecv`` kernel launched by the batch (same correlation id), which carries both directions.
* Exchanges: what one ring step moves, all the P2P ops posted together (K and V as several messages, a tensor list,
  a batch). Posts are cut into runs wherever a compute op, a completion the rank observed, a wait op or a sync
  point lies between two of them; a run's count of sends and of receives (the most common one) is the exchange's
  size, and the i-th exchange of an (iteration, phase) holds the i-th size-many sends and receives in posting
  order, so sends posted apart from their receives (by a helper thread, or a moment later on one hop) still join
  their exchange. An exchange's post is its first op's start: the rank was ready then.
* Rotations as collectives: an all-to-all whose split sizes send everything to one rank and receive everything
  from one rank is a rotation (torch's ring, ``_RotateMethod.ALL_TO_ALL``): an exchange of one send and one receive
  with those peers. An all-gather (or an all-to-all without split sizes) of the attention's K/V (its input holds
  numel(K) or 2 x numel(K) elements) is a ``collective`` exchange (``_RotateMethod.ALL_GATHER``): it has no hop.
  Completion: ``gloo:all_to_all`` / ``gloo:all_gather`` (run by gloo's threads, the i-th with the i-th call; they
  end when the collective does) or the kernels the call launched.
* Sync points (SYNC_COLUMNS): every other collective (barriers, all-reduces, broadcasts, gradient all-gathers):
  joined at the op's start, released when gloo's span of it ends (else the op's end). They end when the last rank
  joins, so the time the others wait there is that rank's.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter

import numpy as np
import pandas as pd

MESSAGE_COLUMNS = ["direction", "peer", "post_ns", "obs_ns", "obs_tid", "bytes", "tid", "via"]
# Typed even when empty: an empty table of object columns would turn every table concatenated with it into objects
# (and pandas then aggregates them in Python, group by group).
MESSAGE_DTYPES = {"direction": str, "peer": "int64", "post_ns": "int64", "obs_ns": "float64", "obs_tid": "int64",
                  "bytes": "int64", "tid": "int64", "via": str}  # fmt: skip
EXCHANGE_COLUMNS = ["kind", "post_ns", "done_ns", "tid", "bytes", "via"]
SYNC_COLUMNS = ["name", "join_ns", "done_ns", "tid"]
SEND_OPS = ("c10d::send",)
RECV_OPS = ("c10d::recv_", "c10d::recv_any_source_")
WAIT_OPS = ("_c10d_functional::wait_tensor",)
COLLECTIVE_OPS = re.compile(
    r"^(?:_c10d_functional::(?:all_to_all_single|all_gather_into_tensor\w*)|c10d::(?:alltoall\w*|_allgather_base_|"
    r"allgather\w*|all_gather\w*)|record_param_comms)$"
)
# Collectives that are sync points (not rotations): c10d ops and functional collectives.
SYNC_OPS = re.compile(
    r"^(?:c10d::(?:barrier|allreduce\w*|broadcast\w*|reduce_scatter\w*|_reduce_scatter_base\w*|reduce_|gather_|"
    r"scatter_|monitored_barrier\w*)|_c10d_functional::(?:all_reduce\w*|broadcast\w*|reduce_scatter\w*))$"
)
COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "_c10d_functional::", "record_param_comms", "ProfilerStep#")
SENDRECV_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_SendRecv")
NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_")


def _args(text: str) -> dict:
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _int_list(value) -> list[int] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def _splits(name: str, args: dict) -> tuple[list[int] | None, list[int] | None]:
    """(input split sizes, output split sizes) of an all-to-all call, when the trace has them."""
    concrete = args.get("concrete") or []
    if name == "_c10d_functional::all_to_all_single" and len(concrete) >= 3:
        return _int_list(concrete[2]), _int_list(concrete[1])
    if name.startswith("c10d::alltoall") and len(concrete) >= 5:
        return _int_list(concrete[4]), _int_list(concrete[3])
    return _int_list(args.get("In split size")), _int_list(args.get("Out split size"))


@functools.lru_cache(maxsize=1024)  # a ring's calls repeat a few shapes
def _numel(dims_text: str) -> int:
    try:
        dims = json.loads(dims_text) if dims_text else []
    except ValueError:
        return -1
    first = dims[0] if dims else None
    while isinstance(first, list) and first and isinstance(first[0], list):  # a TensorList: its first tensor
        first = first[0]
    if isinstance(first, list) and all(isinstance(n, int) for n in first):
        return math.prod(first)
    return -1


def _collective_kind(name: str, args: dict) -> str:
    label = str(args.get("Collective name", name)).lower()
    if "all_to_all" in label or "alltoall" in label:
        return "all_to_all"
    if "gather" in label:
        return "all_gather"
    return label


def kernels_by_launch(kernels: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """NCCL kernels with their launch's host thread and time (launch_tid, launch_ns)."""
    nccl = kernels[kernels["name"].str.contains(NCCL_KERNEL)]
    if nccl.empty or launches.empty:
        return nccl.assign(launch_tid=pd.Series(dtype="int64"), launch_ns=pd.Series(dtype="int64"))
    launch = launches.drop_duplicates("correlation").set_index("correlation")
    return nccl.assign(
        launch_tid=launch["tid"].reindex(nccl["correlation"]).to_numpy(),
        launch_ns=launch["start_ns"].reindex(nccl["correlation"]).to_numpy(),
    ).dropna(subset=["launch_ns"])


def _message(direction, peer, post, obs, obs_tid, nbytes, tid, via) -> dict:
    return dict(direction=direction, peer=int(peer), post_ns=int(post), obs_ns=obs, obs_tid=int(obs_tid),
                bytes=int(nbytes), tid=int(tid), via=via)  # fmt: skip


def rotations(host: pd.DataFrame, kernels: pd.DataFrame, kv_numels: set[int], rank: int, found: Counter):
    """Rotations run as collectives: (messages of all-to-all permutations, one exchange each; ``collective``
    exchanges (all-gathers of K/V); the kernel rows they claimed)."""
    from ringbench.traces.rank_view import outermost

    calls = outermost(host[host["name"].str.match(COLLECTIVE_OPS.pattern)])
    messages, collectives, claimed = [], [], set()
    if calls.empty:
        return messages, collectives, claimed
    comm_ops = host[host["comm_args"] != ""]
    comm_tid = comm_ops["tid"].to_numpy()
    comm_start = comm_ops["start_ns"].to_numpy(np.int64)
    spans = {}
    for kind in ("all_to_all", "all_gather"):
        found_spans = host[host["name"] == f"gloo:{kind}"].sort_values("start_ns", kind="stable")
        spans[kind] = (found_spans["end_ns"].to_numpy(np.int64), found_spans["tid"].to_numpy(np.int64))
    has_kernels = len(kernels) > 0
    parsed: dict[tuple[str, str], tuple] = {}  # a ring's calls repeat a few argument texts: parse each once
    used = Counter()
    for call in calls.sort_values("start_ns").itertuples(index=False):
        key = (call.name, call.comm_args)
        if key not in parsed:
            args = _args(call.comm_args)
            parsed[key] = (_collective_kind(call.name, args), *_splits(call.name, args))
        kind, sends, receives = parsed[key]
        if kind not in ("all_to_all", "all_gather"):
            found["other collectives" if kind == "record_param_comms" else kind] += 1
            continue
        if sends is None and kind == "all_to_all":  # the split sizes may sit on a nested op of the call
            inside = np.nonzero((comm_tid == call.tid) & (comm_start >= call.start_ns) & (comm_start <= call.end_ns))[0]
            for nested in comm_ops.iloc[inside].itertuples(index=False):
                sends, receives = _splits(nested.name, _args(nested.comm_args))
                if sends is not None:
                    break
        # The transfer: gloo's span of the same kind (in call order), or the NCCL kernels the call launched.
        obs_tid = int(call.tid)
        mine = (
            kernels[(kernels["launch_tid"] == call.tid) & kernels["launch_ns"].between(call.start_ns, call.end_ns)]
            if has_kernels
            else kernels
        )
        ends, tids = spans[kind]
        if len(mine):
            end = int(mine["end_ns"].max())
            claimed.update(mine.index)
        elif used[kind] < len(ends):
            end, obs_tid = int(ends[used[kind]]), int(tids[used[kind]])
        else:
            end = int(call.end_ns)
        used[kind] += 1
        numel = _numel(call.input_dims)
        permutation = (
            kind == "all_to_all"
            and sends is not None
            and receives is not None
            and sum(1 for s in sends if s) == 1
            and sum(1 for s in receives if s) == 1
        )
        via = f"{call.name} (rotation)"
        if permutation:
            dst = next(i for i, s in enumerate(sends) if s)
            src = next(i for i, s in enumerate(receives) if s)
            if dst == rank and src == rank:
                found[f"{kind} (to itself)"] += 1
                continue
            group = len(messages) // 2
            for direction, peer in (("send", dst), ("recv", src)):
                row = _message(direction, peer, call.start_ns, end, obs_tid, call.bytes, call.tid, via)
                messages.append(row | {"rotation": group})
        elif numel > 0 and numel in kv_numels:
            collectives.append(dict(kind="collective", post_ns=int(call.start_ns), done_ns=end, tid=int(call.tid),
                                    bytes=int(call.bytes), via=via))  # fmt: skip
        else:
            found[f"{kind} (not a rotation of attention K/V)"] += 1
    return messages, collectives, claimed


def _nested_bytes(comm_ops: pd.DataFrame, op) -> int:
    """Bytes of an op from the record_param_comms it holds (its message size and dtype); 0 when none says."""
    inner = comm_ops[(comm_ops["tid"] == op["tid"]) & comm_ops["start_ns"].between(op["start_ns"], op["end_ns"])]
    sizes = inner.loc[inner["bytes"] >= 0, "bytes"]
    return int(sizes.iloc[0]) if len(sizes) else 0


def p2p_messages(host: pd.DataFrame, kernels: pd.DataFrame, claimed: set) -> list[dict]:
    """Every send and receive op with its peer, post, bytes and this rank's completion observation."""
    comm_ops = host[host["name"] == "record_param_comms"]
    sends = host[host["name"].isin(SEND_OPS)].sort_values("start_ns", kind="stable")
    recvs = host[host["name"].isin(RECV_OPS)].sort_values("start_ns", kind="stable")
    via = "c10d::send/recv_"
    if sends.empty and recvs.empty:  # NCCL without shapes: the ops' record_param_comms carry the peer
        params = host[(host["name"] == "record_param_comms") & (host["peer"] >= 0)]
        kinds = params["comm_args"].map(lambda text: str(_args(text).get("Collective name", "")))
        sends, recvs = params[kinds.str.startswith("send")], params[kinds.str.startswith("recv")]
        via = "record_param_comms send/recv"
    if sends.empty and recvs.empty:
        return []
    spans = {}
    for kind, ops in (("send", sends), ("recv", recvs)):
        found = host[host["name"] == f"gloo:{kind}"].sort_values("start_ns", kind="stable")
        if len(found) == len(ops) and len(ops):
            spans[kind] = found
    sendrecv = kernels[kernels["name"].str.contains(SENDRECV_KERNEL) & ~kernels.index.isin(claimed)]
    kernel_of = {}
    if len(sendrecv) and len(spans) < 2:
        # A batch of P2P ops launches one SendRecv kernel: every op posted on that thread before the launch (and
        # not yet linked) belongs to it.
        posts = pd.concat([sends, recvs]).sort_values("start_ns", kind="stable")
        for kernel in sendrecv.sort_values("launch_ns").itertuples():
            waiting = posts[(posts["tid"] == kernel.launch_tid) & (posts["start_ns"] <= kernel.launch_ns)]
            for index in waiting.index.difference(list(kernel_of)):
                kernel_of[index] = int(kernel.end_ns)
    rows = []
    for direction, ops in (("send", sends), ("recv", recvs)):
        span = spans.get(direction)
        for i, (index, op) in enumerate(ops.iterrows()):
            obs, obs_tid, nbytes = math.nan, int(op["tid"]), int(op["bytes"])
            if span is not None:
                obs, obs_tid = float(span["end_ns"].iloc[i]), int(span["tid"].iloc[i])
                nbytes = int(span["bytes"].iloc[i])
            elif index in kernel_of:
                obs = float(kernel_of[index])
            else:
                obs = float(op["end_ns"])  # a blocking op without a transfer span: the op itself
            if nbytes < 0:
                nbytes = _nested_bytes(comm_ops, op)
            rows.append(_message(direction, op["peer"], op["start_ns"], obs, obs_tid, nbytes, op["tid"], via))
    return rows


def sync_points(host: pd.DataFrame, kernels: pd.DataFrame, found: Counter) -> pd.DataFrame:
    """Barriers and the other collectives that are no rotation: join (the op's start) and release (gloo's span
    of it, the i-th with the i-th op of that name, else the NCCL kernels it launched, else the op's end)."""
    from ringbench.traces.rank_view import outermost

    ops = outermost(host[host["name"].str.match(SYNC_OPS.pattern)]).sort_values("start_ns", kind="stable")
    rows = []
    used = Counter()
    gloo_spans = host[host["name"].str.startswith("gloo:")].sort_values("start_ns", kind="stable")
    ends_of = {name: group["end_ns"].to_numpy(np.int64) for name, group in gloo_spans.groupby("name", sort=False)}
    for op in ops.itertuples(index=False):
        short = op.name.split("::", 1)[-1].rstrip("_")
        gloo = _GLOO_SPAN.get(short.split("_into")[0], f"gloo:{short}")
        ends = ends_of.get(gloo, np.empty(0, np.int64))
        done = int(op.end_ns)
        launched = (
            kernels[(kernels["launch_tid"] == op.tid) & kernels["launch_ns"].between(op.start_ns, op.end_ns)]
            if len(kernels)
            else kernels
        )
        if len(launched):
            done = max(done, int(launched["end_ns"].max()))
        elif used[gloo] < len(ends):
            done = max(done, int(ends[used[gloo]]))
        used[gloo] += 1
        rows.append(dict(name=short, join_ns=int(op.start_ns), done_ns=done, tid=int(op.tid)))
    return pd.DataFrame(rows, columns=SYNC_COLUMNS)


# c10d op name (without "c10d::" and the trailing "_") -> gloo's span of it
_GLOO_SPAN = {"allreduce": "gloo:all_reduce", "broadcast": "gloo:broadcast", "barrier": "gloo:barrier",
              "reduce_scatter": "gloo:reduce_scatter", "_reduce_scatter_base": "gloo:reduce_scatter",
              "all_reduce": "gloo:all_reduce", "allgather": "gloo:all_gather", "reduce": "gloo:reduce"}  # fmt: skip


def exchange_groups(messages: pd.DataFrame, breaks: np.ndarray) -> np.ndarray:
    """Exchange index of each message (rows in posting order, with ``iteration`` and ``phase``): see the module
    doc. ``breaks``: times that end a run of posts (compute starts, observations, wait ops, sync joins)."""
    if messages.empty:
        return np.empty(0, np.int64)
    posts = messages["post_ns"].to_numpy(np.int64)
    key = messages["iteration"].astype(str).to_numpy() + messages["phase"].astype(str).to_numpy()
    breaks = np.sort(np.asarray(breaks, np.int64))
    slot = np.searchsorted(breaks, posts, side="left")  # a break at or before a post ends the run before it
    new_run = np.r_[True, (slot[1:] != slot[:-1]) | (key[1:] != key[:-1])]
    run = np.cumsum(new_run) - 1
    direction = messages["direction"].to_numpy()
    size = {}
    for kind in ("send", "recv"):
        counts = Counter(int(n) for n in pd.Series(run[direction == kind]).value_counts())
        size[kind] = counts.most_common(1)[0][0] if counts else 1
    out = np.zeros(len(messages), np.int64)
    base = 0
    for _, rows in pd.Series(range(len(messages))).groupby(key, sort=False):
        index = rows.to_numpy()
        groups = 0
        for kind in ("send", "recv"):
            mine = index[direction[index] == kind]
            out[mine] = base + np.arange(len(mine)) // size[kind]
            groups = max(groups, -(-len(mine) // size[kind]))
        base += groups
    return out


def message_frame(rows: list[dict], extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """Message rows (MESSAGE_COLUMNS, then ``extra`` int64 columns) as a typed table."""
    columns = [*MESSAGE_COLUMNS, *extra]
    return pd.DataFrame(rows, columns=columns).astype(MESSAGE_DTYPES | dict.fromkeys(extra, "int64"))


__all__ = [
    "COMM_PREFIXES",
    "EXCHANGE_COLUMNS",
    "MESSAGE_COLUMNS",
    "MESSAGE_DTYPES",
    "SYNC_COLUMNS",
    "WAIT_OPS",
    "exchange_groups",
    "kernels_by_launch",
    "message_frame",
    "p2p_messages",
    "rotations",
    "sync_points",
]
