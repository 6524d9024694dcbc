"""The ring rebuilt from every rank's messages, exchanges, compute spans and sync points, as rows of the events table.

* Ring order: who sends to whom. Each rank's successor is the peer most of its sends go to (or, where a rank's
  sends are not in its trace -- posted by a thread the profiler did not follow --, the rank whose receives name it
  most); following the successors from rank 0 must visit every rank once. Rotations by all-gather name no peer:
  the ring is then the rank order (torch's ring takes block rank - i at step i).
* Ring steps, per (iteration, phase, rank): exchanges (all the P2P ops posted together, exchanges.py) are numbered
  by posting order. A phase that posts 2N - 1 exchanges on N ranks (a backward rotating K/V and the dK/dV
  accumulators) has two per step; the lone one is step 0 when the phase computes before its first post (a
  blocking ring), else step N - 1. A phase whose first exchange is posted after its first compute (blocking:
  exchange, then compute) numbers its exchanges from 1. So the exchange of step s brings the block of step s + 1
  (s with a blocking ring): ringbench's own convention, and the same numbering on the sender and the receiver of
  every exchange. Compute span i of the phase is step i; its block's owner is the rank i positions back in the
  ring. In a program that runs several rings per iteration (one per layer), steps keep counting across them.
* Spans of an exchange: ``send`` and ``recv`` from the exchange's post on this rank to the completion of its last
  message in that direction (the earliest evidence, evidence.py), ``censored`` when that completion is only a
  bound; one ``wait`` per exchange that receives: the time the rank sat blocked on it up to that completion
  (zero-length where it came to take it when it had arrived); a rotation by all-gather is a ``collective`` row over
  the time the rank was blocked on it.
* ``own`` rows: the rank busy with its own work beside its compute spans: other ops, and time in no op that was
  not spent waiting (evidence.py); ``sync`` rows: from a rank's join of a barrier (or another collective) to its
  release, numbered world + j for the j-th of the (iteration, phase), the same on every rank. A sync that opens an
  iteration on every rank (a barrier before the ring) marks where the iteration starts: its time belongs to the
  iteration before, which the last rank to join it was still finishing.
* ``iteration`` rows: the forward from the iteration's start to its first backward op (or its end), the backward
  from there to its end.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.record.schema import EVENT_COLUMNS


def ring_order(messages: dict[int, pd.DataFrame], world: int) -> tuple[list[int], str]:
    """(ring in order starting at rank 0, how it was found)."""
    if world == 1:
        return [0], "one rank"
    successor = {}
    named_by = {}  # rank -> the ranks whose receives name it as their sender
    for rank, table in messages.items():
        if table.empty:
            continue
        peers = table.loc[(table["direction"] == "send") & (table["peer"] >= 0) & (table["peer"] != rank), "peer"]
        if len(peers):
            successor[rank] = int(Counter(peers.astype(int)).most_common(1)[0][0])
        for src in table.loc[(table["direction"] == "recv") & (table["peer"] >= 0) & (table["peer"] != rank), "peer"]:
            named_by.setdefault(int(src), Counter())[rank] += 1
    for rank, receivers in named_by.items():
        successor.setdefault(rank, receivers.most_common(1)[0][0])
    if not successor:
        return list(range(world)), "rank order (rotations by all-gather name no peer)"
    missing = [r for r in range(world) if r not in successor]
    if missing:
        raise UsageError(
            f"the exchanges do not form a ring: rank(s) {', '.join(map(str, missing[:8]))} send to no peer "
            f"(others send: {_sends(successor)}); pass traces of every rank of one ring"
        )
    ring, rank = [0], successor[0]
    while rank != 0 and rank not in ring and len(ring) <= world:
        ring.append(rank)
        rank = successor.get(rank, 0)
    if len(ring) != world or rank != 0:
        raise UsageError(
            f"the exchanges do not form one ring over {world} ranks ({_sends(successor)}); "
            "pass the traces of one ring (one process group)"
        )
    return ring, "who sends to whom"


def _sends(successor: dict[int, int]) -> str:
    shown = [f"{a}->{b}" for a, b in sorted(successor.items())[:8]]
    return ", ".join(shown) + (", ..." if len(successor) > 8 else "")


def exchange_steps(posts: np.ndarray, first_compute: float, world: int, phase: str) -> np.ndarray:
    """Ring step of each exchange of one (iteration, phase, rank), ``posts`` in posting order (module doc)."""
    count = len(posts)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    index = np.arange(count)
    blocking = bool(np.isfinite(first_compute) and posts[0] > first_compute)
    if phase == "bwd" and world > 1 and count == 2 * world - 1:
        return (index + 1) // 2 if blocking else index // 2
    return index + (1 if blocking else 0)


def number_steps(exchanges: pd.DataFrame, compute: pd.DataFrame, world: int) -> pd.Series:
    """Ring step of every exchange of one rank (``exchanges`` with iteration, phase, post_ns), by its index
    (exchange_steps, vectorised over (iteration, phase))."""
    steps = pd.Series(-1, index=exchanges.index, dtype="int64")
    mine = exchanges[exchanges["iteration"] >= 0]
    if mine.empty:
        return steps
    mine = mine.sort_values(["iteration", "phase", "post_ns"], kind="stable")
    keys = [mine["iteration"], mine["phase"]]
    index = mine.groupby(keys, sort=False).cumcount().to_numpy()
    count = mine.groupby(keys, sort=False)["post_ns"].transform("size").to_numpy()
    first_post = mine.groupby(keys, sort=False)["post_ns"].transform("min").to_numpy(float)
    first = compute.groupby(["iteration", "phase"])["order_ns"].min() if len(compute) else pd.Series(dtype=float)
    first_compute = first.reindex(pd.MultiIndex.from_arrays(keys)).to_numpy(float)
    blocking = np.isfinite(first_compute) & (first_post > first_compute)
    paired = (mine["phase"].to_numpy() == "bwd") & (world > 1) & (count == 2 * world - 1)
    out = np.where(paired, np.where(blocking, (index + 1) // 2, index // 2), index + blocking.astype(np.int64))
    steps[mine.index] = out
    return steps


def _row(**fields) -> dict:
    base = dict(src=-1, dst=-1, bytes=0, block=-1, pair="", flops=0.0, nccl_ms=np.nan, censored=False, layer=0)
    return base | fields


def iteration_rows(rank: int, position: int, windows: dict) -> list[dict]:
    """``windows``: per iteration number, (start_ns, backward_start_ns or None, end_ns)."""
    rows = []
    common = dict(rank=rank, ring_position=position, src=rank, dst=rank, kind="iteration", step=-1)
    for iteration, (start, backward, end) in windows.items():
        fwd_end = backward if backward is not None else end
        rows.append(_row(iteration=iteration, phase="fwd", start_ns=start, end_ns=fwd_end, **common))
        if backward is not None:
            rows.append(_row(iteration=iteration, phase="bwd", start_ns=backward, end_ns=end, **common))
    return rows


def compute_rows(rank: int, ring: list[int], compute: pd.DataFrame) -> pd.DataFrame:
    """Compute rows of one rank: span i of a phase is step i; its block's owner is i ring positions back."""
    position, world = ring.index(rank), len(ring)
    spans = compute[compute["iteration"] >= 0].sort_values(["iteration", "phase", "order_ns"], kind="stable")
    step = spans.groupby(["iteration", "phase"], sort=False).cumcount().to_numpy()
    owner = np.asarray(ring)[(position - step) % world] if len(spans) else np.empty(0, np.int64)
    return frame_rows(kind="compute", iteration=spans["iteration"].to_numpy(), phase=spans["phase"].to_numpy(),
                      step=step, rank=rank, ring_position=position, start_ns=spans["start_ns"].to_numpy(),
                      end_ns=spans["end_ns"].to_numpy(), src=owner, dst=rank, block=owner,
                      flops=spans["flops"].to_numpy(float))  # fmt: skip


