"""Timeline of a simulated pipeline schedule (planner.schedule.simulate): a Chrome trace for
Perfetto / chrome://tracing, a Gantt chart PNG with activation memory per rank, and a text
strip that fits a terminal.

The trace follows the Chrome Trace Event Format: one process, one thread per pipeline rank
(named by thread_name metadata events), every op, idle gap and point-to-point transfer a
complete event ("ph": "X") with ts and dur in microseconds. The PyTorch pipelining module's
``_dump_chrometrace`` (pytorch@00722e648b74 torch/distributed/pipelining/schedules.py) draws
the same rows with unit durations; the ZB scheduler's ``print_details`` the ASCII strip
(sail-sg/zero-bubble-pipeline-parallelism main scheduler/zb.py:342-373).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..schedule.simulate import SimResult, memory_curve

KIND_NAMES = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad",
              "FB": "F&B pair"}
COLOURS = {"F": "#4C72B0", "B": "#DD8452", "I": "#55A868", "W": "#C44E52", "FB": "#8172B3"}
STRIP = {"F": "F", "B": "B", "I": "I", "W": "W", "FB": "X"}
PLOT_HINT = "the Gantt chart needs matplotlib: pip install 'plan3d[plot]'"


@dataclass(frozen=True)
class TimelineLabels:
    """What a timeline is titled with: the layout as text, the schedule name, the step time
    (default: the result's T_sync), the unit of the result's times ("s" for seconds, "" for
    stage-time units) and how many microseconds one unit is in the trace (1e6 for seconds)."""
    layout: str = ""
    schedule: str = ""
    step_time: float | None = None
    unit: str = "s"
    us_per_unit: float = 1e6


def _labels(result: SimResult, labels) -> TimelineLabels:
    """TimelineLabels from None, a mapping with those keys, or TimelineLabels; the schedule
    name and step time default to the result's."""
    if labels is None:
        labels = TimelineLabels()
    elif not isinstance(labels, TimelineLabels):
        labels = TimelineLabels(**dict(labels))
    return TimelineLabels(labels.layout, labels.schedule or result.schedule.name,
                          result.t_sync if labels.step_time is None else labels.step_time,
                          labels.unit, labels.us_per_unit)


def _fmt_time(value: float, unit: str) -> str:
    """Step time as text: seconds below 1 s in ms, else s; stage-time units plain."""
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.4g} s"
    return f"{value:.4g}" + (f" {unit}" if unit else "")


def title(result: SimResult, labels=None) -> str:
    """One-line title: layout, schedule and step time."""
    lab = _labels(result, labels)
    parts = [lab.layout, lab.schedule, f"step {_fmt_time(lab.step_time, lab.unit)}"]
    return " | ".join(x for x in parts if x)


def _idle_gaps(result: SimResult, rank: int) -> list[tuple[float, float]]:
    """(start, end) of the idle gaps of ``rank`` within [0, T_sync]."""
    gaps, now = [], 0.0
    for e in sorted((e for e in result.events if e.rank == rank), key=lambda e: e.start):
        if e.start > now:
            gaps.append((now, e.start))
        now = max(now, e.end)
    if result.t_sync > now:
        gaps.append((now, result.t_sync))
    return gaps


def _lanes(transfers) -> list[int]:
    """A lane per transfer so that transfers into one rank never overlap within a lane."""
    lanes, ends = [], {}
    for t in transfers:
        free = ends.setdefault(t.dst, [])
        lane = next((i for i, end in enumerate(free) if end <= t.start), len(free))
        free[lane:lane + 1] = [t.end]
        lanes.append(lane)
    return lanes


def _thread(tid: int, name: str, order: int) -> list[dict]:
    return [{"ph": "M", "name": "thread_name", "pid": 0, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": tid,
             "args": {"sort_index": order}}]


def _op_event(e, k: float) -> dict:
    args = {"microbatch": e.microbatch, "chunk": e.chunk, "stage": e.stage}
    if e.direction:
        args["direction"] = e.direction
    if e.back is not None:
        args.update(back_microbatch=e.back[0], back_chunk=e.back[1], back_direction=e.back[2])
    return {"name": e.kind, "cat": KIND_NAMES[e.kind], "ph": "X", "ts": e.start * k,
            "dur": (e.end - e.start) * k, "pid": 0, "tid": e.rank, "args": args}


