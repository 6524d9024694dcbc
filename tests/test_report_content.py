"""The report's content: answers first, contents, the cases that matter, figures that mark the culprit, metadata tables.

Runs on the simulated fixture, a small simulated sweep (contiguous/zigzag x sync/double, rank 2 slow in one case)
and the real 8-rank run with a slow hop; figures are inspected as matplotlib Figures (``.figure(...)``).
"""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path

import matplotlib.colors as mcolors
import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text
from PIL import Image
from support.given import SimConfig, simulate_run

from ringbench.analysis.answers import answers
from ringbench.analysis.findings import analyze
from ringbench.record.store import load_run
from ringbench.report import case_charts, case_sections, charts, write_report
from ringbench.report.content import _chart_rows, build_content
from ringbench.report.html import render_html
from ringbench.report.markdown import render_markdown
from ringbench.report.model import Cell, cases_of
from ringbench.vocab import TOLERANCE

DATA = Path(__file__).parent / "data" / "analysis"
EVIL = '<img src=x onerror="alert(1)">|"&'
RED = mcolors.to_rgba(charts.HIGHLIGHT)


def _sweep(tmp_path: Path | None = None):
    configs = [
        SimConfig.of(world=4, mask="causal", layout=layout, buffer=buffer, iterations=6, jitter=0.03, seed=seed,
                  synthetic_errors=True, slow_rank=2 if (layout, buffer) == ("zigzag", "double") else None,
                  slow_factor=1.8)
        for seed, (layout, buffer) in enumerate((lay, buf) for lay in ("contiguous", "zigzag") for buf in ("sync", "double"))
    ]  # fmt: skip
    return simulate_run(configs, run_id="sweep", path=tmp_path)


@pytest.fixture(scope="module")
def sweep():
    return analyze(_sweep())


@pytest.fixture(scope="module")
def sweep_content(sweep):
    """The sweep's report content, built once (its figures are most of a report's cost); tests only read it."""
    return build_content(sweep)


@pytest.fixture(scope="module")
def real():
    return analyze(load_run(DATA / "real_w8_slow_link"))


def _red(color) -> bool:
    return np.allclose(mcolors.to_rgba(color), RED)


def test_answers_block_heads_html_and_markdown(sweep, sweep_content):
    content = sweep_content
    block = answers(sweep, str(sweep.run.path)).lines()
    first = content.sections[0]
    assert first.title == "Answers" and first.lead == block[0]
    assert list(first.lines[:-1]) == block[1:-1] and first.lines[-1].startswith("next: ")
    assert content.sections[1].title == "Verdict"
    html, md = render_html(content), render_markdown(content)
    assert html.index(block[0]) < html.index('id="verdict"')
    assert md.index(f"**{block[0]}**") < md.index("## Verdict")


def test_a_culprit_hidden_by_overlap_is_named_in_the_headline_not_denied(real):
    """The 8-rank run's slow hop costs nothing (double buffering hides it): the headline names it as hidden."""
    block = answers(real, str(real.run.path))
    assert "No straggler" not in block.headline
    assert block.headline.startswith("hop 2 → 3 (link) is ") and "hidden behind compute" in block.headline
    assert block.straggler.startswith("hop 2 → 3 (link)")


def test_every_contents_link_has_its_anchor(sweep_content):
    content = sweep_content
    html, md = render_html(content), render_markdown(content)
    links = re.findall(r'href="#([^"]+)"', html)
    assert {"answers", "verdict", "step-time", "cases", "details", "run"} <= set(links)
    assert any(link.startswith("case-") for link in links)
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert set(links) <= ids
    md_ids = set(re.findall(r'<a id="([^"]+)"></a>', md))
    assert set(re.findall(r"\]\(#([^)]+)\)", md)) <= md_ids


