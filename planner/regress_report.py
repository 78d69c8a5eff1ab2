"""`plan3d regress`: evaluate a case file, compare with (or rewrite) a baseline, render what moved.

Rendering goes through report's consoles (stdout for results, stderr for progress and errors).
Exit codes: 0 clean (or baseline updated), 1 drift, 2 bad input (UsageError).
"""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from . import baseline as bl
from . import report
from .errors import UsageError
from .regress import Change, compare, count_changed, evaluate_cases, load_cases

KIND_LABELS = {"added": "new term", "removed": "term removed", "case_added": "case added",
               "case_removed": "case removed"}


def _fmt(v) -> str:
    return "-" if v is None else bl.format_value(v).strip('"')


def _fmt_rel(c: Change) -> str:
    if c.kind == "moved" and c.rel is not None:
        if math.isinf(c.rel):
            return "from 0" if c.before == 0 else "inf"
        sign = "+" if float(c.after) >= float(c.before) else "-"  # type: ignore[arg-type]
        return f"{sign}{c.rel:.3%}" if c.rel >= 1e-4 else f"{sign}{c.rel:.2e}"
    if c.kind == "status":
        return c.message or "status changed"
    if c.kind == "case_added" and c.message:
        return f"case added ({c.message})"
    return KIND_LABELS.get(c.kind, "changed")


def changes_table(changes: list[Change], max_rows: int) -> None:
    """Rich table (case, term, before, after, change) of the first ``max_rows`` changes (0 = all)."""
    shown = changes if max_rows <= 0 else changes[:max_rows]
    t = Table(title="Predictions that moved", show_edge=False, header_style="bold")
    for col, justify in (("case", "left"), ("term", "left"), ("before", "right"),
                         ("after", "right"), ("change", "right")):
        t.add_column(col, justify=justify, overflow="fold")
    for c in shown:
        t.add_row(c.case, c.term, _fmt(c.before), _fmt(c.after), _fmt_rel(c))
    report.out.print(t)
    if len(shown) < len(changes):
        report.out.print(f"... and {len(changes) - len(shown):,} more (--max-rows 0 shows all, "
                         "--json gives them to machines)")


def _json_change(c: Change) -> dict:
    rel = None if c.rel is None or math.isinf(c.rel) else c.rel
    return {"case": c.case, "term": c.term, "kind": c.kind, "before": c.before, "after": c.after,
            "rel_change": rel, "message": c.message}


def _json_safe(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def run(cases_path: Path, baseline_path: Path, rtol: float, update: bool, json_out: bool,
        max_rows: int = 100) -> int:
    """The whole command; returns the exit code (0 clean/updated, 1 drift). UsageError on bad input."""
    if not (rtol >= 0 and math.isfinite(rtol)):
        raise UsageError(f"--rtol must be a finite number >= 0, got {rtol}")
    if max_rows < 0:
        raise UsageError(f"--max-rows must be >= 0 (0 = all), got {max_rows}")
    cases = load_cases(cases_path)
    old = None
    if baseline_path.is_dir():
        raise UsageError(f"baseline {baseline_path} is a directory")
    if baseline_path.exists():
        try:
            old = bl.read(baseline_path)
        except UsageError as exc:
            if not update:
                raise
            raise UsageError(f"{exc}; refusing to overwrite a file that is not a baseline "
                             "(remove it first)") from None
    elif not update:
        raise UsageError(f"baseline {baseline_path} not found; create it with "
                         f"`plan3d regress {cases_path} --baseline {baseline_path} --update`")
    with report.err.status("Evaluating cases...", spinner="dots") as status:
        current = evaluate_cases(cases, lambda name: status.update(f"Evaluating {name}..."))
    failing = {k: v for k, v in current.items() if v.get("status") != "ok"}
    if update:
        entries, changed_cases = count_changed(old or {}, current)
        bl.write(baseline_path, current)
        if json_out:
            report.print_json({"updated": str(baseline_path), "cases": len(current),
                               "entries_changed": entries, "cases_changed": changed_cases,
                               "not_ok": {k: v.get("status") for k, v in failing.items()}})
            return 0
        verb = "Wrote" if old is None else "Updated"
        report.out.print(f"{verb} {baseline_path}: {len(current)} cases; {entries:,} entries changed "
                         f"in {changed_cases} case{'s' if changed_cases != 1 else ''}.")
        for name, v in failing.items():
            report.out.print(f"  note: case {name} is recorded as {v.get('status')}: {v.get('message')}")
        return 0
    assert old is not None
    changes = compare(old, current, rtol)
    terms = sum(len(v) for v in current.values())
    if json_out:
        report.print_json({"clean": not changes, "rtol": rtol, "cases": len(current),
                           "terms": terms, "changes": [
                               {k: _json_safe(v) for k, v in _json_change(c).items()}
                               for c in changes]})
        return 1 if changes else 0
    if not changes:
        report.out.print(f"regress: {len(current)} cases, {terms:,} terms match {baseline_path} "
                         f"within rtol {rtol:g}.")
        return 0
    changes_table(changes, max_rows)
    moved_cases = len({c.case for c in changes})
    report.out.print(f"regress: {len(changes):,} change{'s' if len(changes) != 1 else ''} beyond "
                     f"rtol {rtol:g} in {moved_cases} of {len(set(current) | set(old))} cases. "
                     "If intended, rerun with --update and commit the baseline diff.")
    return 1
