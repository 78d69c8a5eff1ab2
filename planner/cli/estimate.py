"""The estimate command: the memory and step-time breakdown of one layout, from flags or a plan."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from ..inputs import check_integers
from ..render import console
from .app import (ALLOCATOR, ASYNC_SAVE, FAILURE_RATE, FLASH, FRAMEWORK, GBS, GPUS, GRAD_DTYPE,
                  JSON, MODEL, MOE_A2A_OVERLAP, MOE_DISPATCHER, OFFLOAD_LAYERS, PRECISION,
                  RECOMPUTE_LAYERS, RESTART_TIME, SEQ, PrecisionChoice, RecomputeChoice,
                  _checkpoint, _moe_job, _require, app, handle_errors)
from .plan import _inputs


@app.command(short_help="Memory and step time of one layout.")
@handle_errors
def estimate(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS,
    hardware: Optional[str] = typer.Option(None, "--hardware",
                                           help="Hardware profile name or YAML file [default: dgx-h100]."),
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size [default: 1]."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel size [default: 1]."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel size [default: gpus/(tp*cp*pp)]."),
    zero_stage: Optional[int] = typer.Option(
        None, "--zero-stage", help="ZeRO stage 0-3 [default: 1, else the framework's highest "
                                   "(torchtitan: 3); 0 with --distributed-optimizer]."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size",
                                                   help="Micro-batch size [default: 1]."),
    recompute: Optional[RecomputeChoice] = typer.Option(None, "--recompute",
                                                        help="Recomputation [default: none]."),
    recompute_num_layers: Optional[int] = RECOMPUTE_LAYERS,
    offload_layers: Optional[int] = OFFLOAD_LAYERS,
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                                     help="Sequence parallelism [default: off; on for an MoE model with tp > 1, which needs it]."),
    vpp: Optional[int] = typer.Option(None, "--vpp", help="Virtual pipeline stages per rank [default: 1]."),
    cp: Optional[int] = typer.Option(None, "--cp", help="Context-parallel size [default: 1]."),
    ep: Optional[int] = typer.Option(None, "--ep", help="Expert-parallel size (MoE) [default: 1]."),
    etp: Optional[int] = typer.Option(None, "--etp", help="Expert-tensor-parallel size (MoE) [default: 1]."),
    distributed_optimizer: Optional[bool] = typer.Option(
        None, "--distributed-optimizer/--no-distributed-optimizer",
        help="Megatron's distributed optimizer, the ZeRO-1 alternative: implies --zero-stage 0 "
             "[default: off]."),
    first_stage_layers: Optional[int] = typer.Option(
        None, "--first-stage-layers", help="Uneven pipeline split: layers on the first stage [default: even]."),
    last_stage_layers: Optional[int] = typer.Option(
        None, "--last-stage-layers", help="Uneven pipeline split: layers on the last stage [default: even]."),
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
    p = _plan_alone(plan, flags) if plan is not None else None
    if p is not None:
        m, hw, training, layout, n, profile = p.model, p.hardware, p.training, p.layout, p.gpus, p.framework
    else:
        m, hw, profile, training, n, layout = _from_flags(flags, allow_cross_node_tp)
    _estimate_output(m, hw, training, n, layout, json_out, p, profile)


def _from_flags(flags: dict, allow_cross_node_tp: bool):
    """(model, hardware, profile, training, gpus, layout) of ``estimate`` from its flags (by
    flag name), each checked as given before the defaults: `--tp 0` is an error, not tp=1;
    tp, cp, pp default to 1 and dp to what they leave (search.check_layout). UsageError."""
    from ..search.check import check_layout
    f = {k.lstrip("-").split("/")[0].replace("-", "_"): v for k, v in flags.items()}
    check_integers({k: f[k] for k in ("tp", "pp", "dp", "cp", "micro_batch_size", "vpp", "ep", "etp")})
    check_integers({k: f[k] for k in ("first_stage_layers", "last_stage_layers",
                                      "recompute_num_layers", "offload_layers")}, allow_zero=True)
    _zero_stage(f["zero_stage"], f["distributed_optimizer"], None, 1)  # the flags' own errors first
    m, hw, profile, training = _inputs(
        f["model"], f["hardware"] or "dgx-h100", f["global_batch_size"], f["seq_length"],
        _checkpoint(f["failure_rate"], f["restart_time"], f["async_save"]), f["framework"],
        f["flash_attention"], f["grad_dtype"], f["allocator_reserve"], f["precision"],
        _moe_job(f["moe_dispatcher"], f["moe_a2a_overlap"]))
    zero_stage = _zero_stage(f["zero_stage"], f["distributed_optimizer"], profile, f["pp"] or 1)
    n = _require(f["gpus"], "--gpus")
    sequence_parallel = f["sequence_parallel"]
    if sequence_parallel is None:  # on where the expert rule needs it and the framework has it
        from ..search.framework_rules import profile_for
        from ..search.rules import moe_needs_sp
        sequence_parallel = moe_needs_sp(m, f["tp"] or 1) and \
            profile_for(training, profile).rules.sequence_parallel
        if sequence_parallel:
            console.note("note: sequence parallelism on: an MoE model with tp > 1 needs it "
                         "(--no-sequence-parallel is refused for the same reason)")
    fields = dict(tp=f["tp"], cp=f["cp"], pp=f["pp"], dp=f["dp"], zero_stage=zero_stage,
                  micro_batch_size=f["micro_batch_size"] or 1,
                  recompute=(f["recompute"] or RecomputeChoice.none).value,
                  sequence_parallel=sequence_parallel, vpp=f["vpp"] or 1,
                  distributed_optimizer=bool(f["distributed_optimizer"]), ep=f["ep"] or 1,
                  etp=f["etp"] or 1, first_stage_layers=f["first_stage_layers"] or 0,
                  last_stage_layers=f["last_stage_layers"] or 0,
                  recompute_num_layers=f["recompute_num_layers"] or 0,
                  offload_layers=f["offload_layers"] or 0)
    layout = check_layout(m, hw, training, n, {k: v for k, v in fields.items() if v is not None},
                          allow_cross_node_tp, profile)
    return m, hw, profile, training, n, layout


def _plan_alone(plan: Path, flags: dict):
    """The checked plan of ``estimate --plan`` (export.read_checked_plan); UsageError when other
    flags are given too (the plan fixes them)."""
    from ..export import read_checked_plan
    given = [flag for flag, value in flags.items() if value is not None]
    if given:
        raise UsageError(f"--plan cannot be combined with {', '.join(given)}: the plan fixes "
                         "them (edit the plan, or estimate from flags without --plan)")
    return read_checked_plan(plan)  # the checks of every plan consumer


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
        _host_offload_line(m, hw, training, est)
        from ..cost.comm import a2a_overlap_note
        overlap = a2a_overlap_note(training, est.candidates)
        if overlap:
            console.note(f"note: {overlap}")
        if fits:
            checkpoint_report(ck, 0, hw, est.candidates.layout(0), "Checkpoint")
    if plan is not None:
        plan_drift(plan, est.to_dict(0, raw=True))
    if not fits:
        raise typer.Exit(1)


def _host_offload_line(m, hw, training, est) -> None:
    """With activation offload, the host memory it takes per GPU against the host's share."""
    from ..cost.offload import host_bytes
    n = int(est.candidates.layout(0).offload_layers)
    if n:
        used = float(host_bytes(m, training, est.candidates)[0]) / 2**30
        console.out.print(f"Activation offload: {n} layers' activations, {used:,.1f} GiB per GPU "
                          f"in host memory (of {hw.host_memory_per_gpu / 2**30:,.1f} GiB per GPU).")


