"""Enumerate -> prune (divisibility, topology, fit) -> evaluate -> rank -> explain.

The space is a broadcast grid of numpy arrays (search.grid), pruned by named masks
(search.rules.constraint_masks) and evaluated by the vectorized cost model on sub-grids of about
CHUNK
layouts that hold the layouts still in (search.scan); each sub-grid keeps only its best. No
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
from ..cost.offload import check_offload_hardware
from ..cost.precision import check_precision
from ..errors import DeadlineError, NoFitError, PlannerError, UsageError
from ..inputs import check_integers
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import objective
from .check import check_inputs
from .framework_rules import check_model, profile_for
from .grid import Grid, build_grid
from .least_layers import as_scanned
from .options import KEEP, TIE_LIMIT, SearchOptions
from .refusal import (FitHint, fewest_gpus, never_done_error, no_fit_message, no_split_reason,
                      nothing_valid_message)
from .scan import scan
from .state import Scan
from . import bands as B
from . import ties
from .ties import Prefer



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
    # tie groups (search.ties): how many of ``ranked``'s first layouts form the top tie group
    # (1: none, or a strict ranking), the row of the best score in ``ranked`` (-1: not kept),
    # the tie band (a log ratio), the --min-free share, the layouts' preference features
    # (ties.Features, in ranked order), the preferences that
    # decided the pick over the best score, and the bands (search.bands.Bands)
    tie_group: int = 1
    fastest: int = 0
    tie_band: float = 0.0
    min_free: float = 0.0
    features: Any = None
    deciding: tuple = ()
    strict: bool = True
    bands: Any = None
    reference: int = 0  # the row the top tie group formed around (ties.TieOrder.reference)


def search(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
           opts: SearchOptions = SearchOptions()) -> SearchResult:
    """Rank every valid layout that fits by the objective (exact ties: no offload, lower ZeRO stage, then less memory).

    ``gpus`` fixes the count; with ``opts.max_gpus`` (and gpus None) the count is searched too.
    The grid is evaluated on sub-grids of about CHUNK layouts (search.scan); each keeps its
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
    bands = B.shipped()
    min_free = bands.min_free() if opts.min_free is None else float(opts.min_free)
    prefer = None if opts.strict_rank else \
        Prefer(float(hw.gpu.hbm_capacity) * (1.0 - min_free), bands, opts.framework)
    # tie groups are drawn from at least KEEP layouts, so the pick does not depend on ``keep``
    inner = opts if opts.strict_rank else replace(opts, keep=max(opts.keep, KEEP))
    passed = scan(model, hw, training, grid, inner, usable, tokens, prefer)
    _refuse_none_kept(model, hw, training, gpus, opts, grid, passed, usable, tokens)
    est, ck, tied = _rank(model, hw, training, grid, passed, inner, tokens, bands, min_free)
    order = tied.order[:opts.keep]
    moved = opts.keep > 1 and tied.fastest not in order
    if moved:  # a long tie group: the fastest is still shown, last
        order = np.concatenate([order[:-1], [tied.fastest]])
    fastest = np.flatnonzero(order == tied.fastest)
    reference = np.flatnonzero(order == tied.reference)
    return SearchResult(ranked=est.take(order), enumerated=grid.size, pruned=passed.pruned,
                        fitting=passed.fitting, objective=opts.objective,
                        seconds=time.perf_counter() - started, usable=usable,
                        checkpoint=None if ck is None else ck.take(order),
                        tie_group=min(tied.group, order.size - moved),
                        fastest=int(fastest[0]) if fastest.size else -1, tie_band=tied.tie,
                        min_free=min_free,
                        features=tied.features.take(order),
                        deciding=tied.deciding, strict=tied.strict, bands=bands,
                        reference=int(reference[0]) if reference.size else 0)


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
          opts: SearchOptions, tokens: float | None, bands, min_free: float) -> tuple:
    """(estimate of the kept layouts, their checkpoint estimate or None, their ties.TieOrder):
    the pool's best ``keep`` and every exact tie at the cut (the pool's order depends on the
    scan's path, the grid index does not), at most TIE_LIMIT x keep, with the best ``keep`` of
    the scan's roomy and preferred pools (search.ties; none with a strict ranking), re-evaluated as flat arrays and
    scored by the objective; ordered by ties.tie_order: the top tie group by preference, then
    the rest by score (a strict ranking: by score; exact ties to no activation offload (no host
    memory, no host-link traffic), the lower ZeRO stage (less traffic), then less memory)."""
    chosen = _best(passed.pool_score, passed.pool_index, opts.keep)
    if not opts.strict_rank:
        chosen = np.concatenate([chosen, *(_best(ps, pi, opts.keep) for ps, pi in passed.pools.values())])
    at = np.unique(chosen)
    est = evaluate(model, hw, training, as_scanned(grid, passed, at))
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
    feats = ties.features(model, hw, training, est, min_free, bands, opts.framework)
    return est, ck, ties.tie_order(est, score, at, feats, bands.tie(), min_free, opts.strict_rank)


def _best(pool_score: list, pool_index: list, keep: int) -> np.ndarray:
    """Grid indices of a pool's best ``keep`` and every exact tie at the cut, at most
    TIE_LIMIT x keep (ordered by score, then grid index)."""
    scores, index = np.concatenate(pool_score), np.concatenate(pool_index)
    order = np.lexsort((index, -scores))
    cut = scores[order[min(keep, scores.size) - 1]]
    return index[order[scores[order] >= cut][:TIE_LIMIT * keep]]


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
