"""The estimate command: the memory and step-time breakdown of one layout, from flags or a plan."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from ..inputs import check_integers
from ..layout.axes import AXES
from ..layout.degrees import SPLIT_DEGREES
from ..render import console
from ..search.check import check_layout
from ..search.framework_rules import profile_for
from ..search.rules import moe_needs_sp
from ..cost.comm import a2a_overlap_note
from ..explain import estimate_report
from ..outputs import estimate_json
from ..render.breakdown import estimate_report as render_estimate
from ..render.breakdown import host_offload_line, plan_drift
from ..render.checkpoint import checkpoint_report
from ..render.search import header
from ..search.run import to_fit
from .app import GBS, GPUS, JSON, MODEL, SEQ, _require, app, handle_errors
from .options import JOB, stated_default, with_options
from .plan import TIMELINE, _inputs
from .timeline import check_timeline, default_png, png_beside, write_timeline


@app.command(short_help="Memory and step time of one layout.")
@handle_errors
@with_options(axes="estimate")
def estimate(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS,
    hardware: Optional[str] = typer.Option(None, "--hardware",
                                           help="Hardware profile name or YAML file [default: dgx-h100]."),
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    plan: Optional[Path] = typer.Option(None, "--plan", help="Evaluate a plan YAML written by --export "
                                        "(alone: it cannot be combined with the other flags)."),
    allow_cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp",
                                             help="Let tp exceed one node's GPUs (a --plan may always)."),
    json_out: bool = JSON, timeline: Optional[Path] = TIMELINE,
    force: bool = typer.Option(False, "--force", help="Overwrite existing --timeline files."),
    axes: dict | None = None, job: dict | None = None,
) -> None:
    """Memory and step-time breakdown of one layout (from flags or --plan). Exits 1 if it does not fit."""
    if timeline is not None:
        check_timeline(timeline, default_png(png_beside(timeline)), force, inputs=[plan] if plan else [])
    elif force:
        raise UsageError("--force lets --timeline overwrite its files; without it it does nothing")
    given = {"--model": model, "--gpus": gpus, "--hardware": hardware,
             "--global-batch-size": global_batch_size, "--seq-length": seq_length,
             "--allow-cross-node-tp": allow_cross_node_tp or None,
             **{a.flag: axes[a.name] for a in AXES if a.flag},
             **{o.flag: job[o.name] for o in JOB}}
    p = _plan_alone(plan, given) if plan is not None else None
    if p is not None:
        m, hw, training, layout, n, profile = p.model, p.hardware, p.training, p.layout, p.gpus, p.framework
    else:
        inputs = dict(model=model, gpus=gpus, hardware=hardware, global_batch_size=global_batch_size,
                      seq_length=seq_length)
        m, hw, profile, training, n, layout = _from_flags(inputs, axes, job, allow_cross_node_tp)
    try:
        _estimate_output(m, hw, training, n, layout, json_out, p, profile)
    finally:  # drawn whether it fits or not
        if timeline is not None:
            write_timeline(m, hw, training, layout, timeline, default_png(png_beside(timeline)), force,
                           strip=not json_out)


def _from_flags(inputs: dict, axes: dict, job: dict, allow_cross_node_tp: bool):
    """(model, hardware, profile, training, gpus, layout) of ``estimate`` from its flags: the
    model and GPUs (``inputs``), the layout axes (``axes``) and the job (``job``), each checked
    as given before the defaults: `--tp 0` is an error, not tp=1; an axis not given takes what
    a layout given by hand takes (tp, cp, pp 1, dp what they leave: search.check.check_layout;
    the framework's ZeRO stage; SP where an MoE model needs it). UsageError."""
    check_integers({a.name: axes[a.name] for a in AXES if a.kind is int and a.minimum > 0})
    check_integers({a.name: axes[a.name] for a in AXES if a.kind is int and a.minimum == 0
                    and a.maximum is None}, allow_zero=True)
    _zero_stage(axes["zero_stage"], axes["distributed_optimizer"], None, 1)  # the flags' own errors first
    m, hw, profile, training = _inputs(inputs["model"], inputs["hardware"] or "dgx-h100",
                                       inputs["global_batch_size"], inputs["seq_length"], job)
    fields = {a.name: axes[a.name] if axes[a.name] is not None or a.name in SPLIT_DEGREES
              else stated_default(a) for a in AXES}  # tp, cp, pp, dp: check_layout's
    fields["zero_stage"] = _zero_stage(axes["zero_stage"], axes["distributed_optimizer"], profile,
                                       axes["pp"] or 1)
    if axes["sequence_parallel"] is None:  # on where the expert rule needs it and the framework has it
        fields["sequence_parallel"] = moe_needs_sp(m, axes["tp"] or 1) and \
            profile_for(training, profile).rules.sequence_parallel
        if fields["sequence_parallel"]:
            console.note("note: sequence parallelism on: an MoE model with tp > 1 needs it "
                         "(--no-sequence-parallel is refused for the same reason)")
    n = _require(inputs["gpus"], "--gpus")
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
    """estimate's JSON (outputs.estimate_json) or tables and checkpoint section; a layout that
    does not fit gets no step time, throughput or checkpoint, its shortfall per GPU and what
    would fit (search.run.to_fit). Exit 1 then."""
    report = estimate_report(m, hw, training, layout, lambda: to_fit(m, hw, training, n, profile))
    est = report.estimate
    if json_out:
        console.print_json(estimate_json(report))
    else:
        header(m, hw, training, n)
        render_estimate(est, report.stages, report.to_fit, report.recompute, report.band)
        host_offload_line(m, hw, training, est)
        overlap = a2a_overlap_note(training, est.candidates)
        if overlap:
            console.note(f"note: {overlap}")
        if report.fits:
            checkpoint_report(report.checkpoint, 0, hw, est.candidates.layout(0), "Checkpoint")
    if plan is not None:
        plan_drift(plan, est.to_dict(0, raw=True))
    if not report.fits:
        raise typer.Exit(1)


def _zero_stage(zero_stage: Optional[int], distributed_optimizer: Optional[bool], profile,
                pp: int) -> int:
    """estimate's ZeRO stage: as given (0-3); else 0 with the distributed optimizer (its
    alternative); else the framework ``profile``'s default with ``pp`` stages
    (search.framework_rules.default_zero_stage; None: 1); UsageError for another value or a stage
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
