"""What a host-side trace proves about its ranks' time: when each message really completed, and whether a rank
in no op was waiting or busy with its own work.

A CPU trace stamps a P2P completion when a rank *observed* it: gloo ends its ``gloo:send`` / ``gloo:recv`` span when
the op's ``wait()`` returns, the later of the true completion and the moment the rank came to take it (plus a
wake-up). Each message has two such observations, the sender's and the receiver's, so

  completion (earliest evidence)  E = min(sender's observation, receiver's observation)      (on one clock)

bounds the true completion from above. A rank whose own observation came well after E took the block late: it
called ``wait()`` only then, since a rank waiting for a block wakes when it completes. A rank that is in no op (a
gap on its ring thread: the thread of its compute) is either waiting or doing work the profiler did not record (a
sleep, Python, an unprofiled library), and the trace tells them apart by that evidence only. Walking a gap forward
through the completions the rank observed in it: up to an observation within ``late_ns`` of E (the rank's own
stamp is the earliest evidence, or agrees with it) the rank was *waiting* for that message; up to an observation
well after E it was busy with its *own* work (the block had arrived); after the last observation, up to its next
op, it was busy with its own work too (nothing it waited for was pending). ``late_ns`` allows a wake-up and the
clock's residual, and a quarter of the transfer itself (a buffered send completes a little before its receive).
A sync point (a barrier) is neither: the rank is held there until the last rank joins.

A message is *measured* when a rank was waiting for it (a wait of at least WAIT_TOL_NS that ended at its
completion) or when it was observed on another thread than the ring's (a helper thread that waits for it, or
gloo's own); otherwise both ranks came to it late and E is only an upper bound: the transfer is *censored*. Link
figures use measured transfers only.

Pure functions of arrays (interval lists sorted by start, disjoint), so the importer stays a composition.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

WAIT_TOL_NS = 20_000  # a wait shorter than this at a completion is a wake-up, not a measurement of it
LATE_NS = 500_000  # an observation this much after the earliest evidence was a late take (not a wake-up)
LATE_SHARE = 0.25  # ... or this share of the transfer's own time, when more (a buffered send ends first)


def union(starts, ends) -> np.ndarray:
    """Sorted disjoint (n, 2) int64 intervals covering the given ones."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    if not len(starts):
        return np.empty((0, 2), np.int64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    new = np.r_[True, starts[1:] > reach[:-1]]
    group = np.cumsum(new) - 1
    out = np.empty((group[-1] + 1, 2), np.int64)
    out[:, 0] = starts[new]
    out[:, 1] = np.maximum.reduceat(ends, np.nonzero(new)[0])
    return out


def subtract(base: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """``base`` minus ``cut`` (both sorted by start; ``cut`` disjoint), as sorted intervals of positive length.

    Walking an interval [s, e) through the cuts that start before e, a piece (cursor, cut start) is left wherever a
    cut starts after the cursor, and the cursor moves to the furthest cut end so far; the rest (cursor, e) closes
    it. So a zero-length cut inside an interval splits it in two. Vectorised over intervals and cuts: the cursor
    before cut k is max(s, the largest end among cuts 0..k-1)."""
    if not len(base) or not len(cut):
        return base[base[:, 1] > base[:, 0]] if len(base) else base
    base, cut = np.asarray(base, np.int64), np.asarray(cut, np.int64)
    starts, reach = cut[:, 0], np.maximum.accumulate(cut[:, 1])
    first = np.searchsorted(reach, base[:, 0], side="right")  # cuts before it end at or before s: no effect
    last = np.searchsorted(starts, base[:, 1], side="left")  # cuts from here on start at or after e
    counts = np.clip(last - first, 0, None)
    owner = np.repeat(np.arange(len(base)), counts)
    k = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(first, counts)
    before = np.where(k > 0, reach[np.clip(k - 1, 0, None)], np.iinfo(np.int64).min)
    cursor = np.maximum(base[owner, 0], before)
    keep = starts[k] > cursor
    closing = np.where(last > 0, np.maximum(base[:, 0], reach[np.clip(last - 1, 0, None)]), base[:, 0])
    tail = closing < base[:, 1]
    pieces = np.r_[np.c_[cursor[keep], starts[k][keep]], np.c_[closing[tail], base[tail, 1]]].reshape(-1, 2)
    # order: by interval, then by the cut that ends each piece (the closing piece last)
    order = np.lexsort((np.r_[k[keep], np.full(int(tail.sum()), len(cut))], np.r_[owner[keep], np.nonzero(tail)[0]]))
    return pieces[order].astype(np.int64)


def match_messages(messages: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """The k-th send of a to b with the k-th receive of b from a (posting order on each side), one row per message:
    src, dst, k, send_row / recv_row (index in that rank's table, -1 where the side is not in the trace),
    send_obs_ns, recv_obs_ns and E (``done_ns``: the earliest observation)."""
    sends, recvs = [], []
    for rank, table in messages.items():
        if table.empty:
            continue
        own = table.sort_values("post_ns", kind="stable")
        out = own[own["direction"] == "send"]
        sends.append(pd.DataFrame({"src": rank, "dst": out["peer"].to_numpy(), "send_row": out.index.to_numpy(),
                                   "send_obs_ns": out["obs_ns"].to_numpy(float)}))  # fmt: skip
        into = own[own["direction"] == "recv"]
        recvs.append(pd.DataFrame({"src": into["peer"].to_numpy(), "dst": rank, "recv_row": into.index.to_numpy(),
                                   "recv_obs_ns": into["obs_ns"].to_numpy(float)}))  # fmt: skip
    columns = ["src", "dst", "k", "send_row", "recv_row", "send_obs_ns", "recv_obs_ns", "done_ns"]
    if not sends and not recvs:
        return pd.DataFrame(columns=columns)
    send = pd.concat(sends, ignore_index=True) if sends else pd.DataFrame(columns=["src", "dst", "send_row",
                                                                                    "send_obs_ns"])  # fmt: skip
    recv = pd.concat(recvs, ignore_index=True) if recvs else pd.DataFrame(columns=["src", "dst", "recv_row",
                                                                                    "recv_obs_ns"])  # fmt: skip
    send["k"] = send.groupby(["src", "dst"]).cumcount()
    recv["k"] = recv.groupby(["src", "dst"]).cumcount()
    both = send.merge(recv, on=["src", "dst", "k"], how="outer")
    both[["send_row", "recv_row"]] = both[["send_row", "recv_row"]].fillna(-1).astype(np.int64)
    both["done_ns"] = np.fmin(both["send_obs_ns"].to_numpy(float), both["recv_obs_ns"].to_numpy(float))
    return both.astype({"src": np.int64, "dst": np.int64, "k": np.int64})[columns]


def late_tolerance(done: np.ndarray, ready: np.ndarray, residual_ns: int = 0) -> np.ndarray:
    """How much later than the earliest evidence a waiting rank may observe a completion (module doc)."""
    window = np.nan_to_num(np.asarray(done, float) - np.asarray(ready, float), nan=0.0).clip(min=0.0)
    return np.maximum(float(max(LATE_NS, 2 * residual_ns)), LATE_SHARE * window)


def classify_gaps(gaps: np.ndarray, times: np.ndarray, done: np.ndarray, ids: np.ndarray, late: np.ndarray,
                  slack: np.ndarray | None = None):  # fmt: skip
    """Walk each gap forward through the completions observed in it (``times``: when this rank observed each,
    ``done``: its E, ``ids``: whose, ``late``: late_tolerance): returns (waits as (start, end, id) rows, own time
    as (start, end) rows).

    An observation belongs to the gap that holds it (or ends within ``slack`` before it: WAIT_TOL_NS unless given
    per observation -- a completion known only from the peer's side is seen by the peer a little later than this
    rank took it); one outside every gap (the rank was busy in an op: observed on another thread) waited for
    nothing."""
    order = np.argsort(times, kind="stable")
    times, done, ids, late = times[order], done[order], ids[order], np.asarray(late)[order]
    slack = np.full(len(times), WAIT_TOL_NS) if slack is None else np.asarray(slack)[order]
    gaps = np.asarray(gaps, np.int64).reshape(-1, 2)
    slot = np.searchsorted(gaps[:, 0], times, side="right") - 1
    inside = (slot >= 0) & (times <= gaps[np.clip(slot, 0, None), 1] + slack) if len(gaps) else slot >= 0
    # The walk, vectorised: the observations of a gap are consecutive here (gaps are sorted and disjoint) and
    # their ``seen`` never decreases, so the cursor before one is the previous one's seen (the gap's start first).
    obs = np.nonzero(inside)[0]
    gap = slot[obs]
    seen = np.minimum(times[obs].astype(np.int64), gaps[gap, 1])
    first = np.r_[True, gap[1:] != gap[:-1]] if len(obs) else np.zeros(0, bool)
    cursor = np.where(first, gaps[gap, 0], np.r_[np.int64(0), seen[:-1]][: len(obs)])
    moved = seen > cursor
    waiting = moved & (times[obs] - done[obs] <= late[obs])
    waits = np.c_[cursor[waiting], seen[waiting], ids[obs][waiting].astype(np.int64)]
    # After a gap's last observation (or from its start), up to its end: the rank's own time.
    reached = gaps[:, 0].copy()
    last = np.r_[gap[1:] != gap[:-1], True] if len(obs) else np.zeros(0, bool)
    reached[gap[last]] = seen[last]
    tail = gaps[:, 1] > reached
    busy = moved & ~waiting
    key_gap = np.r_[gap[busy], np.nonzero(tail)[0]]
    key_at = np.r_[obs[busy], np.full(int(tail.sum()), len(times))]  # a gap's tail after its observations
    own = np.r_[np.c_[cursor[busy], seen[busy]], np.c_[reached[tail], gaps[tail, 1]]][np.lexsort((key_at, key_gap))]
    return waits.astype(np.int64).reshape(-1, 3), own.astype(np.int64).reshape(-1, 2)


def measured(matched: pd.DataFrame, waits: dict[int, np.ndarray], observer_threads: dict) -> np.ndarray:
    """Per matched message: True when E is a measurement (module doc), False when it is only a bound.

    ``waits``: per rank, classify_gaps' wait rows whose id is the row of ``matched``; ``observer_threads``: per
    rank, the message ids it observed on another thread than its ring thread. Only the *receiver*'s wait (or its
    other thread) measures a message: a sender that waits for its send to complete may be waiting for a busy
    receiver to take the block (gloo completes a send when the receiver's wait takes it), and that is the
    receiver's time, not the link's. And the receiver must have waited longer than a late take (LATE_NS): a block
    that completes a few microseconds after a busy receiver came to wait for it completed *because* it came (the
    sender's transport waited for it), so its end bounds the transfer rather than measures it."""
    out = np.zeros(len(matched), bool)
    dst = matched["dst"].to_numpy()
    for rank, rows in waits.items():
        if len(rows):
            ids = rows[(rows[:, 1] - rows[:, 0]) >= LATE_NS, 2]
            out[ids[dst[ids] == rank]] = True
    for rank, ids in observer_threads.items():
        ids = np.asarray(list(ids), np.int64)
        out[ids[dst[ids] == rank]] = True
    return out


__all__ = [
    "WAIT_TOL_NS",
    "classify_gaps",
    "late_tolerance",
    "match_messages",
    "measured",
    "subtract",
    "union",
]
