"""Transfers matched across ranks and the critical path of each iteration: the facts the figures stand on.

Both are pure functions of the events table. ringbench/figures/metrics.py defines the reported figures on them (exposed
communication is the wait time on the critical path), and the analyses (hops, stragglers) read them from here.

Transfers. A receiver's ``recv`` span runs from its post to the block being in hand. Part of that is not the link's fault:
the block cannot leave ``src`` before ``src`` posted its send (the sender's ``send`` start). So, per transfer,

    transfer_start  = max(recv_start on dst, send_start on src)
    transfer_ms     = recv_end - transfer_start                 (the link's latency for this block)
    upstream_wait_ms = max(0, send_start on src - recv_start on dst)   (dst waited for a late sender)
    bandwidth       = bytes / transfer_ms

(ringbench/figures/metrics.py defines transfer_ms and bandwidth; this module matches the spans they are computed from.)
Blaming the link for the whole recv span (``recv_ms``) is the classic mistake: behind a slow rank, every
downstream link looks slow. Sends and recvs of one exchange share (case, repeat, iteration, phase, step, src, dst);
when a step carries several exchanges (the backward's K/V and dK/dV), the k-th send matches the k-th recv in
posting order (``ordinal``), and the k-th wait of the receiver too.

``exchange`` names what moved: ``kv`` (the K/V block) or, in the backward, ``dkv`` (the dK/dV accumulator). The
engine posts K/V before a step's compute and dK/dV after it, and labels both with the posting step, so the last
exchange of a backward step is always dK/dV (sync or double; at step N-1 (double) or 0 (sync) it is the only
one). Hop statistics are kept per exchange: the two differ in bytes (bf16 blocks, fp32 accumulators) and in
what they wait for. ``collective`` rows (the all-gather baseline) are not hops and have no transfer rows.

Critical path. A rank is blocked only by its own compute or by a wait for an exchange. Walking back in time from
the rank that finished the iteration last, at cursor (rank r, time t) take the latest blocking span of r ending by t:

  compute [cs, ce]   -> rank r is on the path for ce - cs; continue at (r, cs)
  wait    [ws, we]   -> the exchange that ended it is the later of r's recv (from the predecessor) and r's own
                        send (to the successor) that completed by we. If that was done by ws (within the clock
                        tolerance), r never waited for it: r was busy until ws (``double``: computing on the
                        block in hand while the exchange ran), so the wait is ``other`` and the walk continues at
                        (r, ws). Otherwise its link is on the path for transfer_ms = end - max(post on r, post on
                        the peer). If the peer posted later than r, r was waiting for the peer (upstream, not the
                        link): continue on the peer at its post time; otherwise continue at (r, post on r).

The first case is what makes the path right with double buffering: a rank that computes slower than the link
moves its block always waits a few microseconds for an exchange that finished long before; jumping from there
back to the exchange's post (the start of the step) would skip the very compute that held the ring back.

Gaps between spans and wait tails after the completion stamp are ``other``. Each move goes back at least one span,
so the walk loops over ring steps (vectorised over iterations), never over events.

A ``collective`` span (the all-gather baseline) ends when the last rank joined it: the walk continues on the rank
that posted it last (its time before that is ``other``); a collective is not a hop, so no link is named there. A
``sync`` span (a barrier, or another collective that is no rotation: imported traces) is walked the same way, so
the others' wait there is charged along the last joiner's own path; it moves no ring data, so none of it is
exposed communication. ``own`` spans (a rank busy with work that is no compute span: imported traces) are the
rank's, like compute. A ``post`` span (imported traces: an exchange's post held back on one hop, time in no op
between its first op and the late one) is that hop's: the walk charges its link for it, all of it exposed (the
ring is held on that hop), and continues at its start on the same rank.

Censored transfers (imported host-side traces: nobody waited when the block completed, so its end is a bound)
keep their rows and their ``censored`` flag; the walk never binds a wait on one (no rank waited for it), and the
hop statistics leave them out (analysis/stragglers.py).

Exposed communication (ringbench/figures/metrics.py) is the wait / collective time on the path: of a wait that the walk
follows to its exchange, the part while the transfer was in flight; of a collective, the part after its last rank
joined. It is what perfect overlap would win: the path would run through the compute beside the exchange instead.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import pandas as pd

STEP_KEYS = ["case_id", "repeat", "iteration", "layer", "phase", "step"]  # layer: each layer is a ring of its own
LINK_KEYS = [*STEP_KEYS, "src", "dst", "ordinal"]
EXCHANGES = ("kv", "dkv")

TRANSFER_COLUMNS = [
    *LINK_KEYS,
    "exchange",
    "bytes",
    "send_start_ns",
    "send_end_ns",
    "recv_start_ns",
    "recv_end_ns",
    "wait_start_ns",
    "wait_end_ns",
    "transfer_start_ns",
    "recv_ms",
    "transfer_ms",
    "upstream_wait_ms",
    "wait_ms",
    "censored",
]
GROUP_KEYS = ["case_id", "repeat", "iteration"]
CRITICAL_PATH_COLUMNS = [*GROUP_KEYS, "resource", "rank", "src", "dst", "ms", "path_ms", "exposed_ms"]
SEGMENT_COLUMNS = [*GROUP_KEYS, "resource", "rank", "src", "dst", "ms", "exposed_ms"]
DEFAULT_TOL_NS = 20_000
_TIME_BITS = 40  # sort key = (group-rank << 40) | time in ns since the iteration began (~18 min of headroom)


def transfer_window(recv_start, recv_end, send_start) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per received block: (transfer start ns, transfer ms, upstream wait ms).

    The block cannot leave before its sender posted it, so the link's part starts at max(recv post, send post)
    (a missing send post counts as in time); what came before it was a wait for a late sender, not the link.
    """
    recv_start, recv_end = np.asarray(recv_start, float), np.asarray(recv_end, float)
    send_start = np.asarray(send_start, float)
    start = np.fmax(recv_start, send_start)
    transfer_ms = np.clip((recv_end - start) / 1e6, 0.0, None)
    upstream_ms = np.clip(np.nan_to_num(send_start - recv_start) / 1e6, 0.0, None)
    return start, transfer_ms, upstream_ms


