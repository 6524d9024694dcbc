"""Three views of a Comparison: a rich table (terminal), Markdown (PR comment) and a JSON document (`--json`).

All three say, next to every change, whether it is significant, and label emulated timings as such.
"""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from ringbench.fmt import json_value, native, p_text
from ringbench.gate.compare import CaseComparison, Comparison
from ringbench.gate.samples import MATCH_FIELDS, CaseSamples, case_label, varying_fields
from ringbench.gate.stats import smallest_p_value
from ringbench.gate.verdict import Verdict, describe_change

JSON_FORMAT = "ringbench-compare"
JSON_VERSION = 1

_STYLE = {
    Verdict.REGRESSION: "bold red",
    Verdict.IMPROVEMENT: "bold green",
    Verdict.NO_CHANGE: "",
    Verdict.NO_DATA: "yellow",
    Verdict.TOO_FEW: "yellow",
}


def _kind(side) -> str:
    """What a side is, in words: a SIMULATED or EMULATED record says so wherever its numbers appear."""
    if side.kind == "run" and side.meta.get("simulated"):
        return "SIMULATED run"
    if side.kind == "run" and side.emulated:
        return "EMULATED run"
    return side.kind


def _fields(comparison: Comparison) -> tuple[str, ...]:
    everything = [c.axes for c in comparison.cases] + [
        c.axes for c in (*comparison.only_baseline, *comparison.only_current)
    ]
    return varying_fields(everything)


def _label(comparison: Comparison, axes) -> str:
    return case_label(axes, _fields(comparison))


def _interval(case_or_summary) -> str:
    return f"[{case_or_summary.ci_low:.3f}, {case_or_summary.ci_high:.3f}]"


def _p(case: CaseComparison, alpha: float) -> str:
    return f"{p_text(case.p_value, alpha)} ({case.unit})"


def _n(case: CaseComparison) -> str:
    return f"{case.n_baseline}/{case.n_current} ({case.repeats_baseline}/{case.repeats_current} rep)"


def headline(comparison: Comparison) -> str:
    """One line: PASS/FAIL, how many cases regressed, under which settings."""
    config = comparison.config
    rule = f"slowdown > {config.max_regression:.0%} with p < {config.alpha:g}"
    if comparison.regressed:
        return f"FAIL: {comparison.summary.regressions} of {comparison.summary.n_cases} cases regressed ({rule})"
    if comparison.too_few:
        others = comparison.summary.n_cases - comparison.too_few
        return (
            f"INCONCLUSIVE: {comparison.too_few} of {comparison.summary.n_cases} cases have too few samples to "
            f"reach p < {config.alpha:g} ({min_samples(config.alpha)} or more iterations per side are needed)"
            + (f"; none of the other {others} regressed" if others else "")
        )
    return f"PASS: no case regressed ({rule}; {comparison.summary.n_cases} cases compared)"


def min_samples(alpha: float) -> int:
    """The fewest samples per side (equal sizes) at which the two-sided test can reach p < alpha."""
    n = 1
    while smallest_p_value(n, n) >= alpha:
        n += 1
    return n


def summary_line(comparison: Comparison) -> str:
    summary = comparison.summary
    level = f"{comparison.config.confidence:.0%} CI"
    change = describe_change(summary.geomean_ratio, summary.significant)
    return (
        f"geometric mean ratio {summary.geomean_ratio:.3f} {_interval(summary)} ({level}) over {summary.n_cases} "
        f"cases: {change}; {summary.regressions} regressed, {summary.improvements} improved"
    )


def notes(comparison: Comparison) -> list[str]:
    """Warnings a reader must see: emulated timings, timings the confidence check does not trust (saturated
    emulation, disagreeing clocks), injected faults, allowed mismatches, one-sided cases."""
    lines = []
    sides = (comparison.baseline, comparison.current)
    if any(side.kind == "run" and side.meta.get("simulated") for side in sides):
        lines.append("SIMULATED: step times are a model's prediction, nothing was measured")
    elif any(side.emulated for side in sides):
        lines.append(
            "EMULATED compute: kernel durations are modelled (communication and the rest of the step are measured)"
        )
    for name, side in (("baseline", comparison.baseline), ("current", comparison.current)):
        for caveat in side.caveats:
            lines.append(f"INCONCLUSIVE timings in the {name} run, case {caveat}")
    lines += comparison.differences
    for mismatch in comparison.mismatches:
        lines.append(f"must-match metadata differs (allowed): {mismatch}")
    for side, cases in (("baseline", comparison.only_baseline), ("current", comparison.only_current)):
        for case in cases:
            lines.append(f"only in {side} (not compared): {_label(comparison, case.axes)} [{case.case_ids[0]}]")
    return lines


