"""The two consoles (stdout for results, stderr for notes, progress and errors), their width, and
what happens when the reader of stdout leaves.

Width: a terminal's own width; anything else (a pipe, a file, a test's capture) is laid out for
``$COLUMNS`` columns, at least 80 (default 80), so piped output reads like an 80-column terminal
and every table of plan3d is designed to show each number whole at 80 columns.

A closed stdout (``plan3d search ... | head -1``): exit quietly like a tool killed by SIGPIPE.
Python ignores SIGPIPE, so a write to a pipe whose reader left raises BrokenPipeError (rich's
Console turns it into exit 1, click's main too). Exit code 1 means "no layout fits" in plan3d, so
the CLI exits 128 + SIGPIPE = 141 instead, what a shell reports for a tool the signal killed
(bash(1), EXIT STATUS: "128+n" for fatal signal n; SIGPIPE is 13 in signal(7)), with nothing on
stderr. The recipe (point stdout at /dev/null so the interpreter's final flush cannot fail
again) is the one in Python's documentation, signal module, "Note on SIGPIPE".
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import NoReturn

from rich.console import Console

EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE
MIN_WIDTH = 80  # the narrowest layout every table is designed for


def stdout_closed() -> NoReturn:
    """Redirect file descriptor 1 to /dev/null and exit EXIT_BROKEN_PIPE (raises SystemExit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout already closed or not a file
        pass
    raise SystemExit(EXIT_BROKEN_PIPE)


# a run of blanks (and the colour codes among them) that ends a line
_LINE_END_BLANKS = re.compile(r"(?:[ \t]|\x1b\[[0-9;]*m)+(?=\n)")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def strip_line_ends(text: str) -> str:
    """``text`` with the spaces and tabs that end each of its lines removed (colour codes among
    them kept): rich pads every cell of a table's last column and leaves the space at which it
    wraps a long line; no line plan3d prints ends in whitespace, piped or not."""
    return _LINE_END_BLANKS.sub(lambda m: "".join(_SGR.findall(m.group())), text)


class PlainEndConsole(Console):
    """rich Console whose lines never end in whitespace (strip_line_ends on what it writes)."""

    def _render_buffer(self, buffer) -> str:  # rich's one exit for everything it writes
        return strip_line_ends(super()._render_buffer(buffer))


class PipeConsole(PlainEndConsole):
    """rich Console whose broken pipe exits 141 (rich's default: SystemExit(1))."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdout_closed()


def layout_width(stream) -> int | None:
    """None (rich measures the terminal) when ``stream`` is a terminal, else $COLUMNS if it is
    a number of at least MIN_WIDTH, else MIN_WIDTH."""
    try:
        if stream.isatty():
            return None
    except (AttributeError, ValueError):
        pass
    columns = os.environ.get("COLUMNS", "")
    return max(int(columns), MIN_WIDTH) if columns.isdigit() else MIN_WIDTH


# emoji off: rich would print "--gpus 8:100: ..." as "--gpus 8💯 ..." (its :name: codes)
out = PipeConsole(highlight=False, emoji=False, width=layout_width(sys.stdout))
err = PlainEndConsole(stderr=True, highlight=False, emoji=False, width=layout_width(sys.stderr))


def error(message: str) -> None:
    """One line on stderr (the message is printed literally: no rich markup, so "[x]" stays)."""
    from rich.markup import escape
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def note(message: str) -> None:
    """A note or warning on stderr, printed literally and wrapped at spaces to stderr's width: a
    terminal's, else $COLUMNS when set wider than 80, else 80 (errors stay one line: ``error``)."""
    err.print(message, markup=False)


def print_json(data: object) -> None:
    """``data`` as indented JSON on stdout (SI units; NaN is the caller's to avoid)."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def write_stdout(data: str | bytes) -> None:
    """``data`` as is on stdout (a file written to '-': text, or bytes such as a PNG)."""
    if isinstance(data, bytes):
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        sys.stdout.write(data)
        sys.stdout.flush()
