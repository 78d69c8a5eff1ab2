"""``plan3d sweep``: the best layout at each GPU count, and how well throughput scales
(the command's flow is planner.cli.sweep; the table and plot planner.render.sweep / .plot).

Scaling efficiency of count n against the smallest count n0 that has a fitting layout:
    eff(n) = (tokens/s(n) / n) / (tokens/s(n0) / n0)
i.e. per-GPU throughput relative to the base (1.0 = perfectly linear strong scaling at a fixed
global batch). With a token budget each row also has the expected time to train with failures
and checkpoints (planner.objective.wall_time; cost.checkpoint): goodput falls as the job's MTBF
1/(N*lambda) shrinks, so the time to train can stop falling, or rise, where tokens/s still grows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from .errors import DeadlineError, NoFitError, PlannerError, UsageError
from .search import MAX_GPUS, SearchOptions, check_inputs, search
from .specs import HardwareProfile, ModelSpec, TrainingSpec


def parse_gpu_counts(text: str, hw: HardwareProfile) -> list[int]:
    """``"64:4096"`` -> [64, 128, ..., 4096] (doublings from the low end, the high end included
    when it is reached exactly); ``"64,256,1024"`` -> that list, sorted. UsageError otherwise;
    every count must be a whole number of nodes beyond one node.
    """
    text = text.strip()
    try:
        if ":" in text:
            lo_s, hi_s = text.split(":", 1)
            lo, hi = int(lo_s), int(hi_s)
            if lo <= 0 or hi < lo:
                raise UsageError(f"--gpus {text}: need 0 < low <= high, e.g. 64:4096")
            if hi > MAX_GPUS:
                raise UsageError(f"--gpus {text}: beyond what plan3d models (at most {MAX_GPUS:,})")
            counts = []
            n = lo
            while n <= hi:
                counts.append(n)
                n *= 2
        else:
            counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--gpus {text!r}: write a range low:high (powers of two between) "
                         "or a comma list, e.g. 64:4096 or 64,256,1024") from None
    if not counts:
        raise UsageError("--gpus: no GPU counts given")
    for n in counts:
        check_inputs(n, hw)
    return counts


def sweep(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, counts: list[int],
          opts: SearchOptions = SearchOptions(),
          on_step: Callable[[int], None] | None = None) -> list[dict]:
    """Search at each count; one row per count (SI units), ``error`` set where none fits/splits.

    Row keys: gpus, global_batch_size, layout (dict), layout_short, tokens_per_s, mfu, step_s,
    memory_bytes, scaling_efficiency (None for the base and for errors), error (None or one line);
    with a token budget (``opts.tokens`` or the model's, and an objective or deadline that
    needs it, planner.objective.needs_goodput) also goodput and time_to_train_s (expected
    wall-clock time, seconds). A count where no layout meets ``opts.deadline_s`` is an error row.
    """
    rows: list[dict] = []
    base: tuple[int, float] | None = None
    no_fit = False  # some count had valid layouts, none fitting: the failure is a NoFitError
    late = False  # some count had fitting layouts, none meeting the deadline
    small = replace(opts, keep=min(opts.keep, 8), max_gpus=None)
    for n in counts:
        try:
            best = search(model, hw, training, n, small).ranked
        except PlannerError as exc:
            no_fit |= isinstance(exc, (NoFitError, DeadlineError))
            late |= isinstance(exc, DeadlineError)
            rows.append({"gpus": n, "global_batch_size": training.global_batch_size,
                         "error": str(exc), "scaling_efficiency": None})
        else:
            tps = float(best.throughput["tokens_per_s"][0])
            eff = None if base is None else (tps / n) / (base[1] / base[0])
            if base is None:
                base = (n, tps)
            lay = best.candidates.layout(0)
            rows.append({"gpus": n, "global_batch_size": training.global_batch_size,
                         "layout": lay.model_dump(), "layout_short": lay.short(),
                         "tokens_per_s": tps, "mfu": float(best.throughput["mfu"][0]),
                         "step_s": float(best.time["step"][0]),
                         "memory_bytes": float(best.memory["total"][0]),
                         "scaling_efficiency": eff, "error": None,
                         **{k: float(best.throughput[k][0]) for k in ("goodput", "time_to_train_s")
                            if k in best.throughput}})
        if on_step is not None:
            on_step(n)
    if base is None:  # exit 1 (like search) when layouts exist but none fits, else 2
        raise (DeadlineError if late else NoFitError if no_fit else UsageError)(
            f"no GPU count in {counts[0]}..{counts[-1]} has a layout of {model.name} that "
            f"{'meets the deadline' if late else 'fits'}: "
            f"{rows[-1]['error']}")
    return rows


def parse_batch_sizes(text: str | None) -> list[int | None]:
    """``"1536"`` -> [1536]; ``"768,1536,3072"`` -> that list; None -> [None] (the model's)."""
    if text is None:
        return [None]
    try:
        sizes = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--global-batch-size {text!r}: write a number or a comma list, "
                         "e.g. 1536 or 768,1536,3072") from None
    if not sizes or any(b <= 0 for b in sizes):
        raise UsageError(f"--global-batch-size {text!r}: sizes must be positive")
    return list(dict.fromkeys(sizes))


def sweep_batches(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                  counts: list[int], batches: list[int], opts: SearchOptions = SearchOptions(),
                  on_step: Callable[[int], None] | None = None) -> list[dict]:
    """``sweep`` at each global batch size (rows in batch, then GPU order); scaling efficiency
    is relative to the first count with a fit at the same batch. When no batch has a fit: the
    first batch's error (NoFitError if any batch had valid layouts that did not fit, else
    UsageError)."""
    rows: list[dict] = []
    errors: list[PlannerError] = []
    for b in batches:
        try:
            rows += sweep(model, hw, training.model_copy(update={"global_batch_size": b}), counts,
                          opts, on_step)
        except PlannerError as exc:
            errors.append(exc)
            what = "the deadline met" if isinstance(exc, DeadlineError) else "fit"
            rows += [{"gpus": n, "global_batch_size": b, "error": f"no {what} at this batch",
                      "scaling_efficiency": None} for n in counts]
    if len(errors) == len(batches):
        kind = next((type(e) for e in errors if isinstance(e, (NoFitError, DeadlineError))),
                    UsageError)
        raise kind(str(errors[0]))
    return rows