def with_layer(events: pd.DataFrame) -> pd.DataFrame:
    """``events`` with a ``layer`` column (0 where a frame made without one lacks it, or holds null: one layer)."""
    if "layer" not in events:
        return events.assign(layer=0)
    if events["layer"].isna().any():
        return events.assign(layer=events["layer"].fillna(0).astype("int64"))
    return events


def _spans(events: pd.DataFrame, kind: str, prefix: str) -> pd.DataFrame:
    """Rows of one kind with an ordinal in posting order within (step keys, src, dst)."""
    labelled = ["exchange"] if "exchange" in events else []  # what moved, where the producer says (schema v3)
    rows = events.loc[events["kind"] == kind, [*STEP_KEYS, "src", "dst", "start_ns", "end_ns", "bytes", *labelled]]
    if kind == "recv":
        flag = events.loc[rows.index, "censored"] if "censored" in events else pd.Series(False, index=rows.index)
        rows = rows.assign(censored=flag.to_numpy(dtype=object) == True)  # noqa: E712 - NaN (older producers): False
    rows = rows.sort_values("start_ns", kind="stable")
    rows["ordinal"] = rows.groupby([*STEP_KEYS, "src", "dst"], sort=False, observed=True).cumcount()
    names = {"start_ns": f"{prefix}_start_ns", "end_ns": f"{prefix}_end_ns", "bytes": f"{prefix}_bytes"}
    return rows.rename(columns=names | {"exchange": f"{prefix}_exchange"})


def transfers(events: pd.DataFrame) -> pd.DataFrame:
    """One row per received block: the receiver's recv and wait matched with the sender's send.

    A recv without a matching send (a truncated record) keeps NaN send times and is treated as posted in time.
    """
    events = with_layer(events)
    recvs = _spans(events, "recv", "recv")
    sends = _spans(events, "send", "send").drop(columns=["send_bytes", "send_exchange"], errors="ignore")
    waits = _spans(events, "wait", "wait").drop(columns=["wait_bytes", "wait_exchange"], errors="ignore")
    out = recvs.merge(sends, on=LINK_KEYS, how="left").merge(waits, on=LINK_KEYS, how="left")
    out = out.rename(columns={"recv_bytes": "bytes"})
    start, transfer_ms, upstream_ms = transfer_window(out["recv_start_ns"], out["recv_end_ns"], out["send_start_ns"])
    out["transfer_start_ns"] = start
    out["recv_ms"] = (out["recv_end_ns"] - out["recv_start_ns"]) / 1e6
    out["transfer_ms"] = transfer_ms
    out["upstream_wait_ms"] = upstream_ms
    out["wait_ms"] = ((out["wait_end_ns"] - out["wait_start_ns"]) / 1e6).fillna(0.0)
    out["exchange"] = exchange_kind(out)
    if "recv_exchange" in out:  # a label the producer recorded wins over the inferred kv / dkv
        recorded = out["recv_exchange"]
        named = recorded.notna() & (recorded.astype(str) != "")
        out.loc[named, "exchange"] = recorded[named].astype(str)
    out["censored"] = out["censored"].astype(bool)
    return out[TRANSFER_COLUMNS].reset_index(drop=True)


