"""What the DeepSpeed ZeRO-3 rows of Narayanan et al. 2021 (Table 2) say about their communication.

Usage:  python benchmarks/zero3_2021.py [RUNS.yaml]

For each DeepSpeed ZeRO-3 run (ids ``megatron21-t2-zero3-*`` of the shipped dataset) prints:
the measured step time (the source's FLOPs, Narayanan's formula, over its TFLOP/s/GPU x GPUs),
plan3d's compute time (forward + backward + recomputation, shipped A100 profile), the bytes each
GPU receives per step in ZeRO-3's collectives (two 16-bit parameter all-gathers and the gradient
reduce-scatter, (n-1)/n of each tensor), and the per-GPU rate those bytes imply under the two
readings that bracket the truth:

- nothing overlapped (DeepSpeed PR #1188: the gathers synchronized the device), so the
  communication took ``measured - compute`` seconds;
- everything overlapped (a perfect prefetch), so the step is ``max(compute, communication)`` and
  the communication took ``measured`` seconds -- possible only where measured > compute.

No rule fitted to these rows is in the cost model; this script shows why none was (the rows do
not follow one rate under either reading) and is the evidence behind the open accuracy target.
All times in seconds, bytes in GB (1e9), rates in GB/s per GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner.cost.model_counts import total_params
from planner.cost.step import estimate_layout
from planner.errors import UsageError
from planner.fidelity.compare import source_flops
from planner.fidelity.runs import RunCase, load_runs

PREFIX = "megatron21-t2-zero3-"


def analyse(cases: list[RunCase]) -> list[dict]:
    """One dict per DeepSpeed ZeRO-3 row: id, gpus, micro_batch, measured_s, compute_s, received_gb,
    exposed_s (measured - compute), rate_no_overlap, rate_full_overlap (GB/s; None where the
    reading is impossible). Raises UsageError if no such row is in ``cases``."""
    rows = []
    for case in cases:
        if not case.id.startswith(PREFIX) or case.skipped or "flops_per_gpu" not in case.measured:
            continue
        est = estimate_layout(case.model, case.hardware, case.training, case.layout)
        measured = source_flops(case)["flops"] / (case.measured["flops_per_gpu"] * case.gpus)
        compute = float(est.time["compute"][0] + est.time["recompute"][0])
        n = case.layout.dp
        received = total_params(case.model) * (2 + 2 + case.training.grad_bytes) * (n - 1) / n / 1e9
        exposed = measured - compute
        rows.append({"id": case.id, "gpus": case.gpus, "micro_batch": case.layout.micro_batch_size,
                     "measured_s": measured, "compute_s": compute, "received_gb": received,
                     "exposed_s": exposed,
                     "rate_no_overlap": received / exposed if exposed > 0 else None,
                     "rate_full_overlap": received / measured if measured > compute else None})
    if not rows:
        raise UsageError(f"no run whose id starts with {PREFIX!r} and has a TFLOP/s figure")
    return rows


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(rows: list[dict]) -> str:
    """The table as Markdown."""
    lines = ["| run | GPUs | micro-batch | measured s | compute s | received GB | measured - compute s "
             "| GB/s, nothing overlapped | GB/s, all overlapped |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['gpus']} | {r['micro_batch']} | {r['measured_s']:.1f} | "
                     f"{r['compute_s']:.1f} | {r['received_gb']:.0f} | {r['exposed_s']:.1f} | "
                     f"{_rate(r['rate_no_overlap'])} | {_rate(r['rate_full_overlap'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=Path, help="runs file (default: the shipped dataset)")
    args = parser.parse_args(argv)
    try:
        print(markdown(analyse(load_runs(args.runs))))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
