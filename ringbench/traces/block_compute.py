"""The block computation of a ring, found from the ring's own structure rather than from op names.

A ring step is: post the exchange, compute on the block in hand, wait (double buffering), or post, wait, compute
(a blocking ring). So whatever the program calls its attention -- a ``record_function("my_block")`` range around
matmuls and a softmax, an SDPA op, a fused kernel -- the block computation is the outermost work on the ring
thread *between a step's post and its wait* (for a blocking ring: between a wait and the next post). The
*candidates* are the outermost spans on the ring thread that hold no exchange event (a post, a wait op, an
observed completion, a sync point): the user's ``record_function`` ranges, aten ops, and on a GPU the kernels the
ring thread launched there. The choice, in order:

1. ``--compute-pattern`` given: the outermost ops, ranges or kernels it matches (an override: the user knows).
2. Attention ops or kernels (rank_view.DEFAULT_COMPUTE_PATTERNS) among the candidates: the outermost candidates
   that are or hold one (a hint: ``record_function("attn")`` around SDPA is the user's block, the range counts).
3. Otherwise the structure: among the candidates between a post and its wait (else between a wait and the next
   post, else anywhere in the iterations), the family (a name with its numbers folded: ``block 3`` and ``block 4``
   are one) holding the most time. A ``record_function`` range is the user's own name for the block: it is taken
   alone when it holds at least half of that time. Aten ops are pieces of one computation (``aten::matmul``,
   ``aten::softmax``, ...): the families holding nine tenths of the time are taken together, and consecutive ones
   with no exchange event between them are one block computation (rank_view.merge_compute).

Each rank chooses from its own trace (``choose``); the importer then settles one choice for every rank
(``settle``): a rank that chose otherwise (a range only its slow code has) is rebuilt from its candidates with the
majority's. ``describe`` puts what was taken into words, so a user can check it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.traces.rank_view import COMPUTE_COLUMNS, attention_flops, outermost

CANDIDATE_COLUMNS = [*COMPUTE_COLUMNS, "family", "source", "hinted", "between"]
# Where a candidate lies in its step: after a post (before the wait: double buffering), after a wait or an observed
# completion and before the next post (a blocking ring), after the iteration's last wait (a double-buffered ring's
# last step, which posts nothing), or elsewhere in an iteration.
BETWEEN = ("post-wait", "wait-post", "after-wait", "other")
RANGE_SHARE = 0.5  # a record_function family holding this share of the pool's time is the block on its own
OPS_SHARE = 0.9  # else the op families holding this share of it, together
IGNORED = re.compile(r"^(?:ProfilerStep#|ringbench:(?:iteration|profiler|fwd step|bwd step)|autograd::engine::)")
NON_COMPUTE_KERNELS = re.compile(r"^nccl|^Memcpy|^Memset|^void at::native::(?:\w+::)?(?:vectorized_)?elementwise_"
                                 r"kernel<4, at::native::FillFunctor")  # fmt: skip


def family_of(name: str, source: str) -> str:
    """The name with what varies per call folded: digits in a range's name, template arguments of a kernel."""
    if source == "kernel":
        return re.split(r"[<(]", name, maxsplit=1)[0].strip() or name
    return re.sub(r"\d+", "#", name) if source == "range" else name


@dataclass(frozen=True, kw_only=True, slots=True)
class Choice:
    """What one rank (or the import) took as the block computation."""

    families: tuple[str, ...]  # the family names taken (one for a range or a hint holder; several ops)
    how: str  # "compute pattern" | "attention ops" | "record_function range" | "ops" | "kernels" | "none"
    where: str  # one of BETWEEN: where the choice was made

    @property
    def found(self) -> bool:
        return bool(self.families)


NONE = Choice(families=(), how="none", where="other")