def _to_fit(m, hw, training, n: int, profile=None):
    """What would make a layout on ``n`` GPUs fit: the best layout that fits on these GPUs,
    else the fewest GPUs on which one fits (refusal.FitHint); None when no count fits."""
    import numpy as np

    from ..errors import NoFitError
    from ..search.refusal import FitHint
    from ..search.options import SearchOptions
    from ..search.run import search
    try:
        best = search(m, hw, training, n, SearchOptions(keep=1, framework=profile)).ranked
    except NoFitError as exc:
        return exc.to_fit
    except UsageError:  # no layout can use n GPUs at all (e.g. the batch): the next count that fits
        from ..search.run import fit_hint
        return fit_hint(m, hw, training, n, SearchOptions(framework=profile))
    return FitHint(n, best.take(np.array([0])))


def _zero_stage(zero_stage: Optional[int], distributed_optimizer: Optional[bool], profile,
                pp: int) -> int:
    """estimate's ZeRO stage: as given (0-3); else 0 with the distributed optimizer (its
    alternative); else the framework ``profile``'s default with ``pp`` stages
    (frameworks.rules.default_zero_stage; None: 1); UsageError for another value or a stage
    beside the distributed optimizer."""
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise UsageError(f"--zero-stage must be 0, 1, 2 or 3, got {zero_stage}")
    if distributed_optimizer and zero_stage:
        raise UsageError(f"--distributed-optimizer replaces ZeRO, so it needs --zero-stage 0 "
                         f"(got {zero_stage}): drop --zero-stage, or drop "
                         f"--distributed-optimizer to keep ZeRO-{zero_stage}")
    if zero_stage is not None:
        return zero_stage
    if distributed_optimizer:
        return 0
    if profile is None:
        return 1
    from ..search.framework_rules import default_zero_stage
    return default_zero_stage(profile.rules, pp)
