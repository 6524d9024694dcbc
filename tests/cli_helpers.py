"""Helpers shared by the CLI tests: invoke the app in-process and check one-line usage errors."""

from typer.testing import CliRunner

from ringbench.cli.app import app


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(result, *fragments: str, stdout_empty: bool = False) -> None:
    """Exit code 2 and exactly one line on stderr, starting with 'error:' and containing every fragment."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    if stdout_empty:
        assert result.stdout == ""