def _between(starts: np.ndarray, breaks: dict[str, np.ndarray], iteration_of=None) -> np.ndarray:
    """Per candidate start: which exchange event came last before it and which comes next, in the same iteration
    (BETWEEN); ``iteration_of(times)``: iteration index of host times (None: one iteration)."""
    waits = np.concatenate([breaks["wait"], breaks.get("wait_op", [])])
    times = np.concatenate([breaks["post"], waits, breaks["other"]]).astype(np.int64)
    kinds = np.concatenate([np.full(len(breaks["post"]), 0), np.full(len(waits), 1),
                            np.full(len(breaks["other"]), 2)])  # fmt: skip
    order = np.argsort(times, kind="stable")
    times, kinds = times[order], kinds[order]
    if not len(times):
        return np.full(len(starts), BETWEEN[3], dtype=object)
    of = iteration_of if iteration_of is not None else (lambda t: np.zeros(len(t), np.int64))
    mine, theirs = of(np.asarray(starts, np.int64)), of(times)
    before = np.searchsorted(times, starts, side="right") - 1
    after = before + 1
    has_prev = (before >= 0) & (theirs[np.clip(before, 0, None)] == mine)
    has_next = (after < len(times)) & (theirs[np.clip(after, 0, len(times) - 1)] == mine)
    prev = np.where(has_prev, kinds[np.clip(before, 0, None)], 2)
    nxt = np.where(has_next, kinds[np.clip(after, 0, len(times) - 1)], 2)
    return np.where(prev == 0, BETWEEN[0], np.where(prev == 1, np.where(nxt == 0, BETWEEN[1], BETWEEN[2]),
                                                    BETWEEN[3]))  # fmt: skip


def candidates(host: pd.DataFrame, tid: int, breaks: dict[str, np.ndarray], hint: re.Pattern,
               kernels: pd.DataFrame | None = None, launches: pd.DataFrame | None = None,
               iteration_of=None) -> pd.DataFrame:  # fmt: skip
    """The outermost spans of the ring thread ``tid`` that hold no exchange event (``breaks``: post / wait / other
    times; ``wait`` holds the observed completions, ``wait_op`` the wait ops), with their family, source (range, op, kernel), whether they are or hold an attention op (``hint``) and
    where they lie in the step (``iteration_of``: _between). On a GPU, the kernels (not NCCL's, no copies) launched
    from there."""
    mine = host[
        (host["tid"] == tid) & ~host["name"].str.startswith(_comm_prefixes()) & ~host["name"].str.match(IGNORED)
    ]
    starts, ends = mine["start_ns"].to_numpy(np.int64), mine["end_ns"].to_numpy(np.int64)
    # What the rank does itself (a post, a wait op, a barrier) never lies inside its compute; an observed completion
    # (a wait returning) may lie inside an op that another thread's transfer outlasted, but not inside the user's
    # range around the block.
    acts = np.sort(np.concatenate([breaks.get("post", []), breaks.get("wait_op", []), breaks.get("other", [])]))
    every = np.sort(np.concatenate(list(breaks.values()))) if breaks else np.empty(0, np.int64)
    ranged = (mine["cat"] == "user_annotation").to_numpy()
    holds = np.where(ranged, _count_inside(every, starts, ends), _count_inside(acts, starts, ends)) > 0
    free = outermost(mine[~holds])
    hinted_ops = host[(host["tid"] == tid) & host["name"].str.contains(hint)]
    source = np.where(free["cat"].to_numpy() == "user_annotation", "range", "op")
    flops = attention_flops(free["name"], free["input_dims"])
    frame = pd.DataFrame({"order_ns": free["start_ns"].to_numpy(np.int64), "start_ns": free["start_ns"].to_numpy(
        np.int64), "end_ns": free["end_ns"].to_numpy(np.int64), "tid": free["tid"].to_numpy(np.int64),
        "flops": flops, "name": free["name"].to_numpy(object), "source": source})  # fmt: skip
    frame["hinted"] = _holds_any(frame, hinted_ops)
    if len(hinted_ops):  # an attention op's FLOPs count for the range that holds it
        frame["flops"] = np.maximum(frame["flops"].to_numpy(float), _held_flops(frame, hinted_ops))
    if kernels is not None and len(kernels) and launches is not None and len(launches):
        frame = _kernels_instead(frame, kernels, launches, tid, hint)
    frame["family"] = [family_of(n, s) for n, s in zip(frame["name"], frame["source"], strict=True)]
    frame["between"] = _between(frame["order_ns"].to_numpy(np.int64), breaks, iteration_of) if len(frame) else []
    return frame[CANDIDATE_COLUMNS].sort_values("order_ns", kind="stable").reset_index(drop=True)


