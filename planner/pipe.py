"""A closed stdout (``plan3d search ... | head -1``): exit quietly like a tool killed by SIGPIPE.

Python ignores SIGPIPE, so a write to a pipe whose reader left raises BrokenPipeError (rich's
Console turns it into exit 1, click's main too). Exit code 1 means "no layout fits" in plan3d, so
the CLI exits 128 + SIGPIPE = 141 instead, what a shell reports for a tool the signal killed
(bash(1), EXIT STATUS: "128+n" for fatal signal n; SIGPIPE is 13 in signal(7)), with nothing on
stderr. The recipe (point stdout at /dev/null so the interpreter's final flush cannot fail
again) is the one in Python's documentation, signal module, "Note on SIGPIPE".
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

from rich.console import Console

EXIT_BROKEN_PIPE = 128 + 13  # 128 + SIGPIPE


def stdout_closed() -> NoReturn:
    """Redirect file descriptor 1 to /dev/null and exit EXIT_BROKEN_PIPE (raises SystemExit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout already closed or not a file
        pass
    raise SystemExit(EXIT_BROKEN_PIPE)


class PipeConsole(Console):
    """rich Console whose broken pipe exits 141 (rich's default: SystemExit(1))."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdout_closed()
