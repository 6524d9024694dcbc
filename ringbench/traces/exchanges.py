"""One rank's exchanges: the ring's communication found in a profiler trace, one row per exchange.

An *exchange* is what a ring step moves: a send to the successor and a receive from the predecessor, posted
together, or a rotation run as a collective. Found from

* P2P ops: ``c10d::send`` / ``c10d::recv_`` (peer and tag in their concrete inputs when shapes are recorded), or
  ``record_param_comms`` of a send / recv (its "Dst Rank" / "Src Rank"); bytes from the recorded shapes and dtypes.
  The i-th send and the i-th receive of a rank, in posting order, are one exchange (a batched P2P group posts
  both at once). Completion: on CPU the ``gloo:send`` / ``gloo:recv`` spans (gloo ends them when the wait
  returns); on a GPU the ``nccl(Dev)Kernel_SendRecv`` kernel launched (same correlation id) by the ops of the
  batch, which carries both directions, so both share its [start, end] on the device.
* Collectives: an all-to-all whose split sizes send everything to one rank and receive everything from one rank
  is a rotation (torch's ring, ``_RotateMethod.ALL_TO_ALL``): a P2P exchange with those peers. An all-gather (or
  an all-to-all without split sizes) of the attention's K/V (its input holds numel(K) or 2 x numel(K) elements)
  is a ``collective`` exchange (``_RotateMethod.ALL_GATHER``): it has no hop. Completion: ``gloo:all_to_all`` /
  ``gloo:all_gather`` (on gloo's threads, the i-th with the i-th call) or the kernels the call launched.
* Waits: ``_c10d_functional::wait_tensor`` when the program waits through one (functional collectives); else
  derived: the rank was blocked from the end of its last host op (the post, or its last compute) until the
  exchange completed; when an op begun after the post was still running at completion, the wait is zero-length
  at that op's end (where the rank came to the wait). On a GPU: the compute stream idle from its last attention
  kernel until the SendRecv kernel ended.

Every other collective (all-reduce, barriers, gradient all-gathers) is counted, not imported (``found``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import numpy as np
import pandas as pd

EXCHANGE_COLUMNS = ["kind", "post_ns", "start_ns", "send_end_ns", "recv_end_ns", "dst", "src", "send_bytes",
                    "recv_bytes", "wait_start_ns", "wait_end_ns", "tid", "via"]  # fmt: skip
SEND_OPS = ("c10d::send",)
RECV_OPS = ("c10d::recv_", "c10d::recv_any_source_")
WAIT_OPS = ("_c10d_functional::wait_tensor",)
COLLECTIVE_OPS = re.compile(
    r"^(?:_c10d_functional::(?:all_to_all_single|all_gather_into_tensor\w*)|c10d::(?:alltoall\w*|_allgather_base_|"
    r"allgather\w*|all_gather\w*)|record_param_comms)$"
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


def _kernels_by_launch(kernels: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """NCCL kernels with their launch's host thread and time (launch_tid, launch_ns)."""
    nccl = kernels[kernels["name"].str.contains(NCCL_KERNEL)]
    if nccl.empty or launches.empty:
        return nccl.assign(launch_tid=pd.Series(dtype="int64"), launch_ns=pd.Series(dtype="int64"))
    launch = launches.drop_duplicates("correlation").set_index("correlation")
    return nccl.assign(
        launch_tid=launch["tid"].reindex(nccl["correlation"]).to_numpy(),
        launch_ns=launch["start_ns"].reindex(nccl["correlation"]).to_numpy(),
    ).dropna(subset=["launch_ns"])


