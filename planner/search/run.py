"""Enumerate -> prune (divisibility, topology, fit) -> evaluate -> rank -> explain.

The space is a broadcast grid of numpy arrays (planner.grid), pruned by named masks
(space.constraint_masks) and evaluated by the vectorized cost model on sub-grids of about CHUNK
layouts that hold the layouts still in (planner.scan); each sub-grid keeps only its best. No
Python loop over candidates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import fmt
from ..cost import Estimate, evaluate
from ..cost.checkpoint import evaluate_checkpoint, unavailable
from ..cost.offload import check_offload_hardware, uses_host_memory
from ..cost.precision import check_precision
from ..errors import DeadlineError, NoFitError, PlannerError, UsageError
from ..inputs import check_integers
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import objective
from .check import check_inputs
from .framework_rules import check_model, profile_for
from .grid import Grid, build_grid
from .least_layers import as_scanned
from .options import TIE_LIMIT, SearchOptions
from .refusal import (FitHint, fewest_gpus, never_done_error, no_fit_message, no_split_reason,
                      nothing_valid_message)
from .scan import scan
from .state import Scan



@dataclass
class SearchResult:
    """Fitting layouts ranked best first (the best ``keep``), and what was pruned.

    ``pruned``: rule -> count, in the order applied; ``enumerated``: layouts in the space (each
    checked by the rules, the valid ones for memory, the fitting ones scored); ``fitting``: valid
    layouts that fit within ``usable`` bytes per GPU (the HBM less any --min-memory-headroom).
    """

    ranked: Estimate
    enumerated: int
    pruned: dict[str, int] = field(default_factory=dict)
    closest_miss: Estimate | None = None
    fitting: int = 0
    objective: str = "throughput"
    seconds: float = 0.0
    usable: float = 0.0
    checkpoint: Any = None  # cost.checkpoint.CheckpointEstimate of ``ranked`` (None: no storage block)


def search(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
           opts: SearchOptions = SearchOptions()) -> SearchResult:
    """Rank every valid layout that fits by the objective (exact ties: no offload, lower ZeRO stage, then less memory).

    ``gpus`` fixes the count; with ``opts.max_gpus`` (and gpus None) the count is searched too.
    The grid is evaluated on sub-grids of about CHUNK layouts (planner.scan); each keeps its
    best ``keep`` (with its ties), and the best overall are re-evaluated as flat arrays at the end. Raises UsageError when no layout can use
    these GPUs/batch at all (the rule that removed the last candidates is named), NoFitError
    when valid layouts exist but none fits in HBM (with the closest miss).
    """
    started = time.perf_counter()
    tokens = opts.tokens if opts.tokens is not None else training.tokens
    _check_search_inputs(model, hw, training, gpus, opts, tokens)
    grid = build_grid(model, hw, training, gpus, opts)
    if grid.size == 0:
        raise UsageError(no_split_reason(model, hw, gpus, opts))
    usable = objective.usable_memory(float(hw.gpu.hbm_capacity), opts.headroom_bytes,
                                     opts.headroom_fraction)
    passed = scan(model, hw, training, grid, opts, usable, tokens)
    _refuse_none_kept(model, hw, training, gpus, opts, grid, passed, usable, tokens)
    est, ck, order = _rank(model, hw, training, grid, passed, opts, tokens)
    return SearchResult(ranked=est.take(order), enumerated=grid.size, pruned=passed.pruned,
                        fitting=passed.fitting, objective=opts.objective,
                        seconds=time.perf_counter() - started, usable=usable,
                        checkpoint=None if ck is None else ck.take(order))


def _refuse_none_kept(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                      gpus: int | None, opts: SearchOptions, grid: Grid, passed: Scan,
                      usable: float, tokens: float | None) -> None:
    """Raise when the scan kept no layout: UsageError naming the rule that removed the last
    valid ones, NoFitError with the closest miss and the fewest GPUs that fit, a never-done
    UsageError or a DeadlineError when none finishes (in time)."""
    if passed.fitting == 0:
        if passed.miss_index < 0:
            rule = next((r for r, n in passed.alive_after.items() if n == 0), "")
            raise UsageError(nothing_valid_message(model, training, gpus or opts.max_gpus, rule,
                                                    grid))
        flat = grid.flat(np.array([passed.miss_index])).replace(**passed.miss_layers)
        miss = evaluate(model, hw, training, flat)
        n = miss.candidates.layout(0).gpus
        hint = fit_hint(model, hw, training, opts.max_gpus or n, opts)
        raise NoFitError(no_fit_message(model, hw, n, miss, usable, hint), closest=miss,
                         usable=usable, to_fit=hint)
    if not any(part.size for part in passed.pool_score):  # none meets the deadline, or ever ends
        raise never_done_error(training, gpus or opts.max_gpus) if passed.fastest_index < 0 else \
            _deadline_error(model, hw, training, grid, passed, gpus or opts.max_gpus, opts, tokens)


def _rank(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid, passed: Scan,
          opts: SearchOptions, tokens: float | None) -> tuple:
    """(estimate of the kept layouts, their checkpoint estimate or None, the order of the best
    ``keep``): the pool's best and every exact tie at the cut (the pool's order depends on the
    scan's path, the grid index does not), at most TIE_LIMIT x keep, re-evaluated as flat
    arrays and scored by the objective; exact ties go to no activation offload (no host memory,
    no host-link traffic), the lower ZeRO stage (less traffic), then less memory."""
    scores, index = np.concatenate(passed.pool_score), np.concatenate(passed.pool_index)
    order = np.lexsort((index, -scores))
    cut = scores[order[min(opts.keep, scores.size) - 1]]
    chosen = order[scores[order] >= cut][:TIE_LIMIT * opts.keep]
    est = evaluate(model, hw, training, as_scanned(grid, passed, np.sort(index[chosen])))
    cand = est.candidates
    gpus_flat = np.asarray(cand.gpus, dtype=np.float64)
    asked = objective.reports_training(opts)
    ck = evaluate_checkpoint(model, hw, training, cand, est.time["step"]) \
        if asked or unavailable(hw) is None else None
    goodput = None if ck is None else ck.values["goodput"]
    if asked:  # time to train, cost: with failures and checkpoints
        objective.annotate(est.throughput, gpus_flat, tokens, opts.price_per_gpu_hour, goodput)
    score = objective.score(opts.objective, est.throughput["tokens_per_s"], gpus_flat, tokens,
                            opts.price_per_gpu_hour, 1.0 if goodput is None else goodput,
                            opts.deadline_s)
    order = np.lexsort((est.memory["total"], cand.zero_stage, uses_host_memory(cand), -score))
    return est, ck, order[:opts.keep]


def fit_hint(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, above: int,
             opts: SearchOptions) -> FitHint | None:
    """``fewest_gpus`` above ``above`` with the best layout there (a search at that count with
    ``opts``; the count is whole nodes, so it is one ``--gpus`` takes); None if no count fits."""
    n = fewest_gpus(model, hw, training, above, opts)
    if n is None:
        return None
    try:
        best = search(model, hw, training, n, replace(opts, max_gpus=None, keep=1)).ranked
    except PlannerError:  # cannot happen: the same rules and memory found a fit at n
        return None
    return FitHint(n, best.take(np.array([0])))


def to_fit(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
           framework=None) -> FitHint | None:
    """What would make a layout on ``gpus`` GPUs fit: the best layout that fits on these GPUs,
    else the fewest GPUs on which one fits (FitHint; ``framework``: the profile whose rules
    apply); None when no count fits."""
    try:
        best = search(model, hw, training, gpus, SearchOptions(keep=1, framework=framework)).ranked
    except NoFitError as exc:
        return exc.to_fit
    except UsageError:  # no layout can use these GPUs at all (e.g. the batch): the next count
        return fit_hint(model, hw, training, gpus, SearchOptions(framework=framework))
    return FitHint(gpus, best.take(np.array([0])))


def _check_search_inputs(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec,
                         gpus: int | None, opts: SearchOptions, tokens: float | None) -> None:
    """UsageError for what no layout can change: keep < 1, the budget (objective.check_budget;
    the step-token floor where the time to train is reported), the GPU count or budget, the
    model under the framework, the precision on the GPU, offload without a host link."""
    if opts.keep < 1:
        raise UsageError(f"the search must keep at least one layout, got keep={opts.keep}")
    objective.check_budget(opts.objective, tokens, opts.price_per_gpu_hour, opts.deadline_s,
                           objective.step_tokens(training) if objective.reports_training(opts) else None)
    if opts.max_gpus is not None:
        # a budget, not a count: any positive integer (the grid keeps whole nodes within it, or
        # below one node a divisor of it), so 12 on 8-GPU nodes searches 1..8 as 4 does 1..4
        check_integers({"max_gpus": opts.max_gpus}, label=lambda _: "--max-gpus")
    elif gpus is None:
        raise UsageError("give a GPU count (--gpus) or a budget (--max-gpus)")
    else:
        check_inputs(gpus, hw)
    check_model(profile_for(training, opts.framework), model, training)
    check_precision(hw, training)
    check_offload_hardware(hw, opts)


def _deadline_error(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
                    passed: Scan, gpus: int, opts: SearchOptions, tokens: float) -> DeadlineError:
    """No fitting layout meets --deadline: the error names the fastest and its time to train."""
    fastest = evaluate(model, hw, training, as_scanned(grid, passed, np.array([passed.fastest_index])))
    layout = fastest.candidates.layout(0)
    budget = f"{tokens:.3g}".replace("e+", "e")
    within = "on" if opts.max_gpus is None else "on at most"
    return DeadlineError(
        f"no layout of {model.name} {within} {gpus:,} x {hw.gpu.name} trains {budget} tokens "
        f"within {fmt.seconds(opts.deadline_s)}: the fastest, {layout.short()} on {layout.gpus:,} "
        f"GPUs, is expected to take {fmt.seconds(passed.fastest_s)} with failures and checkpoints; "
        f"allow more GPUs or a later deadline", fastest=fastest, seconds=passed.fastest_s)