def exchange_kind(rows: pd.DataFrame) -> np.ndarray:
    """``kv`` or ``dkv`` per transfer row: in the backward the last exchange posted in a step is dK/dV."""
    if rows.empty:
        return np.array([], dtype=object)
    last = rows.groupby([*STEP_KEYS, "src", "dst"], observed=True, sort=False)["ordinal"].transform("max")
    is_dkv = (rows["phase"].to_numpy() == "bwd") & (rows["ordinal"].to_numpy() == last.to_numpy())
    return np.where(is_dkv, "dkv", "kv").astype(object)


def clock_tolerance_ns(residual_ns: int) -> int:
    """How far two ranks' stamps may disagree: twice the run's clock-alignment bound (meta.json
    ``ranks.<world>.clock_residual_ns``, RunMeta.clock_residual_ns), and at least DEFAULT_TOL_NS."""
    return max(DEFAULT_TOL_NS, 2 * int(residual_ns or 0))


class Element(IntEnum):
    """What a blocking span on the walk is: the rank's own time, a wait on an exchange, a collective (or
    barrier), or an exchange's post held back on one hop."""

    COMPUTE = 0
    WAIT = 1
    COLLECTIVE = 2
    POST = 3


def _part(element: Element, g, rank, start, end, *, link_src=None, link_dst=None, link_ms=None, link_end=None,
          next_rank=None, next_t=None, exposed_ms=None) -> dict[str, np.ndarray]:  # fmt: skip
    """One kind's elements as arrays (defaults: no link, the walk goes on on the same rank at the start)."""
    n = len(rank)
    return {"g": g, "rank": rank, "start": start, "end": end, "kind": np.full(n, int(element), np.int8),
            "link_src": np.full(n, -1) if link_src is None else link_src,
            "link_dst": np.full(n, -1) if link_dst is None else link_dst,
            "link_ms": np.zeros(n) if link_ms is None else link_ms,
            "link_end": end if link_end is None else link_end,
            "next_rank": rank if next_rank is None else next_rank,
            "next_t": start if next_t is None else next_t,
            "exposed_ms": np.zeros(n) if exposed_ms is None else exposed_ms}  # fmt: skip


def _compute_part(events: pd.DataFrame, group_of) -> dict:
    comp = events.loc[events["kind"].isin(["compute", "own"]), [*GROUP_KEYS, "rank", "start_ns", "end_ns"]]
    return _part(Element.COMPUTE, group_of(comp), comp["rank"].to_numpy(np.int64), comp["start_ns"].to_numpy(np.int64),
                 comp["end_ns"].to_numpy(np.int64))  # fmt: skip


def _waits(xfers: pd.DataFrame) -> pd.DataFrame:
    """Each wait with its exchange's both directions: the predecessor's transfer in, the rank's own send out."""
    waits = xfers[xfers["wait_ms"] > 0].rename(columns={"dst": "rank", "src": "pred"})
    outgoing = xfers[[*STEP_KEYS, "ordinal", "src", "dst", "send_start_ns", "send_end_ns", "recv_start_ns"]].rename(
        columns={"src": "rank", "dst": "succ", "recv_start_ns": "succ_post_ns"}
    )
    waits = (
        waits.rename(columns={"send_start_ns": "pred_post_ns"})
        .drop(columns="send_end_ns")
        .merge(outgoing, on=[*STEP_KEYS, "ordinal", "rank"], how="left")
    )
    if len(waits) and waits.duplicated([*STEP_KEYS, "ordinal", "rank", "pred"]).any():
        # An all-to-all: the rank sent to several peers in the exchange; the one of its sends that completed
        # last is the one that could have held the wait (a ring sends to its successor only).
        waits = waits.sort_values("send_end_ns", kind="stable", na_position="first")
        waits = waits.drop_duplicates([*STEP_KEYS, "ordinal", "rank", "pred"], keep="last")
    return waits