def test_cases_table_has_the_kernel_short_labels_and_full_ids(sweep, sweep_content):
    content = sweep_content
    cases = next(s for s in content.sections if s.anchor == "cases")
    table, ids = cases.tables
    assert table.columns[:3] == ["#", "case", "kernel"]
    labels = [row[1] for row in table.rows]
    assert all(isinstance(cell, Cell) for cell in labels)
    assert [cell.text for cell in labels] == [
        "contiguous · sync",
        "contiguous · double",
        "zigzag · sync",
        "zigzag · double",
    ]
    assert [cell.title for cell in labels] == list(sweep.run.cases["case_id"])
    assert [row[2] for row in ids.rows] == list(sweep.run.cases["case_id"])
    html = render_html(content)
    assert f'title="{sweep.run.cases["case_id"].iloc[0]}"' in html
    assert "Every case: 4 ranks" in html  # the axes that did not vary, once


def test_case_sections_skip_cases_that_cannot_be_judged(sweep):
    # The first case is the fastest, but its timings are spoilt (real compute on too few cores): never shown.
    summary = sweep.summary.copy()
    first = summary["case_id"].iloc[0]
    summary.loc[0, ["confidence", "step_ms"]] = ["inconclusive", 1.0]
    summary.at[0, "inconclusive_reasons"] = ["CPU oversubscribed"]
    confidence = sweep.confidence.copy()
    confidence.at[0, "reason_codes"] = ["oversubscribed"]
    spoilt = dataclasses.replace(sweep, summary=summary, confidence=confidence)
    picks, notes = case_sections.choose(spoilt, cases_of(spoilt))
    shown = [case_id for case_id, _ in picks]
    assert first not in shown
    assert shown[0] == str(sweep.headline()["case_id"]) and "headline culprit" in picks[0][1][0]
    assert "could be judged" in notes[0]
    reasons = [why for _, why in picks]
    assert any("fastest" in why for why in reasons) and any("slowest" in why for why in reasons)


def test_case_sections_say_so_when_none_could_be_judged(sweep):
    summary = sweep.summary.assign(confidence="inconclusive", straggler_kind=None)
    confidence = sweep.confidence.copy()
    for codes, sentence in ((["clock"], "step times can be trusted"), (["oversubscribed"], "not as evidence")):
        confidence["reason_codes"] = [codes] * len(confidence)
        blind = dataclasses.replace(sweep, summary=summary, confidence=confidence)
        picks, notes = case_sections.choose(blind, cases_of(blind))
        assert picks and notes[0].startswith("No case could be judged") and sentence in notes[0]


def test_case_sections_are_capped(sweep, monkeypatch):
    monkeypatch.setattr(case_sections, "MAX_SECTIONS", 2)
    picks, notes = case_sections.choose(sweep, cases_of(sweep))
    assert len(picks) == 2 and any("at most 2 are shown" in note for note in notes)


def test_timeline_has_one_panel_per_phase_and_marks_the_culprit(sweep):
    top = sweep.headline()
    case_id = str(top["case_id"])
    ring = [0, 1, 2, 3]
    iteration = case_charts.representative_iteration(sweep.run.events, case_id)
    fig = case_charts.timeline.figure(iteration, sweep.transfers, ring, charts.Culprit(rank=2))
    forward, backward = fig.axes
    assert forward.get_title(loc="left").startswith("Forward: ring steps 0–3")
    assert backward.get_title(loc="left").startswith("Backward: ring steps 0–3")
    assert forward.get_xlim()[1] < backward.get_xlim()[1]  # the backward follows the forward
    boundary = [t.get_text() for ax in fig.axes for t in ax.texts if "begins" in t.get_text() or "ends" in t.get_text()]
    assert any("forward ends" in t for t in boundary) and any("backward begins" in t for t in boundary)
    steps = {t.get_text() for t in forward.texts} & {"0", "1", "2", "3"}
    assert steps == {"0", "1", "2", "3"}  # compute numbered by its step within the phase
    for ax in fig.axes:
        labels = {label.get_text(): label for label in ax.get_yticklabels()}
        assert _red(labels["rank 2"].get_color()) and not _red(labels["rank 1"].get_color())


