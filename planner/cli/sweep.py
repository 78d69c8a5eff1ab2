"""The flow of ``plan3d sweep``: check the inputs, sweep under a progress bar, plot, print.

The sweep itself is planner.sweep; its table and plot are planner.render.sweep / .plot.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PLOT_EXTRA, UsageError
from ..specs import HardwareProfile, ModelSpec, TrainingSpec


def run(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: str, json_out: bool,
        plot_path: Path | None, force: bool, headroom: str | None, batches: str | None = None,
        tokens: float | None = None, deadline: str | None = None, framework=None) -> None:
    """``plan3d sweep`` (``framework``: the profile whose rules apply, FrameworkProfile or None):
    UsageError on bad input (GPU counts, batches, an existing --plot file without --force, no
    matplotlib, a deadline without a token budget), NoFitError when no count has a fitting
    layout, DeadlineError when none meets the deadline. With a token budget (``tokens`` or the
    model's) each count's layout is the one with the shortest expected time to train (failures
    and checkpoints counted), else the one with the most tokens/s."""
    from ..search.options import search_options
    from ..errors import DeadlineError
    from ..search.objective import check_budget, parse_deadline, reports_training, step_tokens
    from ..outputs import is_stdout, report_to_stderr, shown
    from ..render import console
    from ..render.search import header
    from ..render.sweep import progress, sweep_table
    from ..search.sweep import parse_batch_sizes, parse_gpu_counts, sweep_batches
    counts = parse_gpu_counts(gpus, hw)
    sizes = [b or training.global_batch_size for b in parse_batch_sizes(batches)]
    if plot_path is not None:
        _check_plot(plot_path, force, json_out)
    elif force:
        raise UsageError("--force lets --plot overwrite a file; without --plot it does nothing")
    deadline_s = parse_deadline(deadline)
    budget = tokens if tokens is not None else training.tokens
    opts = search_options(hw, training, {
        "tokens": tokens, "deadline_s": deadline_s, "framework": framework,
        "objective": "throughput" if budget is None else "time-to-train"}, headroom)
    # the inputs' own errors once, not as every count's "no layout"
    check_budget(opts.objective, budget, None, deadline_s,
                 step_tokens(training.model_copy(update={"global_batch_size": max(sizes)}))
                 if reports_training(opts) else None)
    span = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}..{counts[-1]}"
    try:
        with progress() as bar:
            task = bar.add_task("Sweeping GPU counts", total=len(counts) * len(sizes))
            rows = sweep_batches(model, hw, training, counts, sizes, opts,
                                 on_step=lambda n: bar.advance(task))
    except DeadlineError as exc:  # the table (or the rows) still says how far each count misses
        if exc.rows and json_out:
            console.print_json(exc.rows)
        elif exc.rows:
            with report_to_stderr(is_stdout(plot_path)):
                header(model, hw, training, span, batch=",".join(str(b) for b in sizes))
                sweep_table(exc.rows, deadline_s)
        raise
    if plot_path is not None:
        from ..render.plot import save_scaling_plot
        batch = ", ".join(str(b) for b in sizes)
        save_scaling_plot(rows, plot_path, f"{model.name} on {hw.name}, batch {batch} x "
                                           f"{training.seq_length}")
    if json_out:
        console.print_json(rows)
        return
    with report_to_stderr(is_stdout(plot_path)):  # --plot -: stdout holds the PNG alone
        header(model, hw, training, span, batch=",".join(str(b) for b in sizes))
        sweep_table(rows, deadline_s)
        if plot_path is not None:
            console.out.print(f"Wrote the plot to {shown(plot_path)}", markup=False)


def _check_plot(path: Path, force: bool, json_out: bool) -> None:
    """UsageError for a --plot destination that cannot be written (planner.outputs), --plot -
    with --json, or no matplotlib."""
    from ..outputs import check_destination, refuse_json_too
    check_destination(path, force, "--plot", "scaling.png")
    refuse_json_too(path, "--plot", json_out)
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(PLOT_EXTRA)
