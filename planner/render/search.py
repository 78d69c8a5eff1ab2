"""The search's output: the title line, the ranked table (one row per group of tied layouts) and
the explanation under it (formatted from planner.explain's data).

The ranked table has two layouts: one column per layout dimension and per figure where the
console is wide enough, else the layout as folded text beside stacked figures (two or three lines
per row), which fits 80 columns with every number whole.
"""

from __future__ import annotations

import math

from rich.table import Table

from .. import explain as ex
from .. import explain_bands as eb
from .. import fmt
from . import tables
from .console import out
from ..layout.axes import AXES, BY_NAME, PRINTED
from .labels import TIME_LABELS
from ..cost.model_counts import total_params
from ..frameworks.profile import gradient_dtype_name
from ..search.bands import regime_text


def header(model, hw, training, gpus, batch: str | None = None) -> None:
    """The title line. ``gpus``: a count or a description ("at most 1024", "64..4096");
    ``batch``: the global batch as shown (a sweep's list, e.g. "768,1536"); default the
    training's."""
    batch = str(training.global_batch_size) if batch is None else batch
    what = f"{model.name} ({fmt.params(total_params(model))} parameters) on {gpus} x {hw.gpu.name} ({hw.name})"
    job = f"global batch {batch} x {training.seq_length} tokens"
    line = f"{what}, {job}"  # one line where it fits, else broken after the hardware
    out.print(line if len(line) <= out.width else f"{what},\n{job}", markup=False)
    out.print(framework_line(training), markup=False)
    if training.precision != "bf16":  # MFU's peak is not the precision's
        out.print(f"MFU is against the dense BF16 peak ({fmt.tflops(hw.gpu.peak_tflops['bf16'] * 1e12)} "
                  f"TFLOP/s per GPU), not the {training.precision} peak, so it compares across "
                  "precisions", markup=False)
    if model.moe is not None and training.moe_capacity_factor is not None:
        out.print(f"MoE: tokens dropped beyond capacity factor {training.moe_capacity_factor:g}, "
                  "padded to it", markup=False)


PRECISION_NAMES = {"fp8": "per-tensor scaling", "fp8-blockwise": "1x128 / 128x128 block scales",
                   "mxfp8": "1x32 E8M0 block scales"}


def framework_line(training) -> str:
    """The framework and the facts of it a reader checks first: flash attention, the gradient
    dtype, the memory reserve (runtime + per NCCL communicator + allocator share of the working
    set; formulas.md 3.10). Wrapped at spaces by the console."""
    flash = "flash attention" if training.flash_attention else "no flash attention"
    fp8 = "" if training.precision == "bf16" else \
        f" in {training.precision} ({PRECISION_NAMES[training.precision]}, {training.fp8_library})"
    return (f"framework {training.framework}{fp8}: {flash}, {gradient_dtype_name(training)} gradients, "
            f"reserve {fmt.gib(training.reserve_runtime)} + "
            f"{fmt.gib(training.reserve_per_communicator, 2)} per NCCL communicator + "
            f"{fmt.percent(training.reserve_allocator, 0)} of activations and buffers")


