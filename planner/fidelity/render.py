"""Tables and JSON for ``plan3d accuracy`` and ``plan3d calibrate`` (units converted here only)."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table

from ..report import err, out
from .calibrate import FitResult
from .compare import Comparison
from .runs import RunCase

LABELS = {"iteration_s": "s/iter", "flops_per_gpu": "TFLOP/s/GPU", "mfu": "MFU", "hfu": "HFU",
          "tokens_per_s": "tokens/s", "peak_memory": "peak mem"}


def _fmt(key: str, value: float) -> str:
    if key == "iteration_s":
        return f"{value:.2f} s"
    if key == "flops_per_gpu":
        return f"{value / 1e12:.1f}"
    if key in ("mfu", "hfu"):
        return f"{100 * value:.1f}%"
    if key == "peak_memory":
        return f"{value / 2**30:.1f} GiB"
    return f"{value:,.0f}"


def _pct(err: float | None) -> str:
    return "" if err is None or math.isnan(err) else f"{100 * err:+.1f}%"


def comparison_dict(c: Comparison) -> dict:
    """One run as JSON (SI units; errors are fractions)."""
    return {"id": c.case.id, "group": c.case.group, "primary": c.primary,
            "measured": c.measured, "predicted": c.predicted, "error": c.error,
            "fits": c.fits, "predicted_step_s": c.step_s, "assumptions": c.case.assumptions,
            "layout": c.case.layout.model_dump() if c.case.layout else None,
            "hardware": c.case.hardware.name if c.case.hardware else None}


def _finite(value):
    """NaN (no figure to compare) becomes null, so the output stays valid JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return None if isinstance(value, float) and math.isnan(value) else value


def accuracy_json(comparisons: list[Comparison], skipped: list[RunCase], summary: dict) -> dict:
    return {"runs": [comparison_dict(c) for c in comparisons],
            "skipped": [{"id": s.id, "reason": s.skipped} for s in skipped],
            "summary": _finite(summary)}


def accuracy_tables(comparisons: list[Comparison], skipped: list[RunCase], summary: dict) -> None:
    """Run-by-run table, the per-source summary, then the defaults assumed and the skipped runs."""
    table = Table(show_edge=False, header_style="bold", title="Measured vs predicted, run by run (* = assumes defaults)")
    for col in ("run", "layout", "figure", "measured", "predicted", "error", "MFU meas / pred",
                "peak mem meas / pred"):
        table.add_column(col, justify="left" if col in ("run", "layout", "figure") else "right", no_wrap=True)
    for c in comparisons:
        key = c.primary or ""
        lay = c.case.layout
        layout = (f"t{lay.tp} p{lay.pp} d{lay.dp} v{lay.vpp} z{lay.zero_stage} b{lay.micro_batch_size} "
                  f"{lay.recompute[:3]}{'+sp' if lay.sequence_parallel else ''}") if lay else ""
        mfu = f"{_fmt('mfu', c.measured['mfu'])} / {_fmt('mfu', c.predicted['mfu'])}" if "mfu" in c.error else ""
        mem = (f"{_fmt('peak_memory', c.measured['peak_memory'])} / "
               f"{_fmt('peak_memory', c.predicted['peak_memory'])} ({_pct(c.error['peak_memory'])})"
               if "peak_memory" in c.error else "")
        fit = "" if c.fits else " [red]no fit[/]"
        table.add_row(escape(c.case.id) + ("*" if c.case.assumptions else ""), layout, LABELS.get(key, key),
                      _fmt(key, c.measured[key]) if key else "", _fmt(key, c.predicted[key]) if key else "",
                      _pct(c.primary_error) + fit, mfu, mem)
    out.print(table)
    summary_table(summary)
    counts: dict[str, int] = {}
    for c in comparisons:
        for a in c.case.assumptions:
            counts[a] = counts.get(a, 0) + 1
    if counts:
        out.print("[bold]Defaults assumed[/] (rules: planner/fidelity/runs.py; per run: --json): " +
                  escape(", ".join(f"{a} ({n} runs)" for a, n in counts.items())), soft_wrap=True)
    if skipped:
        out.print("[bold]Skipped[/]")
        for s in skipped:
            out.print(f"  {s.id}: {s.skipped}", soft_wrap=True, markup=False)


def summary_table(summary: dict) -> None:
    table = Table(show_edge=False, header_style="bold", title="Error per source (|predicted - measured| / measured)")
    for col in ("source", "runs", "figure", "mean |err|", "max |err|", "memory mean / max", "no fit"):
        table.add_column(col, justify="left" if col in ("source", "figure") else "right")
    for name, row in summary.items():
        mem = (f"{_pct(row['memory_mean_abs_error'])[1:]} / {_pct(row['memory_max_abs_error'])[1:]}"
               if "memory_mean_abs_error" in row else "")
        table.add_row(escape(name), str(int(row["runs"])), LABELS.get(row["metric"], row["metric"]),
                      _pct(row["mean_abs_error"])[1:], _pct(row["max_abs_error"])[1:], mem,
                      str(int(row["predicted_not_to_fit"])))
    out.print(table)


def calibration_report(result: FitResult, hw_name: str, path: str, loo: bool = True) -> None:
    """Per-run fit errors (and leave-one-out errors unless ``loo`` is False: then the column is
    left out), the factors and the summary lines."""
    table = Table(show_edge=False, header_style="bold", title=f"Calibration of {escape(hw_name)}")
    cols = ("run", "fit error") + (("leave-one-out error",) if loo else ())
    for col in cols:
        table.add_column(col, justify="left" if col == "run" else "right")
    for rid in result.runs:
        cells = (escape(rid), _pct(result.fit_errors[rid])) + ((_pct(result.loo_errors.get(rid)),) if loo else ())
        table.add_row(*cells)
    out.print(table)
    out.print("Factors: " + ", ".join(f"{k} {v:.4g}" for k, v in result.factors.items()))
    mean, worst = result.fit_stats
    out.print(f"Fit: mean |err| {100 * mean:.1f}%, max {100 * worst:.1f}%")
    if result.loo_errors:
        lmean, lworst = result.loo_stats
        out.print(f"Leave-one-out: mean |err| {100 * lmean:.1f}%, max {100 * lworst:.1f}%")
    out.print(f"Wrote {path}", markup=False)


def calibration_notes(unused: dict[str, str], used: int, factors: int, hw_name: str) -> None:
    """On stderr: the runs a calibration leaves out, one line per reason, and a warning when
    fewer runs than factors are fitted (the priors then decide most factors)."""
    by_reason: dict[str, list[str]] = {}
    for rid, reason in unused.items():
        by_reason.setdefault(reason, []).append(rid)
    if by_reason:
        err.print(f"note: {used} of {used + len(unused)} runs usable to calibrate {hw_name}; not used:",
                  markup=False, soft_wrap=True)
        for reason, ids in by_reason.items():
            err.print(f"  {reason}: {', '.join(ids)}", markup=False, soft_wrap=True)
    if 0 < used < factors:
        err.print(f"warning: {used} run{'s' if used != 1 else ''} for {factors} factors: the priors "
                  "hold most of them; treat the fit as weak", markup=False, soft_wrap=True)
