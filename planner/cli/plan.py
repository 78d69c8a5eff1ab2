"""Commands that plan: search, sweep, estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .. import catalog
from ..errors import UsageError
from ..render import console
from ..inputs import check_integers, check_numbers, search_options
from .app import (OFFLOAD_LAYERS, RECOMPUTE_LAYERS, ALLOCATOR, ASYNC_SAVE, DEADLINE, FAILURE_RATE,
                  FLASH, FRAMEWORK, GBS, GPUS, GRAD_DTYPE, HARDWARE, HEADROOM, JSON, MODEL,
                  MOE_A2A_OVERLAP, MOE_DISPATCHER, PRECISION, RESTART_TIME, SEQ, PrecisionChoice,
                  RecomputeChoice, _checkpoint, _moe_job, _require, _training, app,
                  handle_errors)


@app.command()
@handle_errors
def search(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS, hardware: str = HARDWARE,
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    top: int = typer.Option(10, "--top", help="How many layouts to show."),
    json_out: bool = JSON,
    export: Optional[Path] = typer.Option(None, "--export", help="Write the best layout as a plan YAML "
                                          "(- for stdout; the table then goes to stderr)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --export file."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Pin tensor-parallel size."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pin pipeline-parallel size."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Pin data-parallel size."),
    zero_stage: Optional[int] = typer.Option(None, "--zero-stage", help="Pin ZeRO stage (0-3)."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Pin micro-batch size."),
    recompute: Optional[RecomputeChoice] = typer.Option(None, "--recompute", help="Pin recomputation."),
    recompute_num_layers: Optional[int] = RECOMPUTE_LAYERS,
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
    max_micro_batch_size: int = typer.Option(64, "--max-micro-batch-size", help="Upper bound on micro-batch size."),
    max_vpp: int = typer.Option(16, "--max-vpp", help="Upper bound on vpp."),
    max_cp: int = typer.Option(16, "--max-cp", help="Upper bound on cp (powers of two)."),
    objective: str = typer.Option("throughput", "--objective",
                                  help="Rank by: throughput | time-to-train | cost."),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens (default: the model's)."),
    price_per_gpu_hour: Optional[float] = typer.Option(None, "--price-per-gpu-hour",
                                                       help="Price of one GPU-hour (for --objective cost)."),
    currency: Optional[str] = typer.Option(None, "--currency",
                                           help="Currency of --price-per-gpu-hour, an ISO 4217 "
                                                "code (EUR, ...) \\[default: USD]."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus",
                                           help="Use at most N GPUs in whole nodes; the search picks the count."),
    min_memory_headroom: Optional[str] = HEADROOM,
    allow_cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp",
                                             help="Let tp exceed one node's GPUs."),
    why_not: Optional[str] = typer.Option(None, "--why-not",
                                          help="Explain a (partial) layout, e.g. 'tp=4,pp=16', against the winner."),
    deadline: Optional[str] = DEADLINE, failure_rate: Optional[float] = FAILURE_RATE,
    restart_time: Optional[str] = RESTART_TIME, async_save: Optional[bool] = ASYNC_SAVE,
    framework: Optional[str] = FRAMEWORK, flash_attention: Optional[bool] = FLASH,
    grad_dtype: Optional[str] = GRAD_DTYPE, allocator_reserve: Optional[float] = ALLOCATOR,
    precision: Optional[PrecisionChoice] = PRECISION,
    moe_dispatcher: Optional[str] = MOE_DISPATCHER, moe_a2a_overlap: Optional[bool] = MOE_A2A_OVERLAP,
) -> None:
    """Rank the TP/PP/DP/ZeRO layouts that fit, by predicted throughput (or --objective)."""
    from ..objective import parse_deadline
    from ..search import search as run_search
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
        sequence_parallel=sequence_parallel,
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
    --max-gpus, --export - with --json), neither --gpus nor --max-gpus, or an --export file
    that exists (no --force)."""
    from ..outputs import check_destination, refuse_json_too
    if export is not None and why_not is not None:
        raise UsageError("--export writes the search's best plan and --why-not judges your "
                         "layout instead: use one at a time (to export your layout, pin it, e.g. "
                         "--tp 8 --pp 8 --export plan.yaml)")
    if export is not None:
        check_destination(export, force)
        refuse_json_too(export, "--export", json_out)
    if gpus is not None and max_gpus is not None:
        raise UsageError("give --gpus (a fixed count) or --max-gpus (a budget), not both")
    if max_gpus is None:
        _require(gpus, "--gpus")