def _sides(comparison: Comparison) -> list[str]:
    return [
        f"{name}: {side.source} ({_kind(side)}, run {side.run_id})"
        for name, side in (("baseline", comparison.baseline), ("current", comparison.current))
    ]


def _percent_change(case: CaseComparison) -> str:
    """``+11.2% [+10.1, +13.4]``: the change in percent with its interval."""
    low, high = (case.ci_low - 1.0) * 100.0, (case.ci_high - 1.0) * 100.0
    return f"{(case.ratio - 1.0) * 100.0:+.1f}% [{low:+.1f}, {high:+.1f}]"


def _p_short(case: CaseComparison, alpha: float) -> str:
    """``4e-21 sig`` / ``0.2 n.s.``: the change column never appears without this one (digits enough to decide
    against alpha: 0.013 n.s. at alpha 0.01)."""
    return f"{p_text(case.p_value, alpha)} {'sig' if case.significant else 'n.s.'}"


def _n_short(case: CaseComparison) -> str:
    """Samples tested per side: ``20/20`` iterations, ``3x20/3x20`` (clustered) or ``6r/6r`` per-repeat medians."""
    if case.unit == "repeat":
        return f"{case.repeats_baseline}r/{case.repeats_current}r"

    def side(n: int, repeats: int) -> str:
        return f"{repeats}x{n // repeats}" if repeats > 1 and n % repeats == 0 else str(n)

    return f"{side(case.n_baseline, case.repeats_baseline)}/{side(case.n_current, case.repeats_current)}"


