"""``plan3d sweep``'s table (one row per GPU count and batch) and the progress bar."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from . import fmt, tables
from .console import err, out


def progress():
    """A rich progress bar on stderr (the table goes to stdout); off when stderr is not a
    terminal, where rich would leave a blank line behind."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)


def _cells(r: dict) -> dict[str, str]:
    if r.get("error"):
        return {k: "-" for k in ("tokens/s", "MFU", "step", "mem/GPU", "scaling eff.")}
    eff = r["scaling_efficiency"]
    return {"tokens/s": fmt.tokens_per_s(r["tokens_per_s"]), "MFU": fmt.percent(r["mfu"]),
            "step": fmt.seconds(r["step_s"]), "mem/GPU": fmt.gib(r["memory_bytes"]),
            "scaling eff.": fmt.percent(eff, 0) if eff is not None else "-"}


def _layout(r: dict) -> str:
    return f"[red]{escape(r['error'])}[/]" if r.get("error") else r["layout_short"]


def _table(rows: list[dict], stacks: list[list[str]], header_break: bool) -> Table:
    batches = len({r["global_batch_size"] for r in rows}) > 1
    t = tables.new()
    for col in ("batch",) * batches + ("GPUs",):
        tables.number_column(t, col)
    tables.text_column(t, "best layout")
    for stack in stacks:
        header = tables.stacked(stack)
        tables.number_column(t, header.replace(" ", "\n") if header_break else header)
    for r in rows:
        cells = _cells(r)
        lead = (fmt.count(r["global_batch_size"]),) * batches + (fmt.count(r["gpus"]),)
        t.add_row(*lead, _layout(r), *(tables.stacked(cells[k] for k in s) for s in stacks))
    return t


def sweep_table(rows: list[dict]) -> None:
    """One row per GPU count (and batch): best layout, tokens/s, MFU, step, memory per GPU and
    scaling efficiency; one column per figure where the console is wide enough, else the figures
    stacked two to a column."""
    wide = [[k] for k in ("tokens/s", "MFU", "step", "mem/GPU", "scaling eff.")]
    narrow = [["tokens/s", "MFU"], ["step", "mem/GPU"], ["scaling eff."]]
    out.print(tables.pick([lambda: _table(rows, wide, False), lambda: _table(rows, narrow, True)],
                          out))
