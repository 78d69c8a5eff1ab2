"""Fidelity benchmark: plan3d's predictions vs published, measured training runs.

Usage:  python benchmarks/fidelity.py [RUNS.yaml] [--out TABLE.md [--force]]

Writes a Markdown table (run by run: measured, predicted, error; then mean and max |error| per
source) to --out (default: stdout; an existing file only with --force). tests/test_fidelity.py runs it on the shipped dataset
(benchmarks/published_runs.yaml) with the issue's accuracy targets as thresholds, so CI fails on
an accuracy regression. Same numbers as `plan3d accuracy`; this script only formats them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.errors import UsageError
from planner.outputs import check_destination, write
from planner.fidelity.compare import Comparison, compare_all, summarize
from planner.fidelity.runs import RunCase, load_runs
from planner import fmt

UNITS = {"iteration_s": (1.0, "s/iter", "{:.2f}"), "flops_per_gpu": (1e-12, "TFLOP/s/GPU", "{:.1f}"),
         "mfu": (100.0, "MFU %", "{:.1f}"), "tokens_per_s": (1.0, "tokens/s", "{:,.0f}"),
         "peak_memory": (1e-9, "GB", "{:.1f}")}


def run(path: Path | None = None) -> tuple[list[RunCase], list[Comparison], dict[str, dict[str, float]]]:
    """(all cases, comparisons of the non-skipped ones, per-source summary) for a runs file."""
    cases = load_runs(path)
    comparisons = compare_all(cases)
    return cases, comparisons, summarize(comparisons)


def _cell(key: str, value: float) -> str:
    scale, _, pattern = UNITS[key]
    return pattern.format(value * scale)


def markdown(cases: list[RunCase], comparisons: list[Comparison], summary: dict) -> str:
    """The benchmark table as Markdown."""
    lines = ["| run | figure | measured | predicted | error | peak memory meas / pred (error) |",
             "|---|---|---:|---:|---:|---:|"]
    for c in comparisons:
        key = c.primary
        if key is None:
            continue
        mem = ""
        if "peak_memory" in c.error:
            mem = (f"{_cell('peak_memory', c.measured['peak_memory'])} / "
                   f"{_cell('peak_memory', c.predicted['peak_memory'])} "
                   f"({fmt.percent(c.error['peak_memory'], signed=True)})")
        lines.append(f"| {c.case.id} | {UNITS[key][1]} | {_cell(key, c.measured[key])} | "
                     f"{_cell(key, c.predicted[key])} | {fmt.percent(c.error[key], signed=True)} | {mem} |")
    lines += ["", "| source | runs | figure | mean abs error | max abs error | peak memory mean / max |",
              "|---|---:|---|---:|---:|---:|"]
    for name, row in summary.items():
        mem = (f"{fmt.percent(row['memory_mean_abs_error'])} / {fmt.percent(row['memory_max_abs_error'])}"
               if "memory_mean_abs_error" in row else "")
        lines.append(f"| {name} | {int(row['runs'])} | {UNITS.get(row['metric'], (0, row['metric']))[1]} | "
                     f"{fmt.percent(row['mean_abs_error'])} | {fmt.percent(row['max_abs_error'])} | {mem} |")
    skipped = [c for c in cases if c.skipped]
    if skipped:
        lines += ["", "Skipped: " + "; ".join(f"{c.id} ({c.skipped})" for c in skipped)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with the table written; bad input (unreadable runs file, --out in a missing
    directory or an existing file without --force) is one line on stderr and exit 2."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=Path, help="runs YAML (default: the shipped dataset)")
    parser.add_argument("--out", type=Path, help="write the Markdown table here (default: stdout)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    args = parser.parse_args(argv)
    try:
        if args.out:  # before the (slow) comparison, so a bad destination fails at once
            check_destination(args.out, args.force, "--out", "fidelity.md")
        text = markdown(*run(args.runs))
        if args.out:  # a file, or stdout for '-' / /dev/stdout (planner.outputs)
            write(args.out, text, args.force, "--out", "fidelity.md")
        else:
            sys.stdout.write(text)
    except UsageError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return exc.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
