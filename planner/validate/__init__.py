"""plan3d validate: run a plan with real PyTorch parallelism and compare with the cost model.

torch is the optional extra ``validate`` (errors.VALIDATE_EXTRA says how to install it); it is
imported only inside this package's functions, never at CLI start-up. ``run_local`` forks the ranks of a miniature of the plan on
this machine (gloo); ``planner.validate.__main__`` is the torchrun entry point for a cluster.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

from ..errors import VALIDATE_EXTRA, PlannerError, UsageError

EXTRA_HINT = VALIDATE_EXTRA


class RunFailed(PlannerError):
    """A rank of the validation run failed or timed out. Exit code 1."""

    exit_code = 1


def require_torch() -> None:
    """UsageError naming the extra if torch is not importable."""
    if importlib.util.find_spec("torch") is None:
        raise UsageError(EXTRA_HINT)


def run_local(plan, world: int = 8, dtype: str = "float64", steps: int = 3,
              layers_per_stage: int = 1, timeout_s: float = 300.0) -> tuple[dict, list[dict]]:
    """Fork the miniature of ``plan`` as gloo ranks on this machine; (result, per-rank records).

    result is compare.compare's object (checks, reported, passed). Raises UsageError for bad
    arguments and RunFailed when a rank fails or the run exceeds ``timeout_s`` seconds.
    """
    require_torch()
    from .compare import compare
    from .miniature import ELEM_BYTES, miniature
    if dtype not in ELEM_BYTES or dtype == "bfloat16":
        raise UsageError(f"--dtype must be float64 or float32 on CPU, got {dtype}")
    if steps < 2:
        raise UsageError("--steps must be at least 2 (step 0 is warm-up)")
    if world <= 0 or layers_per_stage <= 0:
        raise UsageError("--world and --layers-per-stage must be positive")
    run = miniature(plan, world, dtype=dtype, steps=steps, layers_per_stage=layers_per_stage)
    from . import launch, worker  # imports torch once, before forking
    with tempfile.TemporaryDirectory(prefix="plan3d-validate-") as tmp:
        cfg = run.worker_config(tmp)
        codes = launch.fork_ranks(run.world, worker.run_rank, cfg, timeout_s)
        if any(codes):
            errors = sorted(Path(tmp).glob("rank*.err"))
            detail = errors[0].read_text().strip().splitlines()[-1] if errors else \
                f"timed out after {timeout_s:.0f} s" if -9 in codes else f"exit codes {codes}"
            raise RunFailed(f"validation run failed ({errors[0].stem if errors else 'ranks'}): {detail}")
        records = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(run.world)]
    reference = worker.reference_losses(cfg)
    return compare(run, records, reference), records


MEASURED = Path("measured.json")


def measured_destination(path: Path | None, force: bool, json_out: bool) -> Path:
    """Where the measurements go: ``path`` as given (planner.outputs.check_destination: stdout
    for '-', an existing file only with ``force``; not '-' with --json), or when not given the
    first free name of measured.json, measured-2.json, ... so a rerun never collides."""
    from ..outputs import check_destination, free_path, refuse_json_too
    if path is None:
        return free_path(MEASURED)
    check_destination(path, force, "--out", str(MEASURED))
    refuse_json_too(path, "--out", json_out)
    return path


def write_measured(path: Path, result: dict, records: list[dict], force: bool) -> None:
    """measured.json: the result plus every rank's raw record, to ``path`` or stdout ('-');
    UsageError if it is an existing file and not ``force``."""
    from ..outputs import write
    write(path, json.dumps({**result, "ranks": records}, indent=1) + "\n", force, "--out",
          str(MEASURED))
