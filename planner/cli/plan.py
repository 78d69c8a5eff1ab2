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
from .app import (CURRENCY, EXPORT, FORCE, MAX_GPUS, WHY_NOT, OFFLOAD_LAYERS, RECOMPUTE_LAYERS, ALLOCATOR, ASYNC_SAVE, DEADLINE, FAILURE_RATE,
                  FLASH, FRAMEWORK, GBS, GPUS, GRAD_DTYPE, HARDWARE, HEADROOM, JSON, MODEL,
                  MOE_A2A_OVERLAP, MOE_DISPATCHER, PRECISION, RESTART_TIME, SEQ, PrecisionChoice,
                  RecomputeChoice, _checkpoint, _moe_job, _require, _training, app,
                  handle_errors)


@app.command(short_help="Rank the layouts that fit by predicted speed.")
@handle_errors
def search(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS, hardware: str = HARDWARE,
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    top: int = typer.Option(10, "--top", help="How many layouts to show."),
    json_out: bool = JSON,
    export: Optional[Path] = EXPORT, force: bool = FORCE,
    tp: Optional[int] = typer.Option(None, "--tp", help="Pin tensor-parallel size."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pin pipeline-parallel size."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Pin data-parallel size."),
    zero_stage: Optional[int] = typer.Option(None, "--zero-stage", help="Pin ZeRO stage (0-3)."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Pin micro-batch size."),
    recompute: Optional[RecomputeChoice] = typer.Option(None, "--recompute", help="Pin recomputation."),
    recompute_num_layers: Optional[int] = RECOMPUTE_LAYERS, offload_layers: Optional[int] = OFFLOAD_LAYERS,
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                                     help="Pin sequence parallelism."),
    vpp: Optional[int] = typer.Option(None, "--vpp", help="Pin virtual pipeline stages per rank."),
    cp: Optional[int] = typer.Option(None, "--cp", help="Pin context-parallel size."),
    ep: Optional[int] = typer.Option(None, "--ep", help="Pin expert-parallel size (MoE models)."),
    etp: Optional[int] = typer.Option(None, "--etp", help="Pin expert-tensor-parallel size (MoE)."),
    max_ep: Optional[int] = typer.Option(None, "--max-ep", help="Upper bound on ep."),
    distributed_optimizer: Optional[bool] = typer.Option(
        None, "--distributed-optimizer/--no-distributed-optimizer",
        help="Pin Megatron's distributed optimizer (costed as ZeRO-1; off unless pinned)."),
    max_tp: Optional[int] = typer.Option(None, "--max-tp", help="Upper bound on tp."),
    max_pp: Optional[int] = typer.Option(None, "--max-pp", help="Upper bound on pp."),
    max_micro_batch_size: Optional[int] = typer.Option(None, "--max-micro-batch-size", help="Upper bound on micro-batch size [default: 64, or the --micro-batch-size pin]."),
    max_vpp: Optional[int] = typer.Option(None, "--max-vpp", help="Upper bound on vpp [default: 16, or the --vpp pin]."),
    max_cp: Optional[int] = typer.Option(None, "--max-cp", help="Upper bound on cp (powers of two) [default: 16, or the --cp pin]."),
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
    why_not: Optional[str] = WHY_NOT,
    deadline: Optional[str] = DEADLINE, failure_rate: Optional[float] = FAILURE_RATE,
    restart_time: Optional[str] = RESTART_TIME, async_save: Optional[bool] = ASYNC_SAVE,
    framework: Optional[str] = FRAMEWORK, flash_attention: Optional[bool] = FLASH,
    grad_dtype: Optional[str] = GRAD_DTYPE, allocator_reserve: Optional[float] = ALLOCATOR,
    precision: Optional[PrecisionChoice] = PRECISION,
    moe_dispatcher: Optional[str] = MOE_DISPATCHER, moe_a2a_overlap: Optional[bool] = MOE_A2A_OVERLAP,
) -> None:
    """Rank the TP/PP/DP/ZeRO layouts that fit, by predicted throughput (or --objective)."""
    from ..search.objective import parse_deadline
    from ..search.run import search as run_search
    tokens = parse_count(tokens, "--tokens")
    m, hw, profile, training = _inputs(
        model, hardware, global_batch_size, seq_length, _checkpoint(failure_rate, restart_time,
                                                                    async_save),
        framework, flash_attention, grad_dtype, allocator_reserve, precision,
        _moe_job(moe_dispatcher, moe_a2a_overlap))
    check_numbers({"top": top})
    _check_search_flags(export, force, why_not, gpus, max_gpus, json_out)
    opts = search_options(hw, training, dict(
        tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, micro_batch_size=micro_batch_size,
        recompute=recompute.value if recompute else None, recompute_num_layers=recompute_num_layers,
        offload_layers=offload_layers, sequence_parallel=sequence_parallel,
        vpp=vpp, max_tp=max_tp, max_pp=max_pp, max_micro_batch_size=max_micro_batch_size,
        max_vpp=max_vpp, cp=cp, distributed_optimizer=distributed_optimizer, max_cp=max_cp,
        ep=ep, etp=etp, max_ep=max_ep,
        allow_cross_node_tp=allow_cross_node_tp, objective=objective, tokens=tokens,
        price_per_gpu_hour=price_per_gpu_hour, max_gpus=max_gpus,
        deadline_s=parse_deadline(deadline), framework=profile), min_memory_headroom,
        model=m)
    n = gpus if gpus is not None else f"at most {max_gpus}"
    money = _currency(currency, price_per_gpu_hour)
    if why_not is not None:
        _why_not(m, hw, training, gpus, n, opts, why_not, money, json_out)
        return
    with console.err.status("Searching layouts...", spinner="dots"):
        result = run_search(m, hw, training, gpus, opts)
    _export_and_show(m, hw, training, profile, result, export, force, lambda: _search_output(
        m, hw, training, n, result, top, json_out, money, max_gpus is not None, export))