def render_table(comparison: Comparison) -> Table:
    """The rich table of cases (fits an 80-column CI log); print ``notes``, ``summary_line`` and ``headline`` after."""
    level = f"{comparison.config.confidence:.0%} CI"
    table = Table(
        title=(
            f"ringbench compare: change of the median step time, current vs baseline [{level}]; "
            f"p: two-sided Mann–Whitney, with repeats bootstrapped when clustered (sig: p < {comparison.config.alpha:g}); "
            "n: samples per side, repeats x iterations, or r: per-repeat medians tested"
        ),
        caption="\n".join(_sides(comparison)),
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("case", justify="left", overflow="fold", min_width=10)
    table.add_column("ms base→curr", justify="right", no_wrap=True)
    table.add_column(f"change [{level}]", justify="right")
    table.add_column("p", justify="right", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column("verdict", justify="left", no_wrap=True)
    for case in comparison.cases:
        table.add_row(
            _label(comparison, case.axes),
            f"{case.baseline_ms:.4g}→{case.current_ms:.4g}",
            _percent_change(case),
            _p_short(case, comparison.config.alpha),
            _n_short(case),
            Text(case.verdict.value, style=_STYLE[case.verdict]),
        )
    return table


MAX_ANSWER_LINES = 10  # comparisons listed in the answers block; the table below lists every case


def _change_line(comparison: Comparison, case: CaseComparison) -> str:
    if case.verdict == Verdict.NO_DATA:
        return f"no data: {_label(comparison, case.axes)}: one side has no timed iteration"
    if case.verdict == Verdict.TOO_FEW:
        return (
            f"too few samples: {_label(comparison, case.axes)}: {case.baseline_ms:.4g} → {case.current_ms:.4g} ms "
            f"(ratio {case.ratio:.3f}) on {_n(case)} samples, where no result could reach p < "
            f"{comparison.config.alpha:g}"
        )
    return (
        f"{case.verdict.value}: {_label(comparison, case.axes)}: {describe_change(case.ratio, case.significant)}, "
        f"{case.baseline_ms:.4g} → {case.current_ms:.4g} ms (ratio {case.ratio:.3f} {_interval(case)}, "
        f"p {p_text(case.p_value, comparison.config.alpha)})"
    )


def _caveats(comparison: Comparison) -> str:
    parts = []
    if any(side.kind == "run" and side.meta.get("simulated") for side in (comparison.baseline, comparison.current)):
        parts.append("SIMULATED (step times are a model's prediction)")
    elif comparison.baseline.emulated or comparison.current.emulated:
        parts.append("EMULATED compute (kernel durations modelled; communication measured)")
    for name, side in (("baseline", comparison.baseline), ("current", comparison.current)):
        if side.caveats:
            parts.append(f"INCONCLUSIVE timings in {len(side.caveats)} {name} case(s)")
    if comparison.differences:
        parts.append(f"{len(comparison.differences)} difference(s) between the sides (notes below)")
    if comparison.mismatches:
        parts.append(f"{len(comparison.mismatches)} must-match field(s) differ (allowed)")
    for side, cases in (("baseline", comparison.only_baseline), ("current", comparison.only_current)):
        if cases:
            parts.append(f"{len(cases)} case(s) only in the {side}, not compared")
    return "; ".join(parts)


def _next_step(comparison: Comparison) -> str:
    current, baseline = comparison.current, comparison.baseline
    if comparison.regressed:
        if current.kind == "run":
            return (
                f"ringbench report {current.source}   (where the time went: its cases in detail); if the slowdown "
                "is unexpected, rerun both sides with --repeat 3"
            )
        return "rerun the current side and compare its run directory (a baseline file carries no spans)"
    if comparison.too_few:
        return (
            f"rerun both sides with --iters {max(20, min_samples(comparison.config.alpha))} (or --repeat 3) and "
            "compare again"
        )
    if any(case.verdict == Verdict.NO_DATA for case in comparison.cases):
        return f"ringbench analyze {current.source}   (some cases have no timed iteration on one side)"
    if comparison.summary.improvements and current.kind == "run" and baseline.kind != "run":
        return f"ringbench baseline save {current.source} {baseline.source}   (to keep the improvement as the baseline)"
    return "nothing to do: the gate passes"


def answers_lines(comparison: Comparison) -> list[str]:
    """The answers block of a comparison, in the shape that ends `ringbench run`: the headline (the gate's
    verdict), one line per comparison that matters (regressions first, then improvements, then cases without
    data), how many cases did not change, the caveats and the next command."""
    order = {Verdict.REGRESSION: 0, Verdict.IMPROVEMENT: 1, Verdict.TOO_FEW: 2, Verdict.NO_DATA: 3}
    matters = sorted(
        (case for case in comparison.cases if case.verdict in order),
        key=lambda c: (order[c.verdict], -abs(c.ratio - 1.0) if c.ratio == c.ratio else 0.0),
    )
    lines = [headline(comparison)]
    lines += [_change_line(comparison, case) for case in matters[:MAX_ANSWER_LINES]]
    if len(matters) > MAX_ANSWER_LINES:
        lines.append(f"... and {len(matters) - MAX_ANSWER_LINES} more (every case is in the table)")
    unchanged = sum(case.verdict == Verdict.NO_CHANGE for case in comparison.cases)
    if unchanged:
        who = f"all {unchanged} case(s)" if unchanged == len(comparison.cases) else f"the other {unchanged} case(s)"
        lines.append(f"{who}: no significant change beyond {comparison.config.max_regression:.0%}")
    caveats = _caveats(comparison)
    if caveats:
        lines.append(f"caveats: {caveats}")
    lines.append(f"next: {_next_step(comparison)}")
    return lines


def render_markdown(comparison: Comparison) -> str:
    """A PR comment: the answers block (headline, what changed, caveats, next), then the summary, notes, the case
    table, and how to read it."""
    level = f"{comparison.config.confidence:.0%} CI"
    icon = ":x:" if comparison.regressed else ":warning:" if comparison.too_few else ":white_check_mark:"
    block = answers_lines(comparison)
    lines = [f"### {icon} ringbench performance gate: {block[0]}", ""]
    lines += [f"- {line}" for line in block[1:]]
    lines += ["", summary_line(comparison), ""]
    lines += [f"- {line}" for line in (*_sides(comparison), *notes(comparison))]
    lines += [
        "",
        f"| case | baseline ms | current ms | ratio [{level}] | change | p (unit) | n base/curr | verdict |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    order = {Verdict.REGRESSION: 0, Verdict.IMPROVEMENT: 1, Verdict.TOO_FEW: 2, Verdict.NO_CHANGE: 3,
             Verdict.NO_DATA: 4}  # fmt: skip
    for case in sorted(comparison.cases, key=lambda c: order[c.verdict]):
        verdict = f"**{case.verdict.value}**" if case.verdict != Verdict.NO_CHANGE else case.verdict.value
        lines.append(
            f"| `{_label(comparison, case.axes)}` | {case.baseline_ms:.3f} | {case.current_ms:.3f} | "
            f"{case.ratio:.3f} {_interval(case)} | {describe_change(case.ratio, case.significant)} | {_p(case, comparison.config.alpha)} | "
            f"{_n(case)} | {verdict} |"
        )
    config = comparison.config
    lines += [
        "",
        f"<sub>ratio = median step time current / baseline (above 1 is slower), with its bootstrap {level}. "
        f"A case regresses when it is significantly slower (two-sided p < {config.alpha:g}) and more than "
        f"{config.max_regression:.0%} slower. The test is Mann–Whitney over per-repeat medians (unit `repeat`), "
        "over pooled iterations (`iteration`), or over pooled iterations with the p-value raised to that of a "
        "bootstrap that resamples repeats (`clustered`). See docs/ci-gate.md.</sub>",
        "",
    ]
    return "\n".join(lines)


def _case_document(case: CaseComparison) -> dict:
    return {
        "case_id": case.case_id,
        "axes": {name: native(case.axes.get(name)) for name in MATCH_FIELDS},
        "emulated": case.emulated,
        "baseline_ms": json_value(case.baseline_ms),
        "current_ms": json_value(case.current_ms),
        "ratio": json_value(case.ratio),
        "ci_low": json_value(case.ci_low),
        "ci_high": json_value(case.ci_high),
        "p_value": json_value(case.p_value),
        "unit": case.unit,
        "significant": case.significant,
        "verdict": case.verdict.value,
        "n_baseline": case.n_baseline,
        "n_current": case.n_current,
        "repeats_baseline": case.repeats_baseline,
        "repeats_current": case.repeats_current,
    }


def _one_sided(cases: tuple[CaseSamples, ...]) -> list[dict]:
    return [{"case_id": c.case_ids[0], "axes": {k: native(c.axes.get(k)) for k in MATCH_FIELDS}} for c in cases]


def comparison_document(comparison: Comparison) -> dict:
    """The `--json` document (format ``ringbench-compare``, version 1); NaN becomes null."""
    config, summary = comparison.config, comparison.summary
    return {
        "format": JSON_FORMAT,
        "format_version": JSON_VERSION,
        "passed": not comparison.regressed,
        "exit_code": comparison.exit_code,
        "headline": headline(comparison),
        "config": {
            "alpha": config.alpha,
            "confidence": config.confidence,
            "max_regression": config.max_regression,
            "resamples": config.resamples,
            "seed": config.seed,
            "allow_mismatch": config.allow_mismatch,
        },
        "baseline": {
            "source": comparison.baseline.source,
            "kind": comparison.baseline.kind,
            "run_id": comparison.baseline.run_id,
            "caveats": list(comparison.baseline.caveats),
        },
        "current": {
            "source": comparison.current.source,
            "kind": comparison.current.kind,
            "run_id": comparison.current.run_id,
            "caveats": list(comparison.current.caveats),
        },
        "emulated": comparison.baseline.emulated or comparison.current.emulated,
        "mismatches": list(comparison.mismatches),
        "differences": list(comparison.differences),
        "summary": {
            "n_cases": summary.n_cases,
            "geomean_ratio": json_value(summary.geomean_ratio),
            "ci_low": json_value(summary.ci_low),
            "ci_high": json_value(summary.ci_high),
            "significant": summary.significant,
            "regressions": summary.regressions,
            "improvements": summary.improvements,
        },
        "cases": [_case_document(case) for case in comparison.cases],
        "only_baseline": _one_sided(comparison.only_baseline),
        "only_current": _one_sided(comparison.only_current),
    }
