"""The flow of ``plan3d regress``: evaluate a case file, compare with (or rewrite) a baseline,
print what moved. The comparison is planner.regress; the output planner.render.regress.

Exit codes: 0 clean (or baseline updated), 1 drift, 2 bad input (UsageError).
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import UsageError


def _json_change(c) -> dict:
    rel = None if c.rel is None or not math.isfinite(c.rel) else c.rel
    safe = (lambda v: None if isinstance(v, float) and not math.isfinite(v) else v)
    return {"case": c.case, "term": c.term, "kind": c.kind, "before": safe(c.before),
            "after": safe(c.after), "rel_change": rel, "message": c.message}


def _read_baseline(cases_path: Path, baseline_path: Path, update: bool):
    """The baseline's results, None when it does not exist yet (or is stdout, '-') and
    ``update`` creates it."""
    from .. import baseline as bl
    from ..outputs import is_stdout
    if is_stdout(baseline_path):
        if update:
            return None
        raise UsageError(f"--baseline {baseline_path} is stdout, where --update writes a new "
                         "baseline; to compare, give the baseline file")
    if baseline_path.is_dir():
        raise UsageError(f"baseline {baseline_path} is a directory")
    if not baseline_path.exists():
        if update:
            return None
        raise UsageError(f"baseline {baseline_path} not found; create it with "
                         f"`plan3d regress {cases_path} --baseline {baseline_path} --update`")
    try:
        return bl.read(baseline_path)
    except UsageError as exc:
        if not update:
            raise
        raise UsageError(f"{exc}; refusing to overwrite a file that is not a baseline "
                         "(remove it first)") from None


def run(cases_path: Path, baseline_path: Path, rtol: float, update: bool, json_out: bool,
        max_rows: int = 100) -> int:
    """The whole command; returns the exit code (0 clean/updated, 1 drift). UsageError on bad input."""
    from .. import baseline as bl
    from ..regress import baseline_diff, compare, evaluate_cases, load_cases
    from ..render import console, regress as show
    if not (rtol >= 0 and math.isfinite(rtol)):
        raise UsageError(f"--rtol must be a finite number >= 0, got {rtol}")
    if max_rows < 0:
        raise UsageError(f"--max-rows must be >= 0 (0 = all), got {max_rows}")
    if update:
        refuse_other_source(cases_path)
    cases = load_cases(cases_path)
    old = _read_baseline(cases_path, baseline_path, update)
    if json_out and update:
        from ..outputs import refuse_json_too
        refuse_json_too(baseline_path, "--baseline", json_out)
    with console.err.status("Evaluating cases...", spinner="dots") as status:
        current = evaluate_cases(cases, lambda name: status.update(f"Evaluating {name}..."))
    failing = {k: v for k, v in current.items() if v.get("status") != "ok"}
    if update:
        diff = baseline_diff(old or {}, current)
        from ..outputs import is_stdout, report_to_stderr, write
        if is_stdout(baseline_path):  # the new baseline alone on stdout, the report on stderr
            write(baseline_path, bl.dumps(current), force=True)
            with report_to_stderr(True):
                show.updated("Wrote", "stdout", len(current), diff, failing)
            return 0
        bl.write(baseline_path, current)
        if json_out:
            console.print_json({"updated": str(baseline_path), "cases": len(current),
                                "entries_changed": diff.entries,
                                "cases_changed": diff.cases_new + diff.cases_changed + diff.cases_removed,
                                "entries": {"new": diff.new, "changed": diff.changed, "removed": diff.removed},
                                "cases_by_kind": {"new": diff.cases_new, "changed": diff.cases_changed,
                                                  "removed": diff.cases_removed},
                                "not_ok": {k: v.get("status") for k, v in failing.items()}})
        else:
            show.updated("Wrote" if old is None else "Updated", baseline_path, len(current),
                         diff, failing)
        return 0
    changes = compare(old, current, rtol)
    terms = sum(len(v) for v in current.values())
    if json_out:
        console.print_json({"clean": not changes, "rtol": rtol, "cases": len(current),
                            "terms": terms, "changes": [_json_change(c) for c in changes]})
    elif not changes:
        show.clean(len(current), terms, baseline_path, rtol)
    else:
        show.drifted(changes, len({c.case for c in changes}), len(set(current) | set(old)), rtol,
                     max_rows)
    return 1 if changes else 0


def source_tree(start: Path) -> Path | None:
    """The plan3d source tree that holds ``start``: the nearest folder at or above it with a
    ``planner/__init__.py`` and a ``pyproject.toml``; None when there is none."""
    for folder in [start, *start.parents]:
        if (folder / "planner" / "__init__.py").is_file() and (folder / "pyproject.toml").is_file():
            return folder
    return None


def refuse_other_source(cases_path: Path) -> None:
    """UsageError (one line) when the case file sits in a plan3d source tree whose planner is not
    the one running: ``--update`` would record the predictions of the installed copy, not of the
    formulas edited in that tree (a non-editable ``pip install`` of an older state)."""
    import planner
    tree = source_tree(cases_path.resolve().parent)
    running = Path(planner.__file__).resolve().parent
    if tree is not None and (tree / "planner").resolve() != running:
        raise UsageError(f"regress --update: the cases are in the source tree {tree}, but the "
                         f"planner running is {running}; the baseline would record that copy's "
                         f"numbers, not this tree's: install the tree editable (cd {tree} && "
                         f"pip install -e '.[dev]') and rerun")
