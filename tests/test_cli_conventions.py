"""What every command shares: output streams, -h, --version, one-line usage errors, names for values, and the
answers block that ends a run (its shape is pinned here)."""

import json
import re
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, invoke

from ringbench.scenario.scenario import DEFAULT_SCENARIO, load_scenario

DATA = Path(__file__).parent / "data" / "topology"
TINY = ["--world", "2", "--seq", "64", "--heads", "1", "--head-dim", "8", "--iters", "3", "--warmup", "1"]


def test_results_go_to_stdout_and_json_owns_it():
    result = invoke("topo", "--topology", str(DATA / "dgx_a100_nv12.txt"))
    assert result.exit_code == 0 and "NV12" in result.stdout and result.stderr == ""
    as_json = invoke("topo", "--topology", str(DATA / "dgx_a100_nv12.txt"), "--json")
    assert json.loads(as_json.stdout)["classes"] and "NV12" in as_json.stderr  # the table moved to stderr
    quiet = invoke("topo", "--topology", str(DATA / "dgx_a100_nv12.txt"), "-q")
    assert quiet.exit_code == 0 and quiet.stdout == "" and quiet.stderr == ""


@pytest.mark.parametrize("command", ["run", "simulate", "calibrate", "analyze", "report", "compare", "topo", "recommend", "probe", "import",
                                     "check-timeline", "baseline"])  # fmt: skip
def test_every_command_has_short_help_and_names_values_not_types(command):
    result = invoke(command, "-h")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "Usage: ringbench" in text
    assert not re.search(r"<(bool|str|int|float|path|list\[\w+\])>", text), text
    assert "{" not in text.split("\n")[1], text  # usage line: RUN_DIR, not {run_dir}


def test_version_and_one_line_usage_errors():
    version = invoke("--version")
    assert version.exit_code == 0 and version.stdout.startswith("ringbench ")
    for args, fragment in ((["run", "--frobnicate"], "No such option: --frobnicate"),
                           (["run", "--iters", "many"], "Invalid value for '--iters'"),
                           (["analyze"], "Missing argument 'RUN_DIR'"),
                           (["bogus"], "No such command 'bogus'")):  # fmt: skip
        assert_one_line_error(invoke(*args), fragment, "-h)")


def test_run_help_shows_the_defaults_of_the_embedded_scenario():
    text = invoke("run", "-h").stdout
    assert f"default: ({DEFAULT_SCENARIO.world[0]})" in text and f"(default: {DEFAULT_SCENARIO.iters})" in text


def test_every_scenario_axis_is_an_option_of_run_with_one_help_text_everywhere():
    """The axis registry (ringbench/scenario/axes.py) makes the options of run, simulate, plan and calibrate."""
    import inspect
    import typing

    from ringbench.cli import calibrate_cmd, plan_cmd, run_cmd, simulate_cmd
    from ringbench.scenario.axes import axes_for, axis
    from ringbench.scenario.scenario import AXES

    def options(function) -> dict[str, str]:
        out = {}
        for name, parameter in inspect.signature(function).parameters.items():
            extras = typing.get_args(parameter.annotation)[1:] if typing.get_origin(parameter.annotation) else ()
            for extra in extras:
                if getattr(extra, "help", None) is not None:
                    out[name] = extra.help
        return out

    commands = {"run": run_cmd.run, "simulate": simulate_cmd.simulate, "plan": plan_cmd.plan,
                "calibrate": calibrate_cmd.calibrate}  # fmt: skip
    run_options = options(commands["run"])
    for name in AXES:  # every key a scenario file accepts as an axis
        assert run_options.get(name) == axis(name).help, name
    for command, function in commands.items():
        found = options(function)
        for entry in axes_for(command):
            assert found.get(entry.name) == entry.help, (command, entry.name)


