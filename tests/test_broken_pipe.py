"""A closed stdout (`plan3d search ... | head -1`) exits 141 = 128 + SIGPIPE, quietly.

Exit code 1 is reserved for "no layout fits", so a reader that left must not look like it. The
pipe's read end is closed before plan3d starts, so its first write to stdout fails every time
(no race with a reader): through rich's console (tables), sys.stdout.write (--json, --show),
and outside any command (--version).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from planner.render.console import EXIT_BROKEN_PIPE


@pytest.mark.parametrize("args", [
    ("search", "--model", "175b", "--gpus", "512"),    # rich table
    ("search", "--model", "175b", "--gpus", "512", "--json"),  # sys.stdout.write
    ("models", "--show", "llama3-8b"),                  # sys.stdout.write of a YAML
    ("--version",),                                     # outside any command
])
def test_closed_stdout_exits_141_without_a_word(args):
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert EXIT_BROKEN_PIPE == 141  # 128 + SIGPIPE (13, signal(7))
    assert (proc.returncode, proc.stderr) == (141, "")
