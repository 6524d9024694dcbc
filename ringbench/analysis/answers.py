"""Answers first: the few lines that end a run and head every report.

A sweep is run to answer questions: is zigzag faster than contiguous here, how much does double buffering hide,
which rank or hop holds the ring back. ``answers(analysis)`` gives, one line each:

  headline     the most important finding (a straggler, else the largest difference a varied axis made)
  comparisons  for every sweep axis that varied, what it was run for: the ratio of median step times between
               cases that differ only in that axis, with its interval, e.g. "layout: zigzag 1.45x faster than
               contiguous (1.39-1.51), causal, 4 ranks"; "double hides 64% of the communication"
  winners      when the strategy varied: the fastest strategy per context (analysis/strategies.py), e.g.
               "strategy (S=4096): hybrid:2 (double, heads-first) fastest, 140.7 ms; ring 1.10x slower"
  straggler    the culprit with its case and cost, "none" (in the cases that could be judged), or "inconclusive"
  balance      per mask whose layouts were compared (or that has documents or a window): which layout leaves which
               rank with how much more than the mean work (the plan's prediction, with the measured compute beside
               it), e.g. "causal-document (8 ranks): zigzag leaves rank 5 with 1.90× the mean work (measured
               1.85×); doc-balanced 1.04× (1.06×)"
  short ring   per context that ran on a full ring: what the short ring (--buffer double-short) would move
               instead, when it is less (analysis/short_ring_bytes.py), e.g. "short ring: window:512 (8 ranks,
               contiguous): --buffer double-short would move 3.67 MB per iteration instead of 46.14 MB (0.08×; double),
               2 ring steps instead of 8; a rank keeps up to 1 K/V block for the backward"
  caveats      emulation, oversubscribed cores, faults, unchecked numerics: one line
  next         the command to run next

Ratios. Within one *context* (the cases that agree on every other axis), the ratio is median(step of the slower
value) / median(step of the faster one) over timed iterations, and its interval the 5th-95th percentile of the
same ratio over 1000 seeded bootstrap resamples of each side's iterations. Only contexts whose step times can be
trusted count (no saturated emulation, no oversubscribed real compute, enough iterations: analysis/confidence.py);
with several, the line gives their geometric mean and the range of the per-context ratios.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ringbench.analysis.short_ring_bytes import short_ring_lines
from ringbench.figures.metrics import step_times
from ringbench.fmt import number
from ringbench.record.schema import CASE_AXES

AXES = tuple(axis for axis in CASE_AXES if axis != "backward")
RESAMPLES = 1000


@dataclass(frozen=True, kw_only=True, slots=True)
class Comparison:
    """What one varied axis did: ``faster`` beat ``slower`` by ``ratio`` (>= 1) in ``contexts`` contexts."""

    axis: str
    faster: str
    slower: str
    ratio: float
    low: float
    high: float
    contexts: int
    context: str  # the other axes, when they are the same in every context compared
    note: str = ""  # e.g. what double buffering hid
    untrusted: int = 0  # contexts that had both values but whose step times could not be compared

    @property
    def scope(self) -> str:
        """What the ratio covers, when it is not every context that ran both values (else "")."""
        if not self.untrusted:
            return ""
        total = self.contexts + self.untrusted
        where = f" ({self.context})" if self.context else ""
        return f"only the {self.contexts} of {total} contexts whose timings can be compared{where}"

    def line(self) -> str:
        spread = "range" if self.contexts > 1 else "90% interval"
        where = f", {self.context}" if self.context else ""
        over = f" over {self.contexts} contexts" if self.contexts > 1 else ""
        if self.ratio < 1.005:
            text = (
                f"{self.axis}: {self.faster} and {self.slower} equally fast "
                f"({spread} {_x(self.low)}–{_x(self.high)}{over})"
            )
        else:
            text = (
                f"{self.axis}: {self.faster} {_x(self.ratio)} faster than {self.slower} "
                f"({spread} {_x(self.low)}–{_x(self.high)}{over}){where}"
            )
        if self.untrusted:
            text += f"; {self.untrusted} other context(s) not compared (their timings cannot be trusted)"
        return text + (f"; {self.note}" if self.note else "")


@dataclass(frozen=True, kw_only=True, slots=True)
class Answers:
    headline: str
    comparisons: tuple[Comparison, ...]
    straggler: str
    caveats: str
    next_step: str
    winners: tuple[str, ...] = ()  # the fastest strategy per context, one line each (a run that varied it)
    balance: tuple[str, ...] = ()
    short_ring: tuple[str, ...] = ()  # full-ring cases the short ring would move fewer bytes for (short_ring.py)

    def lines(self) -> list[str]:
        """The block, one line each, in the order a reader needs them."""
        lines = [self.headline, *self.winners, *(c.line() for c in self.comparisons), f"straggler: {self.straggler}",
                 *self.balance, *self.short_ring]  # fmt: skip
        if self.caveats:
            lines.append(f"caveats: {self.caveats}")
        lines.append(f"next: {self.next_step}")
        return lines

    def document(self) -> dict:
        """The JSON form (``--json``)."""
        return {
            "headline": self.headline,
            "comparisons": [
                {
                    "axis": c.axis,
                    "faster": c.faster,
                    "slower": c.slower,
                    "ratio": c.ratio,
                    "low": c.low,
                    "high": c.high,
                    "contexts": c.contexts,
                    "context": c.context,
                    "note": c.note,
                    "untrusted_contexts": c.untrusted,
                    "line": c.line(),
                }
                for c in self.comparisons
            ],
            "winners": list(self.winners),
            "balance": list(self.balance),
            "short_ring": list(self.short_ring),
            "straggler": self.straggler,
            "caveats": self.caveats,
            "next": self.next_step,
        }


def _x(ratio: float) -> str:
    return f"{number(ratio, '.2f', missing='?')}×"


def varied_axes(cases: pd.DataFrame) -> list[str]:
    """The sweep axes with more than one value among the cases, in the record's axis order."""
    return [axis for axis in AXES if axis in cases and cases[axis].astype(str).nunique() > 1]