def chrome_trace(result: SimResult, labels=None) -> dict:
    """The timeline as a Chrome Trace Event Format dict (json.dump it; Perfetto and
    chrome://tracing open it): thread r = rank r with its ops (F, B, I, W, FB) and idle gaps,
    threads "rank r p2p" with the transfers into rank r; ts/dur in microseconds
    (labels.us_per_unit per unit of the result). Every rank's row spans [0, T_sync], so the
    events span the step time."""
    lab, p = _labels(result, labels), result.schedule.p
    k = float(lab.us_per_unit)
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
               "args": {"name": title(result, lab)}}]
    lanes = _lanes(result.transfers)
    width = max(lanes, default=0) + 1
    tid = {(t.dst, lane): p + t.dst * width + lane for t, lane in zip(result.transfers, lanes)}
    for r in range(p):
        events += _thread(r, f"rank {r}", 100 * r)
    for (dst, lane), number in sorted(tid.items()):
        events += _thread(number, f"rank {dst} p2p" + (f" {lane + 1}" if lane else ""),
                          100 * dst + 1 + lane)
    events += [_op_event(e, k) for e in result.events]
    for r in range(p):
        events += [{"name": "idle", "cat": "idle", "ph": "X", "ts": a * k, "dur": (b - a) * k,
                    "pid": 0, "tid": r, "cname": "grey", "args": {}}
                   for a, b in _idle_gaps(result, r)]
    events += [{"name": "p2p", "cat": "p2p", "ph": "X", "ts": t.start * k,
                "dur": (t.end - t.start) * k, "pid": 0, "tid": tid[t.dst, lane],
                "args": {"from_rank": t.src, "to_rank": t.dst, "what": t.kind,
                         "microbatch": t.microbatch}}
               for t, lane in zip(result.transfers, lanes)]
    return {"traceEvents": _plain(events), "displayTimeUnit": "ms",
            "otherData": {"layout": lab.layout, "schedule": lab.schedule,
                          "step_time": float(lab.step_time), "unit": lab.unit,
                          "t_sync": float(result.t_sync), "t_span": float(result.t_span)}}