def test_slow_hop_is_red_in_timeline_ring_hops_and_bars(real):
    case_id = str(real.summary["case_id"].iloc[0])
    culprit = charts.Culprit(hop=(2, 3))
    ring = list(range(8))
    iteration = case_charts.representative_iteration(real.run.events, case_id)
    timeline = case_charts.timeline.figure(iteration, real.transfers, ring, culprit)
    colors = [c for coll in timeline.axes[0].collections for c in coll.get_facecolors()]
    assert any(_red(c) for c in colors)  # the slow hop's transfers
    ring_fig = case_charts.ring_diagram.figure(real.hops, ring, case_id, culprit)
    assert any(_red(p.get_edgecolor()) or _red(p.get_facecolor()) for p in ring_fig.axes[0].patches)
    bars = case_charts.hop_bars.figure(real.hops, case_id, ring, culprit)
    (ax,) = bars.axes  # forward only: one exchange
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"{r}→{(r + 1) % 8}" for r in ring]
    assert len(ax.patches) == 8  # only the ring's hops, not an 8 x 8 matrix
    assert [_red(p.get_facecolor()) for p in ax.patches] == [r == 2 for r in ring]
    waits = case_charts.compute_wait_bars.figure(real.run.events, ring, case_id, culprit)
    red = [t.get_text() for t in waits.axes[0].get_xticklabels() if _red(t.get_color())]
    assert red == ["2", "3"]


def test_hop_bars_have_one_panel_per_exchange_in_ring_order(sweep):
    case_id = str(sweep.headline()["case_id"])
    fig = case_charts.hop_bars.figure(sweep.hops, case_id, [0, 1, 2, 3], charts.Culprit(rank=2))
    rows = sweep.hops[sweep.hops["case_id"] == case_id]
    present = set(zip(rows["phase"], rows["exchange"], strict=True))
    order = [("fwd", "kv", "fwd K/V"), ("bwd", "kv", "bwd K/V"), ("bwd", "dkv", "bwd dK/dV")]
    assert [ax.get_title() for ax in fig.axes] == [title for p, e, title in order if (p, e) in present]
    assert len(fig.axes) >= 2  # the forward and the backward, side by side
    for ax in fig.axes:
        assert len(ax.patches) == 4
        red = [t.get_text() for t in ax.get_xticklabels() if _red(t.get_color())]
        assert red == ["1→2", "2→3"]  # the hops touching the slow rank


def test_errors_figure_only_when_checked_with_sensible_axes():
    unchecked = pd.DataFrame({"world": [4], "dtype": ["float32"], "cases": [2], "checked": [0],
                              "fwd_max_abs_err": [np.nan], "bwd_max_abs_err": [np.nan], "passed": [True]})  # fmt: skip
    assert charts.error_figure(unchecked, TOLERANCE) is None
    one = unchecked.assign(checked=2, fwd_max_abs_err=4e-7, bwd_max_abs_err=2e-6)
    ax = charts.error_figure.figure(one, TOLERANCE).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["float32 fwd", "float32 bwd"]
    low, high = ax.get_ylim()
    assert low < 4e-7 and high > TOLERANCE["float32"][1]  # the values and the tolerance are in view
    several = pd.concat([one, one.assign(world=8, bwd_max_abs_err=3e-6)], ignore_index=True)
    ax = charts.error_figure.figure(several, TOLERANCE).axes[0]
    assert list(ax.get_xticks()) == [4, 8]


def test_step_time_chart_groups_by_kernel_and_marks_emulated(sweep):
    run = sweep.run
    cases = run.cases.copy()
    cases["kernel"] = ["torch", "emulated:auto", "torch", "emulated:auto"]
    cases["emulated"] = [False, True, False, True]
    mixed = dataclasses.replace(sweep, run=dataclasses.replace(run, cases=cases))
    rows = _chart_rows(cases_of(mixed))
    assert list(dict.fromkeys(rows["panel"])) == ["torch · sync", "emulated:auto · double"]
    fig = charts.step_time_chart.figure(rows)
    assert [ax.get_title(loc="left") for ax in fig.axes] == ["torch · sync", "emulated:auto · double"]
    hatched = [bool(p.get_hatch()) for ax in fig.axes for p in ax.patches]
    assert hatched == [False, False, True, True]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["1. contiguous", "3. zigzag"]