class _Rows:
    """The cells of the shown rows, formatted once for both table layouts."""

    def __init__(self, result, groups: list[ex.TieGroup], currency: str, gpus_searched: bool,
                 explanation_bands: eb.BandSummary | None = None):
        est = result.ranked
        self.est, self.groups, self.currency = est, groups, currency
        c, th = est.candidates, est.throughput
        self.index = [g.first for g in groups]
        self.layouts = [c.layout(i) for i in self.index]
        self.show_cp = any(lay.cp > 1 for lay in self.layouts)
        gpus = {lay.gpus for lay in self.layouts}
        self.show_gpus = gpus_searched or len(gpus) > 1
        self.show_train = "time_to_train_s" in th
        self.show_cost = "cost" in th
        self.show_ties = any(g.count > 1 for g in groups)
        self.capacity = fmt.capacity(est.memory["capacity"][0])
        self.bubble = est.bubble_share()  # of the step: the column sits beside it
        self.band = explanation_bands.step if explanation_bands is not None else None
        bands = {eb.row_band(result, self.band, i) for i in self.index} if self.band is not None else set()
        self.band_differs = len(bands) > 1
        if not self.band_differs:  # every row's is the regime's: the line above says it
            self.band = None
        self.result = result
        self.group_rows = sum(1 for g in groups if g.first < getattr(result, "tie_group", 1)) \
            if not getattr(result, "strict", True) else 0
        # one unit per column: of the rows shown
        self.units = {k: fmt.duration_unit([float(v[i]) for i in self.index]) for k, v in
                      (("step", est.time["step"]), ("train", th.get("time_to_train_s", [])))
                      if len(v)}

    def figures(self, i: int) -> dict[str, str]:
        """Formatted figures of ranked layout i."""
        est, th = self.est, self.est.throughput
        cells = {"mem/GPU": f"{fmt.gib_value(est.memory['total'][i])}/{self.capacity} GiB",
                 "step": fmt.seconds_in(float(est.time["step"][i]), self.units["step"]),
                 "tokens/s": fmt.tokens_per_s(th["tokens_per_s"][i]),
                 "TFLOP/s": fmt.tflops(th["model_tflops_per_gpu"][i] * 1e12),
                 "MFU": fmt.percent(th["mfu"][i]), "bubble": fmt.percent(self.bubble[i])}
        cells["GPUs"] = fmt.count(self.est.candidates.layout(i).gpus)
        cells["band"] = band_cell(*eb.row_band(self.result, self.band, i)) if self.band is not None else ""
        if self.show_train:
            cells["train"] = fmt.seconds_in(float(th["time_to_train_s"][i]), self.units["train"])
        if self.show_cost:
            cells["cost"] = fmt.money(float(th["cost"][i]), self.currency)
        return cells


def band_cell(below: float, above: float) -> str:
    """A step band as the table shows it: '-22%/+28%' (one '±9%' when both sides round alike)."""
    lo, hi = f"{100 * below:.0f}", f"{100 * above:.0f}"
    return f"±{lo}%" if lo == hi else f"-{lo}%/+{hi}%"


def bands_line(b: eb.BandSummary, rows_differ: bool = False) -> str:
    """The line above the table: the job's bands, what they are drawn from, the tie band."""
    step, mem = b.step, b.memory
    column = "; the band column widens a row's for terms no measured run checked" if rows_differ else ""
    return (f"Bands: measured step -{fmt.percent(step.below)}/+{fmt.percent(step.above)} of "
            f"predicted (tokens/s the mirror), peak memory -{fmt.percent(mem.below)}/"
            f"+{fmt.percent(mem.above)}, for {step.level:.0%}/{mem.level:.0%} of plan3d's measured "
            f"runs, each predicted without its source ({fmt.count(step.runs)} "
            f"{regime_text(step.basis)} runs of {step.sources} sources); steps within "
            f"{fmt.percent(b.tie)} of each other tie ({b.pairs} measured pairs){column}.")


def _cell(axis, lay) -> str:
    """One layout's value of ``axis`` as the wide table shows it."""
    value = getattr(lay, axis.name)
    if axis.name == "first_stage_layers":
        return lay.split_label if value else "even"
    if axis.name == "recompute":
        return lay.recompute_label
    return ("yes" if value else "no") if axis.kind is bool else str(value)


def _wide(rows: _Rows) -> Table:
    """One column per layout axis the short form prints (those printed only when set: where a
    row sets them) and per figure (a wide terminal)."""
    t = tables.new()
    tables.number_column(t, "#")
    dims = [a for a in PRINTED if a.always or any(a.label(lay) for lay in rows.layouts)]
    for a in dims:
        (tables.code_column if a.kind is str else tables.number_column)(t, a.column)
    figures = ["mem/GPU", "step", *["band"] * (rows.band is not None), "tokens/s", "TFLOP/s/GPU",
               "MFU", "bubble", *["GPUs"] * rows.show_gpus, *["train"] * rows.show_train,
               *["cost"] * rows.show_cost]
    for col in figures + ["layouts"] * rows.show_ties:
        tables.number_column(t, col)
    for n, (i, lay, g) in enumerate(zip(rows.index, rows.layouts, rows.groups), start=1):
        f = rows.figures(i)
        f["TFLOP/s/GPU"] = f["TFLOP/s"]
        cells = [str(n), *(_cell(a, lay) for a in dims), *(f[col] for col in figures)]
        cells += [str(g.count) if g.count > 1 else ""] * rows.show_ties
        t.add_row(*cells, end_section=n == rows.group_rows < len(rows.groups))
    return t