def _collectives(host: pd.DataFrame, kernels: pd.DataFrame, kv_numels: set[int], rank: int, found: Counter):
    """Rotations run as collectives: P2P-like rows (all-to-all permutations) and collective rows."""
    from ringbench.traces.rank_view import outermost

    calls = outermost(host[host["name"].str.match(COLLECTIVE_OPS.pattern)])
    comm_ops = host[host["comm_args"] != ""]
    rows, claimed = [], set()
    spans = {
        kind: host[host["name"] == f"gloo:{kind}"].sort_values("start_ns") for kind in ("all_to_all", "all_gather")
    }
    used = Counter()
    for call in calls.sort_values("start_ns").itertuples(index=False):
        args = _args(call.comm_args)
        kind = _collective_kind(call.name, args)
        if kind not in ("all_to_all", "all_gather"):
            found["other collectives" if kind == "record_param_comms" else kind] += 1
            continue
        sends, receives = _splits(call.name, args)
        if sends is None and kind == "all_to_all":  # the split sizes may sit on a nested op of the call
            inner = comm_ops[(comm_ops["tid"] == call.tid) & comm_ops["start_ns"].between(call.start_ns, call.end_ns)]
            for nested in inner.itertuples(index=False):
                sends, receives = _splits(nested.name, _args(nested.comm_args))
                if sends is not None:
                    break
        # The transfer: gloo's span of the same kind (in call order), or the NCCL kernels the call launched.
        mine = kernels[(kernels["launch_tid"] == call.tid) & kernels["launch_ns"].between(call.start_ns, call.end_ns)]
        if len(mine):
            start, end = int(mine["start_ns"].min()), int(mine["end_ns"].max())
            claimed.update(mine.index)
        elif used[kind] < len(spans[kind]):
            span = spans[kind].iloc[used[kind]]
            start, end = int(min(span["start_ns"], call.start_ns)), int(span["end_ns"])
        else:
            start, end = int(call.start_ns), int(call.end_ns)
        used[kind] += 1
        numel = _numel(call.input_dims)
        permutation = (
            kind == "all_to_all"
            and sends is not None
            and receives is not None
            and sum(1 for s in sends if s) == 1
            and sum(1 for s in receives if s) == 1
        )
        if permutation:
            dst = next(i for i, s in enumerate(sends) if s)
            src = next(i for i, s in enumerate(receives) if s)
            if dst == rank and src == rank:
                found[f"{kind} (to itself)"] += 1
                continue
            rows.append(dict(kind="p2p", post_ns=int(call.start_ns), start_ns=int(call.start_ns), send_end_ns=end,
                             recv_end_ns=end, dst=dst, src=src, send_bytes=int(call.bytes), recv_bytes=int(call.bytes),
                             tid=int(call.tid), via=f"{call.name} (rotation)"))  # fmt: skip
        elif numel > 0 and numel in kv_numels:
            rows.append(dict(kind="collective", post_ns=int(call.start_ns), start_ns=start, send_end_ns=end,
                             recv_end_ns=end, dst=-1, src=-1, send_bytes=int(call.bytes), recv_bytes=int(call.bytes),
                             tid=int(call.tid), via=f"{call.name} (rotation)"))  # fmt: skip
        else:
            found[f"{kind} (not a rotation of attention K/V)"] += 1
    return rows, claimed


def _nested_bytes(comm_ops: pd.DataFrame, op) -> int:
    """Bytes of an op from the record_param_comms it holds (its message size and dtype); 0 when none says."""
    inner = comm_ops[(comm_ops["tid"] == op["tid"]) & comm_ops["start_ns"].between(op["start_ns"], op["end_ns"])]
    sizes = inner.loc[inner["bytes"] >= 0, "bytes"]
    return int(sizes.iloc[0]) if len(sizes) else 0