def _currency(code: Optional[str], price: Optional[float]) -> str:
    """The --currency code (upper case; default USD); UsageError unless three letters (ISO 4217),
    or when given without --price-per-gpu-hour (it names that price's unit)."""
    if code is None:
        return "USD"
    if price is None:
        raise UsageError("--currency names the unit of --price-per-gpu-hour: give the price too")
    text = code.strip().upper()
    if len(text) != 3 or not text.isalpha() or not text.isascii():
        raise UsageError(f"--currency must be a three-letter ISO 4217 code such as USD or EUR, "
                         f"got {code!r}")
    return text


def _why_not(m, hw, training, gpus, n, opts, text: str, currency: str, json_out: bool) -> None:
    """--why-not: the verdict on the user's layout, as JSON or text."""
    from ..whynot import why_not as explain_why_not
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
    for line in model_notes(m):
        console.note(f"note: {line}")
    if export is not None:
        console.out.print(f"Wrote the best plan to {shown(export)}", markup=False)


@app.command()
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
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Training tokens, for the time "
                                           "to train (default: the model's)."),
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
    check_numbers({"tokens": tokens})
    profile, training = _training(m, None, seq_length, _checkpoint(failure_rate, restart_time,
                                                                   async_save),
                                  framework, flash_attention, grad_dtype, allocator_reserve,
                                  precision, _moe_job(moe_dispatcher, moe_a2a_overlap))
    from ..cost.precision import check_precision
    check_precision(hw, training)
    run(m, hw, training, _require(gpus, "--gpus"), json_out, plot, force, min_memory_headroom,
        global_batch_size, tokens, deadline, profile)