def _narrow(rows: _Rows) -> Table:
    """The layout as folded text beside stacked figures: each figure column holds two (or, with
    GPUs, time to train or cost, three) values, one per line."""
    third = rows.show_gpus or rows.show_train or rows.show_cost or rows.band is not None
    stacks = [["mem/GPU", "bubble"], ["step", "tokens/s"], ["MFU", "TFLOP/s"]]
    if third:
        for stack, extra, shown in zip(stacks, ("GPUs", "band", "cost"),
                                       (rows.show_gpus, rows.band is not None, rows.show_cost)):
            stack.append(extra if shown else "")
        if rows.show_train:  # time to train sits under the band
            stacks[1].append("train")
    t = tables.new()
    tables.number_column(t, "#")
    tables.text_column(t, "layout")
    for stack in stacks:
        tables.number_column(t, tables.stacked(stack))
    for n, (i, lay, g) in enumerate(zip(rows.index, rows.layouts, rows.groups), start=1):
        f = rows.figures(i)
        f[""] = ""
        tie = f"×{g.count}" if g.count > 1 else ""
        t.add_row(tables.stacked([str(n), tie]), lay.short(),
                  *(tables.stacked(f[k] for k in stack) for stack in stacks),
                  end_section=n == rows.group_rows < len(rows.groups))
    return t


def search_table(result, explanation: ex.SearchExplanation, top: int, currency: str = "USD",
                 gpus_searched: bool = False) -> None:
    """The ranked table (``top`` rows, one per group of tied layouts) and its explanation;
    ``gpus_searched`` (--max-gpus): a GPUs column even when every row uses the same count;
    ``currency``: the code shown with costs."""
    rows = _Rows(result, explanation.groups[:top], currency, gpus_searched, explanation.bands)
    if explanation.bands is not None:
        out.print(bands_line(explanation.bands, rows.band_differs), markup=False)
    out.print(tables.pick([lambda: _wide(rows), lambda: _narrow(rows)], out))
    out.print(explain_text(explanation, rows.capacity, top, result.ranked.candidates), markup=False)


def _ordered(fields) -> list:
    """Layout fields (or (field, ...) tuples) in the order of the layout's short form (the axes
    it does not print last, in the table's order)."""
    order = [a.name for a in PRINTED] + [a.name for a in AXES if a not in PRINTED]
    key = (lambda f: order.index(f[0] if isinstance(f, tuple) else f) if
           (f[0] if isinstance(f, tuple) else f) in order else len(order))
    return sorted(fields, key=key)


def _title(name: str) -> str:
    return BY_NAME[name].title if name in BY_NAME else name


def _differs(differs) -> str:
    return ", ".join(f"{_title(k)} {a} -> {b}" for k, a, b in _ordered(differs))


MAX_TIE_LAYOUTS = 3  # layouts listed per tied row before "and N more"


def _ties_text(groups: list[ex.TieGroup], candidates) -> list[str]:
    """A line per row that stands for tied layouts: which fields vary and the other layouts it
    stands for, in their short form (at most MAX_TIE_LAYOUTS, then how many more)."""
    tied = [(n, g) for n, g in enumerate(groups, start=1) if g.count > 1]
    if not tied:
        return []
    lines = ["Rows that stand for several layouts with the same predicted step time and memory:"]
    for n, g in tied:
        others = [candidates.layout(i).short() for i in g.members[1:]]
        listed = "; ".join(others[:MAX_TIE_LAYOUTS])
        more = len(others) - MAX_TIE_LAYOUTS
        if more > 0:
            listed += f"; and {fmt.count(more)} more (--json lists them all)"
        varying = ", ".join(_title(k) for k in _ordered(g.varying))
        lines.append(f"#{n} ×{g.count} ({varying} vary) also stands for {listed}.")
    return lines


