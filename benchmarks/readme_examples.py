"""Rerun the commands behind the example output of README.md and docs/*.md; check or rewrite it.

Usage:  python benchmarks/readme_examples.py --check | --update  [--only TEXT] [--file PAGE ...]
                                             [--diff] [--jobs N]

Every example output block of a page has a marker line just before its opening fence:

    <!-- example: CMD -->          the block is what CMD prints (stdout)
    <!-- example exit=N: CMD -->   CMD must exit with N; the block is its stdout, then its stderr
    <!-- example -->               a transcript: every "$ CMD" line (a trailing backslash continues
    <!-- example exit=0,2 -->      it) is rerun in order and its output replaces the lines up to
                                   the next "$ " line; exit= lists the exit code of each command

The pages are README.md and every docs/*.md (PAGES), or those given with --file (repeatable).
Commands run in bash with COLUMNS=80, NO_COLOR=1 and this interpreter's bin/ first on PATH (the
`plan3d` installed from this tree; anything else is refused), in one scratch folder per page that
links every top-level entry of the repository (so `benchmarks/...` resolves and files a command
writes, such as plan.yaml, stay out of the tree and carry over to later blocks of the same page,
as for a reader who follows that page top to bottom; a page never reads what another one
writes). Pages run in parallel, --jobs at a time (default: the CPUs), the blocks of a page in
order. Trailing spaces are stripped from every output line. --check prints which blocks differ
(--diff: how) and exits 1 if any does or if a command's exit code is not the one marked;
--update rewrites the blocks that differ, in place in each page (never one whose exit code is
wrong), and exits 1 only for those. --only TEXT reruns just the blocks whose marker or commands
contain TEXT (a block that reads a file an earlier block writes needs that block too: --only
plan.yaml reruns every block that names it). A whole run takes a few minutes on 2 cores. Blocks
left unmarked on purpose are fenced as ```text (hand-written: timings, the repository layout,
the generated command-line reference) or ```bash / ```yaml (commands and inputs, no output);
tests/test_readme_examples.py checks that every other block is marked.
"""

from __future__ import annotations

import argparse
import difflib
import os
from concurrent.futures import ThreadPoolExecutor
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent


def pages() -> list[Path]:
    """The pages whose examples are checked: README.md, then docs/*.md by name."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


MARKER = re.compile(r"^<!--\s*example(?:\s+exit=(?P<exit>[\d,]+))?\s*(?::\s*(?P<cmd>.*?))?\s*-->$")


@dataclass
class Block:
    """One marked fenced block: marker line, content lines [start, end) (0-based), command(s)."""
    marker_line: int
    start: int
    end: int
    command: str | None      # None: a transcript
    exits: list[int]


def find_blocks(lines: list[str]) -> list[Block]:
    """The fenced blocks whose previous line is an example marker (markdown-it finds the fences)."""
    blocks = []
    for tok in MarkdownIt("commonmark").parse("".join(lines)):
        if tok.type != "fence" or tok.map is None or tok.map[0] == 0:
            continue
        m = MARKER.match(lines[tok.map[0] - 1].strip())
        if m is None:
            continue
        exits = [int(x) for x in m["exit"].split(",")] if m["exit"] else []
        blocks.append(Block(tok.map[0] - 1, tok.map[0] + 1, tok.map[1] - 1, m["cmd"] or None, exits))
    return blocks


def run(command: str, cwd: Path) -> tuple[list[str], int]:
    """Output lines of one command (stdout; stderr too when it fails) and its exit code."""
    env = dict(os.environ, COLUMNS="80", NO_COLOR="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    text = done.stdout + (done.stderr if done.returncode else "")
    return [line.rstrip() + "\n" for line in text.rstrip("\n").split("\n")] if text.strip() else [], done.returncode


def transcript_commands(body: list[str]) -> list[list[str]]:
    """The "$ " command lines of a transcript, each with its continuation lines."""
    commands, i = [], 0
    while i < len(body):
        if body[i].startswith("$ "):
            cmd = [body[i]]
            while cmd[-1].rstrip("\n").endswith("\\") and i + 1 < len(body):
                i += 1
                cmd.append(body[i])
            commands.append(cmd)
        i += 1
    return commands


def regenerate(block: Block, lines: list[str], cwd: Path) -> tuple[list[str], list[str]]:
    """(new content lines, problems) of a block."""
    if block.command is not None:
        out, rc = run(block.command, cwd)
        want = block.exits[0] if block.exits else 0
        return out, [] if rc == want else [f"exit code {rc}, marked {want}"]
    commands = transcript_commands(lines[block.start:block.end])
    wants = block.exits or [0] * len(commands)
    if len(wants) != len(commands):
        return [], [f"exit= lists {len(wants)} codes for {len(commands)} commands"]
    new, problems = [], []
    for cmd, want in zip(commands, wants):
        out, rc = run("".join(cmd)[2:].replace("\\\n", " "), cwd)
        new += cmd + out
        if rc != want:
            problems.append(f"{cmd[0].strip()[:60]}...: exit code {rc}, marked {want}")
    return new, problems


def scratch_dir(tmp: Path) -> Path:
    """A folder linking every top-level entry of the repository."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv"):
            (tmp / entry.name).symlink_to(entry)
    return tmp