def _plain(value):
    """numpy scalars as Python numbers, so json.dumps takes the trace."""
    if isinstance(value, dict):
        return {key: _plain(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def gantt_png(result: SimResult, labels, path) -> None:
    """Write a Gantt chart PNG to ``path``: ranks as rows, one colour per op kind, idle shaded;
    below it the activation memory of each rank over time in units of A (at the result's
    gamma); titled with layout, schedule and step time. ImportError (one line) without
    matplotlib; OSError if ``path`` cannot be written."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError(PLOT_HINT) from None
    lab, p = _labels(result, labels), result.schedule.p
    fig = Figure(figsize=(11, 2.2 + 0.35 * p + 2.2))
    FigureCanvasAgg(fig)
    ax, ax_mem = fig.subplots(2, 1, sharex=True,
                              gridspec_kw={"height_ratios": [max(1.5, 0.35 * p), 2.2]})
    _draw_rows(ax, result)
    kinds = [k for k in COLOURS if any(e.kind == k for e in result.events)]
    ax.legend([Patch(color=COLOURS[k]) for k in kinds] + [Patch(color="#e6e6e6")],
              [KIND_NAMES[k] for k in kinds] + ["idle"], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize="small")
    for r in range(p):
        times, values = memory_curve(result, r)
        ax_mem.step(list(times) + [result.t_sync], list(values) + [values[-1]], where="post",
                    label=f"rank {r}", linewidth=1)
    ax_mem.set_ylabel(f"activations (A), gamma={result.gamma:g}", fontsize="small")
    ax_mem.set_xlabel("time" + (f" ({lab.unit})" if lab.unit else " (stage-time units)"))
    if p <= 16:
        ax_mem.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="x-small")
    ax_mem.grid(True, alpha=0.3)
    ax.set_title(title(result, lab))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _draw_rows(ax, result: SimResult) -> None:
    """The Gantt rows: idle background per rank, one broken_barh per (rank, kind, chunk
    parity), micro-batch numbers on the bars when they are few."""
    p, t_end = result.schedule.p, result.t_sync
    for r in range(p):
        ax.broken_barh([(0, t_end)], (r - 0.4, 0.8), facecolors="#e6e6e6")
        for (kind, colour), odd in ((kc, odd) for kc in COLOURS.items() for odd in (0, 1)):
            bars = [(e.start, e.end - e.start) for e in result.events
                    if e.rank == r and e.kind == kind and e.chunk % 2 == odd]
            if bars:       # odd chunks (lower case in the reference's listings) lighter
                ax.broken_barh(bars, (r - 0.4, 0.8), facecolors=colour, edgecolors="white",
                               linewidths=0.4, alpha=0.6 if odd else 1.0)
    if len(result.events) <= 600:
        for e in result.events:
            if (e.end - e.start) > t_end / 150:
                ax.text((e.start + e.end) / 2, e.rank, str(e.microbatch), ha="center",
                        va="center", fontsize=5, color="white")
    ax.set_yticks(range(p), [f"rank {r}" for r in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.set_xlim(0, t_end)


def text_strip(result: SimResult, width: int = 80, unit: str = "") -> list[str]:
    """One line per rank, one character per time slot of T_sync / columns (the op covering the
    slot's midpoint: F, B, I, W, X for an F&B pair, '.' idle), then the legend (the slot and
    the span in ``unit``: "s" prints ms below a second), wrapped; every line at most ``width``
    characters. ValueError if ``width`` leaves no column."""
    p, t_end = result.schedule.p, result.t_sync
    prefix = [f"r{r}".ljust(len(f"r{p - 1}")) + " " for r in range(p)]
    cols = width - len(prefix[0])
    if cols < 1:
        raise ValueError(f"text strip width {width} leaves no column after the rank labels")
    rows = [["."] * cols for _ in range(p)]
    slot = t_end / cols if t_end > 0 else 0.0
    for e in result.events if slot > 0 else ():
        first = max(0, int(-(-(e.start / slot - 0.5) // 1)))     # ceil(start/slot - 1/2)
        last = min(cols, int(-(-(e.end / slot - 0.5) // 1)))
        for i in range(first, last):
            rows[e.rank][i] = STRIP[e.kind]
    legend = (f"F fwd B bwd I in-grad W wt-grad X F&B . idle; one column "
              f"{_fmt_time(slot, unit)}, the pipeline {_fmt_time(t_end, unit)}")
    return [pre + "".join(row) for pre, row in zip(prefix, rows)] + \
        textwrap.wrap(legend, width, break_long_words=True)


# ---------------------------------------------------------------- one step of a plan

TAIL_NAMES = {"sync": "p2p fill + gradient sync", "optimizer": "optimizer step"}


def step_labels(tl) -> TimelineLabels:
    """The labels of a planner.timeline.StepTimeline: its layout, schedule and predicted step
    (seconds)."""
    return TimelineLabels(tl.layout.short(), tl.schedule, tl.step, "s", 1e6)


def step_trace(tl) -> dict:
    """chrome_trace of a StepTimeline's pipeline, then on every rank its once-per-step tail
    (complete events "p2p fill + gradient sync" and "optimizer step" after the last op), so the
    span is the predicted step; otherData adds ``tail`` (seconds by part) and ``fast_step``
    (the search's and estimate's step)."""
    labels = step_labels(tl)
    trace = chrome_trace(tl.result, labels)
    k, start = labels.us_per_unit, float(tl.result.t_sync)
    for part, seconds in tl.tail.items():
        if seconds > 0:
            trace["traceEvents"] += [{"name": TAIL_NAMES[part], "cat": part, "ph": "X",
                                      "ts": start * k, "dur": seconds * k, "pid": 0, "tid": r,
                                      "args": {}} for r in range(tl.result.schedule.p)]
        start += seconds
    trace["otherData"].update(tail={k_: float(v) for k_, v in tl.tail.items()},
                              fast_step=float(tl.fast_step))
    return trace


def step_strip(tl, width: int = 80) -> list[str]:
    """text_strip of a StepTimeline's pipeline, then the step as pipeline + tail, the bubble,
    and the search's step where it differs (closed forms on uneven stages), wrapped at
    ``width``."""
    r = tl.result
    lines = text_strip(r, width, "s")
    words = (f"step {_fmt_time(tl.step, 's')} = pipeline {_fmt_time(r.t_sync, 's')} + "
             f"{_tail_words(tl.tail, tl.step)}"
             f"; bubble {_fmt_time(r.bubble, 's')} ({r.bubble / max(r.t_sync, 1e-30):.1%})")
    if abs(tl.fast_step - tl.step) > 1e-9 * tl.step:
        words += (f"; the search and estimate give {_fmt_time(tl.fast_step, 's')} (closed form; "
                  f"{(tl.fast_step - tl.step) / tl.step:+.3%}): the simulated op order on "
                  "these uneven stages differs")
    return lines + textwrap.wrap(words, width, break_long_words=True)


def _tail_words(tail: dict, step: float) -> str:
    """'p2p fill + gradient sync 30.8 ms + optimizer step 49.2 ms'; a part below a billionth of
    the ``step`` (the residue of a subtraction) as 0."""
    return " + ".join(f"{TAIL_NAMES[k]} {_fmt_time(v if abs(v) > 1e-9 * step else 0.0, 's')}"
                      for k, v in tail.items())
