"""A helper for tests of the CLI's one-line usage errors."""

from __future__ import annotations

from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()


def one_line_error(args: list[str]) -> str:
    """Run the CLI; assert exit 2 with exactly one stderr line, and return it."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]
