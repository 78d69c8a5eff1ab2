"""``plan3d regress``: the predictions that moved, with their units, and the summary lines.

A baseline term is named like ``time.step`` or ``rank1.memory.total`` (SI values); each value is
shown in the unit of its kind (GiB, s, %, tokens/s, TFLOP/s) with as many significant digits as
it takes (4 to 10) to tell the value before from the value after.
"""

from __future__ import annotations

import math

from rich.markup import escape

from .. import fmt
from . import tables
from .console import out

KIND_LABELS = {"added": "new term", "removed": "term removed", "case_added": "case added",
               "case_removed": "case removed", "status": "status"}
MIN_DIGITS, MAX_DIGITS = 4, 10


def _unit(term: str) -> tuple[float, str, bool]:
    """(scale, unit, grouping) of a baseline term: value shown = SI value * scale, then unit."""
    kind = term.split(".", 1)[1] if term.startswith("rank") and "." in term else term
    if kind in ("memory.peak_stage",) or kind.startswith(("layout.", "search.")):
        return 1.0, "", True
    if kind == "time.bubble_fraction" or kind in ("throughput.mfu", "throughput.hfu"):
        return 100.0, "%", False
    if kind.startswith("memory."):
        return 1 / fmt.GIB, " GiB", False
    if kind.startswith("time.") or kind == "throughput.time_to_train_s":
        return 1.0, " s", False
    units = {"throughput.tokens_per_s": (" tokens/s", True), "throughput.model_tflops_per_gpu":
             (" TFLOP/s", False), "throughput.gpu_hours": (" GPU-hours", True)}
    unit, grouping = units.get(kind, ("", False))
    return 1.0, unit, grouping


def value_text(term: str, value, digits: int = MIN_DIGITS) -> str:
    """A baseline value as shown: booleans and strings as they are, integers whole, floats in
    the unit of ``term`` to ``digits`` significant digits; None (absent) -> "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value).lower() if isinstance(value, bool) else value
    scale, unit, grouping = _unit(term)
    if isinstance(value, int) and scale == 1.0:
        return f"{value:,}{unit}" if grouping else f"{value}{unit}"
    return fmt.number(float(value) * scale, digits, grouping) + unit


def pair_text(term: str, before, after) -> tuple[str, str]:
    """``before`` and ``after`` to the fewest significant digits (MIN_DIGITS..MAX_DIGITS) that
    tell them apart (both to the same digits)."""
    for digits in range(MIN_DIGITS, MAX_DIGITS + 1):
        a, b = value_text(term, before, digits), value_text(term, after, digits)
        if a != b:
            break
    return a, b


def change_text(c) -> str:
    """The change column: the relative change of a moved number as a signed percentage (no
    exponent), else what happened (new term, status, ...)."""
    if c.kind == "moved" and c.rel is not None:
        if math.isinf(c.rel):
            return "from 0" if c.before == 0 else "inf"
        sign = 1 if float(c.after) >= float(c.before) else -1
        return fmt.percent_change(sign * c.rel, significant=4)
    return KIND_LABELS.get(c.kind, "changed")


def changes_table(changes: list, max_rows: int) -> None:
    """The first ``max_rows`` changes (0 = all), grouped by case: term, before over after, change."""
    shown = changes if max_rows <= 0 else changes[:max_rows]
    t = tables.new("Predictions that moved")
    tables.text_column(t, "case / term")
    tables.number_column(t, "before\nafter")
    tables.number_column(t, "change")
    case = None
    for c in shown:
        if c.case != case:
            case = c.case
            t.add_row(f"[bold]{escape(case)}[/]", "", "")
        before, after = pair_text(c.term, c.before, c.after)
        name = f"  {escape(c.term)}" + (f"\n  [dim]{escape(c.message)}[/]" if c.message else "")
        t.add_row(name, tables.stacked([before, after]), change_text(c))
    tables.show(t, out)
    if len(shown) < len(changes):
        out.print(f"... and {fmt.count(len(changes) - len(shown))} more (--max-rows 0 shows all, "
                  "--json gives them to machines)")


def updated(verb: str, path, cases: int, diff, failing: dict) -> None:
    """The line after ``--update`` (what the rewrite changed: entries new, changed and removed,
    in which cases; regress.BaselineDiff), and a note per case recorded as not ok."""
    out.print(f"{verb} {path}: {_cases(cases)}; {diff_text(diff)}.", markup=False)
    for name, v in failing.items():
        out.print(f"  note: case {name} is recorded as {v.get('status')}: {v.get('message')}",
                  markup=False)


def diff_text(d) -> str:
    """'entries: 40 new, 12 changed, 3 removed; cases: 1 new, 2 changed, 0 removed': new,
    changed and removed apart (an entry of a new case is new, not changed)."""
    c = fmt.count
    return (f"entries: {c(d.new)} new, {c(d.changed)} changed, {c(d.removed)} removed; "
            f"cases: {c(d.cases_new)} new, {c(d.cases_changed)} changed, {c(d.cases_removed)} removed")


def clean(cases: int, terms: int, path, rtol: float) -> None:
    """The line of a run that matches its baseline."""
    out.print(f"regress: {_cases(cases)}, {fmt.count(terms)} terms match {path} within rtol "
              f"{rtol:g}.", markup=False)


def drifted(changes: list, cases_moved: int, cases: int, rtol: float, max_rows: int) -> None:
    """The table of what moved and the line after it."""
    changes_table(changes, max_rows)
    out.print(f"regress: {fmt.count(len(changes))} change{'s' if len(changes) != 1 else ''} beyond "
              f"rtol {rtol:g} in {cases_moved} of {_cases(cases)}. If intended, rerun with --update "
              "and commit the baseline diff.", markup=False)


def _cases(n: int) -> str:
    """'1 case', '53 cases'."""
    return f"{n} case{'s' if n != 1 else ''}"
