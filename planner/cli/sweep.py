"""The flow of ``plan3d sweep``: check the inputs, sweep under a progress bar, plot, print.

The sweep itself is planner.sweep; its table and plot are planner.render.sweep / .plot.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..specs import HardwareProfile, ModelSpec, TrainingSpec


def run(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: str, json_out: bool,
        plot_path: Path | None, force: bool, headroom: str | None, batches: str | None = None,
        framework=None) -> None:
    """``plan3d sweep`` (``framework``: the profile whose rules apply, FrameworkProfile or None):
    UsageError on bad input (GPU counts, batches, an existing --plot file
    without --force, no matplotlib), NoFitError when no count has a fitting layout."""
    from ..objective import check_headroom
    from ..render import console
    from ..render.search import header
    from ..render.sweep import progress, sweep_table
    from ..search import SearchOptions
    from ..sweep import parse_batch_sizes, parse_gpu_counts, sweep_batches
    counts = parse_gpu_counts(gpus, hw)
    sizes = [b or training.global_batch_size for b in parse_batch_sizes(batches)]
    if plot_path is not None:
        _check_plot(plot_path, force)
    headroom_bytes, headroom_fraction = check_headroom(
        headroom, float(hw.gpu.hbm_capacity),
        float(training.reserve_runtime) + float(hw.framework_overhead or 0.0), hw.gpu.name)
    opts = SearchOptions(headroom_bytes=headroom_bytes, headroom_fraction=headroom_fraction,
                         framework=framework)
    with progress() as bar:
        task = bar.add_task("Sweeping GPU counts", total=len(counts) * len(sizes))
        rows = sweep_batches(model, hw, training, counts, sizes, opts,
                             on_step=lambda n: bar.advance(task))
    if plot_path is not None:
        from ..render.plot import save_scaling_plot
        batch = ", ".join(str(b) for b in sizes)
        save_scaling_plot(rows, plot_path, f"{model.name} on {hw.name}, batch {batch} x "
                                           f"{training.seq_length}")
    if json_out:
        console.print_json(rows)
        return
    span = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}..{counts[-1]}"
    header(model, hw, training, span, batch=",".join(str(b) for b in sizes))
    sweep_table(rows)
    if plot_path is not None:
        console.out.print(f"Wrote the plot to {plot_path}", markup=False)


def _check_plot(path: Path, force: bool) -> None:
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'plan3d[plot]'")
