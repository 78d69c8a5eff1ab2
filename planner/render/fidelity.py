"""Tables and JSON for ``plan3d accuracy`` and ``plan3d calibrate``.

The run-by-run comparison is one table per source (each source's runs share an id prefix, shown
once in the table's title), with measured over predicted stacked in one column, so that every
figure shows whole at 80 columns.
"""

from __future__ import annotations

import math

from rich.markup import escape

from ..fidelity.compare import is_false_oom
from ..fidelity.pairs import precision_pairs
from .. import fmt
from . import tables
from .console import note, out
from ..fidelity.runs import MEASURED_NAMES

LABELS = {"iteration_s": "s/iter", "flops_per_gpu": "TFLOP/s/GPU", "mfu": "MFU", "hfu": "HFU",
          "tokens_per_s": "tokens/s", "peak_memory": "peak mem"}


def figure(key: str, value: float) -> str:
    """A measured or predicted figure with its unit (SI in): "1.42 s", "137.0 TFLOP/s",
    "41.5%", "14.9 GiB", "12,345 tokens/s"."""
    if key == "iteration_s":
        return f"{value:.2f} s"
    if key == "flops_per_gpu":
        return f"{fmt.tflops(value, 1)} TFLOP/s"
    if key in ("mfu", "hfu"):
        return fmt.percent(value)
    if key == "peak_memory":
        return fmt.gib(value)
    return fmt.tokens_per_s(value, unit=True)


def comparison_dict(c) -> dict:
    """One run as JSON (SI units; errors are fractions). ``measured``, ``predicted`` and
    ``error`` have every figure a run can give (fidelity.runs.MEASURED_NAMES), null where this
    run gives none, so every run has the same keys."""
    figures = lambda d: {k: d.get(k) for k in MEASURED_NAMES.values()}  # noqa: E731
    return {"id": c.case.id, "group": c.case.group, "primary": c.primary,
            "measured": figures(c.measured), "predicted": figures(c.predicted),
            "error": figures(c.error),
            "fits": c.fits, "predicted_step_s": c.step_s, "assumptions": c.case.assumptions,
            "resolution": c.case.resolution or None, "precision": c.case.training.precision,
            "layout": c.case.layout.model_dump() if c.case.layout else None,
            "hardware": c.case.hardware.name if c.case.hardware else None}


def _finite(value):
    """NaN (no figure to compare) becomes null, so the output stays valid JSON."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def accuracy_json(comparisons, skipped, summary: dict, loso: dict | None = None) -> dict:
    """``plan3d accuracy --json``: runs (each with its step-time error in-sample and, with
    ``loso``, predicted without its source), skipped runs and the per-source summary."""
    keys = ("memory_mean_abs_error", "memory_max_abs_error", "loso_mean_abs_error",
            "loso_max_abs_error")  # null where a source has none
    runs = []
    for c in comparisons:
        run = comparison_dict(c)
        run["step_error"] = c.step_error if c.primary else None
        run["loso_step_error"] = (loso or {}).get(c.case.id)
        runs.append(run)
    return {"runs": _finite(runs),
            "precision_pairs": _finite([pair_dict(p, loso) for p in precision_pairs(comparisons)]),
            "skipped": [{"id": s.id, "reason": s.skipped} for s in skipped],
            "summary": _finite({name: {**row, **{k: row.get(k) for k in keys}}
                                for name, row in summary.items()})}


def pair_dict(pair, loso: dict | None = None) -> dict:
    """One precision pair as JSON: the two run ids and precisions, the measured and predicted
    speed-ups (T_base / T_other) and their difference in percentage points; with ``loso``, the
    speed-up predicted without the source (each run's LOSO step error applied to its measured
    time), null where a run has none."""
    out = {"base": pair.base.case.id, "other": pair.other.case.id,
           "base_precision": pair.base.case.training.precision,
           "other_precision": pair.other.case.training.precision,
           "measured_speedup": pair.measured, "predicted_speedup": pair.predicted,
           "error_points": pair.error_points, "loso_speedup": None}
    eb, eo = (loso or {}).get(pair.base.case.id), (loso or {}).get(pair.other.case.id)
    if eb is not None and eo is not None:
        out["loso_speedup"] = pair.measured * (1 + eb) / (1 + eo)
    return out


def pairs_table(comparisons, loso: dict | None = None) -> None:
    """Precision pairs (fidelity.pairs): per pair the measured and predicted speed-up of the
    lower precision over the higher (T_base / T_other) and the error in percentage points, in
    sample and without the source (LOSO, where computed). Nothing when there is no pair."""
    pairs = [pair_dict(p, loso) for p in precision_pairs(comparisons)]
    if not pairs:
        return
    t = tables.new("Precision speed-ups of same-layout pairs (T_base / T_other; error in points)")
    tables.text_column(t, "pair")
    for header in ("measured", "predicted", "error", "LOSO error"):
        tables.number_column(t, header)
    for p in pairs:
        lo = "" if p["loso_speedup"] is None else f"{100 * (p['loso_speedup'] - p['measured_speedup']):+.1f}"
        t.add_row(tables.stacked([escape(p["base"]), escape(p["other"])]),
                  f"{p['measured_speedup']:.3f}", f"{p['predicted_speedup']:.3f}",
                  f"{p['error_points']:+.1f}", lo)
    tables.show(t, out)


def _prefix(ids: list[str]) -> str:
    """The ids' common prefix up to and including its last '-', when every id goes on after it."""
    if len(ids) < 2:
        return ""
    common = ids[0]
    for i in ids[1:]:
        while not i.startswith(common):
            common = common[:-1]
    return common[:common.rfind("-") + 1]