def check_install() -> None:
    """Refuse to run when this interpreter's planner is not this tree's (a non-editable install)."""
    import planner
    if Path(planner.__file__).resolve().parent != ROOT / "planner":
        sys.exit(f"error: planner is imported from {Path(planner.__file__).parent}, not {ROOT / 'planner'}: "
                 "run from this tree's virtualenv (pip install -e .)")


def rerun_page(path: Path, only: str | None) -> tuple[list[str], list[Block], list[tuple[list[str], list[str]]]]:
    """(the page's lines, its marked blocks, (new lines, problems) per block), in a scratch folder
    of the page's own; ``only``: just the blocks whose marker or commands contain that text."""
    lines = path.read_text().splitlines(keepends=True)
    blocks = find_blocks(lines)
    if only:
        blocks = [b for b in blocks if only in "".join(lines[b.marker_line:b.end])]
    if not blocks:
        return lines, blocks, []
    with tempfile.TemporaryDirectory(prefix="readme-examples-") as tmp:
        cwd = scratch_dir(Path(tmp))
        return lines, blocks, [regenerate(b, lines, cwd) for b in blocks]


def _name(path: Path) -> str:
    """A page as the reports name it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    """Check or update the marked blocks of every page; the exit code says whether all were as marked."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="report the blocks that differ; exit 1 if any")
    mode.add_argument("--update", action="store_true", help="rewrite the blocks that differ, in place")
    ap.add_argument("--only", help="only the blocks whose marker or commands contain this text")
    ap.add_argument("--file", type=Path, action="append",
                    help="a page to rerun (repeatable; default: README.md and docs/*.md)")
    ap.add_argument("--diff", action="store_true", help="with --check: print a unified diff per block")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="pages rerun at a time")
    args = ap.parse_args(argv)
    check_install()
    files = args.file or pages()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        reruns = list(pool.map(lambda f: rerun_page(f, args.only), files))
    total = failed = changed = 0
    for path, (lines, blocks, results) in zip(files, reruns):
        total += len(blocks)
        page_changed = 0
        for b, (new, problems) in reversed(list(zip(blocks, results))):  # from the end: line numbers stay valid
            label = f"{_name(path)}:{b.marker_line + 1}: {b.command or 'transcript'}"
            if problems:
                failed += 1
                print(f"{label}: " + "; ".join(problems))
                continue
            if new == lines[b.start:b.end]:
                continue
            page_changed += 1
            print(f"{label}: differs" if args.check else f"{label}: updated")
            if args.check and args.diff:
                sys.stdout.writelines(difflib.unified_diff(lines[b.start:b.end], new, _name(path), "rerun"))
            if args.update:
                lines[b.start:b.end] = new
        if args.update and page_changed:
            path.write_text("".join(lines))
        changed += page_changed
    print(f"{len(files)} pages, {total} blocks: {changed} {'differ' if args.check else 'updated'}, "
          f"{failed} with a wrong exit code")
    return 1 if failed or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
