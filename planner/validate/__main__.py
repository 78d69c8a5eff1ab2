"""torchrun entry point: ``torchrun --nproc-per-node 8 --nnodes N ... -m planner.validate plan.yaml``.

Every rank runs the plan's layout with the plan's shapes (``--layers-per-stage K`` keeps K
layers per pipeline chunk, and the prediction uses the same K), NCCL on GPUs and gloo on CPU.
Rank 0 gathers the records, writes ``--out`` and prints the table (or ``--json``); the exit code
is 1 if a check fails. ``--miniature`` runs the --local miniature instead (world size 8).
``--no-reference`` skips the single-process reference (needed when the model does not fit one
device); the losses are then only reported.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from ..errors import PlannerError
    from ..render import console
    parser = argparse.ArgumentParser(prog="python -m planner.validate")
    parser.add_argument("plan", type=Path)
    parser.add_argument("--layers-per-stage", type=int, default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default=None, choices=("float64", "float32", "bfloat16"))
    parser.add_argument("--miniature", action="store_true")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--out", type=Path, default=None)  # measured.json, or the next free name
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except PlannerError as exc:
        console.error(str(exc))
        return exc.exit_code


def _run(args) -> int:
    from ..errors import UsageError
    from ..render import console
    from ..export import read_checked_plan
    from ..outputs import is_stdout, report_to_stderr, shown
    from . import measured_destination, require_torch, write_measured
    require_torch()
    import torch

    from .launch import quiet_collective_deprecations
    quiet_collective_deprecations()  # as quiet as --local (its ranks ignore FutureWarning)

    from ..render.validate import render
    from .compare import compare
    from .miniature import full_scale, miniature
    from .worker import reference_losses, run_rank
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dtype = args.dtype or ("bfloat16" if cuda else "float64")
    plan = read_checked_plan(args.plan)
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if args.miniature:
        run = miniature(plan, world, dtype=dtype, steps=args.steps,
                        layers_per_stage=args.layers_per_stage or 1, device=device)
    else:
        run = full_scale(plan, args.layers_per_stage, dtype, args.steps, device)
    if world != run.world:
        raise UsageError(f"this run needs {run.world} ranks (tp*cp*pp*dp); torchrun started {world}")
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        args.out = measured_destination(args.out, args.force, args.json)
    cfg = run.worker_config(out_dir="", timeout_s=1800)
    cfg["gather"] = True
    record = run_rank(cfg)
    if rank != 0:
        return 0
    reference = None if args.no_reference else reference_losses(cfg)
    result = compare(run, record["all"], reference)
    write_measured(args.out, result, record["all"], force=True)
    if args.json:
        console.print_json(result)
        console.note(f"Wrote the measurements to {args.out}")
    else:
        with report_to_stderr(is_stdout(args.out)):
            render(result, shown(args.out, 'the measurements'))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