UNITS = {"world": "{} ranks", "seq": "S={}", "heads": "{} heads", "head_dim": "D={}", "batch": "B={}",
         "order": "order {}"}  # fmt: skip


def case_labels(cases: pd.DataFrame) -> dict[str, str]:
    """A short label per case: the values of the varied axes only (the full id stays in tables and tooltips)."""
    distinct = cases.drop_duplicates("case_id")
    varied = varied_axes(distinct)
    labels = {}
    for row in distinct.to_dict("records"):
        parts = [UNITS.get(axis, "{}").format(row[axis]) for axis in varied]
        labels[str(row["case_id"])] = " · ".join(parts) or str(row.get("kernel", row["case_id"]))
    return labels


def _ratio_interval(slow: np.ndarray, fast: np.ndarray, seed: int) -> tuple[float, float, float]:
    from ringbench.figures.bootstrap import ratio_interval

    return ratio_interval(slow, fast, resamples=RESAMPLES, seed=seed, confidence=0.9)


def compare_axis(axis: str, cases: pd.DataFrame, samples: pd.DataFrame, judged: set[str], overlap: dict) -> list:
    """The comparisons one varied axis makes: each other value against the axis's first value (as swept)."""
    cases = cases.drop_duplicates("case_id")
    others = [a for a in AXES if a in cases and a != axis]
    values = list(dict.fromkeys(cases[axis].astype(str)))
    per_case = {cid: frame["step_ms"].to_numpy(float) for cid, frame in samples.groupby("case_id")}
    out = []
    base = values[0]
    for value in values[1:]:
        ratios, lows, highs, contexts, untrusted = [], [], [], [], 0
        for _, group in cases.groupby(others, dropna=False, sort=False):
            pick = {str(v): str(cid) for v, cid in zip(group[axis].astype(str), group["case_id"], strict=True)}
            if base not in pick or value not in pick:
                continue
            if not {pick[base], pick[value]} <= judged:
                untrusted += 1
                continue
            a, b = per_case.get(pick[base]), per_case.get(pick[value])
            if a is None or b is None or not len(a) or not len(b):
                continue
            seed = len(ratios)
            ratio, low, high = _ratio_interval(b, a, seed)  # value over base: > 1 means base was faster
            ratios.append(ratio)
            lows.append(low)
            highs.append(high)
            contexts.append(group.iloc[0])
        if not ratios:
            continue
        mean = float(np.exp(np.mean(np.log(ratios))))
        low, high = (lows[0], highs[0]) if len(ratios) == 1 else (min(ratios), max(ratios))
        faster, slower = (base, value) if mean >= 1 else (value, base)
        if mean < 1:
            mean, low, high = 1 / mean, 1 / high, 1 / low
        note = ""
        hidden = overlap.get("double")
        if axis == "buffer" and "double" in (faster, slower) and hidden is not None and hidden == hidden:
            note = f"double hides {number(100 * overlap['double'], '.0f')}% of the communication"
        out.append(Comparison(axis=axis, faster=faster, slower=slower, ratio=mean, low=low, high=high,
                              contexts=len(ratios), context=_shared_context(contexts, others), note=note,
                              untrusted=untrusted))  # fmt: skip
    return out


