"""Breakdowns of one layout: the search winner's bars, ``plan3d estimate``'s tables, and the notes
on a plan evaluated again (``estimate --plan``).

Memory shares are shares of the GPU's HBM capacity everywhere (the bars and estimate's table),
so they add up with the free memory to 100%.
"""

from __future__ import annotations

from .. import explain
from ..cost.offload import host_offload
from ..cost.step import TIME_TERMS
from .. import fmt
from . import tables
from .console import note, out
from .labels import MEMORY_LABELS, TIME_LABELS
from ..search.bands import BY_TERM, regime_text
from .. import __version__

BAR_WIDTH = 40  # cells of a full bar where the console has room
MIN_BAR_WIDTH = 10
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(value: float, scale: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of value/scale of ``width`` cells, in eighths of a cell."""
    if scale <= 0 or value <= 0:
        return ""
    cells = min(value / scale, 1.0) * width
    whole = int(cells)
    part = int((cells - whole) * 8)
    return "█" * whole + (_EIGHTHS[part] if part and whole < width else "")


def _bars(title: str, rows: list[tuple[str, float, str]], total: float):
    """term | value | share | bar; the bar takes what the console leaves (MIN_BAR_WIDTH to
    BAR_WIDTH cells) after the labels at full length."""
    label = max(len(r[0]) for r in rows)
    value = max(len(r[2]) for r in rows + [("", 0.0, "value")])
    width = max(MIN_BAR_WIDTH, min(BAR_WIDTH, out.width - (label + value + 6 + 11)))
    t = tables.new(title)
    tables.text_column(t, "term")
    tables.number_column(t, "value")
    tables.number_column(t, "share")
    t.add_column("", no_wrap=True)
    for name, v, shown in rows:
        t.add_row(name, shown, fmt.percent(v / total) if total else "-",
                  f"[cyan]{bar(v, total, width)}[/]")
    return t


def breakdown_report(result) -> None:
    """The winner's step time and memory as bars (the runner-up is in the explanation)."""
    est = result.ranked
    step = float(est.time["step"][0])
    terms = explain.time_breakdown(est, 0)
    rows = [(TIME_LABELS[t], v, shown) for (t, v), shown in
            zip(terms, fmt.seconds_column([v for _, v in terms]))]
    tables.show(_bars(f"Winner's step time ({fmt.seconds(step)})", rows, step), out)
    cap = float(est.memory["capacity"][0])
    free = max(cap - float(est.memory["total"][0]), 0.0)
    rows = [(MEMORY_LABELS[t], v, fmt.gib(v)) for t, v in explain.memory_breakdown(est, 0)]
    rows.append(("free", free, fmt.gib(free)))
    tables.show(_bars(f"Winner's memory per GPU (shares of its {fmt.capacity(cap)} GiB)", rows, cap), out)


def recompute_line(r: dict) -> str:
    """One line on the recomputation a layout runs (explain.recompute_choice)."""
    cost = "" if r["seconds"] is None else \
        f": {fmt.seconds(r['seconds'])} of the step ({fmt.percent(r['share'])})"
    if r["mode"] != "full":
        return f"recompute {r['mode']} in every layer{cost}"
    if r["method"] == "block":
        n, c = r["num_layers"], r["chunk_layers"]
        return (f"recompute full in the first {n} of each model chunk's {c:g} layers (Megatron "
                f"--recompute-method block --recompute-num-layers {n}; the rest store their "
                f"activations){cost}")
    return f"recompute full in every layer (Megatron --recompute-method uniform){cost}"


def band_text(band: dict, fits: bool) -> str:
    """The estimate's error band in one line (explain_bands.estimate_band)."""
    regime = regime_text(band["regime"])
    mem = band["memory_bytes"]
    memory = (f"peak memory {fmt.gib(mem[0])}-{fmt.gib(mem[1])} (-{fmt.percent(band['memory_below'])}/"
              f"+{fmt.percent(band['memory_above'])} of what is allocated, "
              f"{band['memory_level']:.0%} of measured runs)")
    unchecked = ""
    if band["unchecked"]:
        unchecked = (f"; wider for {', '.join(BY_TERM[k].label for k in band['unchecked'])}, which no "
                     "measured run checked")
    if not fits:
        return f"Band: {memory}."
    step, tps = band["step_s"], band["tokens_per_s"]
    high = "" if tps[1] is None else f"-{fmt.tokens_per_s(tps[1])}"
    return (f"Band: step {fmt.seconds(step[0])}-{fmt.seconds(step[1])} (-{fmt.percent(band['below'])}/"
            f"+{fmt.percent(band['above'])}), tokens/s {fmt.tokens_per_s(tps[0])}{high}, {memory}, "
            f"for {band['level']:.0%} of plan3d's measured runs predicted without their source "
            f"({band['runs']} {regime} runs of {band['sources']} sources){unchecked}.")


def estimate_report(est, stages=None, to_fit=None, recompute=None, band: dict | None = None) -> None:
    """Full memory and time breakdown of one layout (index 0); ``stages`` (cost.stages.
    StageProfile): memory and time of every pipeline rank, the binding one and the imbalance.
    A layout that does not fit gets its memory, how far over it is per GPU and what would make
    it fit (``to_fit``, a refusal.FitHint or None), and no step time or throughput: it cannot
    run. ``band``: the estimate's error band (explain_bands.estimate_band), one line."""
    d = est.to_dict(0)
    out.print(f"Layout: {est.candidates.layout(0).short()}")
    _memory_table(d["memory"])
    if not d["memory"]["fits"]:
        _no_fit_lines(est, d["memory"], to_fit)
        if band is not None:
            out.print(band_text(band, False), markup=False)
        return
    if stages is not None and len(stages.kind) > 1:
        stage_report(stages)
    tm = d["time"]
    t = tables.new("Step time (shares of the step)")
    tables.text_column(t, "term")
    tables.number_column(t, "time")
    tables.number_column(t, "share")
    shown = dict(zip([*TIME_TERMS, "step"], fmt.seconds_column([tm[k] for k in (*TIME_TERMS, "step")])))
    for k in TIME_TERMS:
        t.add_row(TIME_LABELS[k], shown[k], fmt.percent(tm[k] / tm["step"]))
    t.add_row("[bold]step[/]", f"[bold]{shown['step']}[/]", "")
    tables.show(t, out)
    th = d["throughput"]
    out.print(f"tokens/s {fmt.tokens_per_s(th['tokens_per_s'])}  |  MFU {fmt.percent(th['mfu'])}  |  "
              f"HFU {fmt.percent(th['hfu'])}  |  model TFLOP/s per GPU "
              f"{fmt.tflops(th['model_tflops_per_gpu'] * 1e12, 1)}")
    if th.get("mfu_fp8_peak") is not None:
        out.print(f"MFU and HFU are on the dense BF16 peak, comparable across precisions; on the "
                  f"FP8 peak MFU is {fmt.percent(th['mfu_fp8_peak'])}", markup=False)
    out.print(f"bubble {fmt.percent(tm['bubble_share'])} of the step "
              f"({fmt.percent(tm['bubble_fraction'])} of the busiest stage's work)")
    if band is not None:
        out.print(band_text(band, True), markup=False)
    if recompute is not None and recompute["mode"] != "none":
        out.print(recompute_line(recompute), markup=False)


def _memory_table(mem: dict) -> None:
    cap = mem["capacity"]
    t = tables.new(f"Memory per GPU (peak stage; shares of the GPU's {fmt.capacity(cap)} GiB)")
    tables.text_column(t, "term")
    tables.number_column(t, "GiB")
    tables.number_column(t, "share")
    for k in ("weights", "gradients", "optimizer", "activations", "other", "reserve"):
        t.add_row(MEMORY_LABELS[k], fmt.gib_value(mem[k], 2), fmt.percent(mem[k] / cap))
    verdict = "fits" if mem["fits"] else "[bold red]DOES NOT FIT[/]"
    t.add_row(f"[bold]total[/] ({verdict})", f"[bold]{fmt.gib_value(mem['total'], 2)}[/]",
              fmt.percent(mem["total"] / cap))
    spare = cap - mem["total"]
    t.add_row("free" if spare >= 0 else "[bold red]over[/]", fmt.gib_value(abs(spare), 2),
              fmt.percent(abs(spare) / cap))
    tables.show(t, out)


def shortfall_text(mem: dict) -> str:
    """'it needs 192.47 GiB per GPU, 112.83 GiB more than the 79.6 GiB it has' for one layout's
    memory (bytes: total, shortfall_bytes, capacity)."""
    return (f"it needs {fmt.gib(mem['total'], 2)} per GPU, {fmt.gib(mem['shortfall_bytes'], 2)} more "
            f"than the {fmt.capacity(mem['capacity'])} GiB it has")


def _no_fit_lines(est, mem: dict, to_fit) -> None:
    """Does not fit: the shortfall per GPU, no step time or throughput, and what would fit."""
    gpus = est.candidates.layout(0).gpus
    out.print(f"[bold red]Does not fit[/]: {shortfall_text(mem)}; a layout that cannot run has no "
              "step time, tokens/s or MFU.")
    if to_fit is None:
        out.print("To fit: no count of GPUs plan3d models has a layout of this model that fits "
                  "at this sequence length and batch; use GPUs with more memory.")
    elif to_fit.gpus == gpus:
        lay = to_fit.estimate.candidates.layout(0)
        out.print(f"To fit on these {gpus:,} GPUs: {lay.short()} "
                  f"({fmt.gib(float(to_fit.estimate.memory['total'][0]))} per GPU), the best that fits.")
    else:
        out.print(f"To fit: no layout fits on {gpus:,} GPUs; {to_fit.text()}.")


MAX_MIDDLE_ROWS = 6  # distinct middle-rank rows shown before the inner ones are merged


def _stage_groups(stages) -> list[tuple[int, int]]:
    """(first rank, last rank) of the rows: rank 0, each run of middle ranks with the same
    memory (to 0.01 GiB) and time (to 0.1 ms), the last rank; inner middle runs merged into one
    row when there are more than MAX_MIDDLE_ROWS."""
    pp = len(stages.kind)
    key = [(round(float(m) / fmt.GIB, 2), round(float(t) * 1e4)) for m, t in zip(stages.memory, stages.time)]
    groups = [(0, 0)]
    for r in range(1, pp - 1):
        if groups[-1][0] > 0 and key[r] == key[groups[-1][1]]:
            groups[-1] = (groups[-1][0], r)
        else:
            groups.append((r, r))
    middle = groups[1:]
    if len(middle) > MAX_MIDDLE_ROWS:
        keep = MAX_MIDDLE_ROWS // 2
        tail = middle[-(keep - 1):]
        middle = middle[:keep] + [(middle[keep][0], tail[0][0] - 1)] + tail
    return [groups[0]] + middle + [(pp - 1, pp - 1)]


def stage_report(stages) -> None:
    """Memory per GPU and micro-batch time of each pipeline stage (first, each distinct middle,
    last), the rank that binds memory, the slowest, and the imbalance."""
    t = tables.new("Pipeline stages (memory per GPU; forward + backward of one micro-batch)")
    tables.code_column(t, "stage")
    tables.number_column(t, "ranks")
    tables.number_column(t, "GiB")
    tables.number_column(t, "time")
    tables.code_column(t, "")
    unit = fmt.duration_unit([float(x) for x in stages.time])
    for lo, hi in _stage_groups(stages):
        mem = stages.memory[lo:hi + 1]
        shown = fmt.gib_value(mem.max(), 2) if mem.max() - mem.min() < 0.005 * fmt.GIB else \
            f"{fmt.gib_value(mem.max(), 2)}-{fmt.gib_value(mem.min(), 2)}"
        marks = [w for w, r in (("binds memory", stages.binding), ("slowest", stages.slowest))
                 if lo <= r <= hi]
        t.add_row(stages.kind[lo], str(lo) if lo == hi else f"{lo}-{hi}", shown,
                  fmt.seconds_in(float(stages.time[lo]), unit), ", ".join(marks))
    tables.show(t, out)
    out.print(f"stage imbalance: the slowest stage ({stages.kind[stages.slowest]}, rank "
              f"{stages.slowest}) takes {stages.imbalance:.3f}x the mean micro-batch time over "
              f"the {len(stages.kind)} stages; memory binds on the {stages.kind[stages.binding]} "
              f"stage (rank {stages.binding})", markup=False)


def plan_drift(plan, fresh: dict, rtol: float = 1e-9) -> None:
    """Note on stderr when a plan was written by another plan3d version, or when today's estimate
    differs from the one stored in the plan (the cost model or the plan changed since export)."""
    if plan.plan3d_version != __version__:
        note(f"note: plan written by plan3d {plan.plan3d_version}, evaluated with {__version__}")
    stored = (plan.estimate or {}).get("time", {}).get("step")
    now = fresh["time"]["step"]
    if stored is not None and abs(stored - now) > rtol * abs(now):
        note(f"note: the plan's stored step time {fmt.seconds(stored)} differs from today's "
             f"estimate {fmt.seconds(now)}; the cost model, or the plan, changed since export")


def host_offload_line(model, hw, training, est) -> None:
    """With activation offload, the host memory it takes per GPU against the host's share."""
    layers, used = host_offload(model, training, est.candidates)
    if layers:
        out.print(f"Activation offload: {layers} layers' activations, {used / 2**30:,.1f} GiB "
                  f"per GPU in host memory (of {hw.host_memory_per_gpu / 2**30:,.1f} GiB per GPU).")