def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_figures_are_2x_with_labels_of_at_least_9_pt(sweep, sweep_content, real, tmp_path):
    content = sweep_content
    assert len(content.figures) >= 7
    for png in content.figures:
        image = Image.open(io.BytesIO(png.data))
        assert image.size == png.size and round(image.info["dpi"][0]) == charts.DPI
    html = render_html(content)
    for png in content.figures:
        width, height = png.size
        assert f'width="{width // 2}" height="{height // 2}"' in html
    case_id = str(sweep.headline()["case_id"])
    iteration = case_charts.representative_iteration(sweep.run.events, case_id)
    culprit = charts.Culprit(rank=2)
    drawn = [
        charts.step_time_chart.figure(_chart_rows(cases_of(sweep))),
        charts.overlap_bars.figure(sweep.overlap_buffers),
        charts.error_figure.figure(sweep.numerics, TOLERANCE),
        case_charts.timeline.figure(iteration, sweep.transfers, [0, 1, 2, 3], culprit),
        case_charts.ring_diagram.figure(sweep.hops, [0, 1, 2, 3], case_id, culprit),
        case_charts.hop_bars.figure(sweep.hops, case_id, [0, 1, 2, 3], culprit),
        case_charts.compute_wait_bars.figure(sweep.run.events, [0, 1, 2, 3], case_id, culprit),
    ]
    for fig in drawn:
        sizes = {t.get_text(): t.get_fontsize() for t in _texts(fig)}
        assert min(sizes.values()) >= charts.MIN_FONT_PT, sizes
        assert fig.get_size_inches()[0] * 96 <= 1150  # shown at half its pixels: fits the page at 100%
    # The timeline of the slowest case, as written: 2x pixels of an 11.5 in figure.
    folder = write_report(sweep.run, tmp_path)
    width, _ = Image.open(folder / "figures" / "case1_timeline.png").size
    assert width == round(11.5 * charts.DPI)


def test_run_metadata_is_tables_not_dict_reprs(tmp_path):
    run = load_run(DATA / "real_w8_slow_link")
    run.meta["gpus"] = [{"name": "NVIDIA H100", "memory_gib": 79.6, "capability": "9.0", "driver": "550.1"}] * 2
    content = build_content(analyze(run))
    section = content.sections[-1]
    assert section.title == "Run"
    titles = [t.title for t in section.tables]
    assert titles == ["", "Versions", "Devices (one row per rank)", "Ranks per world size"]
    versions = dict((row[0], row[1]) for row in section.tables[1].rows)
    assert versions["torch"] == "2.13.0+cpu" and versions["cuda"] == "none"
    assert section.tables[2].rows[1][:2] == ["1", "NVIDIA H100"]
    html, md = render_html(content), render_markdown(content)
    for text in (html, md):
        assert "{'" not in text and '{"' not in text


def test_hostile_strings_in_labels_and_metadata_are_escaped(tmp_path):
    run = _sweep(tmp_path / "sweep")
    run.cases["kernel"] = [EVIL + " $a_{b$ \\", "torch", EVIL + " $a_{b$ \\", "torch"]  # not TeX either
    run.meta["versions"] = {"torch": EVIL}
    run.meta["gpus"] = [{"name": EVIL}]
    run.meta["scenario"] = {"name": EVIL, "description": EVIL}
    folder = write_report(run, tmp_path / "out")
    html = (folder / "report.html").read_text()
    assert EVIL not in html and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert "<script" not in html.lower()
    md = (folder / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ") and "onerror" in line]
    assert len(rows) >= 3 and all('onerror="alert(1)">\\|' in row for row in rows)  # a pipe does not split a row
