"""Commands that check predictions: regress, accuracy, calibrate."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path
from typing import Optional

import typer

from .. import catalog
from ..render import console
from ..errors import UsageError
from .app import JSON, app, handle_errors


@app.command(short_help="Compare predictions with a golden baseline.")
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
    from .regress import run
    code = run(cases, baseline, rtol, update, json_out, max_rows)
    if code:
        raise typer.Exit(code)



@app.command(short_help="Predicted vs measured on published runs.")
@handle_errors
def accuracy(
    runs: Optional[Path] = typer.Argument(None, help="Runs YAML (published_runs.yaml schema); default: the shipped datasets."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="Without RUNS: the shipped dataset to check, published "
                                          "(dense, A100/H100, 2020-24), modern (MoE, FP8/MXFP8, H100/B200/GB200) or all [default: all]."),
    resolve: str = typer.Option("default", "--resolve", help="What a run leaves unknown becomes: default (one "
                                "stated default each) or search (the planner's best layout consistent with the run)."),
    loso: bool = typer.Option(True, "--loso/--no-loso", help="Also predict each source with factors fitted "
                              "without it (leave-one-source-out)."),
    json_out: bool = JSON,
) -> None:
    """Measured vs predicted for published (or your own) training runs, with errors per source."""
    from ..fidelity.compare import compare_all, summarize
    from ..render.fidelity import accuracy_json, accuracy_tables
    cases = _accuracy_cases(runs, dataset, resolve)
    comparisons = compare_all(cases)
    skipped = [c for c in cases if c.skipped is not None]
    if not comparisons:
        first = skipped[0]
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise UsageError(f"{runs}: no run can be compared; run {first.id}: {first.skipped}{more}")
    held = None
    if loso:
        from ..fidelity.loso import loso_errors
        with console.err.status("Refitting without each source (leave-one-source-out)...", spinner="dots"):
            held = loso_errors(cases)
    summary = summarize(comparisons, held)
    if json_out:
        console.print_json(accuracy_json(comparisons, skipped, summary, held))
    else:
        accuracy_tables(comparisons, skipped, summary, held)


def _accuracy_cases(runs: Optional[Path], dataset: str, resolve: str) -> list:
    """The runs to check: the RUNS file, or the shipped ``dataset`` (published, modern, all);
    with ``resolve`` search, each run's unknown settings resolved (planner.fidelity.resolve)."""
    from ..fidelity.runs import DATASETS, load_datasets, load_runs
    if resolve not in ("default", "search"):
        raise UsageError(f"--resolve must be default or search, got {resolve!r}")
    if runs is not None and dataset is not None:
        raise UsageError(f"--dataset chooses a shipped dataset; with a runs file ({runs}) give "
                         "one or the other")
    dataset = dataset or "all"
    if runs is not None:
        cases = load_runs(runs)
    elif dataset == "all":
        cases = load_datasets(list(DATASETS))
    else:
        cases = load_datasets([dataset])
    if resolve == "search":
        from ..fidelity.resolve import resolve as resolve_case
        with console.err.status("Resolving unknown settings by search...", spinner="dots"):
            for case in cases:
                resolve_case(case)
    return cases



@app.command(short_help="Fit a hardware profile to measured runs.")
@handle_errors
def calibrate(
    runs: Path = typer.Argument(..., help="Measured runs YAML (published_runs.yaml schema)."),
    hardware: str = typer.Option(..., "--hardware", help="Hardware profile to calibrate (name or YAML)."),
    output: Path = typer.Option(..., "--output", "-o", help="Where to write the calibrated profile "
                                "YAML (- for stdout; the report then goes to stderr)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    loo: bool = typer.Option(True, "--loo/--no-loo", help="Also report the leave-one-out error."),
    exclude: list[str] = typer.Option([], "--exclude", help="Leave out runs whose id matches this glob (repeatable)."),
    min_trust: Optional[str] = typer.Option(None, "--min-trust", help="Fit only on runs whose notes tag trust as at least this: high, medium or low."),
) -> None:
    """Fit a hardware profile's efficiency factors to measured runs; write a new profile."""
    from ..outputs import check_destination, is_stdout, report_to_stderr, shown
    from ..fidelity.calibrate import factors_of, fit, partition, source_text, with_factors
    from ..fidelity.profile_io import write_profile
    from ..render.fidelity import assumptions_text, calibration_notes, calibration_report
    from ..fidelity.runs import load_runs, select_runs
    hw_file = [] if catalog.is_bare_name(hardware) else [Path(hardware)]  # a profile file
    check_destination(output, force, "--output", "my-profile.yaml", inputs=[runs] + hw_file)
    hw = catalog.resolve_hardware(hardware)
    from ..fidelity.calibrate import fitted_runs
    if fitted_runs(hw):  # its priors are a fit already: a second fit pulls toward the same runs
        console.note(f"warning: --hardware {hardware} is itself a profile plan3d calibrate wrote; "
                     "fitting it again moves its factors further on the same evidence: start from "
                     "the shipped profile it came from")
    loaded = load_runs(runs)
    for pat in exclude:  # a mistyped glob would leave in the run it meant to leave out
        if not any(fnmatch(c.id, pat) for c in loaded):
            raise UsageError(f"--exclude {pat!r} matches no run id of {runs.name} (globs: * and ?)")
    cases = select_runs(loaded, exclude, min_trust)
    for c in cases:  # runs on the profile's GPU are predicted with the profile being fitted
        if c.skipped is None and c.hardware is not None and c.hardware.gpu.name == hw.gpu.name:
            c.hardware = hw
    used, unused = partition(cases, hw)
    kept = {c.id for c in cases}
    for c in loaded:
        if c.id not in kept:
            unused[c.id] = "excluded by --exclude" if any(fnmatch(c.id, p) for p in exclude) else \
                f"excluded by --min-trust {min_trust} (trust: {c.trust})"
    calibration_notes(unused, len(used), len(factors_of(hw)), hw.name, assumptions_text(used))
    if not used:
        why = "after --exclude/--min-trust" if len(kept) < len(loaded) else "to calibrate on"
        raise UsageError(f"no usable measured run on hardware {hw.name} {why}")
    with console.err.status("Fitting efficiency factors...", spinner="dots"):
        result = fit(cases, hw, leave_one_out=loo)
    fitted = with_factors(hw, result.factors, source_text(result, runs.name))
    # its own name, so tables and plans tell it from the shipped profile it started from
    name = hw.name if hw.name.endswith("-calibrated") else f"{hw.name}-calibrated"
    fitted = fitted.model_copy(update={"name": name, "aliases": []})
    write_profile(fitted, output, force, calibrated_from=hw.name)
    with report_to_stderr(is_stdout(output)):  # -o -: stdout holds the profile alone
        calibration_report(result, hw.name, shown(output), loo=loo)
    from ..fidelity.compare import compare
    no_fit = [c.id for c in used if not compare(c, fitted).fits]
    if no_fit:  # these ran: plan3d's memory model misses them, whatever their fitted times
        console.note(f"warning: {len(no_fit)} fitted run{'s' if len(no_fit) > 1 else ''} "
                     f"({', '.join(no_fit)}) {'are' if len(no_fit) > 1 else 'is'} predicted not "
                     "to fit in GPU memory on the fitted profile; plan3d accuracy shows the "
                     "memory terms (a measured run that does not fit is a memory-model miss)")
