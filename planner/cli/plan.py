"""Commands that plan: search, sweep, estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import catalog
from ..errors import UsageError
from ..render import console
from ..inputs import check_numbers
from ..search.options import search_options
from ..units import parse_count
from ..search.objective import parse_deadline, parse_share
from ..search.run import search as run_search
from .app import (CURRENCY, DEADLINE, EXPORT, FORCE, GBS, GPUS, HARDWARE, HEADROOM, JSON,
                  MAX_GPUS, MIN_FREE, MODEL, SEQ, STRICT_RANK, WHY_NOT, _require, _training, app,
                  handle_errors)
from .options import with_options
from .timeline import check_timeline, default_png, png_beside, write_timeline

TIMELINE = typer.Option(None, "--timeline", help="Write the winner's step (estimate: the "
                        "layout's) as a Chrome trace JSON here and its Gantt chart beside it "
                        "(.png; extra 'plot'); --force overwrites them.")


@app.command(short_help="Rank the layouts that fit by predicted speed.")
@handle_errors
@with_options(axes="search")
def search(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS, hardware: str = HARDWARE,
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    top: int = typer.Option(10, "--top", help="How many layouts to show."),
    json_out: bool = JSON,
    export: Optional[Path] = EXPORT, force: bool = FORCE,
    objective: str = typer.Option("throughput", "--objective",
                                  help="Rank by: throughput | time-to-train | cost."),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Training tokens, e.g. 2e12 or 2T "
                                         "(default: the model's)."),
    price_per_gpu_hour: Optional[float] = typer.Option(None, "--price-per-gpu-hour",
                                                       help="Price of one GPU-hour: prices the run (the cost "
                                                       "column; --objective cost ranks by it)."),
    currency: Optional[str] = CURRENCY, max_gpus: Optional[int] = MAX_GPUS,
    min_memory_headroom: Optional[str] = HEADROOM,
    allow_cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp",
                                             help="Let tp exceed one node's GPUs."),
    why_not: Optional[str] = WHY_NOT, deadline: Optional[str] = DEADLINE,
    timeline: Optional[Path] = TIMELINE,
    min_free: Optional[str] = MIN_FREE, strict_rank: bool = STRICT_RANK,
    axes: dict | None = None, job: dict | None = None,
) -> None:
    """Rank the layouts that fit, by predicted throughput (or --objective); layouts within
    plan3d's error band of the best are a tie, picked by memory headroom, checked terms and
    convention (--strict-rank: by the objective alone)."""
    tokens = parse_count(tokens, "--tokens")
    m, hw, profile, training = _inputs(model, hardware, global_batch_size, seq_length, job)
    check_numbers({"top": top})
    _check_search_flags(export, force, why_not, gpus, max_gpus, json_out, timeline)
    if timeline is not None:
        if why_not is not None:
            raise UsageError("--timeline draws the search's winner and --why-not judges your "
                             "layout instead: use one at a time")
        check_timeline(timeline, default_png(png_beside(timeline)), force, inputs=[export] if export else [])
    opts = search_options(hw, training, dict(
        axes, allow_cross_node_tp=allow_cross_node_tp, objective=objective, tokens=tokens,
        price_per_gpu_hour=price_per_gpu_hour, max_gpus=max_gpus,
        deadline_s=parse_deadline(deadline), framework=profile, min_free=parse_share(min_free, "--min-free"),
        strict_rank=strict_rank), min_memory_headroom, model=m)
    n = gpus if gpus is not None else f"at most {max_gpus}"
    money = _currency(currency, price_per_gpu_hour)
    if why_not is not None:
        _why_not(m, hw, training, gpus, n, opts, why_not, money, json_out)
        return
    with console.err.status("Searching layouts...", spinner="dots"):
        result = run_search(m, hw, training, gpus, opts)
    _export_and_show(m, hw, training, profile, result, export, force, lambda: _search_output(
        m, hw, training, n, result, top, json_out, money, max_gpus is not None, export))
    if timeline is not None:  # the winner's step
        write_timeline(m, hw, training, result.ranked.candidates.layout(0), timeline,
                       default_png(png_beside(timeline)), force, strip=not json_out)


def _export_and_show(m, hw, training, profile, result, export, force, show) -> None:
    """Write the winner as a plan (--export) and print the search (``show``), to stderr when
    the plan goes to stdout (--export -)."""
    from ..explain_bands import estimate_band
    from ..export import make_plan, write_plan
    from ..outputs import is_stdout, report_to_stderr
    best = result.ranked
    if export is not None:
        estimate = {**best.to_dict(0), "band": estimate_band(m, hw, training, best, 0)}
        write_plan(make_plan(m, hw, training, best.candidates.layout(0), estimate, profile),
                   export, force)
    with report_to_stderr(is_stdout(export)):  # --export -: stdout holds the plan alone
        show()


def _check_search_flags(export: Optional[Path], force: bool, why_not: Optional[str],
                        gpus: Optional[int], max_gpus: Optional[int], json_out: bool,
                        timeline: Optional[Path] = None) -> None:
    """UsageError for flags that cannot go together (--export with --why-not, --gpus with
    --max-gpus, --export - with --json, --force without --export), neither --gpus nor
    --max-gpus, or an --export file that exists (no --force)."""
    from ..outputs import check_destination, refuse_json_too
    if export is not None and why_not is not None:
        raise UsageError("--export writes the search's best plan and --why-not judges your "
                         "layout instead: use one at a time (to export your layout, pin it, e.g. "
                         "--tp 8 --pp 8 --export plan.yaml)")
    if export is not None:
        check_destination(export, force)
        refuse_json_too(export, "--export", json_out)
    elif force and timeline is None:
        raise UsageError("--force lets --export (and --timeline) overwrite a file; without them "
                         "it does nothing")
    if gpus is not None and max_gpus is not None:
        raise UsageError("give --gpus (a fixed count) or --max-gpus (a budget), not both")
    if max_gpus is None:
        _require(gpus, "--gpus")


def _currency(code: Optional[str], price: Optional[float]) -> str:
    """The --currency code (upper case; default USD); UsageError unless three letters (the form
    of ISO 4217 codes; any three letters are taken: the code only labels the price),
    or when given without --price-per-gpu-hour (it names that price's unit)."""
    if code is None:
        return "USD"
    if price is None:
        raise UsageError("--currency names the unit of --price-per-gpu-hour: give the price too")
    text = code.strip().upper()
    if len(text) != 3 or not text.isalpha() or not text.isascii():
        raise UsageError(f"--currency must be a three-letter code such as USD or EUR, "
                         f"got {code!r}")
    return text


def _why_not(m, hw, training, gpus, n, opts, text: str, currency: str, json_out: bool) -> None:
    """--why-not: the verdict on the user's layout, as JSON or text."""
    from ..search.whynot import why_not as explain_why_not
    verdict = explain_why_not(m, hw, training, gpus, opts, text, currency)
    if json_out:
        data = verdict.to_dict()
        console.print_json({**data, "currency": currency} if opts.price_per_gpu_hour else data)
        return
    from ..render.search import header
    from ..render.whynot import why_not_report
    header(m, hw, training, n)
    why_not_report(verdict)


def _search_output(m, hw, training, n, result, top: int, json_out: bool, currency: str,
                   gpus_searched: bool, export: Optional[Path]) -> None:
    """The search's JSON (one entry per group of tied layouts, best first) or its tables."""
    from ..explain import explain_search
    from ..outputs import search_json
    best = result.ranked
    explanation = explain_search(result, m, hw, training)
    groups = explanation.groups
    if top > len(groups) and result.fitting > len(best):  # capped at the search's keep
        rows = f"{len(groups):,}" + (f" rows ({len(best):,} layouts)" if len(groups) < len(best) else "")
        console.note(f"note: --top {top:,} shows the best {rows} of the {result.fitting:,} layouts "
                     f"that fit (the search keeps {len(best):,})")
    ck = result.checkpoint
    if json_out:
        console.print_json(search_json(m, result, explanation, top, currency, hw, training))
        return
    from ..explain import model_notes
    from ..outputs import shown
    from ..render.breakdown import breakdown_report
    from ..render.checkpoint import checkpoint_report
    from ..render.search import header, search_table
    header(m, hw, training, n)
    search_table(result, explanation, top, currency, gpus_searched=gpus_searched)
    from ..explain import precision_loss
    from ..render.search import precision_text
    loss = precision_loss(m, hw, training, best, 0)
    if loss is not None:
        console.out.print(precision_text(loss), markup=False)
    breakdown_report(result)
    checkpoint_report(ck, 0, hw, best.candidates.layout(0), "Winner's checkpoint")
    from ..cost.comm import a2a_overlap_note
    overlap = a2a_overlap_note(training, best.candidates)
    if overlap:
        console.note(f"note: the winner: {overlap}")
    from ..explain import schedule_note
    schedule = schedule_note(m, hw, training, best)
    if schedule:
        console.note(f"note: the winner runs {schedule}")
    for line in model_notes(m):
        console.note(f"note: {line}")
    if export is not None:
        console.out.print(f"Wrote the best plan to {shown(export)}", markup=False)


@app.command(short_help="Best layout per GPU count, with scaling.")
@handle_errors
@with_options()
def sweep(
    model: Optional[str] = MODEL, hardware: str = HARDWARE,
    gpus: Optional[str] = typer.Option(None, "--gpus", "-g",
                                       help="GPU counts: low:high (doublings) or a comma list."),
    global_batch_size: Optional[str] = typer.Option(
        None, "--global-batch-size", help="Sequences per step, or a comma list to sweep too."),
    seq_length: Optional[int] = SEQ,
    json_out: bool = JSON,
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw tokens/s (log-log, with ideal "
                                        "linear scaling) and MFU vs GPUs to a PNG (- for stdout)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --plot file."),
    min_memory_headroom: Optional[str] = HEADROOM,
    tokens: Optional[str] = typer.Option(None, "--tokens", help="Training tokens, for the time "
                                         "to train, e.g. 2e12 or 2T (default: the model's)."),
    deadline: Optional[str] = DEADLINE, job: dict | None = None,
) -> None:
    """Best layout, tokens/s, MFU, scaling efficiency and time to train at each GPU count."""
    from .sweep import run
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    tokens = parse_count(tokens, "--tokens")
    check_numbers({"tokens": tokens})
    profile, training = _training(m, None, seq_length, job)
    from ..cost.precision import check_precision
    check_precision(hw, training)
    run(m, hw, training, _require(gpus, "--gpus"), json_out, plot, force, min_memory_headroom,
        global_batch_size, tokens, deadline, profile)


def _inputs(model, hardware, global_batch_size, seq_length, job: dict):
    """(model, hardware, framework profile, TrainingSpec) from the flags and the job options
    (options.JOB; UsageError)."""
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    profile, training = _training(m, global_batch_size, seq_length, job)
    return m, hw, profile, training