def _wait_part(xfers: pd.DataFrame, group_of, tol_ns: int) -> dict | None:
    waits = _waits(xfers)
    if not len(waits):
        return None
    col = lambda name: waits[name].to_numpy(float)  # noqa: E731
    we, re, rs, tr, ps = col("wait_end_ns"), col("recv_end_ns"), col("recv_start_ns"), col("transfer_start_ns"), \
        col("pred_post_ns")  # fmt: skip
    se, ss, succ_post, ws = col("send_end_ns"), col("send_start_ns"), col("succ_post_ns"), col("wait_start_ns")
    # The send binds only if it completed after the recv and still before the wait ended.
    by_send = (np.nan_to_num(se, nan=-np.inf) > re) & (np.nan_to_num(se, nan=np.inf) <= we + tol_ns)
    own = waits["rank"].to_numpy(np.int64)
    pred, succ = waits["pred"].to_numpy(np.int64), waits["succ"].fillna(-1).to_numpy(np.int64)
    upstream_in = np.nan_to_num(ps, nan=-np.inf) > rs  # the predecessor posted after us: we waited on it
    upstream_out = np.nan_to_num(succ_post, nan=-np.inf) > ss
    link_end = np.where(by_send, se, re)
    moved_from = np.where(by_send, np.fmax(ss, succ_post), tr)  # when the binding transfer began
    # The exchange was still in flight when the rank began to wait: the wait is the exchange's. Otherwise the
    # rank was busy until ws (double: computing beside the exchange) and the walk stays on it.
    binding = link_end > ws + tol_ns
    next_t = np.where(by_send, np.where(upstream_out, succ_post, ss), np.where(upstream_in, ps, rs))
    next_rank = np.where(by_send, np.where(upstream_out, succ, own), np.where(upstream_in, pred, own))
    # Exposed: the wait while the transfer was in flight (its wake-up tail would remain with perfect overlap).
    in_flight = np.fmin(link_end, we) - np.fmax(ws, np.nan_to_num(moved_from, nan=-np.inf))
    exposed = np.clip(in_flight, 0.0, we - ws) / 1e6
    return _part(Element.WAIT, group_of(waits), own, ws.astype(np.int64), we.astype(np.int64),
                 link_src=np.where(binding, np.where(by_send, own, pred), -1),
                 link_dst=np.where(binding, np.where(by_send, succ, own), -1),
                 link_ms=np.where(binding, np.clip((link_end - moved_from) / 1e6, 0.0, None), 0.0),
                 link_end=link_end.astype(np.int64), next_rank=np.where(binding, next_rank, own),
                 next_t=np.where(binding, np.minimum(next_t, link_end), ws).astype(np.int64),
                 exposed_ms=np.where(binding, exposed, 0.0))  # fmt: skip


def _post_part(events: pd.DataFrame, group_of) -> dict | None:
    held = events.loc[events["kind"] == "post", [*GROUP_KEYS, "rank", "src", "dst", "start_ns", "end_ns"]]
    if not len(held):
        return None
    ms = (held["end_ns"] - held["start_ns"]).to_numpy(float) / 1e6
    return _part(Element.POST, group_of(held), held["rank"].to_numpy(np.int64), held["start_ns"].to_numpy(np.int64),
                 held["end_ns"].to_numpy(np.int64), link_src=held["src"].to_numpy(np.int64),
                 link_dst=held["dst"].to_numpy(np.int64), link_ms=ms, exposed_ms=ms)  # fmt: skip


def _collective_part(events: pd.DataFrame, group_of, tol_ns: int) -> dict | None:
    coll = events.loc[events["kind"].isin(["collective", "sync"]), [*STEP_KEYS, "rank", "kind", "start_ns", "end_ns"]]
    if not len(coll):
        return None
    # A collective ends when the last rank joined: continue on that rank at its post (upstream) if it is not us.
    last = coll.groupby(STEP_KEYS, observed=True)["start_ns"].transform("max").to_numpy(np.int64)
    joiner = coll.sort_values("start_ns").groupby(STEP_KEYS, observed=True)["rank"].transform("last")
    own, cs, ce = (
        coll["rank"].to_numpy(np.int64),
        coll["start_ns"].to_numpy(np.int64),
        coll["end_ns"].to_numpy(np.int64),
    )
    late = last > cs + tol_ns
    resumed = np.where(late, last, cs)
    # a barrier moves no ring data: its time after the last join is no exposed communication
    exposed = np.where(coll["kind"].to_numpy() == "sync", 0.0, (ce - resumed).clip(min=0) / 1e6)
    return _part(Element.COLLECTIVE, group_of(coll), own, cs, ce,
                 next_rank=np.where(late, joiner.reindex(coll.index).to_numpy(np.int64), own), next_t=resumed,
                 exposed_ms=exposed)  # fmt: skip


