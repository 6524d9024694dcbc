"""The short ring's bytes: when a case that ran on a full ring would move fewer bytes on the short ring, how many.

The full ring (``sync``, ``double``) sends every K/V block around all N - 1 hops and every dK/dV accumulator home,
whatever the mask sees. The short ring (``sync-short``, ``double-short``; ringbench/engine/short_ring.py) sends a
block only as far as some rank's queries see it and stops once the window is covered: for a causal window of
W = S/8 on 8 contiguous ranks one hop per block instead of seven. The producer records what the short ring would
move for each case (cases ``short_ring_bytes``, from the plan's route); this module sets it beside what the case
moved (``bytes_moved``), one line per (mask, ranks, documents, layout) context:

    short ring: window:512 (8 ranks, contiguous): --buffer double-short would move 3.67 MB per iteration
    instead of 46.14 MB (0.08×; double), 2 ring steps instead of 8; a rank keeps up to 1 K/V block for the backward

The short ring keeps the blocks a rank saw for the backward (up to D, the route's depth): a window's one or two, but
N - 1 on a causal contiguous ring, where it trades O(S) memory for the bytes; the line says how many.

A context gets a line when the short ring would move at most SHORT_SHARE of the full ring's bytes and the run did
not already run it there (then the buffer comparison says what it did). Buffers are never switched for the user:
a window mask on ``--buffer double`` runs the full ring (docs/strategies.md, "Window masks and the short ring").
"""

from __future__ import annotations

import pandas as pd

from ringbench.fmt import number

SHORT_SHARE = 0.9  # a saving smaller than a tenth of the bytes is not worth a line
FULL_RINGS = ("sync", "double")
SHORT_RINGS = ("sync-short", "double-short")


def _mb(value: float) -> str:
    return f"{number(value / 1e6, '.2f')} MB"


def short_ring_lines(cases: pd.DataFrame, plans: dict | None = None) -> tuple[str, ...]:
    """The lines (module docstring), in the cases' order; () for records without the columns. ``plans``: meta.json's
    plans (case id -> the plan's predictions), for the short ring's depth."""
    if cases.empty or not {"mask", "world", "layout", "buffer", "bytes_moved", "short_ring_bytes"} <= set(cases):
        return ()
    table = cases.drop_duplicates("case_id").copy()
    for axis in ("docs", "layers"):  # older records lack them
        table[axis] = table[axis].astype(object).where(table[axis].notna(), "none") if axis in table else "none"
    keys = [k for k in ("mask", "world", "docs", "layout", "seq", "heads", "head_dim", "batch", "dtype", "layers")
            if k in table]  # everything the bytes depend on but the buffer  # fmt: skip
    several_seq = "seq" in table and table["seq"].nunique() > 1
    lines = []
    for values, group in table.groupby(keys, sort=False):
        context = dict(zip(keys, values, strict=True))
        line = _line(context, group, several_seq, plans or {})
        if line:
            lines.append(line)
    return tuple(lines)


def _line(context: dict, group: pd.DataFrame, several_seq: bool, plans: dict) -> str:
    if group["buffer"].isin(SHORT_RINGS).any():
        return ""  # the run has the short ring here: the buffer comparison says what it did
    full = group[group["buffer"].isin(FULL_RINGS) & group["bytes_moved"].notna() & group["short_ring_bytes"].notna()]
    if full.empty:
        return ""
    moved = float(full["bytes_moved"].median())
    short = float(full["short_ring_bytes"].iloc[0])
    if moved <= 0 or short > SHORT_SHARE * moved:
        return ""
    buffer = "double-short" if "double" in set(full["buffer"]) else "sync-short"
    ran = ", ".join(dict.fromkeys(full["buffer"].astype(str)))
    docs = f", docs {context['docs']}" if str(context.get("docs", "none")) != "none" else ""
    seq = f", S={int(context['seq'])}" if several_seq else ""
    where = f"{context['mask']} ({int(context['world'])} ranks{seq}{docs}, {context['layout']})"
    return (f"short ring: {where}: --buffer {buffer} would move {_mb(short)} per iteration instead of {_mb(moved)} "
            f"({number(short / moved, '.2f')}×; {ran}){_depth(plans.get(str(full['case_id'].iloc[0])), context)}")  # fmt: skip


def _depth(plan: dict | None, context: dict) -> str:
    """What else the short ring changes: the steps it stops after, the blocks a rank keeps for the backward (the
    full ring keeps none: the short ring trades memory for bytes when the mask sees far)."""
    depths = [layer.get("short_depth") for layer in (plan or {}).get("layers", [])]
    if not depths or any(d is None for d in depths):
        return ""
    depth, world = max(depths), int(context["world"])
    steps = f", {depth + 1} ring steps instead of {world}" if depth + 1 < world else ""
    return f"{steps}; a rank keeps up to {depth} K/V block{'s' if depth != 1 else ''} for the backward"


__all__ = ["SHORT_SHARE", "short_ring_lines"]
