"""benchmarks/readme_examples.py: markers are found, transcripts rerun, exit codes checked; every
output block of README.md is marked (console and plain fences; ```text blocks are hand-written)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_examples", ROOT / "benchmarks" / "readme_examples.py")
rx = importlib.util.module_from_spec(_spec)
sys.modules["readme_examples"] = rx  # dataclasses look their module up there
_spec.loader.exec_module(rx)

DOC = """# t

<!-- example: echo one -->
```
stale
```

<!-- example exit=0,3 -->
```console
$ echo a \\
    b
old output
$ echo err >&2; exit 3
```

<!-- example: echo not a marker: a blank line separates it -->

```
untouched
```
"""


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_markers_find_their_blocks_only():
    blocks = rx.find_blocks(_lines(DOC))
    assert [(b.command, b.exits) for b in blocks] == [("echo one", []), (None, [0, 3])]
    first = blocks[0]
    assert _lines(DOC)[first.start:first.end] == ["stale\n"]  # the content between the fences


def test_transcript_commands_join_continuations():
    body = ["$ echo a \\\n", "    b\n", "old output\n", "$ true\n"]
    assert rx.transcript_commands(body) == [["$ echo a \\\n", "    b\n"], ["$ true\n"]]


def test_regenerate_reruns_and_checks_exit_codes(tmp_path):
    lines = _lines(DOC)
    one, transcript = rx.find_blocks(lines)
    assert rx.regenerate(one, lines, tmp_path) == (["one\n"], [])
    new, problems = rx.regenerate(transcript, lines, tmp_path)
    # a failing command keeps its stderr; "echo a b" prints "a b"
    assert new == ["$ echo a \\\n", "    b\n", "a b\n", "$ echo err >&2; exit 3\n", "err\n"]
    assert problems == []
    transcript.exits = [0, 0]
    assert rx.regenerate(transcript, lines, tmp_path)[1] == ["$ echo err >&2; exit 3...: exit code 3, marked 0"]


def test_every_output_block_of_the_readme_is_marked():
    lines = _lines((ROOT / "README.md").read_text())
    marked = {b.start - 1 for b in rx.find_blocks(lines)}
    unmarked = [t.map[0] + 1 for t in MarkdownIt("commonmark").parse("".join(lines))
                if t.type == "fence" and t.info.strip() in ("", "console") and t.map[0] not in marked]
    assert unmarked == [], f"README.md lines {unmarked}: output blocks without an example marker"