def _elements(events: pd.DataFrame, xfers: pd.DataFrame, origin: pd.Series, width: int, tol_ns: int):
    """The blocking spans of every (iteration, rank), sorted by end, with where the walk continues after each."""
    index = origin.index

    def group_of(frame: pd.DataFrame) -> np.ndarray:
        return index.get_indexer(pd.MultiIndex.from_frame(frame[GROUP_KEYS]))

    parts = [_compute_part(events, group_of), _wait_part(xfers, group_of, tol_ns), _post_part(events, group_of),
             _collective_part(events, group_of, tol_ns)]  # fmt: skip
    parts = [part for part in parts if part is not None]
    el = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    base = origin.to_numpy(np.int64)[el["g"]]
    for key in ("start", "end", "link_end", "next_t"):
        el[key] = np.clip(el[key] - base, 0, (1 << _TIME_BITS) - 1)
    el["gr"] = el["g"] * width + el["rank"]
    el["key"] = (el["gr"] << _TIME_BITS) | el["end"]
    order = np.argsort(el["key"], kind="stable")
    return {key: value[order] for key, value in el.items()}


def critical_path(
    events: pd.DataFrame, xfers: pd.DataFrame | None = None, tol_ns: int = DEFAULT_TOL_NS
) -> pd.DataFrame:
    """Per iteration, the ms of the critical path spent on each rank's compute, on each link, and elsewhere.
    (critical_path_segments gives the same table and the spans the walk went through.)

    ``tol_ns`` absorbs clock-alignment residue between ranks (``clock_tolerance_ns(run.meta.clock_residual_ns())``).
    Dense: every rank and link of the case appears in every iteration (0 ms when off the path); ``path_ms`` is the
    iteration's length from its first span (repeated on its rows). ``exposed_ms``: of a link's time on the path,
    the part its receiving rank sat blocked (what overlap did not hide); on the ``other`` row, the collectives'
    time on the path; summed over an iteration's rows, its exposed communication (metrics.exposed_comm).
    An iteration without spans has NaN ``ms`` and ``exposed_ms``.
    """
    return critical_path_segments(events, xfers, tol_ns)[0]