def _shared_context(rows: list[pd.Series], others: list[str]) -> str:
    """The other axes' values that every compared context shares, in a few words."""
    if not rows:
        return ""
    frame = pd.DataFrame(rows)
    words = []
    for axis in ("mask", "world", "kernel", "buffer", "layout", "dtype"):
        if axis in others and axis in frame and frame[axis].astype(str).nunique() == 1:
            value = frame[axis].iloc[0]
            words.append((f"{value} rank" + ("s" if int(value) != 1 else "")) if axis == "world" else str(value))
    return ", ".join(words)


def answers(analysis, run_dir: str | None = None) -> Answers:
    """The answers block of an analysed run (analysis.findings.RunAnalysis)."""
    from ringbench.analysis.findings import label_line, straggler_sentence

    run = analysis.run
    cases = run.cases.drop_duplicates("case_id") if len(run.cases) else run.cases
    summary = analysis.summary
    judged = set(summary.loc[summary["confidence"] == "conclusive", "case_id"].astype(str)) if len(summary) else set()
    comparable = _comparable(analysis.confidence)
    samples = step_times(run.events) if len(run.events) else pd.DataFrame(columns=["case_id", "step_ms"])
    overlap = {}
    if len(analysis.overlap_buffers):
        overlap = dict(zip(analysis.overlap_buffers["buffer"], analysis.overlap_buffers["overlap_efficiency"],
                           strict=True))  # fmt: skip
    comparisons = []
    for axis in varied_axes(cases) if len(cases) else []:
        if axis != "strategy":  # a strategy comes with its own buffer and placement: compared by strategy_winners
            comparisons += compare_axis(axis, cases, samples, comparable, overlap)
    comparisons.sort(key=lambda c: -c.ratio)
    winners = _winners(cases, samples, comparable)

    top = analysis.headline()
    labels = case_labels(cases) if len(cases) else {}
    world_one = len(cases) and (cases["world"].astype(int) == 1).all()
    material = top is not None and _cost_share(top) >= MATERIAL_SHARE
    if world_one:
        straggler = "not applicable (1 rank)"
    elif top is not None:
        straggler = _straggler_line(top, labels.get(str(top["case_id"]), str(top["case_id"])), len(summary) > 1)
    elif straggler_sentence(None, analysis):
        judged_count = len(judged)
        straggler = f"none (in {judged_count} case(s) that could be judged)" if judged_count < len(summary) else "none"
    else:
        straggler = "inconclusive: no case could be judged (see caveats)"

    if material:
        headline = (
            f"{_culprit(top)} {_holds(top)} the ring back: costs {number(top['cost_ms'], '.1f')} ms per iteration "
            f"({number(100 * _cost_share(top), '.0f')}% of the step)"
        )
    elif len(winners):
        top_win = winners.sort_values("margin", ascending=False).iloc[0]
        headline = (f"{top_win['strategy']} is the fastest strategy"
                    + (f" ({top_win['context']})" if top_win["context"] else "")
                    + f", {_x(top_win['margin'])} ahead of {top_win['runner_up']}")  # fmt: skip
    elif comparisons:
        best = comparisons[0]
        scope = f"; {best.scope}" if best.scope else ""
        headline = f"{best.faster} is {_x(best.ratio)} faster than {best.slower} ({best.axis}{scope})"
    elif world_one:
        headline = "1 rank: compute only (no ring to measure)"
    elif len(summary) and not judged:
        headline = "Inconclusive: no case could be judged, so nothing is named (the caveats say why)"
    else:
        fracs = summary["exposed_comm_frac"].dropna() if len(summary) else pd.Series(dtype=float)
        share = f"{number(100 * fracs.median(), '.1f')}%" if len(fracs) else "n/a"
        if top is not None:  # a culprit whose cost the overlap hides: name it, and say it costs (almost) nothing
            headline = (
                f"{_culprit(top)} is {number(top['ratio'], '.2f')}× its peers but hidden behind compute (costs "
                f"{number(top['cost_ms'], '.1f')} ms per iteration); exposed communication {share} of step time"
            )
        else:
            headline = f"No straggler found; exposed communication {share} of step time"

    caveats = _caveats(analysis, label_line(analysis))
    balance = balance_lines(analysis)
    target = run_dir or str(run.path)
    if len(summary) and not judged:
        next_step = _next_when_unjudged(analysis)
    else:
        next_step = f"ringbench report {target}   (then open reports/<run-id>/report.html)"
    return Answers(headline=headline, comparisons=tuple(comparisons), straggler=straggler, caveats=caveats,
                   next_step=next_step, winners=tuple(winners["line"]) if len(winners) else (),
                   balance=balance, short_ring=short_ring_lines(cases, run.meta.plans) if len(cases) else ())  # fmt: skip


