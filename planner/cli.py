"""The `plan3d` command line (typer). Thin: parse, call the planner, hand results to report."""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

if not sys.stdout.isatty():  # help and tables piped or captured: don't cut option names at 80
    os.environ.setdefault("TERMINAL_WIDTH", "160")

import typer  # noqa: E402

from . import __version__, catalog, report  # noqa: E402
from .errors import PlannerError, UsageError  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan 3D-parallel (TP/PP/DP/ZeRO) training of large transformers.")


def _version(value: bool) -> None:
    if value:
        report.out.print(f"plan3d {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Plan 3D-parallel (TP/PP/DP/ZeRO) training of large transformers."""


class RecomputeChoice(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


def handle_errors(func):
    """Turn planner errors into one line on stderr and their exit code; never a traceback."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except PlannerError as exc:
            report.error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:  # `plan3d ... | head`: the reader left, nothing to report
            sys.stderr.close()
            raise typer.Exit(0) from None
        except OSError as exc:
            report.error(f"cannot write the output: {exc.strerror or exc}")
            raise typer.Exit(74) from None  # EX_IOERR
        except KeyboardInterrupt:
            report.error("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # a bug: still one line, the traceback on request
            if os.environ.get("PLAN3D_DEBUG"):
                raise
            report.error(f"internal error: {type(exc).__name__}: {exc} "
                         "(set PLAN3D_DEBUG=1 for the traceback and please report it)")
            raise typer.Exit(3) from None
    return wrapper


# Shared options --------------------------------------------------------------------------------
MODEL = typer.Option(None, "--model", "-m", help="Catalog model name or alias (e.g. 175b), or a YAML file.")
GPUS = typer.Option(None, "--gpus", "-g", help="Number of GPUs (whole nodes beyond one node).")
HARDWARE = typer.Option("dgx-h100", "--hardware", help="Hardware profile name or YAML file.")
GBS = typer.Option(None, "--global-batch-size", help="Sequences per optimizer step (default: the model's).")
SEQ = typer.Option(None, "--seq-length", help="Tokens per sequence (default: the model's).")
JSON = typer.Option(False, "--json", help="Print JSON (SI units: bytes, seconds) instead of tables.")
MAX_SEQ_LENGTH = 10_000_000
MAX_BATCH = 100_000_000


def _training(model, global_batch_size, seq_length):
    from .catalog import validate
    from .specs import TrainingSpec
    for name, value, top in (("--global-batch-size", global_batch_size, MAX_BATCH),
                             ("--seq-length", seq_length, MAX_SEQ_LENGTH)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be positive, got {value}")
        if value is not None and value > top:
            raise UsageError(f"{name} {value:,} is beyond what plan3d models (at most {top:,})")
    limit = model.max_position_embeddings
    if seq_length and model.position_embedding == "learned" and limit and seq_length > limit:
        raise UsageError(f"--seq-length {seq_length} exceeds the {limit} learned position "
                         f"embeddings of {model.name}")
    data = {"seq_length": seq_length or model.training.seq_length,
            "global_batch_size": global_batch_size or model.training.global_batch_size,
            "tokens": model.training.tokens}
    return validate(TrainingSpec, data, "training")


def _require(value, flag: str):
    if value is None:
        raise UsageError(f"missing option {flag}")
    return value


@app.command()
@handle_errors
def search(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS, hardware: str = HARDWARE,
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    top: int = typer.Option(10, "--top", help="How many layouts to show."),
    json_out: bool = JSON,
    export: Optional[Path] = typer.Option(None, "--export", help="Write the best layout as a plan YAML."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --export file."),
    tp: Optional[int] = typer.Option(None, "--tp", help="Pin tensor-parallel size."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pin pipeline-parallel size."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Pin data-parallel size."),
    zero_stage: Optional[int] = typer.Option(None, "--zero-stage", help="Pin ZeRO stage (0-3)."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size", help="Pin micro-batch size."),
    recompute: Optional[RecomputeChoice] = typer.Option(None, "--recompute", help="Pin recomputation."),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                                     help="Pin sequence parallelism."),
    vpp: Optional[int] = typer.Option(None, "--vpp", help="Pin virtual pipeline stages per rank."),
    cp: Optional[int] = typer.Option(None, "--cp", help="Pin context-parallel size."),
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
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus",
                                           help="Use at most N GPUs in whole nodes; the search picks the count."),
    min_memory_headroom: Optional[str] = typer.Option(None, "--min-memory-headroom",
                                                      help="Memory to leave free per GPU: '4GiB' or '10%'."),
    allow_cross_node_tp: bool = typer.Option(False, "--allow-cross-node-tp",
                                             help="Let tp exceed one node's GPUs."),
    why_not: Optional[str] = typer.Option(None, "--why-not",
                                          help="Explain a (partial) layout, e.g. 'tp=4,pp=16', against the winner."),
) -> None:
    """Rank the TP/PP/DP/ZeRO layouts that fit, by predicted throughput (or --objective)."""
    from .export import check_destination, make_plan, write_plan
    from .search import SearchOptions
    from .search import search as run_search
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    training = _training(m, global_batch_size, seq_length)
    _check_positive(top=top, tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size, vpp=vpp,
                    max_tp=max_tp, max_pp=max_pp, max_micro_batch_size=max_micro_batch_size,
                    max_vpp=max_vpp, cp=cp, max_cp=max_cp, max_gpus=max_gpus,
                    price_per_gpu_hour=price_per_gpu_hour, tokens=tokens)
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise UsageError(f"--zero-stage must be 0, 1, 2 or 3, got {zero_stage}")
    if export is not None:
        check_destination(export, force)
    from .objective import parse_headroom
    if gpus is not None and max_gpus is not None:
        raise UsageError("give --gpus (a fixed count) or --max-gpus (a budget), not both")
    if max_gpus is None:
        _require(gpus, "--gpus")
    headroom_bytes, headroom_fraction = parse_headroom(min_memory_headroom)
    opts = SearchOptions(tp=tp, pp=pp, dp=dp, zero_stage=zero_stage, micro_batch_size=micro_batch_size,
                         recompute=recompute.value if recompute else None,
                         sequence_parallel=sequence_parallel, vpp=vpp, max_tp=max_tp, max_pp=max_pp,
                         max_micro_batch_size=max_micro_batch_size, max_vpp=max_vpp,
                         cp=cp, distributed_optimizer=distributed_optimizer, max_cp=max_cp,
                         allow_cross_node_tp=allow_cross_node_tp, objective=objective, tokens=tokens,
                         price_per_gpu_hour=price_per_gpu_hour, max_gpus=max_gpus,
                         headroom_bytes=headroom_bytes, headroom_fraction=headroom_fraction)
    n = gpus if gpus is not None else f"at most {max_gpus}"
    if why_not is not None:
        from .whynot import why_not as explain_why_not
        verdict = explain_why_not(m, hw, training, gpus, opts, why_not)
        if json_out:
            report.print_json(verdict.to_dict())
        else:
            report.header(m, hw, training, n)
            from .report_scale import why_not_report
            why_not_report(verdict)
        return
    with report.err.status("Searching layouts...", spinner="dots"):
        result = run_search(m, hw, training, gpus, opts)
    best = result.ranked
    if export is not None:
        write_plan(make_plan(m, hw, training, best.candidates.layout(0), best.to_dict(0)), export, force)
    if json_out:
        report.print_json([best.to_dict(i) for i in range(min(top, len(best)))])
    else:
        report.header(m, hw, training, n)
        report.search_table(result, top)
        from .report_scale import breakdown_report
        breakdown_report(result)
        if export is not None:
            report.out.print(f"Wrote the best plan to {export}")


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
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw tokens/s and MFU vs GPUs to a PNG."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --plot file."),
    min_memory_headroom: Optional[str] = typer.Option(None, "--min-memory-headroom",
                                                      help="Memory to leave free per GPU: '4GiB' or '10%'."),
) -> None:
    """Best layout, tokens/s, MFU and scaling efficiency at each GPU count."""
    from .sweep import run_command
    m = catalog.resolve_model(_require(model, "--model"))
    hw = catalog.resolve_hardware(hardware)
    training = _training(m, None, seq_length)
    run_command(m, hw, training, _require(gpus, "--gpus"), json_out, plot, force, min_memory_headroom,
                global_batch_size)


@app.command()
@handle_errors
def estimate(
    model: Optional[str] = MODEL, gpus: Optional[int] = GPUS,
    hardware: Optional[str] = typer.Option(None, "--hardware",
                                           help="Hardware profile name or YAML file [default: dgx-h100]."),
    global_batch_size: Optional[int] = GBS, seq_length: Optional[int] = SEQ,
    tp: Optional[int] = typer.Option(None, "--tp", help="Tensor-parallel size [default: 1]."),
    pp: Optional[int] = typer.Option(None, "--pp", help="Pipeline-parallel size [default: 1]."),
    dp: Optional[int] = typer.Option(None, "--dp", help="Data-parallel size [default: gpus/(tp*pp)]."),
    zero_stage: Optional[int] = typer.Option(None, "--zero-stage", help="ZeRO stage 0-3 [default: 1]."),
    micro_batch_size: Optional[int] = typer.Option(None, "--micro-batch-size",
                                                   help="Micro-batch size [default: 1]."),
    recompute: Optional[RecomputeChoice] = typer.Option(None, "--recompute",
                                                        help="Recomputation [default: none]."),
    sequence_parallel: Optional[bool] = typer.Option(None, "--sequence-parallel/--no-sequence-parallel",
                                                     help="Sequence parallelism [default: off]."),
    vpp: Optional[int] = typer.Option(None, "--vpp", help="Virtual pipeline stages per rank [default: 1]."),
    cp: Optional[int] = typer.Option(None, "--cp", help="Context-parallel size [default: 1]."),
    distributed_optimizer: Optional[bool] = typer.Option(
        None, "--distributed-optimizer/--no-distributed-optimizer",
        help="Megatron's distributed optimizer, with --zero-stage 0 [default: off]."),
    first_stage_layers: Optional[int] = typer.Option(
        None, "--first-stage-layers", help="Uneven pipeline split: layers on the first stage [default: even]."),
    last_stage_layers: Optional[int] = typer.Option(
        None, "--last-stage-layers", help="Uneven pipeline split: layers on the last stage [default: even]."),
    plan: Optional[Path] = typer.Option(None, "--plan", help="Evaluate a plan YAML written by --export "
                                        "(alone: it cannot be combined with the other flags)."),
    json_out: bool = JSON,
) -> None:
    """Memory and step-time breakdown of one layout (from flags or --plan). Exits 1 if it does not fit."""
    from .cost.step import estimate_layout
    from .search import check_layout
    flags = {"--model": model, "--gpus": gpus, "--hardware": hardware,
             "--global-batch-size": global_batch_size, "--seq-length": seq_length, "--tp": tp,
             "--pp": pp, "--dp": dp, "--zero-stage": zero_stage, "--micro-batch-size": micro_batch_size,
             "--recompute": recompute, "--sequence-parallel": sequence_parallel, "--vpp": vpp,
             "--cp": cp, "--distributed-optimizer": distributed_optimizer,
             "--first-stage-layers": first_stage_layers, "--last-stage-layers": last_stage_layers}
    if plan is not None:
        from .export import read_plan
        given = [flag for flag, value in flags.items() if value is not None]
        if given:
            raise UsageError(f"--plan cannot be combined with {', '.join(given)}: the plan fixes "
                             "them (edit the plan, or estimate from flags without --plan)")
        p = read_plan(plan)
        m, hw, training, layout, n = p.model, p.hardware, p.training, p.layout, p.gpus
        check_layout(m, hw, training, n, layout.model_dump())
    else:
        m = catalog.resolve_model(_require(model, "--model"))
        hw = catalog.resolve_hardware(hardware or "dgx-h100")
        training = _training(m, global_batch_size, seq_length)
        n = _require(gpus, "--gpus")
        layout = _layout(m, hw, training, n, tp or 1, pp or 1, dp,
                         1 if zero_stage is None else zero_stage, micro_batch_size or 1,
                         (recompute or RecomputeChoice.none).value, bool(sequence_parallel), vpp or 1,
                         cp=cp or 1, distributed_optimizer=bool(distributed_optimizer),
                         first_stage_layers=first_stage_layers or 0,
                         last_stage_layers=last_stage_layers or 0)
    est = estimate_layout(m, hw, training, layout)
    result = est.to_dict(0)
    if json_out:
        report.print_json(result)
    else:
        report.header(m, hw, training, n)
        report.estimate_report(est)
    if plan is not None:
        report.plan_drift(p, result)
    if not result["memory"]["fits"]:
        raise typer.Exit(1)


def _layout(m, hw, training, gpus, tp, pp, dp, zero_stage, micro_batch_size, recompute, sp, vpp,
            cp=1, distributed_optimizer=False, first_stage_layers=0, last_stage_layers=0):
    """Validate one user layout against the same rules the search applies (UsageError)."""
    from .search import check_layout
    _check_positive(tp=tp, pp=pp, dp=dp, micro_batch_size=micro_batch_size, vpp=vpp, cp=cp)
    fields = dict(tp=tp, pp=pp, zero_stage=zero_stage, micro_batch_size=micro_batch_size,
                  recompute=recompute, sequence_parallel=sp, vpp=vpp, cp=cp,
                  distributed_optimizer=distributed_optimizer,
                  first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers)
    if dp is not None:
        fields["dp"] = dp
    return check_layout(m, hw, training, gpus, fields)


def _check_positive(**values) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive, got {value}")


@app.command()
@handle_errors
def models(json_out: bool = JSON,
           show: Optional[str] = typer.Option(None, "--show", help="Print one model (catalog name, "
                                              "YAML or HF config.json) as YAML, valid for --model.")) -> None:
    """List the model catalog."""
    from .cost.flops import total_params
    if show is not None:
        import sys
        import yaml
        data = catalog.resolve_model(show).model_dump(mode="json", exclude_none=True)
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True))
        return
    entries = catalog.models().values()
    if json_out:
        report.print_json([m.model_dump(mode="json", exclude_none=True) for m in entries])
        return
    rows = [(m.name, f"{total_params(m) / 1e9:.1f}B", str(m.num_layers), str(m.hidden_size),
             f"{m.num_attention_heads}/{m.kv_heads}", m.activation, ", ".join(m.aliases))
            for m in sorted(entries, key=total_params)]
    report.catalog_table("Models", rows, ("name", "params", "layers", "hidden", "heads/kv", "mlp", "aliases"))


@app.command()
@handle_errors
def hardware(json_out: bool = JSON) -> None:
    """List the hardware profiles."""
    entries = catalog.hardware_profiles().values()
    if json_out:
        report.print_json([h.model_dump(mode="python") for h in entries])  # SI numbers
        return
    rows = []
    for h in entries:
        d = h.model_dump(mode="json")
        rows.append((h.name, h.gpu.name, d["gpu"]["hbm_capacity"], f"{h.gpu.peak_tflops['bf16']:g}",
                     str(h.gpus_per_node), d["intra_node"]["bandwidth_per_gpu"],
                     f"{h.inter_node.nics_per_node} x {h.inter_node.bandwidth_per_nic * 8 / 1e9:g} Gb/s"))
    report.catalog_table("Hardware profiles", rows, ("name", "GPU", "HBM", "bf16 TFLOP/s",
                                                     "GPUs/node", "NVLink/GPU (one way)", "NICs/node"))


@app.command()
@handle_errors
def regress(
    cases: Path = typer.Argument(..., metavar="CASES.yaml",
                                 help="Case file: a YAML list of cases (layouts or searches)."),
    baseline: Path = typer.Option(..., "--baseline", help="Baseline YAML of the expected predictions."),
    rtol: float = typer.Option(1e-6, "--rtol", help="Relative change above which a number has drifted."),
    update: bool = typer.Option(False, "--update", help="Rewrite the baseline with the current predictions."),
    max_rows: int = typer.Option(100, "--max-rows", help="Rows of the drift table to print (0 = all)."),
    json_out: bool = JSON,
) -> None:
    """Compare the cost model's predictions on a case file with a baseline (exit 1 on drift)."""
    from .regress_report import run
    code = run(cases, baseline, rtol, update, json_out, max_rows)
    if code:
        raise typer.Exit(code)


@app.command("export")
@handle_errors
def export_cmd(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    to: str = typer.Option(..., "--to", help="Target: megatron, nemo, deepspeed or torchtitan."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write to FILE instead of stdout."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --output file."),
    torchtitan_format: str = typer.Option("overrides", "--torchtitan-format",
                                          help="overrides (torchtitan 0.3) or toml (0.2.x)."),
) -> None:
    """Write a plan as a training framework's arguments or config."""
    from .export import read_plan
    from .frameworks import export_plan
    if output is not None and output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    if output is not None and output.is_dir():
        raise UsageError(f"{output} is a directory")
    result = export_plan(read_plan(plan), to.strip().lower(), torchtitan_format.strip().lower())
    for note in result.notes:
        report.err.print(f"note: {note}", markup=False, soft_wrap=True)
    if output is None:
        import sys
        sys.stdout.write(result.text)
        return
    try:
        output.write_text(result.text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
    report.err.print(f"Wrote {to} configuration to {output}", markup=False)


@app.command()
@handle_errors
def accuracy(
    runs: Optional[Path] = typer.Argument(None, help="Runs YAML (published_runs.yaml schema); default: the shipped dataset."),
    json_out: bool = JSON,
) -> None:
    """Measured vs predicted for published (or your own) training runs, with errors per source."""
    from .fidelity.compare import compare_all, summarize
    from .fidelity.render import accuracy_json, accuracy_tables
    from .fidelity.runs import load_runs
    cases = load_runs(runs)
    comparisons = compare_all(cases)
    skipped = [c for c in cases if c.skipped is not None]
    summary = summarize(comparisons)
    if json_out:
        report.print_json(accuracy_json(comparisons, skipped, summary))
    else:
        accuracy_tables(comparisons, skipped, summary)


@app.command()
@handle_errors
def placement(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    order: str = typer.Option("megatron", "--order",
                              help="Rank order: megatron (default), torchtitan or megatron-tp-pp-dp."),
    json_out: bool = typer.Option(False, "--json", help="Print every group and the node of every rank."),
) -> None:
    """Which ranks form each TP/DP/PP group, which node each is on, and whether TP crosses a node."""
    from .export import read_plan
    from .placement import full, render, summary
    p = read_plan(plan)
    key = order.strip().lower()
    if json_out:
        report.print_json(full(p, key))
    else:
        report.out.print(render(summary(p, key)), markup=False, soft_wrap=True)


@app.command()
@handle_errors
def validate(
    plan: Path = typer.Argument(..., help="Plan YAML written by `plan3d search --export`."),
    local: bool = typer.Option(False, "--local", help="Run a miniature of the plan on this machine (gloo)."),
    world: int = typer.Option(8, "--world", help="Ranks to fork with --local (the miniature needs <= 8)."),
    device: str = typer.Option("cpu", "--device", help="Device of the --local run (cpu only)."),
    steps: int = typer.Option(3, "--steps", help="Training steps (step 0 is warm-up)."),
    dtype: str = typer.Option("float64", "--dtype", help="float64 (exact checks) or float32."),
    layers_per_stage: int = typer.Option(1, "--layers-per-stage", help="Layers per pipeline chunk."),
    out: Path = typer.Option(Path("measured.json"), "--out", help="Where to write the measurements."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --out file."),
    timeout: float = typer.Option(600.0, "--timeout", help="Wall-clock limit of the run, seconds."),
    json_out: bool = JSON,
) -> None:
    """Run a plan with real PyTorch parallelism and check measured against predicted."""
    from .validate import require_torch
    require_torch()
    if not local:
        raise UsageError("on a cluster run `torchrun --nproc-per-node N ... -m planner.validate PLAN` "
                         "(see README); on this machine pass --local")
    if device != "cpu":
        raise UsageError(f"--local runs on cpu (forked gloo ranks), got --device {device}; "
                         "use torchrun for GPUs")
    from .export import read_plan
    from .validate import run_local, write_measured
    from .validate.compare import render
    p = read_plan(plan)
    if out.exists() and not force:
        raise UsageError(f"{out} exists; pass --force to overwrite it")
    with report.err.status("Running the miniature on forked ranks...", spinner="dots"):
        result, records = run_local(p, world=world, dtype=dtype, steps=steps,
                                    layers_per_stage=layers_per_stage, timeout_s=timeout)
    write_measured(out, result, records, force=True)
    if json_out:
        report.print_json(result)
    else:
        render(result, str(out))
    if not result["passed"]:
        raise typer.Exit(1)


@app.command()
@handle_errors
def calibrate(
    runs: Path = typer.Argument(..., help="Measured runs YAML (published_runs.yaml schema)."),
    hardware: str = typer.Option(..., "--hardware", help="Hardware profile to calibrate (name or YAML)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the calibrated profile YAML."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    loo: bool = typer.Option(True, "--loo/--no-loo", help="Also report the leave-one-out error."),
    exclude: list[str] = typer.Option([], "--exclude", help="Leave out runs whose id matches this glob (repeatable)."),
    min_trust: Optional[str] = typer.Option(None, "--min-trust", help="Fit only on runs whose notes tag trust as at least this: high, medium or low."),
) -> None:
    """Fit a hardware profile's efficiency factors to measured runs; write a new profile."""
    from .fidelity.calibrate import fit, source_text, with_factors
    from .fidelity.profile_io import write_profile
    from .fidelity.render import calibration_report
    from .fidelity.runs import load_runs, select_runs
    if output.exists() and not force:
        raise UsageError(f"{output} exists; pass --force to overwrite it")
    hw = catalog.resolve_hardware(hardware)
    cases = select_runs(load_runs(runs), exclude, min_trust)
    for c in cases:  # runs on the profile's GPU are predicted with the profile being fitted
        if c.skipped is None and c.hardware is not None and c.hardware.gpu.name == hw.gpu.name:
            c.hardware = hw
    with report.err.status("Fitting efficiency factors...", spinner="dots"):
        result = fit(cases, hw, leave_one_out=loo)
    fitted = with_factors(hw, result.factors, source_text(result, runs.name))
    write_profile(fitted, output, force)
    calibration_report(result, hw.name, str(output))


def main() -> None:
    """Console entry point: usage errors (bad flag, bad value) become one line on stderr, exit 2.

    Typer parses with (its vendored copy of) click in non-standalone mode so that its errors
    reach us; they carry ``format_message()`` and ``exit_code`` in every typer/click version.
    """
    import sys
    try:
        code = app(standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        report.error("aborted")
        sys.exit(130)
    except Exception as exc:
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        ctx = getattr(exc, "ctx", None)
        if ctx is not None and not exc.format_message().strip():  # bare `plan3d`: show help
            report.out.print(ctx.get_help())
            sys.exit(0)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        report.error(f"{exc.format_message()}{hint}")
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
