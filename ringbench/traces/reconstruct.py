"""The ring rebuilt from every rank's exchanges and compute spans, as rows of the events table (schema.py).

* Ring order: who sends to whom. Each rank's successor is the peer most of its sends go to; following the
  successors from rank 0 must visit every rank once. Rotations by all-gather name no peer: the ring is then the
  rank order (torch's ring takes block rank - i at step i).
* Ring steps, per (iteration, phase, rank): exchanges are numbered by posting order. A phase that posts 2N - 1
  exchanges on N ranks (a backward rotating K/V and the dK/dV accumulators) has two per step; the lone one is
  step 0 when the phase computes before its first post (a blocking ring), else step N - 1. A phase whose first
  exchange is posted after its first compute (blocking: exchange, then compute) numbers its exchanges from 1.
  So the exchange of step s brings the block of step s + 1 (s with a blocking ring): ringbench's own convention,
  and the same numbering on the sender and the receiver of every exchange. Compute span i of the phase is step
  i; its block's owner is the rank i positions back in the ring. In a program that runs several rings per
  iteration (one per layer), steps keep counting across them.
* Spans: send and recv from the exchange's post to its completion in that direction; a ``wait`` per received
  block (zero-length when it did not block); a rotation by all-gather is a ``collective`` row over the time the
  rank was blocked on it. ``iteration`` rows: the forward from the iteration's start to its first backward op
  (or its end), the backward from there to its end.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from ringbench.errors import UsageError
from ringbench.record.schema import EVENT_COLUMNS


def ring_order(exchanges: dict[int, pd.DataFrame], world: int) -> tuple[list[int], str]:
    """(ring in order starting at rank 0, how it was found)."""
    if world == 1:
        return [0], "one rank"
    successor = {}
    for rank, table in exchanges.items():
        peers = table.loc[(table["kind"] == "p2p") & (table["dst"] >= 0) & (table["dst"] != rank), "dst"]
        if len(peers):
            successor[rank] = int(Counter(peers.astype(int)).most_common(1)[0][0])
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


def _row(**fields) -> dict:
    base = dict(src=-1, dst=-1, bytes=0, block=-1, pair="", flops=0.0, nccl_ms=np.nan, layer=0)
    return base | fields


def rank_rows(rank, ring, exchanges, compute, windows, world) -> list[dict]:
    """The events rows of one rank. ``exchanges`` and ``compute`` carry ``iteration`` (index into ``windows``,
    -1 outside) and ``phase``; ``windows``: per iteration index, (start_ns, backward_start_ns or None, end_ns)."""
    position = ring.index(rank)
    rows = []
    common = dict(rank=rank, ring_position=position)
    for iteration, (start, backward, end) in windows.items():
        fwd_end = backward if backward is not None else end
        rows.append(_row(iteration=iteration, phase="fwd", step=-1, kind="iteration", start_ns=start, end_ns=fwd_end,
                         src=rank, dst=rank, **common))  # fmt: skip
        if backward is not None:
            rows.append(_row(iteration=iteration, phase="bwd", step=-1, kind="iteration", start_ns=backward,
                             end_ns=end, src=rank, dst=rank, **common))  # fmt: skip
    for (iteration, phase), spans in compute[compute["iteration"] >= 0].groupby(["iteration", "phase"]):
        for step, span in enumerate(spans.sort_values("order_ns").itertuples(index=False)):
            owner = ring[(position - step) % world]
            rows.append(_row(iteration=int(iteration), phase=phase, step=step, kind="compute",
                             start_ns=int(span.start_ns), end_ns=int(span.end_ns), src=owner, dst=rank, block=owner,
                             flops=float(span.flops), **common))  # fmt: skip
    for (iteration, phase), group in exchanges[exchanges["iteration"] >= 0].groupby(["iteration", "phase"]):
        group = group.sort_values("post_ns", kind="stable")
        mine = compute[(compute["iteration"] == iteration) & (compute["phase"] == phase)]
        first = float(mine["order_ns"].min()) if len(mine) else np.nan
        steps = exchange_steps(group["post_ns"].to_numpy(float), first, world, phase)
        for step, ex in zip(steps, group.itertuples(index=False), strict=True):
            at = dict(iteration=int(iteration), phase=phase, step=int(step), **common)
            if ex.kind == "collective":
                rows.append(_row(kind="collective", start_ns=int(ex.wait_start_ns), end_ns=int(ex.wait_end_ns),
                                 dst=rank, bytes=int(ex.recv_bytes), **at))  # fmt: skip
                continue
            if ex.dst >= 0 and np.isfinite(ex.send_end_ns):
                rows.append(_row(kind="send", start_ns=int(ex.start_ns), end_ns=int(ex.send_end_ns), src=rank,
                                 dst=int(ex.dst), bytes=int(ex.send_bytes), **at))  # fmt: skip
            if ex.src >= 0 and np.isfinite(ex.recv_end_ns):
                source = int(ex.src)
                rows.append(_row(kind="recv", start_ns=int(ex.start_ns), end_ns=int(ex.recv_end_ns), src=source,
                                 dst=rank, bytes=int(ex.recv_bytes), **at))  # fmt: skip
                rows.append(_row(kind="wait", start_ns=int(ex.wait_start_ns), end_ns=int(ex.wait_end_ns),
                                 src=source, dst=rank, **at))  # fmt: skip
    return rows


LATE_TAKE_SLACK_NS = 1_000_000  # completions observed this much later than the peer saw them were taken late


def _partners(exchanges: dict[int, pd.DataFrame]) -> dict[tuple[int, int, str], tuple[int, int]]:
    """(rank, row, "send"|"recv") -> (peer rank, peer row): the k-th send of a to b with the k-th receive of b
    from a (posting order), as the clock alignment pairs them."""
    sends, recvs = {}, {}
    for rank, table in exchanges.items():
        p2p = table[table["kind"] == "p2p"]
        for dst, rows in p2p[p2p["dst"] >= 0].groupby("dst", sort=False):
            sends[(rank, int(dst))] = list(rows.index)
        for src, rows in p2p[p2p["src"] >= 0].groupby("src", sort=False):
            recvs[(int(src), rank)] = list(rows.index)
    out = {}
    for (src, dst), rows in sends.items():
        for send_row, recv_row in zip(rows, recvs.get((src, dst), []), strict=False):
            out[(src, send_row, "send")] = (dst, recv_row)
            out[(dst, recv_row, "recv")] = (src, send_row)
    return out


def settle_late_takes(exchanges: dict[int, pd.DataFrame], compute: dict[int, pd.DataFrame],
                      slack_ns: int = LATE_TAKE_SLACK_NS) -> int:  # fmt: skip
    """Host-side (CPU) traces show a P2P completion when the rank *observed* it (at its wait), not when the data
    moved. On one clock, the peer's observation bounds the transfer: a receive is done once its sender saw the
    send complete, a send once its receiver saw the block arrive (roughly: a buffered send completes before the
    receiver's thread has read it, so the bound is only trusted for a rank that takes its blocks late).

    A rank takes its blocks late when the median over its exchanges of the time between the bound and its own
    observation exceeds ``slack_ns`` (one late take now and then is the scheduler, which the completion rightly
    carries). For each such exchange over ``slack_ns``, with a derived wait (no wait op), the rank did not wait
    all that time: it was busy with work no pattern names (a sleep, Python, an unprofiled library). Its wait keeps only the time until the exchange was
    done, moved to just before the take, and the compute span that ended last before the wait is stretched over
    the rest: the ring waited for this rank, not for a link. Edits the
    tables in place; returns how many exchanges were taken late."""
    partners = _partners(exchanges)
    observed = {rank: table[["send_end_ns", "recv_end_ns"]].copy() for rank, table in exchanges.items()}
    takes: dict[int, list[tuple]] = {}  # rank -> (row, taken, done, idle_from, derived) per exchange
    for rank, table in exchanges.items():
        seen = observed[rank]
        for index in table.index[table["kind"] == "p2p"]:
            row = table.loc[index]
            taken = float(np.nanmax([seen.at[index, "send_end_ns"], seen.at[index, "recv_end_ns"]]))
            cut: dict[str, float] = {}
            for direction, other in (("send", "recv_end_ns"), ("recv", "send_end_ns")):
                partner = partners.get((rank, index, direction))
                mine = seen.at[index, f"{direction}_end_ns"]
                if partner is None or not np.isfinite(mine):
                    continue
                bound = float(observed[partner[0]].at[partner[1], other])
                if np.isfinite(bound) and bound < mine:
                    cut[direction] = max(bound, float(row["start_ns"]))
            done = float(np.nanmax([cut.get("send", seen.at[index, "send_end_ns"]),
                                    cut.get("recv", seen.at[index, "recv_end_ns"])]))  # fmt: skip
            idle_from = float(row["wait_start_ns"]) if np.isfinite(row["wait_start_ns"]) else taken
            derived = not str(row["via"]).startswith("_c10d_functional::")
            takes.setdefault(rank, []).append((index, taken, done, idle_from, derived, dict(cut)))
    late = 0
    for rank, rows in takes.items():
        lags = [taken - max(done, idle) for _, taken, done, idle, _, _ in rows if np.isfinite(taken)]
        # A rank that takes its blocks late does so step after step; a late take here and there is the
        # scheduler (CPU ranks sharing cores), which the receive's completion rightly carries.
        if not lags or float(np.median(lags)) <= slack_ns:
            continue
        table, spans = exchanges[rank], compute.get(rank)
        for index, taken, done, idle_from, derived, cut in rows:
            if not derived or not np.isfinite(taken) or taken - max(done, idle_from) <= slack_ns:
                continue
            late += 1
            for direction, end in cut.items():  # the transfer ended when the peer saw it end
                table.at[index, f"{direction}_end_ns"] = end
            # The rank waited (idle_from -> done, if at all) and was busy (done -> taken); in the record its own
            # time comes first, as a ring step orders them (compute, then wait for the next block).
            waited = max(0.0, done - idle_from)
            table.at[index, "wait_start_ns"], table.at[index, "wait_end_ns"] = taken - waited, taken
            if spans is None or not len(spans):
                continue
            iteration = table.at[index, "iteration"]
            before = spans[(spans["end_ns"] <= idle_from) & (spans["iteration"] == iteration)]
            if len(before):
                spans.at[before["end_ns"].idxmax(), "end_ns"] = int(taken - waited)
    return late


def events_frame(rows: list[dict], case_id: str, origin_ns: int) -> pd.DataFrame:
    """Rows -> the events table: the case id, repeat 0, times relative to ``origin_ns``, schema column order."""
    events = pd.DataFrame(rows)
    events["case_id"] = case_id
    events["repeat"] = 0
    events["start_ns"] = events["start_ns"].astype("int64") - origin_ns
    events["end_ns"] = events["end_ns"].astype("int64") - origin_ns
    order = ["iteration", "rank", "phase", "start_ns"]
    return events.sort_values(order, kind="stable").reset_index(drop=True)[list(EVENT_COLUMNS)]


__all__ = ["events_frame", "exchange_steps", "rank_rows", "ring_order"]
