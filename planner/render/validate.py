"""``plan3d validate``: the measured-vs-predicted table of a validator run (planner.validate).

Values by kind, each in one format: losses to 12 significant digits (trailing zeros kept, so
they line up), collective volumes as "calls x bytes", byte counts whole with separators, times
in s/ms, other numbers to 6 significant digits.
"""

from __future__ import annotations

from rich.markup import escape

from .. import fmt
from . import tables
from .console import out


def value_text(name: str, value, time_unit: tuple[str, int] | None = None) -> str:
    """One measured or predicted value of check ``name`` as printed; None -> "-"; times in
    ``time_unit`` (one for the table: fmt.duration_unit), else the unit that reads best."""
    if value is None:
        return "-"
    if isinstance(value, list):  # [calls, payload bytes] of a collective
        return f"{value[0]:,} x {value[1]:,} B"
    if isinstance(value, str):
        return value
    if name.startswith("loss"):
        return fmt.loss(value)
    if name.startswith("schedule "):  # ops in the order / chunks in flight: counts
        return f"{int(value):,} " + ("ops" if name.startswith("schedule order") else "chunks")
    if "time" in name:
        return fmt.seconds(float(value)) if time_unit is None else fmt.seconds_in(float(value), time_unit)
    if "bytes" in name or "peak" in name:
        return f"{value:,.0f} B"
    return fmt.number(value, 6)


def render(result: dict, path: str | None) -> None:
    """Print the run's layout, the checks (and the reported values) and the verdict."""
    run = result["run"]
    lay = run["layout"]
    out.print(f"Validated {run['model']['name']} on {run['world']} ranks ({run['device']}, "
              f"{run['dtype']}): tp={lay['tp']} cp={lay.get('cp', 1)} pp={lay['pp']} "
              f"dp={lay['dp']} zero={lay['zero_stage']} vpp={lay['vpp']} "
              f"recompute={lay['recompute']}{' sp' if lay['sequence_parallel'] else ''}",
              markup=False)
    table = tables.new()
    tables.text_column(table, "check")
    for col in ("measured", "predicted", "ok"):
        tables.number_column(table, col)
    rows = result["checks"] + result["reported"]
    unit = fmt.duration_unit([r[k] for r in rows for k in ("measured", "predicted")
                              if "time" in r["name"] and isinstance(r[k], (int, float))])
    for c in result["checks"]:
        table.add_row(escape(c["name"]), value_text(c["name"], c["measured"], unit),
                      value_text(c["name"], c["predicted"], unit),
                      "[green]yes[/]" if c["passed"] else "[red]NO[/]")
    for r in result["reported"]:
        table.add_row(f"[dim]{escape(r['name'])}[/]", value_text(r["name"], r["measured"], unit),
                      value_text(r["name"], r["predicted"], unit), "[dim]info[/]")
    tables.show(table, out)
    for note in result.get("notes", []):
        out.print(f"note: {note}", markup=False)
    for item in result.get("not_exercised", []):
        out.print(f"[yellow]not exercised[/]: {escape(item['feature'])}: {escape(item['reason'])}")
    failed = [c["name"] for c in result["checks"] if not c["passed"]]
    out.print(f"{len(result['checks']) - len(failed)}/{len(result['checks'])} checks passed"
              + (f"; FAILED: {', '.join(failed)}" if failed else "")
              + (f". Wrote {path}" if path else ""), markup=False)