def _layout(lay, training=None) -> str:
    """A run's layout in one short line: t2 p8 d16 e32 v4 z1 b1 sel+ sp fp8 (recompute none, sel,
    sel+, full or full:N, each distinct)."""
    if lay is None:
        return ""
    extra = "".join(f" {k}{v}" for k, v in (("c", lay.cp), ("e", lay.ep)) if v > 1)
    precision = "" if training is None or training.precision == "bf16" else f" {training.precision}"
    return (f"t{lay.tp} p{lay.pp} d{lay.dp}{extra} v{lay.vpp} z{lay.zero_stage} "
            f"b{lay.micro_batch_size} {lay.recompute_label.replace('selective', 'sel')}"
            f"{' sp' if lay.sequence_parallel else ''}"
            f"{precision}")


def _group_table(group: str, comparisons, loso: dict | None = None):
    prefix = _prefix([c.case.id for c in comparisons])
    mfu = any("mfu" in c.error and c.primary != "mfu" for c in comparisons)
    mem = any("peak_memory" in c.error for c in comparisons)
    title = f"{escape(group)}" + (f": runs {escape(prefix)}*" if prefix else "")
    t = tables.new(title)
    tables.text_column(t, "run\nlayout")
    held = ("step err\nLOSO",) if loso is not None else ()
    for col in ("measured\npredicted", "error") + held + ("MFU meas.\nMFU pred.",) * mfu + \
            ("mem meas.\nmem pred.", "mem\nerror") * mem:
        tables.number_column(t, col)
    for c in comparisons:
        key = c.primary or ""
        run = escape(c.case.id[len(prefix):]) + ("*" if c.case.assumptions else "")
        no_fit = "" if c.fits else ("\n[red]false OOM[/]" if is_false_oom(c)
                                    else "\n[red]no fit[/]")
        cells = [tables.stacked([run, _layout(c.case.layout, c.case.training)]),
                 tables.stacked([figure(key, c.measured[key]), figure(key, c.predicted[key])])
                 if key else "",
                 fmt.percent(c.primary_error, signed=True) + no_fit]
        if loso is not None:
            cells.append(tables.stacked([fmt.percent(c.step_error, signed=True),
                                         fmt.percent(loso.get(c.case.id), signed=True)]) if key else "")
        if mfu:
            cells.append(tables.stacked([fmt.percent(c.measured["mfu"]), fmt.percent(c.predicted["mfu"])])
                         if "mfu" in c.error and c.primary != "mfu" else "")
        if mem:
            has = "peak_memory" in c.error
            cells += [tables.stacked([fmt.gib(c.measured["peak_memory"]), fmt.gib(c.predicted["peak_memory"])])
                      if has else "", fmt.percent(c.error["peak_memory"], signed=True) if has else ""]
        t.add_row(*cells)
    return t


def accuracy_tables(comparisons, skipped, summary: dict, loso: dict | None = None) -> None:
    """Run by run (one table per source), the per-source summary, then the defaults assumed
    and the skipped runs."""
    out.print("[bold]Measured vs predicted, run by run[/] (* = assumes defaults; error = "
              "(predicted - measured) / measured)")
    groups: dict[str, list] = {}
    for c in comparisons:
        groups.setdefault(c.case.group, []).append(c)
    for group, members in groups.items():
        tables.show(_group_table(group, members, loso), out)
    summary_table(summary)
    pairs_table(comparisons, loso)
    in_sample = (loso or {}).get("__in_sample__") or []
    if loso is not None and loso.get("__refits__", 0):
        out.print(f"Leave-one-source-out: {loso['__refits__']} refits of the fitted profiles "
                  "(benchmarks/calibration.yaml) without the source predicted; runs on profiles "
                  "that are not fitted, or of sources they are not fitted on, are held out already.")
    elif loso is not None and not in_sample:
        out.print("Leave-one-source-out: no shipped profile is fitted on these runs' sources "
                  "(benchmarks/calibration.yaml), so every error above is held out already.")
    if in_sample:
        out.print(f"In-sample: {len(in_sample)} of these runs are on a profile plan3d calibrate "
                  f"fitted on them ({', '.join(in_sample)}): their errors, LOSO column included, "
                  "are fit errors, not held out; calibrate with --exclude to hold one out.",
                  markup=False)
    assumed = assumptions_text([c.case for c in comparisons])
    if assumed:
        out.print("[bold]Defaults assumed[/] (rules: planner/fidelity/runs.py; per run: --json): " +
                  escape(assumed))
    if skipped:
        out.print("[bold]Skipped[/]")
        for s in skipped:
            out.print(f"  {s.id}: {s.skipped}", markup=False)