def _winners(cases: pd.DataFrame, samples: pd.DataFrame, comparable: set[str]) -> pd.DataFrame:
    from ringbench.analysis.strategies import strategy_winners

    if not len(cases) or "strategy" not in varied_axes(cases) or samples.empty:
        return pd.DataFrame()
    medians = samples.groupby("case_id")["step_ms"].median()
    return strategy_winners(cases, medians, comparable)


def _structured(mask: str) -> bool:
    """A mask with documents or a window (its balance is worth a line even without a layout comparison)."""
    return "document" in mask or "window" in mask


def balance_lines(analysis) -> tuple[str, ...]:
    """One line per (mask, ranks, documents) context whose layouts were compared or whose mask has documents or a
    window: the layouts from most to least unbalanced, the worst with its busiest rank (module docstring)."""
    cases = analysis.run.cases
    balance = analysis.balance_cases
    if cases.empty or balance.empty or "layout" not in cases:
        return ()
    axes = cases.drop_duplicates("case_id")[["case_id", "mask", "layout", "world", "docs"]].copy()
    axes["docs"] = axes["docs"].astype(object).where(axes["docs"].notna(), "none").astype(str)  # old records: no docs
    axes["case_id"] = axes["case_id"].astype(str)
    table = axes.merge(balance.astype({"case_id": str}).drop(columns="world"), on="case_id")
    table = table[(table["world"].astype(int) > 1) & table["predicted_imbalance"].notna()]
    lines = []
    for (mask, world, docs), group in table.groupby(["mask", "world", "docs"], sort=False):
        if group["layout"].nunique() < 2 and not _structured(str(mask)):
            continue
        per_layout = group.groupby("layout", sort=False).agg(
            predicted=("predicted_imbalance", "first"), measured=("imbalance", "median"),
            busiest=("busiest_rank", "first"),
        ).sort_values("predicted", ascending=False)  # fmt: skip
        parts = []
        for n, (layout, row) in enumerate(per_layout.iterrows()):
            measured = f"measured {_x(row['measured'])}" if row["measured"] == row["measured"] else "not traced"
            if n == 0:
                parts.append(f"{layout} leaves rank {int(row['busiest'])} with {_x(row['predicted'])} the mean work "
                             f"({measured})")  # fmt: skip
            else:
                parts.append(f"{layout} {_x(row['predicted'])} ({measured})")
        where = f"{mask} ({int(world)} ranks" + (f", docs {docs}" if docs != "none" else "") + ")"
        lines.append(f"balance: {where}: " + "; ".join(parts))
    return tuple(lines)


