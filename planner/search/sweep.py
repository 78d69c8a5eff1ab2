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

from ..errors import DeadlineError, NoFitError, PlannerError, UsageError
from ..inputs import check_numbers, training_spec
from ..inputs import MAX_GPUS
from .options import SearchOptions
from .check import check_inputs
from .run import search
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from ..fmt import gib, seconds


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

    Row keys (every row has all of them, ROW_KEYS): gpus, global_batch_size, layout (dict),
    layout_short, tokens_per_s, mfu, step_s, memory_bytes, scaling_efficiency (None for the base
    and for errors), error (None or one line: the search's, with the count that would fit),
    error_brief (the same as the table's cell says it: the closest memory, the deadline miss); a
    row with an error has None for the figures. With a token budget (``opts.tokens`` or the
    model's, and an objective or deadline that needs it, planner.objective.needs_goodput) a row
    with a layout also has goodput and time_to_train_s (expected wall-clock time, seconds). A
    count where no layout meets ``opts.deadline_s`` is an error row. DeadlineError when layouts
    fit but none meets the deadline at any count, NoFitError when no count has a fit (some had
    valid layouts), UsageError when no count has a valid layout.
    """
    rows, failures = _rows(model, hw, training, counts, opts, on_step)
    _raise_if_none(model, counts, rows, failures, rows)
    return rows


def _rows(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, counts: list[int],
          opts: SearchOptions, on_step: Callable[[int], None] | None) -> tuple[list[dict], set]:
    """(rows of ``sweep``, the kinds of search error its counts met: NoFitError where valid
    layouts did not fit, DeadlineError where fitting layouts missed the deadline)."""
    rows: list[dict] = []
    base: tuple[int, float] | None = None
    failures: set = set()
    # the scaling curve: each count's best by the objective alone (strict_rank), not a tie
    # group's pick, so that a row's throughput is the count's best
    small = replace(opts, keep=min(opts.keep, 8), max_gpus=None, strict_rank=True)
    for n in counts:
        try:
            best = search(model, hw, training, n, small).ranked
        except PlannerError as exc:
            failures |= {type(exc)} & {NoFitError, DeadlineError}
            rows.append(row(n, training.global_batch_size, error=str(exc),
                            error_brief=_short_error(exc, opts)))
        else:
            tps = float(best.throughput["tokens_per_s"][0])
            eff = None if base is None else (tps / n) / (base[1] / base[0])
            if base is None:
                base = (n, tps)
            rows.append(row(n, training.global_batch_size, best, eff))
        if on_step is not None:
            on_step(n)
    timed = [k for k in ("goodput", "time_to_train_s") if any(k in r for r in rows)]
    for r in rows:  # every row has the same keys: None where a count has no layout
        for k in timed:
            r.setdefault(k, None)
    return rows, failures


def _short_error(exc: PlannerError, opts: SearchOptions) -> str:
    """A count's error as its table cell says it: a missed deadline as the time the fastest
    layout would take and that layout, no fit as the closest layout's memory and the count
    from which a layout fits (the search's sentences repeat the model, the GPUs and the budget
    the header gives, and the closest layout; --json and plan3d search have them in full); any
    other error in full."""
    if isinstance(exc, DeadlineError) and exc.fastest is not None and exc.seconds is not None:
        return (f"misses the {seconds(opts.deadline_s)} deadline: {seconds(exc.seconds)} at best, "
                f"{exc.fastest.candidates.layout(0).short()}")
    if isinstance(exc, NoFitError) and exc.closest is not None and exc.usable is not None:
        need = float(exc.closest.memory["total"][0])
        more = "" if exc.to_fit is None else f"; fits from {exc.to_fit.gpus:,} GPUs"
        return f"no fit: the closest needs {gib(need)} of {gib(exc.usable)}{more}"
    return str(exc)


def _raise_if_none(model: ModelSpec, counts: list[int], rows: list[dict], failures: set,
                   table: list[dict]) -> None:
    """When no row has a layout: DeadlineError if layouts fitted but none met the deadline
    (carrying the sweep's ``table`` rows, each count marked, for the caller to print), NoFitError
    (like search, exit 1) if layouts existed but none fitted, else UsageError, naming the last
    count's reason."""
    if all(r["error"] for r in rows):
        span = f"no GPU count in {counts[0]}..{counts[-1]}"
        if DeadlineError in failures:
            at = f"{rows[-1]['gpus']:,} GPUs" + (
                f" (batch {rows[-1]['global_batch_size']:,})"
                if len({r['global_batch_size'] for r in table}) > 1 else "")
            raise DeadlineError(f"{span} trains {model.name} within the deadline; on {at}: "
                                f"{rows[-1]['error_brief']}", rows=table)
        if NoFitError in failures:
            raise NoFitError(f"{span} has a layout of {model.name} that fits: {rows[-1]['error']}")
        raise UsageError(f"{span} can run {model.name}: {rows[-1]['error']}")


ROW_KEYS = ("gpus", "global_batch_size", "layout", "layout_short", "tokens_per_s", "mfu",
            "step_s", "memory_bytes", "scaling_efficiency", "error", "error_brief")


def row(gpus: int, batch: int, best=None, efficiency: float | None = None,
        error: str | None = None, error_brief: str | None = None) -> dict:
    """One sweep row with every key of ROW_KEYS: the best layout (``best``, an Estimate, index
    0) and its figures, or None for each where ``error`` (one line) says why there is none,
    ``error_brief`` the same as the table's cell says it (default: ``error``)."""
    out = dict.fromkeys(ROW_KEYS)
    out.update(gpus=gpus, global_batch_size=batch, scaling_efficiency=efficiency, error=error,
               error_brief=error_brief or error)
    if best is not None:
        lay = best.candidates.layout(0)
        out.update(layout=lay.model_dump(), layout_short=lay.short(),
                   tokens_per_s=float(best.throughput["tokens_per_s"][0]),
                   mfu=float(best.throughput["mfu"][0]), step_s=float(best.time["step"][0]),
                   memory_bytes=float(best.memory["total"][0]))
        out.update({k: float(best.throughput[k][0]) for k in ("goodput", "time_to_train_s")
                    if k in best.throughput})
    return out


def parse_batch_sizes(text: str | None) -> list[int | None]:
    """``"1536"`` -> [1536]; ``"768,1536,3072"`` -> that list; None -> [None] (the model's).
    Each size is checked as --global-batch-size is everywhere (planner.inputs.check_numbers)."""
    if text is None:
        return [None]
    try:
        sizes = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--global-batch-size {text!r}: write a number or a comma list, "
                         "e.g. 1536 or 768,1536,3072") from None
    if not sizes:
        raise UsageError(f"--global-batch-size {text!r}: sizes must be positive")
    for b in sizes:
        check_numbers({"global_batch_size": b})
    return list(dict.fromkeys(sizes))


def sweep_batches(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                  counts: list[int], batches: list[int], opts: SearchOptions = SearchOptions(),
                  on_step: Callable[[int], None] | None = None) -> list[dict]:
    """``sweep`` at each global batch size (rows in batch, then GPU order); scaling efficiency
    is relative to the first count with a fit at the same batch. Each batch's TrainingSpec is
    checked as every command checks one (planner.inputs.training_spec). When no batch has a
    fit: the first batch's error (DeadlineError or NoFitError if any batch had layouts that
    missed the deadline or did not fit, else UsageError)."""
    rows: list[dict] = []
    failed: list[tuple[list[dict], set]] = []  # batches without a fit at any count
    for b in batches:
        spec = training_spec(model, {**training.model_dump(mode="json"), "global_batch_size": b},
                             where="--global-batch-size")
        found, failures = _rows(model, hw, spec, counts, opts, on_step)
        rows += found
        if all(r["error"] for r in found):
            failed.append((found, failures))
    if len(failed) == len(batches):
        _raise_if_none(model, counts, failed[0][0], set().union(*(f for _, f in failed)), rows)
    return rows