def _p2p(host: pd.DataFrame, kernels: pd.DataFrame, claimed: set, found: Counter) -> list[dict]:
    """Sends and receives paired into exchanges (i-th with i-th), with their completion."""
    comm_ops = host[host["name"] == "record_param_comms"]
    sends = host[host["name"].isin(SEND_OPS)].sort_values("start_ns")
    recvs = host[host["name"].isin(RECV_OPS)].sort_values("start_ns")
    via = "c10d::send/recv_"
    if sends.empty and recvs.empty:  # NCCL without shapes: the ops' record_param_comms carry the peer
        params = host[(host["name"] == "record_param_comms") & (host["peer"] >= 0)]
        kinds = params["comm_args"].map(lambda text: str(_args(text).get("Collective name", "")))
        sends, recvs = params[kinds.str.startswith("send")], params[kinds.str.startswith("recv")]
        via = "record_param_comms send/recv"
    if sends.empty and recvs.empty:
        return []
    ends, sizes = {}, {}
    for kind, ops in (("send", sends), ("recv", recvs)):
        spans = host[host["name"] == f"gloo:{kind}"].sort_values("start_ns")
        if len(spans) == len(ops) and len(ops):
            ends[kind] = spans["end_ns"].to_numpy(np.int64)
            sizes[kind] = spans["bytes"].to_numpy(np.int64)
    sendrecv = kernels[kernels["name"].str.contains(SENDRECV_KERNEL) & ~kernels.index.isin(claimed)]
    posts = pd.concat([sends.assign(direction="send"), recvs.assign(direction="recv")]).sort_values("start_ns")
    kernel_of = {}
    if len(sendrecv) and len(ends) < 2:
        # A batch of P2P ops launches one SendRecv kernel: every op posted on that thread before the launch (and
        # not yet linked) belongs to it.
        for kernel in sendrecv.sort_values("launch_ns").itertuples():
            waiting = posts[(posts["tid"] == kernel.launch_tid) & (posts["start_ns"] <= kernel.launch_ns)]
            for index in waiting.index.difference(list(kernel_of)):
                kernel_of[index] = (int(kernel.start_ns), int(kernel.end_ns))
    rows = []
    count = max(len(sends), len(recvs))
    for i in range(count):
        send = sends.iloc[i] if i < len(sends) else None
        recv = recvs.iloc[i] if i < len(recvs) else None
        post = min(int(op["start_ns"]) for op in (send, recv) if op is not None)
        row = dict(kind="p2p", post_ns=post, start_ns=post, send_end_ns=np.nan, recv_end_ns=np.nan, dst=-1, src=-1,
                   send_bytes=0, recv_bytes=0, tid=int((send if send is not None else recv)["tid"]), via=via)  # fmt: skip
        for direction, op in (("send", send), ("recv", recv)):
            if op is None:
                continue
            if direction in ends:
                end = int(ends[direction][i])
            elif op.name in kernel_of:  # op.name: the op's row label in ``posts``
                row["start_ns"], end = kernel_of[op.name]
            else:
                end = int(op["end_ns"])  # blocking op without a transfer span: the op itself
            row[f"{direction}_end_ns"] = end
            row["dst" if direction == "send" else "src"] = int(op["peer"])
            nbytes = int(sizes[direction][i]) if direction in sizes else int(op["bytes"])
            row[f"{direction}_bytes"] = nbytes if nbytes >= 0 else _nested_bytes(comm_ops, op)
        rows.append(row)
    return rows


def rank_exchanges(host, kernels, launches, kv_numels: set[int], rank: int) -> tuple[pd.DataFrame, Counter]:
    """The exchanges of one rank (EXCHANGE_COLUMNS, by post time) and a count of the communication not imported.

    ``host``: the rank's cpu_op and user_annotation events; ``kernels`` / ``launches``: its GPU kernels and their
    cuda_runtime / cuda_driver launches (empty on CPU); ``kv_numels``: element counts that identify an attention
    K/V buffer (numel(K) and 2 x numel(K) of its attention ops).
    """
    found: Counter = Counter()
    nccl = _kernels_by_launch(kernels, launches)
    collective_rows, claimed = _collectives(host, nccl, kv_numels, rank, found)
    sendrecv = int(nccl["name"].str.contains(SENDRECV_KERNEL).sum()) if len(nccl) else 0
    if sendrecv:
        found["NCCL SendRecv kernels"] += sendrecv
    rows = _p2p(host, nccl, claimed, found) + collective_rows
    frame = pd.DataFrame(rows, columns=[c for c in EXCHANGE_COLUMNS if c not in ("wait_start_ns", "wait_end_ns")])
    frame = frame.assign(wait_start_ns=np.nan, wait_end_ns=np.nan).sort_values("post_ns", kind="stable")
    return frame.reset_index(drop=True)[EXCHANGE_COLUMNS], found