def test_the_axis_table_of_docs_scenarios_is_the_registry():
    """docs/scenarios.md's axis table is written from the registry; a changed axis fails here until it is rewritten."""
    import importlib.util

    from ringbench.scenario.axes import AXES

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("scenarios_table", root / "docs" / "scenarios_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (root / "docs" / "scenarios.md").read_text()
    assert module.render(page) == page, "docs/scenarios.md's axis table is stale: run python docs/scenarios_table.py"
    for entry in AXES:
        assert f"| {entry.name} (`--{entry.name.replace('_', '-')}`) |" in page, entry.name


def test_dtype_aliases_and_shipped_names():
    from ringbench.scenario.scenario import Scenario

    assert Scenario(dtype=("bf16", "fp32")).dtype == ("bfloat16", "float32")
    with pytest.raises(ValueError, match=r"shipped scenario name: buffers, default, .*stragglers"):
        load_scenario("scenarios/no_such_one.yaml")


def test_the_end_of_a_run_is_a_short_block_of_answers(tmp_path):
    """The shape: table, then headline, one comparison per varied axis, straggler, caveats, next -- on stdout."""
    result = invoke("run", "--world", "2", "--seq", "1024", "--heads", "2", "--head-dim", "32", "--iters", "4",
                    "--warmup", "1", "--layout", "contiguous", "--layout", "zigzag", "--buffer", "double",
                    "--kernel", "emulated:auto", "--no-check", "--out", str(tmp_path), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    answers = json.loads(result.stdout)["answers"]
    shown = [line for line in result.stderr.splitlines() if line.strip()]  # --json: human output on stderr
    start = shown.index(answers["headline"])
    block = shown[start:]
    assert block[0] == answers["headline"]
    comparisons = block[1 : block.index(next(line for line in block if line.startswith("straggler: ")))]
    assert [c["line"] for c in answers["comparisons"]] == comparisons
    assert all(line.startswith("layout: ") for line in comparisons)  # the one axis that varied
    assert block[len(comparisons) + 1].startswith("straggler: ")
    block = block[: block.index(next(line for line in block if line.startswith("next: "))) + 1]
    assert block[-1] == f"next: {answers['next']}" and all(len(line) < 400 for line in block)
    assert "[1/2]" in result.stderr  # progress on stderr


def test_no_fault_clears_a_scenarios_faults_and_one_rank_says_so(tmp_path):
    stragglers = load_scenario("stragglers")
    assert stragglers.faults
    result = invoke("run", "stragglers", "--no-fault", "--world", "1", "--seq", "64", "--iters", "3", "--warmup", "1",
                    "--kernel", "emulated:20", "--out", str(tmp_path), "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert all(case["faults"] == "" for case in document["cases"])
    assert "a 1-rank ring has no communication" in result.stderr
    assert document["answers"]["straggler"].startswith("not applicable")
    assert "communication is real" not in document["answers"]["caveats"]  # one rank communicates nothing
    assert result.stderr.count("no communication") == 1, result.stderr  # said once, at the start
    (row,) = [line for line in result.stderr.splitlines() if line.startswith("│ causal")]
    assert row.split("│")[4].strip() == "none", row  # the exposed column: one word
    assert "n/a" not in result.stderr


def test_an_untraced_run_says_untraced_not_a_made_up_share():
    from ringbench.fmt import exposed_text

    assert exposed_text(float("nan"), 2) == "untraced" and exposed_text(None, 4) == "untraced"
    assert exposed_text(0.123, 4) == "12.3%" and exposed_text(float("nan"), 1) == "none"


def test_every_json_document_opens_with_its_format_and_gives_the_run_dir(tmp_path):
    """One envelope: "format" (which document) and "format_version" first; "run_dir" wherever a record exists."""
    from ringbench.cli.common import JSON_DOCUMENTS

    run = str(Path(__file__).parent / "data" / "analysis" / "sim_w4_slow_rank")
    baseline = str(tmp_path / "base.json")
    calls = {
        "analyze": ["analyze", run, "--json"],
        "report": ["report", run, "--out", str(tmp_path / "reports"), "--json"],
        "baseline": ["baseline", "save", run, baseline, "--json"],
        "compare": ["compare", baseline, run, "--json"],
        "recommend": ["recommend", "--topology", str(DATA / "dgx_a100_nv12.txt"), "--order", "stride:3", "--json"],
        "topo": ["topo", "--topology", str(DATA / "dgx_a100_nv12.txt"), "--json"],
        "plan": [
            "plan",
            "--topology",
            str(DATA / "dgx_a100_nv12.txt"),
            "--world",
            "8",
            "--seq",
            "2048",
            "--heads",
            "8",
            "--head-dim",
            "32",
            "--json",
            "-q",
        ],
    }
    for name, args in calls.items():
        result = invoke(*args)
        assert result.exit_code in (0, 1, 3), (name, result.output)
        document = json.loads(result.stdout)
        assert list(document)[:2] == ["format", "format_version"], (name, list(document)[:3])
        assert isinstance(document["format_version"], int)
        if name in JSON_DOCUMENTS and name not in ("topo", "compare"):
            assert document["format"] == f"ringbench-{name}", document["format"]
        if name in ("analyze", "report", "baseline"):
            assert document["run_dir"] == run, name


def test_every_command_names_the_json_document_it_writes():
    """Each command's Output says which envelope its --json opens with (a missing one failed only at --json time)."""
    import re

    from ringbench.cli.common import JSON_DOCUMENTS

    commands = Path(__file__).parent.parent / "ringbench" / "cli"
    for path in sorted(commands.glob("*_cmd.py")):
        for call in re.findall(r"Output\(([^)]*)\)", path.read_text()):
            named = re.search(r'document="([^"]+)"', call)
            assert named and named.group(1) in JSON_DOCUMENTS, (path.name, call)
