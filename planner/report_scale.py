"""Rich rendering for the cluster-scale features: breakdown bars, runner-up and --why-not
verdicts, sweep tables and progress. Units are converted here only (GiB, ms, %, tokens/s).
"""

from __future__ import annotations

from rich.table import Table

from . import explain
from .report import GIB, TIME_LABELS, seconds, err, gib, out

BAR_WIDTH = 40
MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
                 "activations": "activations", "other": "buffers + framework"}
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of value/scale of ``width`` cells, in eighths of a cell."""
    if scale <= 0 or value <= 0:
        return ""
    cells = min(value / scale, 1.0) * width
    whole = int(cells)
    part = int((cells - whole) * 8)
    return "█" * whole + (_EIGHTHS[part] if part and whole < width else "")


def _bars(title: str, rows: list[tuple[str, float, str]], total: float) -> Table:
    t = Table(title=title, show_edge=False, header_style="bold", title_justify="left")
    t.add_column("term")
    t.add_column("value", justify="right")
    t.add_column("share", justify="right")
    t.add_column("", no_wrap=True)
    for label, value, shown in rows:
        t.add_row(label, shown, f"{value / total * 100:.1f}%" if total else "-",
                  f"[cyan]{bar(value, total)}[/]")
    return t


def breakdown_report(result) -> None:
    """The winner's step time and memory as bars (the runner-up is explained by report.explain)."""
    est = result.ranked
    step = float(est.time["step"][0])
    rows = [(TIME_LABELS[t], v, seconds(v)) for t, v in explain.time_breakdown(est, 0)]
    out.print(_bars(f"Winner's step time ({seconds(step)})", rows, step))
    mem = explain.memory_breakdown(est, 0)
    cap = float(est.memory["capacity"][0])
    rows = [(MEMORY_LABELS[t], v, f"{v / GIB:.1f} GiB") for t, v in mem]
    rows.append(("free", max(cap - float(est.memory["total"][0]), 0.0),
                 f"{max(cap - float(est.memory['total'][0]), 0.0) / GIB:.1f} GiB"))
    out.print(_bars(f"Winner's memory per GPU (of {gib(cap)} GiB)", rows, cap))


def _delta_text(deltas: list[tuple[str, float]], limit: int = 3) -> str:
    worse = [(t, d) for t, d in deltas if d > 0][:limit]
    better = [(t, d) for t, d in deltas if d < 0]
    text = ", ".join(f"{TIME_LABELS[t]} +{seconds(d)}" for t, d in worse) or "no term"
    if better:
        t, d = min(better, key=lambda x: x[1])
        text += f"; partly offset by {TIME_LABELS[t]} {seconds(d).replace('-', '−')}"
    return text


def why_not_report(verdict) -> None:
    """Print a WhyNot verdict."""
    if verdict.status == "invalid":
        out.print(f"[bold red]{verdict.text}: invalid[/] — it breaks: " + "; ".join(verdict.reasons))
        return
    if verdict.status == "no-fit":
        out.print(f"[bold red]{verdict.text}: does not fit[/] — {verdict.reasons[0]}")
        return
    mine = verdict.completion
    out.print(f"{verdict.text}: best completion {mine.candidates.layout(0).short()}")
    if verdict.status == "winner":
        best = verdict.winner.candidates.layout(0) if verdict.winner is not None else None
        if best is not None and best != mine.candidates.layout(0):  # e.g. distopt vs ZeRO-1
            ahead = float(mine.throughput["tokens_per_s"][0]) / float(
                verdict.winner.throughput["tokens_per_s"][0]) - 1.0
            if ahead > 1e-9:  # the search should have found it: say so rather than call it a tie
                out.print(f"[bold yellow]It is {ahead * 100:.2f}% faster than the search's pick[/] "
                          f"{best.short()}: the search did not reach it (please report this).")
            else:
                out.print(f"[bold green]It ties the winner[/] {best.short()} (no fitting layout beats it).")
        else:
            out.print("[bold green]It is the winner[/] (no fitting layout beats it).")
        return
    out.print(f"[bold]{verdict.slower_by * 100:.1f}% slower than the winner[/] "
              f"{verdict.winner.candidates.layout(0).short()}: {'; '.join(verdict.reasons)}.")
    t = Table(show_edge=False, header_style="bold")
    t.add_column("term")
    t.add_column("yours", justify="right")
    t.add_column("winner", justify="right")
    t.add_column("difference", justify="right")
    for term, d in verdict.deltas:
        t.add_row(TIME_LABELS[term], seconds(float(mine.time[term][0])),
                  seconds(float(verdict.winner.time[term][0])),
                  ("+" if d >= 0 else "−") + seconds(abs(d)))
    out.print(t)


def progress():
    """A rich progress bar on stderr (the table goes to stdout); off when stderr is not a
    terminal, where rich would leave a blank line behind."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal)


def sweep_table(rows: list[dict]) -> None:
    """One line per GPU count: best layout, tokens/s, MFU, scaling efficiency."""
    from rich.markup import escape
    batches = len({r["global_batch_size"] for r in rows}) > 1
    t = Table(show_edge=False, header_style="bold")
    cols = ("batch",) * batches + ("GPUs", "best layout", "tokens/s", "MFU", "step", "mem/GPU",
                                   "scaling eff.")
    for col in cols:
        t.add_column(col, justify="left" if col == "best layout" else "right")
    for r in rows:
        lead = (f"{r['global_batch_size']:,}",) * batches
        if r.get("error"):
            t.add_row(*lead, f"{r['gpus']:,}", f"[red]{escape(r['error'])}[/]", "-", "-", "-", "-", "-")
            continue
        t.add_row(*lead, f"{r['gpus']:,}", r["layout_short"], f"{r['tokens_per_s']:,.0f}",
                  f"{r['mfu'] * 100:.1f}%", seconds(r["step_s"]), f"{r['memory_bytes'] / GIB:.1f} GiB",
                  f"{r['scaling_efficiency'] * 100:.0f}%" if r["scaling_efficiency"] is not None else "-")
    out.print(t)
