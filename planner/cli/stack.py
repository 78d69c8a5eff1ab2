"""Commands that take a plan into the training stack: export, placement, validate."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import UsageError
from ..render import console
from .app import JSON, app, handle_errors


@app.command("export", short_help="Write a plan as a framework's config.")
@handle_errors
def export_cmd(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    to: Optional[str] = typer.Option(None, "--to", help="Target: megatron, nemo, deepspeed, torchtitan, "
                                     "or a framework (megatron-core, ...) [default: the plan's framework]."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to FILE instead of "
                                          "stdout (- or /dev/stdout: stdout)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --output file."),
    torchtitan_format: Optional[str] = typer.Option(
        None, "--torchtitan-format",
        help="overrides (torchtitan 0.3.0, default) or toml (torchtitan 0.2.2)."),
) -> None:
    """Write a plan as a training framework's arguments or config."""
    from ..export import read_checked_plan
    from ..frameworks import export_plan, export_target
    from ..catalog import is_bare_name
    from ..outputs import check_destination, is_stdout, write
    if output is not None:  # never over its inputs: the plan, a framework profile file
        inputs = [plan] + ([Path(to)] if to is not None and not is_bare_name(to) else [])
        check_destination(output, force, "--output", "config.txt", inputs=inputs)
    elif force:
        raise UsageError("--force lets --output overwrite a file; without --output it does nothing")
    p = read_checked_plan(plan)
    target = export_target(to, p)
    if torchtitan_format is not None and target != "torchtitan":
        raise UsageError(f"--torchtitan-format applies to --to torchtitan only, not --to {target}")
    result = export_plan(p, target, (torchtitan_format or "overrides").strip().lower())
    from ..explain import model_notes
    for note in _fit_note(p) + result.notes + model_notes(p.model):
        console.note(f"note: {note}")
    write(output or Path("-"), result.text, force, "--output", "config.txt")
    if output is not None and not is_stdout(output):
        console.note(f"Wrote {target} configuration to {output}")


def _fit_note(plan) -> list[str]:
    """[] when the plan fits its GPUs' memory, else the one note that it does not (the export
    still writes it: plan3d estimate --plan shows the terms)."""
    from ..cost.step import estimate_layout
    from ..render.breakdown import shortfall_text
    est = estimate_layout(plan.model, plan.hardware, plan.training, plan.layout)
    if bool(est.fits[0]):
        return []
    missing = shortfall_text(est.to_dict(0)["memory"])
    return [f"this plan does not fit: {missing}; `plan3d estimate --plan` shows the terms, "
            "`plan3d search` a layout that fits"]


@app.command(short_help="Which ranks form each parallel group.")
@handle_errors
def placement(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    order: Optional[str] = typer.Option(
        None, "--order", help="Rank order: megatron, torchtitan or megatron-tp-pp-dp [default: "
        "torchtitan for a plan made for torchtitan, else megatron]."),
    json_out: bool = typer.Option(False, "--json", help="Print every group, the node and the NVLink "
                                  "domain of every rank."),
) -> None:
    """Which ranks form each TP/CP/DP/PP group (EP/ETP/EDP for MoE), which node and NVLink domain
    each is on, whether TP crosses a node and EP leaves the NVLink domain."""
    from ..export import read_checked_plan
    from ..placement import full, summary
    p = read_checked_plan(plan)
    made_for = p.framework.export if p.framework is not None else None
    key = order.strip().lower() if order is not None else \
        ("torchtitan" if made_for == "torchtitan" else "megatron")
    if json_out:
        console.print_json(full(p, key))
    else:
        from ..render.placement import placement_report
        placement_report(summary(p, key))


@app.command(short_help="Run a plan with torch.distributed, compare.")
@handle_errors
def validate(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    local: bool = typer.Option(False, "--local", help="Run a miniature of the plan on this machine (gloo)."),
    world: int = typer.Option(8, "--world", help="Ranks to fork with --local (8; a cp plan needs 16 to keep dp=2)."),
    device: str = typer.Option("cpu", "--device", help="Device of the --local run (cpu only)."),
    steps: int = typer.Option(3, "--steps", help="Training steps (step 0 is warm-up)."),
    dtype: str = typer.Option("float64", "--dtype", help="float64 (exact checks) or float32."),
    layers_per_stage: int = typer.Option(1, "--layers-per-stage", help="Layers per pipeline chunk."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to write the measurements (- for "
                                       "stdout) [default: measured.json, or measured-2.json, ... "
                                       "if that exists]."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --out file."),
    timeout: float = typer.Option(600.0, "--timeout", help="Wall-clock limit of the run, seconds."),
    json_out: bool = JSON,
) -> None:
    """Run a plan with real PyTorch parallelism and check measured against predicted."""
    from ..validate import require_torch
    require_torch()
    if not local:
        raise UsageError("on a cluster run `torchrun --nproc-per-node N ... -m planner.validate PLAN` "
                         "(see docs/validate.md); on this machine pass --local")
    if device != "cpu":
        raise UsageError(f"--local runs on cpu (forked gloo ranks), got --device {device}; "
                         "use torchrun for GPUs")
    from ..export import read_checked_plan
    from ..outputs import is_stdout, report_to_stderr, shown
    from ..validate import measured_destination, run_local, write_measured
    from ..render.validate import render
    for flag, value in (("--world", world), ("--steps", steps), ("--layers-per-stage", layers_per_stage),
                        ("--timeout", timeout)):
        if value <= 0:
            raise UsageError(f"{flag} must be positive, got {value:g}")
    p = read_checked_plan(plan)
    from ..outputs import refuse_input
    if out is not None:
        refuse_input(out, [plan], "--out")  # the measurements never replace the plan
    out = measured_destination(out, force, json_out)
    with console.err.status("Running the miniature on forked ranks...", spinner="dots"):
        result, records = run_local(p, world=world, dtype=dtype, steps=steps,
                                    layers_per_stage=layers_per_stage, timeout_s=timeout)
    write_measured(out, result, records, force=True)
    if json_out:
        console.print_json(result)
        console.note(f"Wrote the measurements to {out}")
    else:
        with report_to_stderr(is_stdout(out)):  # --out -: stdout holds the measurements alone
            render(result, shown(out, 'the measurements'))
    if not result["passed"]:
        raise typer.Exit(1)