def explain_text(e: ex.SearchExplanation, capacity: str, top: int, candidates) -> str:
    """Why the winner wins, which of the ``top`` rows stand for tied layouts (and the layouts
    each stands for, from the ranked ``candidates``), what the runner-up loses, and what was
    pruned, in a few plain lines. ``capacity``: GiB per GPU as shown."""
    w = e.winner
    overhead = (f"the largest overhead is {TIME_LABELS[w.largest.term]} "
                f"({fmt.percent(w.largest.share)})" if w.largest else "overheads are under 0.1% each")
    lines = [f"Winner: {w.layout.short()}: compute is {fmt.percent(w.compute_share, 0)} of its "
             f"{fmt.seconds(w.step_s)} step; {overhead}."]
    if e.tie is not None:
        lines.append(_tie_text(e.tie, e.bands))
    lines += _ties_text(e.groups[:top], candidates)
    r = e.runner_up
    if r is not None and r.ties_on_time:
        more = r.extra_memory / fmt.GIB
        memory = f"{abs(more):.1f} GiB {'more' if more >= 0 else 'less'} memory"
        lines.append(f"Runner-up ties on time ({_differs(r.differs)}) and uses {memory}; ties rank "
                     f"no offload, then the lower ZeRO stage, then the smaller memory, first.")
    elif r is not None and r.slower_by < 0:  # the pick is not the fastest: #2 is faster
        more = ", ".join(f"{TIME_LABELS[t]} +{fmt.seconds(d)}" for t, d in r.worse)
        less = ", ".join(f"{TIME_LABELS[t]} -{fmt.seconds(-d)}" for t, d in r.better) or "no single term"
        lines.append(f"#2 ({_differs(r.differs)}) is {fmt.percent(-r.slower_by, 2)} faster: "
                     f"{less}" + (f"; more: {more}" if more else "") + ".")
    elif r is not None:
        worse = ", ".join(f"{TIME_LABELS[t]} +{fmt.seconds(d)}" for t, d in r.worse) or "no single term"
        better = ", ".join(f"{TIME_LABELS[t]} -{fmt.seconds(-d)}" for t, d in r.better)
        lines.append(f"Runner-up ({_differs(r.differs)}) is {fmt.percent(r.slower_by, 2)} slower: "
                     f"{worse}" + (f"; less: {better}" if better else "") + ".")
    if e.cp_fallback is not None:
        lines.append(_cp_text(e.cp_fallback))
    p = e.pruning
    pruned = "; ".join(f"{fmt.count(v)} by '{k}'" for k, v in p.pruned.items() if v)
    if 0 < p.usable < p.capacity:  # --min-memory-headroom in effect
        pruned += (f" (fit = within {fmt.gib(p.usable)} of the {capacity} GiB, leaving the "
                   f"--min-memory-headroom free)")
    lines.append(f"Searched {fmt.count(p.enumerated)} layouts, {fmt.count(p.fitting)} fit. "
                 f"Pruned: {pruned or 'none'}.")
    return "\n".join(lines)


PREFERENCE_WORDS = {"headroom": "memory headroom", "checked": "fewer terms no measured run checked",
                    "conventional": "the conventional layout", "fewer pipeline stages":
                    "fewer pipeline stages", "speed": "speed"}


def _prefs_text(p: eb.Preferences, min_free: float) -> str:
    """One layout's standing on the preferences, in words."""
    room = (f"leaves {fmt.gib(p.free_bytes)} ({fmt.percent(p.free)}) free, "
            f"{'at least' if p.roomy else 'under'} the {fmt.percent(min_free)} --min-free")
    checked = ("uses " + ", ".join(p.unchecked) + ", which no measured run checked") if p.unchecked \
        else "uses no term a measured run has not checked"
    usual = ("departs from convention: " + ", ".join(p.marks)) if p.marks else "is conventional"
    return f"{room}; {checked}; {usual}; pp={p.pp}"


