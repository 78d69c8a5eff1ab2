"""``plan3d sweep``'s table (one row per GPU count and batch) and the progress bar."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .. import fmt
from . import tables
from .console import err, out


def progress():
    """A rich progress bar on stderr (the table goes to stdout); off when stderr is not a
    terminal, where rich would leave a blank line behind."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)


FIGURES = ("tokens/s", "MFU", "step", "mem/GPU", "scaling eff.", "train", "goodput")


def _units(rows: list[dict]) -> dict[str, tuple[str, int]]:
    """The one duration unit (and decimals) of the step and train columns (fmt.duration_unit)."""
    return {k: fmt.duration_unit([r[key] for r in rows if r.get(key) is not None and not r.get("error")])
            for k, key in (("step", "step_s"), ("train", "time_to_train_s"))}


def _cells(r: dict, units: dict[str, tuple[str, int]]) -> dict[str, str]:
    if r.get("error"):
        return {k: "-" for k in FIGURES}
    eff = r["scaling_efficiency"]
    train = r.get("time_to_train_s")
    return {"tokens/s": fmt.tokens_per_s(r["tokens_per_s"]), "MFU": fmt.percent(r["mfu"]),
            "step": fmt.seconds_in(r["step_s"], units["step"]), "mem/GPU": fmt.gib(r["memory_bytes"]),
            "scaling eff.": fmt.percent(eff, 0) if eff is not None else "-",
            "train": fmt.seconds_in(train, units["train"]) if train is not None else "-",
            "goodput": fmt.percent(r["goodput"], 2) if r.get("goodput") is not None else "-"}


def _layout(r: dict) -> str:
    return f"[red]{escape(r.get('error_brief') or r['error'])}[/]" if r.get("error") else r["layout_short"]


def _table(rows: list[dict], stacks: list[list[str]], header_break: bool) -> Table:
    batches = len({r["global_batch_size"] for r in rows}) > 1
    t = tables.new()
    for col in ("batch",) * batches + ("GPUs",):
        tables.number_column(t, col)
    tables.text_column(t, "best layout")
    for stack in stacks:
        header = tables.stacked(stack)
        tables.number_column(t, header.replace(" ", "\n") if header_break else header)
    units = _units(rows)
    for r in rows:
        cells = _cells(r, units)
        lead = (fmt.count(r["global_batch_size"]),) * batches + (fmt.count(r["gpus"]),)
        t.add_row(*lead, _layout(r), *(tables.stacked(cells[k] for k in s) for s in stacks))
    return t


def sweep_table(rows: list[dict], deadline_s: float | None = None) -> None:
    """One row per GPU count (and batch): best layout, tokens/s, MFU, step, memory per GPU,
    scaling efficiency and, with a token budget, the expected time to train and the goodput;
    one column per figure where the console is wide enough, else the figures stacked two to a
    column (three with a token budget). Under it, with a token budget: the count that trains soonest per batch, and whether
    more GPUs stop paying (the time to train rises again) within the sweep."""
    timed = any(r.get("time_to_train_s") is not None for r in rows)
    figures = FIGURES if timed else FIGURES[:5]
    wide = [[k] for k in figures]
    narrow = [["tokens/s", "MFU"], ["step", "mem/GPU"], ["scaling eff."]]
    if timed:
        narrow = [["tokens/s", "MFU", "train"], ["step", "mem/GPU", "goodput"], ["scaling eff."]]
    out.print(tables.pick([lambda: _table(rows, wide, False), lambda: _table(rows, narrow, True)],
                          out))
    if timed:
        for line in _soonest(rows, deadline_s):
            out.print(line, markup=False)


def _soonest(rows: list[dict], deadline_s: float | None) -> list[str]:
    """One line per batch: the GPU count with the shortest expected time to train, and the
    larger counts that take longer (more GPUs no longer pay: goodput falls as failures come
    more often and per-GPU throughput drops)."""
    lines = []
    for batch in dict.fromkeys(r["global_batch_size"] for r in rows):
        timed = [r for r in rows if r["global_batch_size"] == batch and r.get("time_to_train_s") is not None]
        if not timed:
            continue
        best = min(timed, key=lambda r: r["time_to_train_s"])
        slower = [r["gpus"] for r in timed if r["gpus"] > best["gpus"]]
        at = f" (batch {fmt.count(batch)})" if len(rows) != len(timed) or len(lines) else ""
        line = (f"Soonest trained{at}: {fmt.count(best['gpus'])} GPUs, "
                f"{fmt.seconds(best['time_to_train_s'])} with failures and checkpoints")
        if slower:
            line += (f"; {', '.join(fmt.count(n) for n in slower)} GPUs take longer: adding GPUs "
                     "stops paying there")
        if deadline_s is not None:
            line += f" (deadline {fmt.seconds(deadline_s)})"
        lines.append(line + ".")
    return lines
