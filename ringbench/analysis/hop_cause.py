"""What a slow hop's evidence can and cannot separate: the link, or the sender's own code holding the send back.

A block reaches its receiver late when the link is slow *or* when the sender posted it late. The trace tells them
apart only when it holds the sender's post:

  held_back       the sender posted its receive and then, time later, its send on this hop (``post`` rows: time in
                  no op inside one exchange): its own code held the send back. That time is on the hop's
                  transfer, so the hop is what the ring waits on, but a faster link would not help.
  link_or_sender  the sends on this hop are not in the sender's trace (a thread the profiler did not follow posted
                  them): when they were posted is unknown, so a late post and a slow link look the same. A trace
                  that follows that thread (or with GPU kernels: NCCL's SendRecv kernel shows the transfer on the
                  device) or a probe of the link (``ringbench probe``) would tell.
  link            both posts are in the trace, on time: the transfer itself took longer.

``hop_cause(events, meta, src, dst)`` reads the record (``post`` rows; meta ``imported.unseen_sides``); a run's own
record posts every send itself, so its slow hops are links.
"""

from __future__ import annotations

import pandas as pd

HELD_SHARE = 0.5  # held-back posts explaining this share of the hop's extra time per iteration: the sender's code
CAUSES = ("link", "held_back", "link_or_sender")


def hop_cause(events: pd.DataFrame, meta, case_id, src: int, dst: int, extra_ms: float) -> tuple[str, str]:
    """(cause, what to say) of a slow hop src -> dst of a case (module doc); ``extra_ms``: the hop's extra time per
    iteration (straggler table)."""
    mine = events[(events["case_id"] == case_id) & (events["kind"] == "post")]
    held = mine[(mine["src"] == src) & (mine["dst"] == dst)]
    if len(held):
        per_iteration = ((held["end_ns"] - held["start_ns"]) / 1e6).groupby([held["repeat"], held["iteration"]]).sum()
        per_post = float(((held["end_ns"] - held["start_ns"]) / 1e6).median())
        if float(per_iteration.median()) >= HELD_SHARE * max(extra_ms, 0.0):
            return "held_back", (
                f"held back by rank {src}'s own code: it posted its sends on this hop {per_post:.3g} ms after the "
                f"exchange's first op ({float(per_iteration.median()):.3g} ms per iteration), so a faster link "
                "would not help; look at what runs between its receive's post and its send's"
            )
    unseen = (meta.get("imported") or {}).get("unseen_sides") or [] if hasattr(meta, "get") else []
    if any(int(s["src"]) == src and int(s["dst"]) == dst and s.get("side") == "send" for s in unseen):
        return "link_or_sender", (
            f"the link, or rank {src}'s own code posting its sends late: the sends on this hop are not in its trace "
            "(a thread the profiler did not follow posted them), so the trace cannot tell the two apart; a trace "
            "that follows that thread or holds GPU kernels (NCCL's SendRecv kernel times the transfer on the "
            "device), or a probe of the link (ringbench probe), would"
        )
    return "link", "both ends posted on time and the transfer itself took longer: the link"


__all__ = ["CAUSES", "hop_cause"]