def _pair(row: dict, key: str) -> str:
    """ "mean/max" in per cent of a summary row's ``key``_mean/_max_abs_error ("" where absent):
    "3.0/5.6"."""
    mean, worst = row.get(f"{key}_mean_abs_error"), row.get(f"{key}_max_abs_error")
    if mean is None or math.isnan(mean):
        return ""
    return f"{100 * mean:.1f}/{100 * worst:.1f}"


def summary_table(summary: dict) -> None:
    """One row per source: runs, mean / max |error| of the step time in-sample and predicted
    without the source (LOSO, where computed), of tokens/s and of peak memory where measured,
    and how many runs are predicted not to fit (of which false OOMs under --resolve search)."""
    loso = any("loso_mean_abs_error" in row for row in summary.values())
    mem = any("memory_mean_abs_error" in row for row in summary.values())
    t = tables.new("Error per source, % mean/max of |predicted - measured| / measured")
    tables.text_column(t, "source")
    tables.number_column(t, "runs")
    columns = [("step", "step time\nin-sample")] + [("loso", "step time\nLOSO")] * loso + \
        [("tokens", "tokens/s\nin-sample")] + [("memory", "peak\nmemory")] * mem
    for _, header in columns:
        tables.number_column(t, header)
    tables.number_column(t, "no fit")
    for name, row in summary.items():
        oom = int(row.get("false_oom", 0))
        no_fit = str(int(row["predicted_not_to_fit"])) + (f" ({oom} false)" if oom else "")
        t.add_row(escape(name), str(int(row["runs"])), *[_pair(row, key) for key, _ in columns], no_fit)
    tables.show(t, out)


def factor(name: str, value: float) -> str:
    """A fitted efficiency factor as printed: 4 significant digits, with its unit where it has
    one ("step_overhead 11.3 ms", "matmul_half_flops 1.6 GFLOP", "matmul 0.7912")."""
    if name == "step_overhead":
        return fmt.duration_text(value)
    if name == "matmul_half_flops":
        return f"{fmt.significant(value / 1e9)} GFLOP"
    return fmt.significant(value)


def calibration_report(result, hw_name: str, path: str, loo: bool = True) -> None:
    """Per-run fit errors (and leave-one-out errors unless ``loo`` is False: then the column is
    left out), the factors and the summary lines."""
    t = tables.new(f"Calibration of {escape(hw_name)}")
    tables.text_column(t, "run")
    tables.number_column(t, "fit error")
    if loo:
        tables.number_column(t, "leave-one-out\nerror")
    for rid in result.runs:
        cells = [escape(rid), fmt.percent(result.fit_errors[rid], signed=True)]
        t.add_row(*cells, *([fmt.percent(result.loo_errors.get(rid), signed=True)] if loo else []))
    tables.show(t, out)
    out.print("Factors: " + ", ".join(f"{k} {factor(k, v)}" for k, v in result.factors.items()))
    mean, worst = result.fit_stats
    out.print(f"Fit: mean |err| {fmt.percent(mean)}, max {fmt.percent(worst)}")
    if result.loo_errors:
        lmean, lworst = result.loo_stats
        out.print(f"Leave-one-out: mean |err| {fmt.percent(lmean)}, max {fmt.percent(lworst)}")
    out.print(f"Wrote the calibrated profile to {path}", markup=False)
    for warning in result.warnings:  # on stderr: a factor the runs pushed to a bound or far away
        note(f"warning: {warning}: the model misses something this factor absorbs; a finding, "
             "not a value to trust")


def assumptions_text(cases) -> str:
    """What the runs ``cases`` (RunCase) assume, each with how many runs: 'recompute=none (3
    runs), precision=bf16 (1 run)' ('' when nothing is assumed)."""
    counts: dict[str, int] = {}
    for case in cases:
        for a in case.assumptions:
            counts[a] = counts.get(a, 0) + 1
    return ", ".join(f"{a} ({n} run{'' if n == 1 else 's'})" for a, n in counts.items())


def calibration_notes(unused: dict[str, str], used: int, factors: int, hw_name: str,
                      assumed: str = "") -> None:
    """On stderr: the runs a calibration leaves out, one line per reason, a warning when fewer
    runs than factors are fitted (the priors then decide most factors), and what the fitted runs
    assume (``assumed``, assumptions_text)."""
    by_reason: dict[str, list[str]] = {}
    for rid, reason in unused.items():
        by_reason.setdefault(reason, []).append(rid)
    if by_reason:
        note(f"note: {used} of {used + len(unused)} runs usable to calibrate {hw_name}; not used:")
        for reason, ids in by_reason.items():
            note(f"  {reason}: {', '.join(ids)}")
    if 0 < used < factors:
        note(f"warning: {used} run{'s' if used != 1 else ''} for {factors} factors: the priors "
             "hold most of them; treat the fit as weak")
    if assumed:
        note(f"note: the fitted runs assume (each setting they leave unknown at its one default, "
             f"as plan3d accuracy without --resolve search): {assumed}")
