"""Table building blocks: one style, number columns that are never cut, and the choice between a
wide layout and a narrow (stacked) one by the width the console has.

Rules every table of plan3d follows, so that each number shows whole at 80 columns:
- number columns never wrap (``no_wrap``); at most one text column per table folds (wraps at its
  spaces), and no word of it is longer than that column may shrink to;
- a renderer offers its layouts widest first and ``pick`` takes the first that fits with no cell
  wrapped, else the last (narrow) one, whose minimum width (rich's measurement: number columns
  at full width, the text column at its longest word) is designed to be at most 80.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

UNLIMITED = 100_000  # columns: "as wide as the table wants"


def new(title: str | None = None, **options) -> Table:
    """A table in plan3d's style: no outer edge, bold headers, a left-aligned title."""
    return Table(title=title, show_edge=False, header_style="bold", title_justify="left", **options)


def number_column(table: Table, header: str, **options) -> None:
    """A right-aligned column that never wraps (numbers, short codes)."""
    table.add_column(header, justify="right", no_wrap=True, **options)


def code_column(table: Table, header: str, **options) -> None:
    """A left-aligned column that never wraps (names, identifiers, short words)."""
    table.add_column(header, justify="left", no_wrap=True, **options)


def text_column(table: Table, header: str, **options) -> None:
    """The left-aligned column that folds at its spaces when the table needs room."""
    table.add_column(header, justify="left", overflow="fold", **options)


def min_width(table: Table, console: Console) -> int:
    """Columns needed to print ``table`` without cutting a word or number."""
    return _measure(table, console).minimum


def full_width(table: Table, console: Console) -> int:
    """Columns needed to print ``table`` with no cell wrapped."""
    return _measure(table, console).maximum


def _measure(table: Table, console: Console) -> Measurement:
    # measured with room to spare: rich clamps a table's measurement to the width it is given
    return Measurement.get(console, console.options.update_width(UNLIMITED), table)


def pick(builders: Sequence[Callable[[], Table]], console: Console) -> Table:
    """The first table of ``builders`` (widest layout first) that fits ``console`` with no cell
    wrapped; else the last, whose text column folds (it fits 80 columns by design)."""
    for build in builders[:-1]:
        table = build()
        if full_width(table, console) <= console.width:
            return table
    return builders[-1]()


def stacked(cells: Iterable[str]) -> str:
    """Several values in one cell, one per line (a stacked row); empty values stay as blank
    lines so the lines of neighbouring cells correspond."""
    return "\n".join(cells)


def show(table: Table, console: Console) -> None:
    """Print ``table`` with its title on a line of its own above it, wrapped at the console's
    width rather than at the table's (rich wraps a title inside the table's own width)."""
    title, table.title = table.title, None
    if title:
        console.print(title, style="table.title")
    console.print(table)
