"""The events rows of one rank on the shared clock (reconstruct.py's layout), as tables: its exchanges' send, recv,
wait and collective rows, its held-back posts, its own time and its sync points.

Each producer returns a DataFrame of rows (``reconstruct.frame_rows``), built from arrays over the rank's exchanges
and spans: a rank of a long trace has tens of thousands of rows, and a row as a dict costs about a kilobyte and a
few microseconds where a column entry costs eight bytes. ``view`` is assemble.py's rank on the shared clock
(rank, gpu, ring_tid, windows, messages, exchanges, compute, syncs, busy).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ringbench.traces.evidence import LATE_NS, WAIT_TOL_NS, subtract, union
from ringbench.traces.reconstruct import frame_rows, step_of

SEEN_FROM_PEER = "seen from its peer only"
MERGE_NS = 200_000  # waits of one exchange this close together are one wait (the wake-ups between them)


def windows_of(view) -> np.ndarray:
    """(n, 2) the rank's iteration windows (start, end)."""
    return np.array([(w[0], w[2]) for w in view.windows.values()], np.int64).reshape(-1, 2)


def post_spread(view) -> pd.DataFrame:
    """Per exchange posted on the ring thread: from its first op to its last (start_ns, end_ns), and the hop of
    the last op (src, dst): who held the exchange back."""
    posted = view.messages[(view.messages["tid"] == view.ring_tid) & (view.messages["via"] != SEEN_FROM_PEER)]
    if posted.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "src", "dst"])
    posted = posted.sort_values("post_ns", kind="stable")
    first = posted.groupby("group")["post_ns"].min()
    last = posted.groupby("group").tail(1).set_index("group")
    send = last["direction"] == "send"
    return pd.DataFrame({"start_ns": first, "end_ns": last["post_ns"],
                         "src": np.where(send, view.rank, last["peer"]),
                         "dst": np.where(send, last["peer"], view.rank)})  # fmt: skip


def post_rows(view, ring: list[int], spread: pd.DataFrame) -> pd.DataFrame | None:
    """An exchange's post held back on one hop (time in no op between its first op and its last, over
    WAIT_TOL_NS): that hop's time. ``spread``: post_spread(view)."""
    spread = spread[(spread["end_ns"] - spread["start_ns"]) > WAIT_TOL_NS]
    rows = []
    for group, held in spread.iterrows():
        if group not in view.exchanges.index or view.exchanges.at[group, "iteration"] < 0:
            continue
        ex = view.exchanges.loc[group]
        pieces = subtract(np.array([[held["start_ns"], held["end_ns"]]], np.int64), view.busy)
        for start, end in pieces:
            rows.append(dict(iteration=int(ex["iteration"]), phase=ex["phase"], step=int(ex["step"]),
                             start_ns=int(start), end_ns=int(end), src=int(held["src"]), dst=int(held["dst"])))  # fmt: skip
    if not rows:
        return None
    table = pd.DataFrame(rows)
    return frame_rows(kind="post", iteration=table["iteration"].to_numpy(), phase=table["phase"].to_numpy(),
                      step=table["step"].to_numpy(), rank=view.rank, ring_position=ring.index(view.rank),
                      start_ns=table["start_ns"].to_numpy(), end_ns=table["end_ns"].to_numpy(),
                      src=table["src"].to_numpy(), dst=table["dst"].to_numpy())  # fmt: skip


def _sides(view, exchanges: pd.DataFrame, matched: pd.DataFrame, ids: pd.Series, censored: np.ndarray):
    """Per (exchange, direction, peer) of the rank: its last completion (``end``), bytes, the latest observation
    (``seen``) and whether the completion is only a bound (``censored``), in order of completion."""
    done = matched["done_ns"].to_numpy(float)
    flags = censored if not view.gpu else np.zeros(len(censored), bool)
    msgs = view.messages.assign(mid=ids.to_numpy())
    msgs = msgs[(msgs["mid"] >= 0) & msgs["group"].isin(exchanges.index)]
    msgs = msgs.assign(done=done[msgs["mid"].to_numpy()], flag=flags[msgs["mid"].to_numpy()],
                       bytes=msgs["bytes"].clip(lower=0))  # fmt: skip
    msgs = msgs[np.isfinite(msgs["done"])].sort_values("done", kind="stable")
    msgs = msgs.assign(measured_done=msgs["done"].where(~msgs["flag"]))
    sides = msgs.groupby(["group", "direction", "peer"], sort=False).agg(
        end=("done", "last"), bytes=("bytes", "sum"), seen=("obs_ns", "max"), measured=("measured_done", "max"),
    ).reset_index()  # fmt: skip
    # A side's completion is measured when a message measured completed with its last one (within a late take's
    # tolerance: K waited for, V in hand the moment after), else it is a bound.
    sides["censored"] = ~(sides["end"] - sides["measured"] <= LATE_NS).to_numpy() if not view.gpu else False
    sides["seen"] = sides["seen"].fillna(sides["end"])
    return sides