def _next_when_unjudged(analysis) -> str:
    """The fix of the reason that kept most cases from being judged (REASONS' third field), in one line."""
    from collections import Counter

    from ringbench.analysis.confidence import MIN_ITERATIONS, REASONS

    confidence = analysis.confidence
    counts = Counter(code for codes in confidence.get("reason_codes", ()) for code in (codes or ()))
    if not counts:
        return "ringbench analyze --json RUN_DIR   (nothing here could be judged; its inconclusive_reasons say why)"
    code = counts.most_common(1)[0][0]
    what, _, fix = REASONS[code]
    if code == "iterations" and analysis.run.meta.get("source") == "profiler":
        fix = f"capture {MIN_ITERATIONS} or more profiler steps per rank (a torch.profiler schedule) and import again"
    return f"{fix}   (nothing here could be judged: {what})"


MATERIAL_SHARE = 0.03  # a culprit heads the answers when it costs at least this share of its case's step


def _cost_share(row) -> float:
    cost, step = float(row.get("cost_ms") or 0.0), float(row.get("step_ms") or 0.0)
    return cost / step if step > 0 and cost == cost else 0.0


def _straggler_line(row, label: str, several: bool) -> str:
    from ringbench.analysis.findings import tied_names

    where = f" in {label}" if several else ""
    ratio = number(row["ratio"], ".2f")
    if row["straggler_kind"] == "compute":
        what = f"{ratio}× the other ranks' own time per unit of work"
    else:
        what = f"transfer {ratio}× the other hops' per byte (upstream waits excluded; no rank blamed)"
    cost = number(row["cost_ms"], ".1f")
    hidden = " (hidden behind compute)" if _cost_share(row) < MATERIAL_SHARE else ""
    alone = "; equally to blame: fixing one alone does not help" if tied_names(row) else ""
    together = " together" if tied_names(row) else ""
    return f"{_culprit(row)}{where}: {what}{alone}; costs the ring {cost} ms per iteration{together}{hidden}"


# Reasons that spoil the step times themselves (not only the attribution of a straggler): such cases are not compared.
TIMING_REASONS = ("saturated", "oversubscribed", "iterations")


def _comparable(confidence: pd.DataFrame) -> set[str]:
    """Cases whose step times can be compared: none of TIMING_REASONS applies (untraced or clock caveats do not
    change a step time measured on one host)."""
    if confidence is None or confidence.empty:
        return set()
    keep = [not set(codes or ()) & set(TIMING_REASONS) for codes in confidence["reason_codes"]]
    return set(confidence.loc[keep, "case_id"].astype(str))


def _holds(row) -> str:
    from ringbench.analysis.findings import tied_names

    return "hold" if tied_names(row) else "holds"


def _culprit(row) -> str:
    from ringbench.analysis.findings import tied_names

    tied = tied_names(row).replace("->", "→")
    if row["straggler_kind"] == "compute":
        return f"ranks {tied} (compute)" if tied else f"rank {int(row['straggler_rank'])} (compute)"
    if tied:
        return f"hops {tied} (links)"
    cause, src = row.get("hop_cause"), int(row["slow_hop_src"])
    kind = {"held_back": f"held back by rank {src}'s code",
            "link_or_sender": f"link, or rank {src}'s code: the trace cannot tell"}.get(cause, "link")  # fmt: skip
    return f"hop {src} → {int(row['slow_hop_dst'])} ({kind})"


def _caveats(analysis, label: str | None) -> str:
    parts = []
    if label:
        parts.append(label.split(";")[0])
    summary = analysis.summary
    unjudged = int((summary["confidence"] == "inconclusive").sum()) if len(summary) else 0
    if unjudged:
        parts.append(f"{unjudged} of {len(summary)} case(s) could not be judged (analyze says why)")
    if analysis.faults:
        parts.append("injected faults: " + ", ".join(analysis.faults))
    if analysis.worst_error.empty:
        parts.append("numerics not checked")
    elif not bool(analysis.worst_error.iloc[0]["passed"]):
        parts.append("a case FAILED its numerical check")
    return "; ".join(parts)


__all__ = ["Answers", "Comparison", "answers", "case_labels", "varied_axes"]