@app.command()
@handle_errors
def estimate(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS,
    hardware: Optional[str] = typer.Option(None, "--hardware",
                                           help="Hardware profile name or YAML file \\[default: dgx-h100]."),
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size \\[default: 1]."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel size \\[default: 1]."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel size \\[default: gpus/(tp*cp*pp)]."),
    zero_stage: Optional[int] = typer.Option(
        None, "--zero-stage", help="ZeRO stage 0-3 \\[default: 1; 0 with --distributed-optimizer]."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size",
                                                   help="Micro-batch size \\[default: 1]."),
    recompute: Optional[RecomputeChoice] = typer.Option(None, "--recompute",
                                                        help="Recomputation \\[default: none]."),
    recompute_num_layers: Optional[int] = RECOMPUTE_LAYERS,
    offload_layers: Optional[int] = OFFLOAD_LAYERS,
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                                     help="Sequence parallelism \\[default: off]."),
    vpp: Optional[int] = typer.Option(None, "--vpp", help="Virtual pipeline stages per rank \\[default: 1]."),
    cp: Optional[int] = typer.Option(None, "--cp", help="Context-parallel size \\[default: 1]."),
    ep: Optional[int] = typer.Option(None, "--ep", help="Expert-parallel size (MoE) \\[default: 1]."),
    etp: Optional[int] = typer.Option(None, "--etp", help="Expert-tensor-parallel size (MoE) \\[default: 1]."),
    distributed_optimizer: Optional[bool] = typer.Option(
        None, "--distributed-optimizer/--no-distributed-optimizer",
        help="Megatron's distributed optimizer, the ZeRO-1 alternative: implies --zero-stage 0 "
             "\\[default: off]."),
    first_stage_layers: Optional[int] = typer.Option(
        None, "--first-stage-layers", help="Uneven pipeline split: layers on the first stage \\[default: even]."),
    last_stage_layers: Optional[int] = typer.Option(
        None, "--last-stage-layers", help="Uneven pipeline split: layers on the last stage \\[default: even]."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Evaluate a plan YAML written by --export "
                                        "(alone: it cannot be combined with the other flags)."),
    allow_cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp",
                                             help="Let tp exceed one node's GPUs (a --plan may always)."),
    json_out: bool = JSON,
    failure_rate: Optional[float] = FAILURE_RATE, restart_time: Optional[str] = RESTART_TIME,
    async_save: Optional[bool] = ASYNC_SAVE,
    framework: Optional[str] = FRAMEWORK, flash_attention: Optional[bool] = FLASH,
    grad_dtype: Optional[str] = GRAD_DTYPE, allocator_reserve: Optional[float] = ALLOCATOR,
    precision: Optional[PrecisionChoice] = PRECISION,
    moe_dispatcher: Optional[str] = MOE_DISPATCHER, moe_a2a_overlap: Optional[bool] = MOE_A2A_OVERLAP,
) -> None:
    """Memory and step-time breakdown of one layout (from flags or --plan). Exits 1 if it does not fit."""
    from ..search import check_layout
    flags = {"--model": model, "--gpus": gpus, "--hardware": hardware,
             "--global-batch-size": global_batch_size, "--seq-length": seq_length, "--tp": tp,
             "--pp": pp, "--dp": dp, "--zero-stage": zero_stage, "--micro-batch-size": micro_batch_size,
             "--recompute": recompute, "--recompute-num-layers": recompute_num_layers,
             "--offload-layers": offload_layers,
             "--sequence-parallel": sequence_parallel, "--vpp": vpp,
             "--cp": cp, "--ep": ep, "--etp": etp, "--distributed-optimizer": distributed_optimizer,
             "--first-stage-layers": first_stage_layers, "--last-stage-layers": last_stage_layers,
             "--allow-cross-node-tp": allow_cross_node_tp or None, "--failure-rate": failure_rate,
             "--restart-time": restart_time, "--async-save/--sync-save": async_save,
             "--framework": framework, "--flash-attention": flash_attention,
             "--grad-dtype": grad_dtype, "--allocator-reserve": allocator_reserve,
             "--precision": precision, "--moe-dispatcher": moe_dispatcher,
             "--moe-a2a-overlap": moe_a2a_overlap}
    if plan is not None:
        p = _plan_alone(plan, flags)
        m, hw, training, layout, n, profile = p.model, p.hardware, p.training, p.layout, p.gpus, p.framework
    else:
        # Checked as given, before the defaults: `--tp 0` is an error, not tp=1.
        check_integers(dict(tp=tp, pp=pp, dp=dp, cp=cp, micro_batch_size=micro_batch_size, vpp=vpp,
                            ep=ep, etp=etp))
        check_integers(dict(first_stage_layers=first_stage_layers,
                            last_stage_layers=last_stage_layers,
                            recompute_num_layers=recompute_num_layers,
                            offload_layers=offload_layers), allow_zero=True)
        zero_stage = _zero_stage(zero_stage, distributed_optimizer)
        m, hw, profile, training = _inputs(
            model, hardware or "dgx-h100", global_batch_size, seq_length,
            _checkpoint(failure_rate, restart_time, async_save), framework, flash_attention,
            grad_dtype, allocator_reserve, precision, _moe_job(moe_dispatcher, moe_a2a_overlap))
        n = _require(gpus, "--gpus")
        fields = dict(tp=tp, cp=cp, pp=pp, dp=dp, zero_stage=zero_stage,
                      micro_batch_size=micro_batch_size or 1,
                      recompute=(recompute or RecomputeChoice.none).value,
                      sequence_parallel=bool(sequence_parallel), vpp=vpp or 1,
                      distributed_optimizer=bool(distributed_optimizer), ep=ep or 1, etp=etp or 1,
                      first_stage_layers=first_stage_layers or 0,
                      last_stage_layers=last_stage_layers or 0,
                      recompute_num_layers=recompute_num_layers or 0,
                      offload_layers=offload_layers or 0)
        # tp, cp, pp default to 1 and dp to what they leave (search.check_layout)
        layout = check_layout(m, hw, training, n, {k: v for k, v in fields.items() if v is not None},
                              allow_cross_node_tp, profile)
    _estimate_output(m, hw, training, n, layout, json_out, p if plan is not None else None, profile)


def _plan_alone(plan: Path, flags: dict):
    """The checked plan of ``estimate --plan`` (export.read_checked_plan); UsageError when other
    flags are given too (the plan fixes them)."""
    from ..export import read_checked_plan
    given = [flag for flag, value in flags.items() if value is not None]
    if given:
        raise UsageError(f"--plan cannot be combined with {', '.join(given)}: the plan fixes "
                         "them (edit the plan, or estimate from flags without --plan)")
    return read_checked_plan(plan)  # the checks of every plan consumer