def _blocked_runs(view, matched: pd.DataFrame, ids: pd.Series, waits: np.ndarray) -> pd.DataFrame:
    """Per exchange, the time the rank sat blocked on it (start, end): its last run of waits (MERGE_NS apart
    joined), found by the exchange of the message (or the collective) each wait was for."""
    group_of = pd.Series(view.messages["group"].to_numpy(), index=ids.to_numpy())
    group_of = group_of[group_of.index >= 0]
    blocked = pd.DataFrame(waits, columns=["start", "end", "id"])
    collective = blocked["id"] >= len(matched)
    blocked["group"] = np.where(collective, blocked["id"] - len(matched),
                                group_of.reindex(blocked["id"].where(~collective, -1)).to_numpy())  # fmt: skip
    return _last_runs(blocked.dropna(subset=["group"]).astype({"group": "int64"}))


def exchange_rows(view, ring: list[int], matched: pd.DataFrame, ids: pd.Series, waits: np.ndarray,
                  censored: np.ndarray) -> pd.DataFrame | None:  # fmt: skip
    """send / recv rows per exchange side, each receive followed by its wait row, then the collective rows."""
    exchanges = view.exchanges[view.exchanges["iteration"] >= 0]
    if exchanges.empty:
        return None
    last = _blocked_runs(view, matched, ids, waits)
    sides = _sides(view, exchanges, matched, ids, censored)
    coll = exchanges[exchanges["kind"] == "collective"]
    if sides.empty and coll.empty:
        return None
    ex = exchanges.reindex(sides["group"])
    post = ex["post_ns"].to_numpy(np.int64)
    send = (sides["direction"] == "send").to_numpy()
    peer = sides["peer"].to_numpy(np.int64)
    src, dst = np.where(send, view.rank, peer), np.where(send, peer, view.rank)
    wait_start, wait_end = _wait_times(view, ex, sides, last)
    c_start = coll["done_ns"].to_numpy(float).astype(np.int64)  # a collective waited for by no wait: its end
    c_end = c_start.copy()
    _take_runs(last, coll.index, c_start, c_end)
    rows = _Layout(recv=~send, collectives=len(coll))
    iteration, phase, step = (ex[name].to_numpy() for name in ("iteration", "phase", "step"))
    return frame_rows(
        kind=rows(sides["direction"].to_numpy(object), "wait", "collective"),
        iteration=rows(iteration, iteration, coll["iteration"].to_numpy()),
        phase=rows(phase, phase, coll["phase"].to_numpy(object)),
        step=rows(step, step, coll["step"].to_numpy()),
        rank=view.rank, ring_position=ring.index(view.rank),
        start_ns=rows(post, wait_start, c_start),
        end_ns=rows(np.maximum(sides["end"].to_numpy(float).astype(np.int64), post), wait_end, c_end),
        src=rows(src, src, -1),
        dst=rows(dst, view.rank, view.rank),
        bytes=rows(sides["bytes"].to_numpy(np.int64), 0, coll["bytes"].to_numpy(np.int64)),
        censored=rows(sides["censored"].to_numpy(bool), False, False),
    )  # fmt: skip


class _Layout:
    """Where exchange_rows' rows go: the side rows in order, each receive followed by its wait row, then the
    collective rows. ``rows(side, wait, collective)`` lays out one column (arrays or scalars)."""

    def __init__(self, recv: np.ndarray, collectives: int) -> None:
        self.recv, self.collectives = recv, collectives
        self.at = np.argsort(np.r_[2 * np.arange(len(recv)), 2 * np.nonzero(recv)[0] + 1], kind="stable")

    def __call__(self, side, wait, collective) -> np.ndarray:
        n = len(self.recv)
        side, wait = np.broadcast_to(side, n), np.broadcast_to(wait, n)
        return np.r_[np.r_[side, wait[self.recv]][self.at], np.broadcast_to(collective, self.collectives)]


