"""Rich rendering of search results and estimates. Nothing else in plan3d prints.

Units are converted here only: bytes -> GiB, seconds -> s/ms, FLOP/s -> TFLOP/s, fractions -> %.
"""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from .cost import Estimate
from .cost.step import TIME_TERMS
from .pipe import PipeConsole
from .search import SearchResult
from .specs import HardwareProfile, ModelSpec, TrainingSpec
from .units import format_gib

GIB = 2.0**30
# Piped output is not wrapped at rich's default 80 columns: the ranked table needs ~130.
out = PipeConsole(highlight=False, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

TIME_LABELS = {
    "compute": "compute (GEMMs, attention, elementwise)",
    "recompute": "activation recomputation",
    "tp_comm": "TP/SP communication (exposed)",
    "cp_comm": "CP ring communication (exposed)",
    "pp_comm": "pipeline p2p (exposed)",
    "dp_comm": "DP/ZeRO communication (exposed)",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step + fixed per-step overhead",
}


def error(message: str) -> None:
    """One line on stderr (the message is printed literally: no rich markup, so "[x]" stays)."""
    from rich.markup import escape
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def seconds(s: float) -> str:
    """Seconds as ms, s, h or days, whichever reads best."""
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 3600:
        return f"{s:.2f} s"
    return f"{s / 3600:.1f} h" if s < 86400 else f"{s / 86400:.1f} days"


def param_count(n: float) -> str:
    """A parameter count as people write it: 174.6B, 1.01T, 125.2M, 5,120."""
    if round(n / 1e12, 2) >= 1:
        value = n / 1e12
        return f"{value:.2f}T" if round(value, 2) < 10 else f"{value:.1f}T"
    for scale, unit in ((1e9, "B"), (1e6, "M")):
        if round(n / scale, 1) >= 1:
            return f"{n / scale:.1f}{unit}"
    return f"{n:,.0f}"


def header(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
           batch: str | None = None) -> None:
    """The one-line title. ``batch``: the global batch as shown (a sweep's list, e.g.
    "768,1536"); default the training's."""
    from .cost.flops import total_params
    batch = str(training.global_batch_size) if batch is None else batch
    out.print(f"[bold]{model.name}[/] ({param_count(total_params(model))} parameters) on "
              f"{gpus} x {hw.gpu.name} ({hw.name}), global batch {batch} x "
              f"{training.seq_length} tokens")


def gib(capacity_bytes: float) -> str:
    """An HBM capacity in GiB as printed (units.format_gib): whole (80) when it is, else one
    decimal (79.6 for the H100's 81,559 MiB), so a total of 79.6 is never shown against 80."""
    return format_gib(capacity_bytes)


def search_table(result: SearchResult, top: int, gpus_searched: bool = False) -> None:
    """The ranked table (``top`` rows) and its explanation; ``gpus_searched`` (--max-gpus): a
    GPUs column even when every shown layout uses the same count."""
    est = result.ranked
    n = min(top, len(est))
    table = Table(show_edge=False, header_style="bold")
    c = est.candidates
    show_cp = bool((c.cp > 1).any())  # cp beside tp, as in the layout's short form
    for col in ("#", "tp", *("cp",) * show_cp, "pp", "dp", "zero", "mbs", "vpp", "recompute", "SP",
                "mem/GPU", "step", "tokens/s", "TFLOP/s/GPU", "MFU", "bubble"):  # noqa: E501
        table.add_column(col, justify="left" if col == "recompute" else "right")
    extra = _extra_columns(est, gpus_searched)
    for col in extra:
        table.add_column(col, justify="right")
    for i in range(n):
        lay = c.layout(i)
        mem = est.memory
        table.add_row(
            str(i + 1), str(lay.tp), *(str(lay.cp),) * show_cp, str(lay.pp), str(lay.dp),
            str(lay.zero_stage),
            str(lay.micro_batch_size), str(lay.vpp), lay.recompute,
            "yes" if lay.sequence_parallel else "no",
            f"{mem['total'][i] / GIB:.1f}/{gib(mem['capacity'][i])} GiB",
            seconds(est.time["step"][i]), f"{est.throughput['tokens_per_s'][i]:,.0f}",
            f"{est.throughput['model_tflops_per_gpu'][i]:.0f}",
            f"{est.throughput['mfu'][i] * 100:.1f}%",
            f"{est.time['bubble_fraction'][i] * 100:.1f}%", *(f(i) for f in extra.values()))
    out.print(table)
    out.print(explain(result))


def _extra_columns(est: Estimate, gpus_searched: bool = False) -> dict:
    """Columns shown only when they say something: GPUs (when the search picked the count),
    time to train and cost (when a token budget / a price was given)."""
    c, th = est.candidates, est.throughput
    gpus = c.gpus
    cols = {}
    if c.distributed_optimizer.any():
        cols["distopt"] = lambda i: "yes" if c.distributed_optimizer[i] else "no"
    if (c.first_stage_layers > 0).any():
        cols["pp split"] = lambda i: (f"{int(c.first_stage_layers[i])}+..+{int(c.last_stage_layers[i])}"
                                      if c.first_stage_layers[i] > 0 else "even")
    if gpus_searched or len(set(gpus.tolist())) > 1:
        cols["GPUs"] = lambda i: f"{int(gpus[i]):,}"
    if "time_to_train_s" in th:
        cols["train"] = lambda i: seconds(float(th['time_to_train_s'][i]))
    if "cost" in th:
        cols["cost"] = lambda i: f"{th['cost'][i]:,.0f}"
    return cols


def explain(result: SearchResult) -> str:
    """Why the winner wins, and what was pruned, in a few plain lines."""
    est = result.ranked
    lines = []
    step = est.time["step"]
    terms = {t: float(est.time[t][0]) for t in TIME_TERMS}
    big = sorted((t for t in terms if t != "compute"), key=terms.get, reverse=True)[0]
    overhead = (f"the largest overhead is {TIME_LABELS[big]} ({terms[big] / step[0] * 100:.1f}%)"
                if terms[big] >= 0.001 * step[0] else "overheads are under 0.1% each")
    lines.append(f"Winner: {est.candidates.layout(0).short()}: compute is "
                 f"{terms['compute'] / step[0] * 100:.0f}% of its {seconds(step[0])} step; {overhead}.")
    if len(est) > 1:
        first, second = est.candidates.layout(0), est.candidates.layout(1)
        differs = ", ".join(f"{k} {getattr(first, k)} -> {getattr(second, k)}"
                            for k in type(first).model_fields if getattr(first, k) != getattr(second, k))
        extra = (est.memory["total"][1] - est.memory["total"][0]) / GIB
        if step[1] <= step[0] * (1 + 1e-4):
            lines.append(f"Runner-up ties on time ({differs}) and uses {extra:+.1f} GiB; ties rank "
                         f"the lower ZeRO stage, then the smaller memory, first.")
        else:
            from .explain import term_deltas
            worse = ", ".join(f"{TIME_LABELS[t]} +{seconds(d)}"
                              for t, d in term_deltas(est, 1, est, 0) if d > 0) or "no single term"
            lines.append(f"Runner-up ({differs}) is {(step[1] / step[0] - 1) * 100:.2f}% slower: "
                         f"{worse}.")
    cand = est.candidates
    if int(cand.cp[0]) > 1:  # the least checked term decides the winner: say so, with the fallback
        no_cp = [i for i in range(len(est)) if int(cand.cp[i]) == 1]
        tps = est.throughput["tokens_per_s"]
        alt = (f"the best kept layout without it, #{no_cp[0] + 1} ({cand.layout(no_cp[0]).short()}), "
               f"runs {(1 - tps[no_cp[0]] / tps[0]) * 100:.1f}% fewer tokens/s (--max-cp 1 pins it off)"
               if no_cp else "no layout without it is among those kept (--max-cp 1 pins it off)")
        lines.append(f"The winner uses context parallelism (cp={int(cand.cp[0])}), whose cost "
                     f"(formulas.md 5.7, ring exposure) no measured run has checked yet; {alt}.")
    pruned = "; ".join(f"{v:,} by '{k}'" for k, v in result.pruned.items() if v)
    capacity = float(est.memory["capacity"][0])
    if 0 < result.usable < capacity:  # --min-memory-headroom in effect
        pruned += (f" (fit = within {result.usable / GIB:.1f} of the {gib(capacity)} GiB, "
                   f"leaving the --min-memory-headroom free)")
    lines.append(f"Searched {result.enumerated:,} layouts, {result.fitting:,} fit. Pruned: {pruned or 'none'}.")
    return "\n".join(lines)


def estimate_report(est: Estimate) -> None:
    """Full memory and time breakdown of one layout (index 0)."""
    d = est.to_dict(0)
    lay = est.candidates.layout(0)
    out.print(f"Layout: {lay.short()}")
    mem = d["memory"]
    t = Table(title="Memory per GPU (peak stage)", show_edge=False, header_style="bold")
    t.add_column("term")
    t.add_column("GiB", justify="right")
    t.add_column("share", justify="right")
    for k in ("weights", "gradients", "optimizer", "activations", "other"):
        t.add_row(k, f"{mem[k] / GIB:.2f}", f"{mem[k] / mem['total'] * 100:.1f}%")
    verdict = "fits" if mem["fits"] else "[bold red]DOES NOT FIT[/]"
    t.add_row("[bold]total[/]", f"[bold]{mem['total'] / GIB:.2f}[/]",
              f"of {gib(mem['capacity'])} GiB: {verdict}")
    out.print(t)
    tm = d["time"]
    t = Table(title="Step time", show_edge=False, header_style="bold")
    t.add_column("term")
    t.add_column("time", justify="right")
    t.add_column("share", justify="right")
    for k in TIME_TERMS:
        t.add_row(TIME_LABELS[k], seconds(tm[k]), f"{tm[k] / tm['step'] * 100:.1f}%")
    t.add_row("[bold]step[/]", f"[bold]{seconds(tm['step'])}[/]", "")
    out.print(t)
    th = d["throughput"]
    out.print(f"tokens/s {th['tokens_per_s']:,.0f}  |  model TFLOP/s per GPU "
              f"{th['model_tflops_per_gpu']:.1f}  |  MFU {th['mfu'] * 100:.1f}%  |  HFU "
              f"{th['hfu'] * 100:.1f}%  |  bubble {tm['bubble_fraction'] * 100:.1f}% of the busiest stage's work")


def plan_drift(plan, fresh: dict, rtol: float = 1e-9) -> None:
    """Note on stderr when a plan was written by another plan3d version, or when today's estimate
    differs from the one stored in the plan (the cost model or the plan changed since export)."""
    from . import __version__
    if plan.plan3d_version != __version__:
        err.print(f"note: plan written by plan3d {plan.plan3d_version}, evaluated with {__version__}",
                  soft_wrap=True, markup=False)
    stored = (plan.estimate or {}).get("time", {}).get("step")
    now = fresh["time"]["step"]
    if stored is not None and abs(stored - now) > rtol * abs(now):
        err.print(f"note: the plan's stored step time {seconds(stored)} differs from today's "
                  f"estimate {seconds(now)}; the cost model, or the plan, changed since export",
                  soft_wrap=True, markup=False)


def catalog_table(title: str, rows: list[tuple[str, ...]], columns: tuple[str, ...]) -> None:
    t = Table(title=title, show_edge=False, header_style="bold")
    for col in columns:
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    out.print(t)
