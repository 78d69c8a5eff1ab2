"""The timeline command, and --timeline of search and estimate: one step of a layout's pipeline
schedule as a Chrome trace (JSON), a Gantt chart (PNG) and a text strip in the terminal."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from ..render import console
from .app import app, handle_errors

PNG_HINT = ("the Gantt chart needs matplotlib, plan3d's optional extra 'plot': pip install -e "
            "'.[plot]' in the plan3d source tree (or pip install 'matplotlib>=3.6'); --no-png "
            "writes the trace alone")


def png_beside(trace: Path) -> Path:
    """The PNG written beside a trace: its name with .png for .json (timeline.json ->
    timeline.png), else .png appended."""
    return trace.with_suffix(".png") if trace.suffix == ".json" else Path(f"{trace}.png")


def default_png(png: Path) -> Path | None:
    """The Gantt chart a timeline writes when none is named: ``png``, or None where matplotlib
    (the extra 'plot') is missing: the trace and the strip are written, and write_timeline says
    why the chart is not. A chart named with --png without matplotlib is an error instead."""
    return png if importlib.util.find_spec("matplotlib") is not None else None


def check_timeline(trace: Path, png: Path | None, force: bool, inputs=()) -> None:
    """UsageError before any work for a destination that cannot be written (outputs.
    check_destination: never over an existing file without ``force``, never over an input),
    stdout (the trace is a file), the two being one file, or a PNG without matplotlib."""
    from ..outputs import check_destination, is_stdout
    for path, flag, example in ((trace, "--timeline", "timeline.json"), (png, "--png", "timeline.png")):
        if path is None:
            continue
        if is_stdout(path):
            raise UsageError(f"{flag} writes a file; give it a name such as {example}")
        check_destination(path, force, flag, example, inputs=inputs)
    if png is not None and Path(png).resolve() == Path(trace).resolve():
        raise UsageError(f"the trace and the PNG would both be {trace}: give --png another name")
    if png is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError(PNG_HINT)


def write_timeline(model, hw, training, layout, trace: Path, png: Path | None, force: bool,
                   max_ops: int | None = None, width: int | None = None, strip: bool = True) -> None:
    """Simulate one step of ``layout`` (planner.timeline.step_timeline), write its Chrome trace
    to ``trace`` and, unless ``png`` is None, its Gantt chart there; print the text strip
    (``strip``) and what was written (check_timeline first). UsageError (one line) for a step
    too long to draw."""
    from ..outputs import write
    from ..render.timeline import gantt_png, step_labels, step_strip, step_trace
    from ..timeline import MAX_OPS, step_timeline
    tl = step_timeline(model, hw, training, layout, max_ops or MAX_OPS)
    try:
        lines = step_strip(tl, width or console.out.width) if strip else []
    except ValueError as exc:  # the rank labels fill the width
        raise UsageError(f"--width {width}: {exc}; give at least "
                         f"{len(str(tl.result.schedule.p - 1)) + 3}") from None
    write(trace, json.dumps(step_trace(tl)) + "\n", force, "--timeline", "timeline.json")
    if png is not None:
        try:
            gantt_png(tl.result, step_labels(tl), png)
        except OSError as exc:
            raise UsageError(f"cannot write {png}: {exc.strerror or exc}") from None
    for line in lines:
        console.out.print(line, markup=False, highlight=False, soft_wrap=True)
    wrote = f"{trace}" + (f" and the Gantt chart to {png}" if png is not None else "")
    if png is None and importlib.util.find_spec("matplotlib") is None:
        wrote += " (no Gantt chart: it needs matplotlib, the extra 'plot')"
    console.note(f"Wrote the timeline (Chrome trace: Perfetto, chrome://tracing) to {wrote}")


@app.command(short_help="Draw one step of a plan's pipeline schedule.")
@handle_errors
def timeline(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Chrome trace JSON to write "
                                         "[default: the plan's name with .trace.json]."),
    png: Optional[Path] = typer.Option(None, "--png", help="Gantt chart PNG to write (extra "
                                       "'plot') [default: the plan's name with .png]."),
    no_png: bool = typer.Option(False, "--no-png", help="Write the trace alone."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
    max_ops: Optional[int] = typer.Option(None, "--max-ops", help="Most ops of one step to "
                                          "simulate and draw [default: 60,000]."),
    width: Optional[int] = typer.Option(None, "--width", help="Columns of the text strip "
                                        "[default: the terminal's]."),
) -> None:
    """One step of the plan's pipeline schedule: each rank's forward, backward (input and weight
    gradients) and idle time with the cost model's op times, the gradient sync and optimizer
    after them; a Chrome trace (ranks as threads), a PNG Gantt chart with the activation memory
    per rank, and a text strip here. Its span is the predicted step."""
    from ..export import read_checked_plan
    for flag, value in (("--max-ops", max_ops), ("--width", width)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be positive, got {value}")
    trace = trace or plan.with_name(plan.stem + ".trace.json")
    chart = None if no_png else (png or default_png(plan.with_name(plan.stem + ".png")))
    if no_png and png is not None:
        raise UsageError("--png names the chart that --no-png leaves out: give one of them")
    check_timeline(trace, chart, force, inputs=[plan])
    p = read_checked_plan(plan)
    write_timeline(p.model, p.hardware, p.training, p.layout, trace, chart, force, max_ops, width)