def _inputs(model, hardware, global_batch_size, seq_length, checkpoint, framework, flash,
            grad_dtype, allocator, precision=None, moe=None):
    """(model, hardware, framework profile, TrainingSpec) from the flags (UsageError); ``moe``
    the MoE settings of app._moe_job."""
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    profile, training = _training(m, global_batch_size, seq_length, checkpoint, framework, flash,
                                  grad_dtype, allocator, precision, moe)
    return m, hw, profile, training


def _estimate_output(m, hw, training, n: int, layout, json_out: bool, plan, profile) -> None:
    """estimate's JSON or tables and checkpoint section, with every pipeline rank (``pipeline``:
    each rank's memory and time, the binding and the slowest rank, the imbalance); a layout
    that does not fit gets no step time, throughput or checkpoint, its shortfall per GPU and the
    fewest GPUs on which a layout fits (``to_fit``). Exit 1 then."""
    from ..cost.checkpoint import evaluate_checkpoint, unavailable
    from ..cost.stages import stage_profile
    from ..cost.step import estimate_layout
    from ..render.breakdown import estimate_report, plan_drift
    est = estimate_layout(m, hw, training, layout)
    result = est.to_dict(0)
    fits = result["memory"]["fits"]
    hint = None if fits else _to_fit(m, hw, training, n, profile)
    ck = None if unavailable(hw) or not fits else evaluate_checkpoint(
        m, hw, training, est.candidates, est.time["step"])
    stages = stage_profile(m, hw, training, est)
    from ..explain import recompute_choice
    recompute = recompute_choice(m, est, 0)
    if json_out:
        console.print_json({**result, "recompute": recompute, "to_fit": hint.to_dict() if hint else None,
                            "checkpoint": ck.to_dict(0) if ck else None,
                            "pipeline": {"ranks": stages.to_list(), "binding": stages.binding,
                                         "slowest": stages.slowest, "imbalance": stages.imbalance}})
    else:
        from ..render.checkpoint import checkpoint_report
        from ..render.search import header
        header(m, hw, training, n)
        estimate_report(est, stages, hint, recompute)
        if fits:
            checkpoint_report(ck, 0, hw, est.candidates.layout(0), "Checkpoint")
    if plan is not None:
        plan_drift(plan, est.to_dict(0, raw=True))
    if not fits:
        raise typer.Exit(1)


def _to_fit(m, hw, training, n: int, profile=None):
    """What would make a layout on ``n`` GPUs fit: the best layout that fits on these GPUs,
    else the fewest GPUs on which one fits (refusal.FitHint); None when no count fits."""
    import numpy as np

    from ..errors import NoFitError
    from ..refusal import FitHint
    from ..search import SearchOptions, search
    try:
        best = search(m, hw, training, n, SearchOptions(keep=1, framework=profile)).ranked
    except NoFitError as exc:
        return exc.to_fit
    except UsageError:  # no layout can use n GPUs at all (e.g. the batch): the next count that fits
        from ..refusal import fit_hint
        return fit_hint(m, hw, training, n, SearchOptions(framework=profile))
    return FitHint(n, best.take(np.array([0])))


def _zero_stage(zero_stage: Optional[int], distributed_optimizer: Optional[bool]) -> int:
    """estimate's ZeRO stage: as given (0-3), else 1, or 0 with the distributed optimizer (its
    alternative); UsageError for another value or a stage beside the distributed optimizer."""
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise UsageError(f"--zero-stage must be 0, 1, 2 or 3, got {zero_stage}")
    if distributed_optimizer and zero_stage:
        raise UsageError(f"--distributed-optimizer replaces ZeRO, so it needs --zero-stage 0 "
                         f"(got {zero_stage}): drop --zero-stage, or drop "
                         f"--distributed-optimizer to keep ZeRO-{zero_stage}")
    if zero_stage is None:  # ZeRO-1, or its alternative the distributed optimizer
        return 0 if distributed_optimizer else 1
    return zero_stage


def _with_gpus(entry: dict) -> dict:
    """A search --json entry: ``gpus`` beside ``layout``, then the estimate's keys and, as in
    ``estimate --json``, ``to_fit`` (None: every listed layout fits)."""
    from ..specs import Layout
    lay = entry["layout"]
    return {"layout": lay, "gpus": Layout(**lay).gpus,
            **{k: v for k, v in entry.items() if k != "layout"}, "to_fit": None}