def _wait_times(view, ex: pd.DataFrame, sides: pd.DataFrame, last: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of the wait on each side's exchange: the kernel's wait on a GPU; else the last run of waits on
    the exchange; else none (zero-length where the rank came to take the block). int64: ns since the epoch need
    61 bits, more than a float holds."""
    start = came_to(view.busy, sides["seen"].to_numpy(float)).astype(np.int64)
    end = start.copy()
    _take_runs(last, sides["group"], start, end)
    if view.gpu and "wait_start_ns" in ex:
        kernel = np.isfinite(ex["wait_start_ns"].to_numpy(float))
        start[kernel] = ex["wait_start_ns"].to_numpy(float)[kernel].astype(np.int64)
        end[kernel] = ex["wait_end_ns"].to_numpy(float)[kernel].astype(np.int64)
    return start, end


def _take_runs(runs: pd.DataFrame, groups, start: np.ndarray, end: np.ndarray) -> None:
    """Where an exchange of ``groups`` has a run of waits in ``runs``, its (start, end) into ``start``, ``end``."""
    at = pd.Index(runs.index).get_indexer(pd.Index(groups)) if len(runs) else np.full(len(start), -1)
    found = at >= 0
    start[found] = runs["start"].to_numpy(np.int64)[at[found]]
    end[found] = runs["end"].to_numpy(np.int64)[at[found]]


def _last_runs(blocked: pd.DataFrame) -> pd.DataFrame:
    """Per exchange (``group``), the last run of its waits: consecutive waits less than MERGE_NS apart are one."""
    if blocked.empty:
        return pd.DataFrame(columns=["start", "end"])
    blocked = blocked.sort_values(["group", "start"], kind="stable")
    previous_end = blocked.groupby("group")["end"].shift()
    new_run = previous_end.isna() | (blocked["start"] - previous_end > MERGE_NS)
    blocked = blocked.assign(run=new_run.astype(int).groupby(blocked["group"]).cumsum())
    final = blocked[blocked["run"] == blocked.groupby("group")["run"].transform("max")]
    return final.groupby("group").agg(start=("start", "min"), end=("end", "max"))


def came_to(busy: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """When the rank came to take the blocks it observed at ``seen``: then, or at the end of the op it was in (an
    observation on another thread while the ring thread computed)."""
    seen = np.asarray(seen, float)
    if not len(busy):
        return seen.copy()
    slot = np.searchsorted(busy[:, 0], seen, side="right") - 1
    end = busy[np.clip(slot, 0, None), 1]
    inside = (slot >= 0) & (end > seen) & np.isfinite(seen)
    return np.where(inside, end.astype(float), seen)


def own_rows(view, ring: list[int], own: np.ndarray) -> pd.DataFrame | None:
    """The rank's own work beside its compute spans: other ops and unprofiled time that was no wait."""
    compute = union(view.compute["start_ns"], view.compute["end_ns"]) if len(view.compute) else np.empty((0, 2))
    others = subtract(view.busy, compute.astype(np.int64))
    spans = union(np.r_[own[:, 0], others[:, 0]], np.r_[own[:, 1], others[:, 1]])
    spans = clip(spans, windows_of(view))
    if not len(spans):
        return None
    starts = np.array([w[0] for w in view.windows.values()], np.int64)
    numbers = np.array(list(view.windows), np.int64)
    order = np.argsort(starts)
    slot = order[np.clip(np.searchsorted(starts[order], spans[:, 0], side="right") - 1, 0, None)]
    iteration = numbers[slot]
    backward = np.array([view.windows[n][1] if view.windows[n][1] is not None else np.iinfo(np.int64).max
                         for n in iteration], np.int64)  # fmt: skip
    phase = np.where(spans[:, 0] >= backward, "bwd", "fwd").astype(object)
    anchors = pd.concat([
        view.compute[view.compute["iteration"] >= 0].assign(time_ns=view.compute["start_ns"])[
            ["iteration", "phase", "time_ns", "step"]],
        view.exchanges[view.exchanges["iteration"] >= 0].assign(time_ns=view.exchanges["post_ns"])[
            ["iteration", "phase", "time_ns", "step"]],
    ])  # fmt: skip
    steps = step_of(anchors, iteration, phase, spans[:, 0])
    return frame_rows(kind="own", iteration=iteration, phase=phase, step=steps, rank=view.rank,
                      ring_position=ring.index(view.rank), start_ns=spans[:, 0], end_ns=spans[:, 1], src=view.rank,
                      dst=view.rank)  # fmt: skip


def clip(spans: np.ndarray, windows: np.ndarray) -> np.ndarray:
    """``spans`` cut to the union of ``windows``."""
    if not len(spans) or not len(windows):
        return np.empty((0, 2), np.int64)
    outside = subtract(np.array([[min(spans[:, 0].min(), windows[:, 0].min()) - 1,
                                  max(spans[:, 1].max(), windows[:, 1].max()) + 1]], np.int64),
                       union(windows[:, 0], windows[:, 1]))  # fmt: skip
    return subtract(spans.astype(np.int64), outside)


def sync_rows(view, ring: list[int], world: int) -> pd.DataFrame | None:
    """A rank's join of a barrier (or another collective) to its release, the j-th of its (iteration, phase)
    numbered world + j."""
    syncs = view.syncs[view.syncs["iteration"] >= 0].sort_values("join_ns", kind="stable")
    if syncs.empty:
        return None
    # rows grouped by (iteration, phase) in order of each group's first join, then by join within the group
    syncs = syncs.assign(j=syncs.groupby(["iteration", "phase"], sort=False).cumcount())
    first = syncs.groupby(["iteration", "phase"], sort=False).ngroup()
    syncs = syncs.iloc[np.argsort(first.to_numpy(), kind="stable")]
    join = syncs["join_ns"].to_numpy(np.int64)
    return frame_rows(kind="sync", iteration=syncs["iteration"].to_numpy(np.int64),
                      phase=syncs["phase"].to_numpy(object), step=world + syncs["j"].to_numpy(np.int64),
                      rank=view.rank, ring_position=ring.index(view.rank), start_ns=join,
                      end_ns=np.maximum(join, syncs["done_ns"].to_numpy(np.int64)), dst=view.rank)  # fmt: skip


__all__ = ["MERGE_NS", "SEEN_FROM_PEER", "came_to", "clip", "exchange_rows", "own_rows", "post_rows",
           "post_spread", "sync_rows", "windows_of"]  # fmt: skip