def _tie_text(t: eb.TieSummary, b: eb.BandSummary | None) -> str:
    """Which rows tie with the winner and how the winner was picked among them."""
    band = fmt.percent(b.tie) if b is not None else "the tie band"
    free = b.min_free if b is not None else 0.0
    if t.strict:
        return ("Ranked strictly by the objective (--strict-rank): no tie groups; rows within "
                f"{band} of each other are ties within plan3d's error.")
    order = ("memory headroom, then fewer unchecked terms, then convention (TP and EP inside "
             "the NVLink domain, CP only at measured sequence lengths, ZeRO-1 before ZeRO-2/3), "
             "then fewer pipeline stages, then speed")
    if t.layouts <= 1:
        head = f"No other kept layout is within the {band} tie band of the winner; it"
    else:
        rows = "row 1" if t.rows == 1 else f"rows 1-{t.rows}"
        of = "the fastest" if t.fastest_in_group else \
            f"the fastest that leaves the {fmt.percent(free)} --min-free share"
        count = (f"at least {fmt.count(t.layouts)} layouts: the search keeps that many"
                 if t.capped else f"{fmt.count(t.layouts)} layouts")
        head = (f"Tie: {rows} ({count}) are within {band} of {of} "
                "(more where a term no measured run checked widens a band); the winner is "
                f"picked among them by {order}. It")
        if not t.any_roomy:
            head = (f"No kept layout leaves the {fmt.percent(free)} --min-free share, so memory "
                    f"headroom picks the one that leaves the most. {head}")
    text = f"{head} {_prefs_text(t.pick, free)}."
    if t.fastest_layout is not None and t.fastest is not None:
        why = PREFERENCE_WORDS.get(t.deciding[0], t.deciding[0]) if t.deciding else "the preferences"
        # within the memory band of not fitting: peak up to e^hi x predicted
        tight = 1.0 - math.exp(-b.memory.hi) if b is not None else free
        risk = ", within plan3d's memory error of not fitting" if t.fastest.free < tight else ""
        text += (f" The fastest, #{t.fastest_row} ({t.fastest_layout.short()}), is "
                 f"{fmt.percent(t.better_by, 1)} faster, but loses on {why}{risk}: it "
                 f"{_prefs_text(t.fastest, free)}.")
    return text


def precision_text(loss: ex.PrecisionLoss) -> str:
    """Why FP8 is predicted slower than BF16 on the winner's layout, its terms and sizes."""
    parts = []
    for what, seconds, note in loss.terms:
        name = TIME_LABELS.get(what, what)
        sign = "+" if seconds >= 0 else "-"
        parts.append(f"{name} {sign}{fmt.seconds(abs(seconds))}" + (f" ({note})" if note else ""))
    slower = loss.step / loss.bf16_step - 1.0
    return (f"{loss.precision.upper()} is predicted {fmt.percent(slower)} slower than BF16 on the "
            f"winner's layout ({fmt.seconds(loss.step)} vs {fmt.seconds(loss.bf16_step)} per step), "
            f"FP8 minus BF16: {'; '.join(parts)}.")


def _cp_text(f: ex.CpFallback) -> str:
    if f.row is None:
        alt = "no layout without it is among those kept (--max-cp 1 pins it off)"
    elif f.row == 1:
        alt = (f"#1 also stands for a layout without it ({f.layout.short()}), at the same speed "
               "(--max-cp 1 pins it off)")
    else:
        more = "fewer" if f.fewer_tokens >= 0 else "more"
        alt = (f"the best kept layout without it, #{f.row} ({f.layout.short()}), runs "
               f"{fmt.percent(abs(f.fewer_tokens))} {more} tokens/s (--max-cp 1 pins it off)")
    return (f"The winner uses context parallelism (cp={f.cp}) where no measured run has checked "
            f"its cost (formulas.md 5.7, ring exposure; measured CP runs: benchmarks/"
            f"error_bands.yaml, checked); {alt}.")
