"""One clock for every rank of an imported job.

Traces of one host share its clock: each trace's times are its ``baseTimeNanoseconds`` plus its ``ts``, both on
that host's wall clock, so their offset is exactly 0. Across hosts the base times are wall clocks that may
disagree (NTP keeps them within milliseconds at best), so each other host is shifted by an offset found from the
ring itself: a block cannot be in hand before its sender posted it. For every transfer from a host whose clock
is known (rank 0's host first) to host h, ``recv_end + offset_h >= send_post + offset_known`` bounds offset_h
from below; every transfer from h back bounds it from above. The offset is the middle of that interval and the
residual its half-width (stored as ``clock_residual_ns``; the analyses attribute no difference smaller than
twice it). A host bounded on one side only is shifted the least that satisfies its transfers, and its residual
is that shift (how far its wall clock was off at least).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass(frozen=True, kw_only=True, slots=True)
class ClockFit:
    offsets_ns: dict[int, int]  # rank -> ns added to its times
    residual_ns: int
    method: str
    notes: tuple[str, ...] = field(default=())


def transfer_pairs(messages: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """The k-th send of rank a to b paired with the k-th receive of b from a: src, dst, send_post_ns, recv_end_ns
    (the send's post and the receiver's observation of the block, times as in the traces, before any offset)."""
    from ringbench.traces.evidence import match_messages

    columns = ["src", "dst", "send_post_ns", "recv_end_ns"]
    matched = match_messages(messages)
    both = matched[(matched["send_row"] >= 0) & (matched["recv_row"] >= 0)]
    if both.empty:
        return pd.DataFrame(columns=columns)
    post = [float(messages[int(r)].at[int(i), "post_ns"]) for r, i in zip(both["src"], both["send_row"], strict=True)]
    return pd.DataFrame({"src": both["src"].to_numpy(), "dst": both["dst"].to_numpy(), "send_post_ns": post,
                         "recv_end_ns": both["recv_obs_ns"].to_numpy(float)})[columns]  # fmt: skip


def align_clocks(hosts: dict[int, str], messages: dict[int, pd.DataFrame]) -> ClockFit:
    """Offsets per rank (0 for every rank on rank 0's host) and the residual bound, from the transfers
    (``messages``: per rank, exchanges.MESSAGE_COLUMNS)."""
    if len(set(hosts.values())) <= 1:
        return ClockFit(offsets_ns=dict.fromkeys(hosts, 0), residual_ns=0, method="one host: shared clock")
    pairs = transfer_pairs(messages)
    pairs = pairs.assign(src_host=pairs["src"].map(hosts), dst_host=pairs["dst"].map(hosts))
    known = {hosts[min(hosts)]: 0.0}
    residual, notes = 0.0, []
    todo = sorted(set(hosts.values()) - set(known))
    while todo:
        progress = False
        for host in list(todo):
            into = pairs[(pairs["dst_host"] == host) & pairs["src_host"].isin(known)]
            back = pairs[(pairs["src_host"] == host) & pairs["dst_host"].isin(known)]
            lower = (
                (into["send_post_ns"] + into["src_host"].map(known) - into["recv_end_ns"]).max() if len(into) else None
            )
            upper = (
                (back["recv_end_ns"] + back["dst_host"].map(known) - back["send_post_ns"]).min() if len(back) else None
            )
            if lower is None and upper is None:
                continue
            if lower is not None and upper is not None:
                offset, half = (lower + upper) / 2, abs(upper - lower) / 2
                if lower > upper:
                    notes.append(f"host {host}: its transfers disagree by {(lower - upper) / 1e6:.3f} ms")
            else:
                bound = lower if lower is not None else upper
                offset = max(bound, 0.0) if lower is not None else min(bound, 0.0)
                half = abs(offset)
                notes.append(f"host {host}: clock bounded on one side only (shifted {offset / 1e6:.3f} ms)")
            known[host] = float(offset)
            residual = max(residual, half)
            todo.remove(host)
            progress = True
        if not progress:
            notes.append(f"host(s) {', '.join(todo)}: no transfer with an aligned host; base times kept")
            known.update(dict.fromkeys(todo, 0.0))
            break
    offsets = {rank: int(np.rint(known[host])) for rank, host in hosts.items()}
    method = "profiler base times, aligned across hosts by send/recv bounds"
    return ClockFit(offsets_ns=offsets, residual_ns=int(np.ceil(residual)), method=method, notes=tuple(notes))


__all__ = ["ClockFit", "align_clocks", "transfer_pairs"]