def _count_inside(times: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many of the sorted ``times`` lie strictly inside each (start, end)."""
    times = np.asarray(times, np.int64)
    return np.searchsorted(times, ends, side="left") - np.searchsorted(times, starts, side="right")


def _comm_prefixes() -> tuple[str, ...]:
    from ringbench.traces.exchanges import COMM_PREFIXES

    return COMM_PREFIXES


def _holds_any(frame: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per candidate (one thread, not overlapping): whether it is or holds one of ``ops``."""
    if frame.empty or ops.empty:
        return np.zeros(len(frame), bool)
    starts, ends = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
    slot = np.searchsorted(starts, ops["start_ns"].to_numpy(np.int64), side="right") - 1
    inside = (slot >= 0) & (ops["end_ns"].to_numpy(np.int64) <= ends[np.clip(slot, 0, None)])
    out = np.zeros(len(frame), bool)
    out[slot[inside]] = True
    return out


def _held_flops(frame: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    starts = frame["start_ns"].to_numpy(np.int64)
    inner = outermost(ops)
    flops = attention_flops(inner["name"], inner["input_dims"])
    slot = np.searchsorted(starts, inner["start_ns"].to_numpy(np.int64), side="right") - 1
    out = np.zeros(len(frame))
    ok = slot >= 0
    np.add.at(out, slot[ok], flops[ok])
    return out


def _kernels_instead(frame: pd.DataFrame, kernels: pd.DataFrame, launches: pd.DataFrame, tid: int,
                     hint: re.Pattern) -> pd.DataFrame:  # fmt: skip
    """On a GPU the work is the kernels: those launched from inside a candidate, timed by the kernel, ordered by
    the launch, carrying the candidate's family when it is a range (the user's name for them)."""
    launch = launches[launches["tid"] == tid].drop_duplicates("correlation").set_index("correlation")
    work = kernels[~kernels["name"].str.contains(NON_COMPUTE_KERNELS) & kernels["correlation"].isin(launch.index)]
    if work.empty:
        return frame.iloc[0:0]
    order = launch["start_ns"].reindex(work["correlation"]).to_numpy(np.int64)
    starts, ends = frame["start_ns"].to_numpy(np.int64), frame["end_ns"].to_numpy(np.int64)
    slot = np.searchsorted(starts, order, side="right") - 1
    inside = (slot >= 0) & (order <= ends[np.clip(slot, 0, None)])
    holder = frame.iloc[np.clip(slot, 0, None)]
    names = np.where(inside & (holder["source"].to_numpy() == "range"), holder["name"].to_numpy(object),
                     work["name"].to_numpy(object))  # fmt: skip
    out = pd.DataFrame({"order_ns": order, "start_ns": work["start_ns"].to_numpy(np.int64),
                        "end_ns": work["end_ns"].to_numpy(np.int64), "tid": tid, "flops": 0.0, "name": names,
                        "source": np.where(names == work["name"].to_numpy(object), "kernel", "range"),
                        "hinted": work["name"].str.contains(hint).to_numpy() | (inside & holder["hinted"].to_numpy())})  # fmt: skip
    return out[inside]


def choose(frame: pd.DataFrame, override: bool) -> Choice:
    """This rank's choice from its candidates (module doc); ``override``: --compute-pattern was given, so
    ``hinted`` marks the spans it matched."""
    if frame.empty:
        return NONE
    if frame["hinted"].any():
        families = tuple(dict.fromkeys(frame.loc[frame["hinted"], "family"]))
        found = set(frame.loc[frame["hinted"], "between"])
        return Choice(families=families, how="compute pattern" if override else "attention ops",
                      where=next(w for w in BETWEEN if w in found))  # fmt: skip
    if override:
        return NONE
    for where in BETWEEN:
        pool = frame[frame["between"] == where]
        if where in BETWEEN[2:] and "iteration" in pool:  # outside the ring's steps only what recurs like them
            recurs = pool.groupby(["family", "iteration"]).size().groupby(level="family").median() >= 2
            pool = pool[pool["family"].map(recurs).fillna(False).astype(bool)]
        if len(pool):
            break
    ms = (pool["end_ns"] - pool["start_ns"]).groupby(pool["family"]).sum().sort_values(ascending=False)
    if pool.empty or ms.sum() <= 0:
        return NONE
    top = ms.index[0]
    is_range = (pool.loc[pool["family"] == top, "source"] == "range").all()
    if is_range and ms.iloc[0] >= RANGE_SHARE * ms.sum():
        return Choice(families=(top,), how="record_function range", where=where)
    kernel = (pool["source"] == "kernel").any()
    ops = ms[pool.drop_duplicates("family").set_index("family")["source"].reindex(ms.index) != "range"]
    ops = ops[ops > 0]
    if ops.empty:
        return Choice(families=(top,), how="record_function range", where=where)
    covered = ops.cumsum() / ops.sum()
    families = tuple(ops.index[: int(np.searchsorted(covered.to_numpy(), OPS_SHARE)) + 1])
    return Choice(families=families, how="kernels" if kernel else "ops", where=where)


def select(frame: pd.DataFrame, choice: Choice) -> pd.DataFrame:
    """The candidates a choice takes, as compute ops (COMPUTE_COLUMNS). A range or hint family counts wherever
    it lies in an iteration (the last step of a double-buffered ring computes after its last wait); op families
    only where the choice was made and in the steps beside it (not the work before the ring or after it)."""
    if not choice.found or frame.empty:
        return pd.DataFrame(columns=COMPUTE_COLUMNS)
    taken = frame["family"].isin(choice.families)
    if choice.how in ("ops", "kernels"):
        taken &= frame["between"] != BETWEEN[3]
    return frame.loc[taken, COMPUTE_COLUMNS].reset_index(drop=True)


def settle(choices: list[Choice]) -> Choice:
    """One choice for every rank: the most common among the ranks that found one (ties: the first rank's)."""
    found = [c for c in choices if c.found]
    if not found:
        return NONE
    counts = Counter(found)
    return max(found, key=lambda c: counts[c])  # max keeps the first of equal counts


def describe(choice: Choice, per_rank: dict[int, float], share: float) -> str:
    """What was taken as the block computation, in one sentence (``per_rank``: spans per iteration, median;
    ``share``: of the median rank's iteration time)."""
    names = ", ".join(f"`{f}`" for f in choice.families[:4]) + (" ..." if len(choice.families) > 4 else "")
    how = {"compute pattern": "matched by --compute-pattern", "attention ops": "attention ops, or the ranges "
           "holding them", "record_function range": "a record_function range", "ops": "the ops",
           "kernels": "the kernels launched"}[choice.how]  # fmt: skip
    where = {
        "post-wait": "between each step's post and its wait",
        "wait-post": "between each wait and the next post (a blocking ring)",
        "after-wait": "after the ring's waits",
        "other": "in the iterations (no step of the ring holds work)",
    }[choice.where]
    counts = sorted(set(per_rank.values()))
    if len(counts) == 1:
        count = f"{counts[0]:g} per iteration on every rank"
    else:
        count = "per iteration " + ", ".join(f"rank {r}: {n:g}" for r, n in sorted(per_rank.items())[:8])
    return (f"compute taken: {names} ({how}, found {where}); {count}; {share:.0%} of the step (median rank); "
            "if that is not the block computation, pass --compute-pattern REGEX naming it")  # fmt: skip


def annotations_seen(names) -> list[str]:
    """The user's record_function names among ``names`` (numbers folded, profiler and ringbench markers and
    communication left out), most frequent first."""
    folded = Counter(family_of(str(n), "range") for n in names if not IGNORED.match(str(n))
                     and not str(n).startswith(_comm_prefixes()))  # fmt: skip
    return [name for name, _ in folded.most_common(8)]


__all__ = [
    "BETWEEN",
    "CANDIDATE_COLUMNS",
    "NONE",
    "Choice",
    "annotations_seen",
    "candidates",
    "choose",
    "describe",
    "family_of",
    "select",
    "settle",
]
