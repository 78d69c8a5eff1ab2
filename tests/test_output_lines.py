"""Lines as a reader (or a pipe) gets them: notes, warnings and --show output wrapped at 80
columns (or $COLUMNS when wider) outside a terminal while errors stay one line, YAML that stays
YAML when wrapped, no line of any command ending in whitespace, and plot axes in numbers."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.render.console import PlainEndConsole, strip_line_ends
from tests.conftest import wide_console

runner = CliRunner()
BLANK_END = re.compile(r"[ \t](?:\x1b\[[0-9;]*m)*$")  # whitespace, then at most colour codes


def _run(*args: str, columns: str = "80") -> tuple[int, str, str]:
    """The real entry point in a subprocess, stdout and stderr pipes (not terminals)."""
    env = dict(os.environ, COLUMNS=columns)
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args],
                          capture_output=True, text=True, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def _ends_clean(text: str) -> None:
    padded = [line for line in text.splitlines() if BLANK_END.search(line)]
    assert not padded, padded


# ------------------------------------------------------------------ notes and errors

@pytest.mark.parametrize("columns", ["80", "120"])
def test_notes_wrap_at_the_width_and_errors_stay_one_line(columns):
    code, out, err = _run("search", "--model", "175b", "--gpus", "512", "--top", "1",
                          columns=columns)
    assert code == 0, err
    width = int(columns)
    lines = err.splitlines()
    # gpt3-175b's notes hold a 600-character one (the batch and dropout sources)
    assert len(lines) > 4 and max(map(len, lines)) <= width and max(map(len, lines)) > width - 15
    assert sum(line.startswith("note: ") for line in lines) >= 3
    _ends_clean(out + err)
    code, out, err = _run("search", "--model", "no-such-model-" + "x" * 150, "--gpus", "8",
                          columns=columns)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and len(err) > width


def test_a_warning_on_stderr_wraps_too():
    from planner.render import console
    buf = io.StringIO()
    saved = console.err
    console.err = PlainEndConsole(file=buf, width=80, highlight=False, emoji=False)
    try:
        console.note("warning: " + " ".join(["factor"] * 40))
        console.error("bad input " + " ".join(["word"] * 40))
    finally:
        console.err = saved
    lines = buf.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines[:-1]) and len(lines) == 5  # 4 wrapped + 1 error
    assert len(lines[-1]) > 80 and lines[-1].startswith("error: bad input")


# ------------------------------------------------------------------ --show YAML

def _show_ok(kind: str, name: str, width: int) -> str:
    with wide_console(width):
        res = runner.invoke(app, [kind, "--show", name])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, (name, too_wide)
    _ends_clean(res.stdout)
    return res.stdout


@pytest.mark.parametrize("width", [80, 100])
def test_every_shown_profile_is_yaml_within_the_width(width):
    from planner.cli.catalogs import _model_dict
    for name, model in catalog.models().items():
        text = _show_ok("models", name, width)
        assert yaml.safe_load(text) == _model_dict(model)  # folding kept every string
    for name, profile in catalog.framework_profiles().items():
        data = yaml.safe_load(_show_ok("frameworks", name, width))
        assert data == profile.model_dump(mode="json", exclude_none=True)


def test_a_shown_model_reads_back_as_the_same_model(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(_show_ok("models", "deepseek-v3", 80))
    assert catalog.resolve_model(str(path)) == catalog.resolve_model("deepseek-v3")


# ------------------------------------------------------------------ trailing whitespace

LINE_COMMANDS = [
    ["search", "--model", "175b", "--gpus", "512", "--top", "2"],
    ["search", "--model", "llama3-8b", "--gpus", "8", "--top", "4"],
    ["search", "--model", "175b", "--gpus", "512", "--why-not", "tp=8,pp=8"],
    ["estimate", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "8", "--zero-stage", "1",
     "--sequence-parallel", "--vpp", "3"],
    ["sweep", "--model", "175b", "--gpus", "256:1024", "--tokens", "3e11"],
    ["models"], ["hardware"], ["frameworks"], ["frameworks", "--show", "deepspeed"],
    ["placement", "--help"], ["--help"],
]


@pytest.mark.parametrize("args", LINE_COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_no_line_ends_in_whitespace_piped_or_wide(args):
    for width in (80, 200):  # a pipe, and a wide terminal's one-column-per-figure tables
        with wide_console(width):
            res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        _ends_clean(res.output)


def test_no_line_ends_in_whitespace_in_a_terminal():
    # colour codes may sit between the padding and the line's end: they stay, the blanks go
    from planner.render import tables
    buf = io.StringIO()
    term = PlainEndConsole(file=buf, width=80, force_terminal=True, color_system="standard")
    t = tables.new("title")
    tables.text_column(t, "a")
    tables.number_column(t, "b")
    t.add_row("[bold]x[/]", "1")
    t.add_row("a longer cell", "[red]22[/]")
    tables.show(t, term)
    term.print("[bold]" + "word " * 30 + "[/]")
    text = buf.getvalue()
    assert "\x1b[" in text
    _ends_clean(text)
    assert strip_line_ends("a  \x1b[0m \x1b[1m\nb \n") == "a\x1b[0m\x1b[1m\nb\n"


# ------------------------------------------------------------------ plot axes

def test_sweep_plot_axes_read_as_counts():
    pytest.importorskip("matplotlib")
    from planner.render.plot import scaling_figure
    rows = [{"gpus": n, "global_batch_size": 1536, "tokens_per_s": 30_000.0 * n / 64 * (1 - n / 8192),
             "mfu": 0.5 - n / 20_000} for n in (64, 128, 256, 512, 1024)]
    fig = scaling_figure(rows, "t")
    fig.canvas.draw()
    ax, ax_mfu = fig.axes
    assert [t.get_text() for t in ax_mfu.get_xticklabels()] == ["64", "128", "256", "512", "1,024"]
    ylabels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert ylabels and all(re.fullmatch(r"[\d,]+", y) for y in ylabels), ylabels
    assert "BF16" in ax_mfu.get_ylabel()