def attach_waits(exchanges: pd.DataFrame, host: pd.DataFrame, compute: pd.DataFrame, on_gpu: bool) -> pd.DataFrame:
    """Fill wait_start_ns / wait_end_ns: from wait_tensor ops (FIFO over the functional collectives), else
    derived (see the module doc). A wait that did not block is zero-length at the exchange's completion."""
    if exchanges.empty:
        return exchanges
    out = exchanges.copy()
    done = out[["send_end_ns", "recv_end_ns"]].max(axis=1).to_numpy(float)
    waited = np.zeros(len(out), dtype=bool)
    functional = out["via"].str.startswith("_c10d_functional::").to_numpy()
    waits = host[host["name"].isin(WAIT_OPS)].sort_values("start_ns")
    pending = list(np.nonzero(functional)[0])
    for wait in waits.itertuples(index=False):
        posted = [i for i in pending if out.at[i, "post_ns"] <= wait.start_ns]
        if not posted:
            continue
        i = posted[0]
        pending.remove(i)
        out.at[i, "wait_start_ns"], out.at[i, "wait_end_ns"] = wait.start_ns, wait.end_ns
        waited[i] = True
    if on_gpu:
        ends = np.sort(compute["end_ns"].to_numpy(np.int64)) if len(compute) else np.empty(0, np.int64)
        starts = np.sort(compute["start_ns"].to_numpy(np.int64)) if len(compute) else np.empty(0, np.int64)
        for i in np.nonzero(~waited)[0]:
            end = int(done[i])
            last = ends[np.searchsorted(ends, end, side="right") - 1] if np.any(ends <= end) else out.at[i, "start_ns"]
            later = np.searchsorted(starts, end, side="left") < len(starts)  # the compute stream resumed after
            start = max(int(last), int(out.at[i, "start_ns"])) if later else end
            out.at[i, "wait_start_ns"], out.at[i, "wait_end_ns"] = min(start, end), end
        return out
    busy = host[(host["cat"] == "cpu_op") & ~host["name"].str.startswith(COMM_PREFIXES)]
    busy = pd.concat([busy[["tid", "start_ns", "end_ns"]], compute[["tid", "start_ns", "end_ns"]]])
    by_tid = {}
    for tid, group in busy.groupby("tid", sort=False):
        group = group.sort_values("start_ns")
        by_start = group["start_ns"].to_numpy(np.int64)
        reach = group["end_ns"].to_numpy(np.int64)
        by_tid[tid] = (by_start, reach, np.sort(reach))
    empty = np.empty(0, np.int64)
    for i in np.nonzero(~waited)[0]:
        end, post = int(done[i]), int(out.at[i, "post_ns"])
        starts, reach, sorted_ends = by_tid.get(int(out.at[i, "tid"]), (empty, empty, empty))
        lo, hi = np.searchsorted(starts, post, side="right"), np.searchsorted(starts, end, side="left")
        busy_until = int(reach[lo:hi].max()) if hi > lo else end
        if busy_until > end:  # an op begun after the post was running at completion: no wait, when it ended
            out.at[i, "wait_start_ns"] = out.at[i, "wait_end_ns"] = busy_until
            continue
        last = np.searchsorted(sorted_ends, end, side="right") - 1
        start = max(post, int(sorted_ends[last]) if last >= 0 else post)
        out.at[i, "wait_start_ns"], out.at[i, "wait_end_ns"] = min(start, end), end
    return out


__all__ = ["EXCHANGE_COLUMNS", "attach_waits", "rank_exchanges"]