def frame_rows(**columns) -> pd.DataFrame:
    """Events rows as a DataFrame: the given columns (arrays or scalars), the rest at their defaults."""
    lengths = [len(v) for v in columns.values() if isinstance(v, (np.ndarray, list, pd.Series))]
    n = lengths[0] if lengths else 1
    base = _row()
    out = {key: (np.asarray(value) if not np.isscalar(value) else np.full(n, value)) for key, value in columns.items()}
    for key, value in base.items():
        out.setdefault(key, np.full(n, value, dtype=object if isinstance(value, str) else None))
    return pd.DataFrame(out)


def step_of(anchors: pd.DataFrame, iteration: np.ndarray, phase: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Ring step of spans that belong to no exchange (own time, found per rank): the step of the rank's next
    compute or exchange event in the same (iteration, phase), or its last one. ``anchors``: iteration, phase,
    time_ns, step."""
    out = np.zeros(len(times), np.int64)
    if anchors.empty or not len(times):
        return out
    key = pd.Series(np.asarray(iteration)).astype(str).to_numpy() + np.asarray(phase, dtype=str)
    anchor_key = anchors["iteration"].astype(str).to_numpy() + anchors["phase"].astype(str).to_numpy()
    codes, _ = pd.factorize(np.r_[anchor_key, key])
    a_code, t_code = codes[: len(anchors)].astype(np.int64), codes[len(anchors) :].astype(np.int64)
    a_time, times = anchors["time_ns"].to_numpy(np.int64), np.asarray(times, np.int64)
    base = min(int(a_time.min()), int(times.min()))
    # One sortable key per (iteration, phase) and time: the code in the high bits, the time (ns since the first
    # event, < 2**41: 36 minutes) below.
    a_key = (a_code << 41) | np.clip(a_time - base, 0, (1 << 41) - 1)
    t_key = (t_code << 41) | np.clip(times - base, 0, (1 << 41) - 1)
    order = np.argsort(a_key, kind="stable")
    a_key, a_code, a_step = a_key[order], a_code[order], anchors["step"].to_numpy(np.int64)[order]
    pos = np.searchsorted(a_key, t_key, side="left")  # the first anchor at or after the span's start ...
    last = np.searchsorted(a_code, t_code, side="right") - 1  # ... else the key's last one
    found = last >= 0
    found &= a_code[np.clip(last, 0, None)] == t_code
    same = (pos < len(a_key)) & (a_code[np.clip(pos, 0, len(a_key) - 1)] == t_code)
    pick = np.where(same, pos, last)
    out[found] = a_step[pick[found]]
    return out


def events_frame(rows: list[pd.DataFrame], case_id: str, origin_ns: int) -> pd.DataFrame:
    """DataFrames of rows -> the events table: the case id, repeat 0, times relative to ``origin_ns``, schema
    column order; rows that tie on (iteration, rank, phase, start) keep the order they are given in."""
    events = pd.concat([frame for frame in rows if len(frame)], ignore_index=True)  # a rank has iteration rows
    events["case_id"] = case_id
    events["repeat"] = 0
    events["start_ns"] = events["start_ns"].astype("int64") - origin_ns
    events["end_ns"] = events["end_ns"].astype("int64") - origin_ns
    events["censored"] = events["censored"].fillna(False).astype(bool)
    order = ["iteration", "rank", "phase", "start_ns"]
    return events.sort_values(order, kind="stable").reset_index(drop=True).reindex(columns=list(EVENT_COLUMNS))


__all__ = [
    "compute_rows",
    "events_frame",
    "exchange_steps",
    "frame_rows",
    "iteration_rows",
    "number_steps",
    "ring_order",
    "step_of",
]