def critical_path_segments(
    events: pd.DataFrame, xfers: pd.DataFrame | None = None, tol_ns: int = DEFAULT_TOL_NS
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(critical_path's table, the path's segments): one segment per span the walk went through, with the
    resource it charged (``rank`` compute, ``link`` transfer; ``other``: a wait that did not bind, a collective),
    its ms on the path and its exposed ms (SEGMENT_COLUMNS)."""
    events = with_layer(events)
    if xfers is None:
        xfers = transfers(events)
    steps = events[events["kind"].isin(["compute", "wait", "collective", "own", "sync", "post"])]
    if steps.empty:
        return pd.DataFrame(columns=CRITICAL_PATH_COLUMNS), pd.DataFrame(columns=SEGMENT_COLUMNS)
    origin = events.groupby(GROUP_KEYS, observed=True, sort=True)["start_ns"].min()
    width = int(events["rank"].max()) + 1
    el = _elements(events, xfers, origin, width, tol_ns)

    # Start each walk at the rank whose last blocking span ends last in the iteration.
    last = np.r_[np.nonzero(np.diff(el["gr"]))[0], len(el["gr"]) - 1]  # last element of each (g, rank)
    by_g = pd.DataFrame({"g": el["g"][last], "end": el["end"][last], "gr": el["gr"][last]})
    start = by_g.loc[by_g.groupby("g")["end"].idxmax()]
    cur_gr, t = start["gr"].to_numpy(np.int64).copy(), start["end"].to_numpy(np.int64).copy()
    walk_g = start["g"].to_numpy(np.int64)
    path_ns = t.copy()
    contributions: list[tuple[np.ndarray, ...]] = []
    active = np.ones(len(cur_gr), bool)
    for _ in range(4 * int(np.bincount(el["gr"]).max()) + 16):
        idx = np.searchsorted(el["key"], (cur_gr << _TIME_BITS) + t + tol_ns, side="right") - 1
        for _retry in range(4):  # the span must begin before the cursor, or the walk would not move back
            idx_c = np.clip(idx, 0, None)
            ok = active & (idx >= 0) & (el["gr"][idx_c] == cur_gr)
            back = ok & (el["start"][idx_c] >= t)
            if not back.any():
                break
            idx = np.where(back, idx - 1, idx)
        active = ok & (el["start"][idx_c] < t)
        if not active.any():
            break
        sel, e = np.nonzero(active)[0], idx_c[active]
        is_compute = el["kind"][e] == Element.COMPUTE
        dur_ms = np.where(is_compute, (el["end"][e] - el["start"][e]) / 1e6, el["link_ms"][e])
        contributions.append(
            (walk_g[sel], is_compute, el["rank"][e], el["link_src"][e], el["link_dst"][e], dur_ms, el["exposed_ms"][e])
        )
        next_gr = walk_g[sel] * width + el["next_rank"][e]
        next_t = el["next_t"][e]
        stuck = (next_gr == cur_gr[sel]) & (next_t >= t[sel])
        cur_gr[sel], t[sel] = next_gr, next_t
        active[sel[stuck]] = False
    groups = origin.index.to_frame(index=False)
    groups["g"] = np.arange(len(groups))
    names = ["g", "is_compute", "rank", "src", "dst", "ms", "exposed_ms"]
    if contributions:
        cols = [np.concatenate(c) for c in zip(*contributions, strict=True)]
        c = pd.DataFrame(dict(zip(names, cols, strict=True)))
    else:
        c = pd.DataFrame({name: [] for name in names})
    c = c.astype({"g": "int64", "is_compute": bool, "rank": "int64", "src": "int64", "dst": "int64"})
    segments = c.merge(groups, on="g", how="left")
    segments["resource"] = np.where(segments["is_compute"], "rank", np.where(segments["src"] >= 0, "link", "other"))
    segments["rank"] = np.where(segments["is_compute"], segments["rank"], -1)
    return _dense_path(events, xfers, groups, walk_g, path_ns, c), segments[SEGMENT_COLUMNS]


def _dense_path(events, xfers, groups, walk_g, path_ns, c) -> pd.DataFrame:
    total_exposed = c.groupby("g")["exposed_ms"].sum().reindex(walk_g).fillna(0.0).to_numpy(float)
    path = pd.DataFrame({"g": walk_g, "path_ms": path_ns / 1e6, "total_exposed": total_exposed})
    ranks = c[c["is_compute"].astype(bool)].groupby(["g", "rank"], as_index=False)["ms"].sum()
    links = c[~c["is_compute"].astype(bool)].groupby(["g", "src", "dst"], as_index=False)[["ms", "exposed_ms"]].sum()
    # Dense: every (iteration, rank of its case) and (iteration, link of its case), 0 ms when off the path.
    case_ranks = events[["case_id", "rank"]].drop_duplicates()
    case_links = xfers[["case_id", "src", "dst"]].drop_duplicates()
    dense_r = groups.merge(case_ranks, on="case_id").merge(ranks, on=["g", "rank"], how="left")
    dense_r = dense_r.assign(resource="rank", src=-1, dst=-1, exposed_ms=0.0)
    dense_l = groups.merge(case_links, on="case_id").merge(links, on=["g", "src", "dst"], how="left")
    dense_l = dense_l.assign(resource="link", rank=-1)
    out = pd.concat([dense_r, dense_l], ignore_index=True)
    out[["ms", "exposed_ms"]] = out[["ms", "exposed_ms"]].fillna(0.0)
    out = out.merge(path, on="g", how="left")
    other = out.groupby("g", as_index=False).agg(
        ms=("ms", "sum"),
        exposed_ms=("exposed_ms", "sum"),
        path_ms=("path_ms", "first"),
        total=("total_exposed", "first"),
    )
    other["ms"] = (other["path_ms"] - other["ms"]).clip(lower=0.0)
    other["exposed_ms"] = (other.pop("total") - other["exposed_ms"]).clip(lower=0.0)  # collectives: not a link
    other = groups.merge(other, on="g").assign(resource="other", rank=-1, src=-1, dst=-1)
    out = pd.concat([out, other], ignore_index=True).sort_values(["g", "resource", "rank", "src", "dst"])
    unwalked = out["path_ms"].isna()  # an iteration without spans: not traced, nothing on its path is known
    out.loc[unwalked, ["ms", "exposed_ms"]] = np.nan
    out = out.astype({"rank": "int64", "src": "int64", "dst": "int64"})
    return out[CRITICAL_PATH_COLUMNS].reset_index(drop=True)
