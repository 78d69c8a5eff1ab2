"""benchmarks/readme_examples.py: markers are found, transcripts rerun, exit codes checked, pages
updated in place; every output block of README.md and docs/*.md is marked (console and plain
fences; ```text blocks are hand-written or generated)."""

from __future__ import annotations

from pathlib import Path

import pytest

from markdown_it import MarkdownIt
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
rx = load_benchmark("readme_examples")

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


# docs/formulas.md's plain fences hold formulas, not command output
UNCHECKED = {"formulas.md"}


def test_the_pages_are_the_readme_and_docs():
    names = [p.relative_to(ROOT).as_posix() for p in rx.pages()]
    assert names[0] == "README.md" and "docs/search.md" in names and "docs/formulas.md" in names


@pytest.mark.parametrize("page", [p for p in rx.pages() if p.name not in UNCHECKED], ids=lambda p: p.name)
def test_every_output_block_of_the_readme_is_marked(page):
    lines = _lines(page.read_text())
    marked = {b.start - 1 for b in rx.find_blocks(lines)}
    unmarked = [t.map[0] + 1 for t in MarkdownIt("commonmark").parse("".join(lines))
                if t.type == "fence" and t.info.strip() in ("", "console") and t.map[0] not in marked]
    assert unmarked == [], f"{page.name} lines {unmarked}: output blocks without an example marker"


def test_update_rewrites_each_page_in_place(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rx, "check_install", lambda: None)
    one, two = tmp_path / "one.md", tmp_path / "two.md"
    one.write_text(DOC)
    two.write_text("# two\n\n<!-- example: echo two -->\n```\nold\n```\n")
    files = ["--file", str(one), "--file", str(two)]
    assert rx.main(["--check", *files]) == 1  # both pages hold a stale block
    assert rx.main(["--update", *files]) == 0
    assert "```\none\n```" in one.read_text() and "a b\n" in one.read_text()
    assert two.read_text() == "# two\n\n<!-- example: echo two -->\n```\ntwo\n```\n"
    assert one.read_text().endswith("```\nuntouched\n```\n")  # an unmarked block is left alone
    assert rx.main(["--check", *files]) == 0
    assert "2 pages, 3 blocks: 0 differ" in capsys.readouterr().out


def test_a_page_runs_in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(rx, "check_install", lambda: None)
    writes, reads = tmp_path / "a.md", tmp_path / "b.md"
    writes.write_text("<!-- example: echo x > made.txt; cat made.txt -->\n```\nx\n```\n")
    reads.write_text("<!-- example exit=1: cat made.txt 2>/dev/null || exit 1 -->\n```\n```\n")
    assert rx.main(["--check", "--file", str(writes), "--file", str(reads)]) == 0