def _export_and_show(m, hw, training, profile, result, export, force, show) -> None:
    """Write the winner as a plan (--export) and print the search (``show``), to stderr when
    the plan goes to stdout (--export -)."""
    from ..export import make_plan, write_plan
    from ..outputs import is_stdout, report_to_stderr
    best = result.ranked
    if export is not None:
        write_plan(make_plan(m, hw, training, best.candidates.layout(0), best.to_dict(0), profile),
                   export, force)
    with report_to_stderr(is_stdout(export)):  # --export -: stdout holds the plan alone
        show()


def _check_search_flags(export: Optional[Path], force: bool, why_not: Optional[str],
                        gpus: Optional[int], max_gpus: Optional[int], json_out: bool) -> None:
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
    elif force:
        raise UsageError("--force lets --export overwrite a file; without --export it does nothing")
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
    from ..explain import explain_search, tie_dict
    best = result.ranked
    explanation = explain_search(result)
    groups = explanation.groups
    if top > len(groups) and result.fitting > len(best):  # capped at the search's keep
        rows = f"{len(groups):,}" + (f" rows ({len(best):,} layouts)" if len(groups) < len(best) else "")
        console.note(f"note: --top {top:,} shows the best {rows} of the {result.fitting:,} layouts "
                     f"that fit (the search keeps {len(best):,})")
    ck = result.checkpoint
    if json_out:
        extra = {"currency": currency} if "cost" in best.throughput else {}
        from ..explain import recompute_choice
        console.print_json([{**_with_gpus(best.to_dict(g.first, result.usable)), **extra,
                             "recompute": recompute_choice(m, best, g.first),
                             "ties": tie_dict(best, g),
                             "checkpoint": ck.to_dict(g.first) if ck else None}
                            for g in groups[:top]])
        return
    from ..explain import model_notes
    from ..outputs import shown
    from ..render.breakdown import breakdown_report
    from ..render.checkpoint import checkpoint_report
    from ..render.search import header, search_table
    header(m, hw, training, n)
    search_table(result, explanation, top, currency, gpus_searched=gpus_searched)
    breakdown_report(result)
    checkpoint_report(ck, 0, hw, best.candidates.layout(0), "Winner's checkpoint")
    from ..cost.comm import a2a_overlap_note
    overlap = a2a_overlap_note(training, best.candidates)
    if overlap:
        console.note(f"note: the winner: {overlap}")
    for line in model_notes(m):
        console.note(f"note: {line}")
    if export is not None:
        console.out.print(f"Wrote the best plan to {shown(export)}", markup=False)


@app.command(short_help="Best layout per GPU count, with scaling.")
@handle_errors
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
    deadline: Optional[str] = DEADLINE, failure_rate: Optional[float] = FAILURE_RATE,
    restart_time: Optional[str] = RESTART_TIME, async_save: Optional[bool] = ASYNC_SAVE,
    framework: Optional[str] = FRAMEWORK, flash_attention: Optional[bool] = FLASH,
    grad_dtype: Optional[str] = GRAD_DTYPE, allocator_reserve: Optional[float] = ALLOCATOR,
    precision: Optional[PrecisionChoice] = PRECISION,
    moe_dispatcher: Optional[str] = MOE_DISPATCHER, moe_a2a_overlap: Optional[bool] = MOE_A2A_OVERLAP,
) -> None:
    """Best layout, tokens/s, MFU, scaling efficiency and time to train at each GPU count."""
    from .sweep import run
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    tokens = parse_count(tokens, "--tokens")
    check_numbers({"tokens": tokens})
    profile, training = _training(m, None, seq_length, _checkpoint(failure_rate, restart_time,
                                                                   async_save),
                                  framework, flash_attention, grad_dtype, allocator_reserve,
                                  precision, _moe_job(moe_dispatcher, moe_a2a_overlap))
    from ..cost.precision import check_precision
    check_precision(hw, training)
    run(m, hw, training, _require(gpus, "--gpus"), json_out, plot, force, min_memory_headroom,
        global_batch_size, tokens, deadline, profile)


def _inputs(model, hardware, global_batch_size, seq_length, checkpoint, framework, flash,
            grad_dtype, allocator, precision=None, moe=None):
    """(model, hardware, framework profile, TrainingSpec) from the flags (UsageError); ``moe``
    the MoE settings of app._moe_job."""
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    profile, training = _training(m, global_batch_size, seq_length, checkpoint, framework, flash,
                                  grad_dtype, allocator, precision, moe)
    return m, hw, profile, training


def _with_gpus(entry: dict) -> dict:
    """A search --json entry: ``gpus`` beside ``layout``, then the estimate's keys and, as in
    ``estimate --json``, ``to_fit`` (None: every listed layout fits)."""
    from ..layout import Layout
    lay = entry["layout"]
    return {"layout": lay, "gpus": Layout(**lay).gpus,
            **{k: v for k, v in entry.items() if k != "layout"}, "to_fit": None}
