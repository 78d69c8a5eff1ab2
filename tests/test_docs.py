"""The documentation holds together: every relative link of README.md and docs/*.md reaches a file
and, with a #fragment, a heading of it (GitHub's anchors); every page is on the README's map; the
README stays short; docs/cli.md is what benchmarks/cli_reference.py generates from the commands'
own --help."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from markdown_it import MarkdownIt
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The README holds what plan3d is, the set-up, the main job with its ~80-line output and the map
# of docs/ (about 200 lines in all). 250 leaves room for the output to grow a little, not for a
# topic section to move back in (the shortest, "Rank placement", is 60 lines).
README_MAX_LINES = 250

_md = MarkdownIt("commonmark")


def _load(name: str):
    return load_benchmark(name)


def slug(text: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped (letters, digits,
    '_', '-' and spaces kept), spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, repeated ones numbered -1, -2, ... as GitHub does."""
    tokens = _md.parse(path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for i, tok in enumerate(tokens):
        if tok.type != "heading_open":
            continue
        text = "".join(c.content for c in tokens[i + 1].children or []
                       if c.type in ("text", "code_inline"))
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """Every link and image target of a Markdown file."""
    out = []
    for tok in _md.parse(path.read_text()):
        for child in tok.children or []:
            if child.type == "link_open":
                out.append(child.attrs["href"])
            elif child.type == "image":
                out.append(child.attrs["src"])
    return out


def test_slug_follows_github():
    assert slug("Validating a plan with real PyTorch") == "validating-a-plan-with-real-pytorch"
    assert slug("Regression tests of predictions (plan3d regress)") == \
        "regression-tests-of-predictions-plan3d-regress"
    assert slug("Calibrated, not tuned") == "calibrated-not-tuned"
    assert slug("12. Checkpoints and failures: size per rank") == "12-checkpoints-and-failures-size-per-rank"
    assert slug("plan3d search") == "plan3d-search"


def test_every_relative_link_reaches_a_file_and_heading():
    broken = []
    for page in PAGES:
        for href in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", href):  # https:, mailto: ...
                continue
            target, _, fragment = unquote(href).partition("#")
            dest = (page.parent / target).resolve() if target else page
            where = f"{page.relative_to(ROOT)}: {href}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif fragment and (dest.suffix != ".md" or fragment not in anchors(dest)):
                broken.append(f"{where}: no heading #{fragment} in {dest.relative_to(ROOT)}")
    assert broken == [], "\n".join(broken)


def test_every_page_is_on_the_readme_map():
    mapped = {(ROOT / unquote(h).partition("#")[0]).resolve() for h in links(ROOT / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in mapped]
    assert missing == [], f"docs pages the README does not link: {missing}"


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < README_MAX_LINES, f"README.md has {lines} lines; topics belong in docs/"


def test_readme_keeps_the_set_up_at_the_top():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    install = next(line for line in ci.splitlines() if line.startswith("python3 -m venv"))
    # .ci/run's install line is the README's, the main job there with --top 3 to keep the log short
    assert install.replace(" --top 3", "").replace(" -q", "") in readme
    assert "python -m pytest -q" in readme
    assert readme.index("## Set-up") < readme.index("## Example") < readme.index("## Documentation")


def test_cli_reference_is_what_the_commands_print():
    ref = _load("cli_reference")
    assert (ROOT / "docs" / "cli.md").read_text() == ref.render(), \
        "docs/cli.md is stale: run python benchmarks/cli_reference.py --update"


def test_cli_reference_has_every_command_at_a_fixed_width():
    ref = _load("cli_reference")
    sections = ref.helps()
    names = [path for path, _ in sections]
    assert names[0] == "plan3d" and "plan3d search" in names and "plan3d validate" in names
    widest = max(len(line) for _, text in sections for line in text.splitlines())
    assert widest <= ref.WIDTH
    assert all("\x1b[" not in text for _, text in sections)  # no colour codes
    assert ref.helps(60) != sections  # the width is the script's, not the terminal's
