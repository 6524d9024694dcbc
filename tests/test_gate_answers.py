"""The gate's Markdown opens with the answers block of a run: verdict, what changed (regressions first), caveats, next."""

from __future__ import annotations

from support.synthetic import lognormal_steps, write_synthetic_run

from ringbench.gate.compare import compare
from ringbench.gate.render import answers_lines, render_markdown


def _side(path, medians: dict[str, float], seed: int):
    cases = {
        f"c{i}": ({"layout": layout}, lognormal_steps(cv=0.02, iterations=20, median_ms=ms, seed=seed + i))
        for i, (layout, ms) in enumerate(medians.items())
    }
    return write_synthetic_run(path, cases)


def test_markdown_is_headed_by_the_answers_block_regressions_first(tmp_path):
    base = _side(tmp_path / "base", {"contiguous": 100.0, "zigzag": 100.0, "striped": 100.0}, seed=1)
    current = _side(tmp_path / "current", {"contiguous": 85.0, "zigzag": 112.0, "striped": 100.0}, seed=11)
    result = compare(base, current)
    lines = answers_lines(result)
    assert lines[0].startswith("FAIL: 1 of 3 cases regressed")
    assert lines[1].startswith("regression: layout=zigzag: 1") and "% slower (significant), " in lines[1]
    assert lines[2].startswith("improvement: layout=contiguous: 1") and "% faster (significant)" in lines[2]
    assert lines[3] == "the other 1 case(s): no significant change beyond 5%"
    assert lines[-1] == f"next: ringbench report {current}   (where the time went: its cases in detail); if the " \
        "slowdown is unexpected, rerun both sides with --repeat 3"  # fmt: skip
    text = render_markdown(result)
    head = text.split("\n\n")[:2]
    assert head[0] == f"### :x: ringbench performance gate: {lines[0]}"
    assert head[1].splitlines() == [f"- {line}" for line in lines[1:]]
    assert text.index("- regression: layout=zigzag") < text.index("| case | baseline ms")  # the table stays below


def test_a_passing_gate_says_so_with_its_caveats(tmp_path):
    base = _side(tmp_path / "base", {"contiguous": 100.0}, seed=1)
    current = _side(tmp_path / "current", {"contiguous": 100.0, "zigzag": 90.0}, seed=21)
    lines = answers_lines(compare(base, current))
    assert lines[0].startswith("PASS")
    assert lines[1] == "all 1 case(s): no significant change beyond 5%"
    assert lines[2] == "caveats: 1 case(s) only in the current, not compared"
    assert lines[3] == "next: nothing to do: the gate passes"


def test_too_few_samples_to_reach_alpha_is_inconclusive_never_a_pass(tmp_path):
    """3 iterations a side: even a 70% slowdown cannot give p < 0.01, so the gate says so (exit 3), never PASS."""
    cases = {"c0": ({"layout": "zigzag"}, lognormal_steps(cv=0.02, iterations=3, median_ms=100.0, seed=1))}
    slow = {"c0": ({"layout": "zigzag"}, lognormal_steps(cv=0.02, iterations=3, median_ms=170.0, seed=2))}
    result = compare(write_synthetic_run(tmp_path / "base", cases), write_synthetic_run(tmp_path / "cur", slow))
    lines = answers_lines(result)
    assert result.exit_code == 3 and result.too_few == 1 and not result.summary.significant
    assert lines[0].startswith("INCONCLUSIVE: 1 of 1 cases have too few samples to reach p < 0.01 (5 or more")
    assert lines[1].startswith("too few samples: (single case): ") and "on 3/3 (1/1 rep) samples" in lines[1]
    assert lines[-1].startswith("next: rerun both sides with --iters 20")
    assert render_markdown(result).startswith("### :warning: ringbench performance gate: INCONCLUSIVE")
