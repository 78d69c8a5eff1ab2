"""Enumerate -> prune (divisibility, topology, fit) -> evaluate -> rank -> explain.

The space is a broadcast grid of numpy arrays (planner.grid), pruned by named masks
(space.constraint_masks) and evaluated by the vectorized cost model on sub-grids of about CHUNK
layouts that hold the layouts still in (planner.scan); each sub-grid keeps only its best. No
Python loop over candidates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import objective
from .cost import Estimate, evaluate
from .cost.collectives import nvlink_domain
from .cost.checkpoint import evaluate_checkpoint, unavailable
from .layout.degrees import SPLIT_DEGREES, split_problem
from .errors import DeadlineError, NoFitError, UsageError
from .grid import Grid, axis, expert_mesh, parallel_splits, pinned_split
from .inputs import MAX_GPUS, check_integers, gpu_count  # noqa: F401 (MAX_GPUS re-exported)
from .refusal import fit_hint, never_done_error, no_fit_message, no_split_reason, nothing_valid_message
from .scan import CHUNK, FIT_RULE, Scan, scan  # noqa: F401 (re-exported)
from .scan_layers import as_scanned
from .space import LAYERS_RULE, MOE_SP_RULE, TP_RULE, UNEVEN_RULE, constraint_masks, rules_broken
from .layout import Candidates
from .layout.split import (default_uneven_split, divisors, uneven_problem, uneven_splits, uneven_vpp_options)
from .framework_spec import FrameworkProfile
from .layout import RECOMPUTE_CODES, Layout
from .specs import HardwareProfile, ModelSpec, TrainingSpec

CROSS_NODE_HINT = "pass --allow-cross-node-tp to let tp span nodes"


KEEP = 256  # fitting layouts kept, best first, for the tables, the runner-up and exports
TIE_LIMIT = 16  # exact ties at the keep cut re-evaluated for the tie rule: at most this x keep


@dataclass(frozen=True)
class SearchOptions:
    """Pins (a single allowed value) and bounds of the search dimensions; None = free.

    The distributed optimizer costs what ZeRO-1 costs (planner.cost.context), so unless pinned
    the search leaves it off and ZeRO-1 stands for both.

    ``objective``: throughput | time-to-train | cost (planner.objective); ``tokens`` overrides
    the model's training token budget; ``price_per_gpu_hour`` prices cost; ``deadline_s``: keep
    only layouts whose expected time to train (failures and checkpoints counted) is at most
    this many seconds (planner.objective.score). ``max_gpus``: a budget
    of at most this many GPUs (any positive integer); the search also picks the count, whole
    nodes within it or, below one node, a divisor of a node. ``headroom_bytes`` /
    ``headroom_fraction``: memory per GPU that a layout must leave free beyond the framework's
    reserve. ``recompute_num_layers``: a pinned N of full recompute of the first N layers of
    each model chunk (None: with full recompute the search takes the least N that fits,
    cost.recompute.least_recompute_layers; 0: every layer). ``offload_layers``: a pinned N of
    layers whose activations go to host memory (None: where the framework offers activation
    offload, a layout with pp 1 and no recomputation that does not fit otherwise gets the least
    N that fits, cost.offload; 0: never). ``first_stage_layers`` / ``last_stage_layers``: a
    pinned pipeline split (an even split matches when every stage holds that many layers).
    ``framework``: the profile whose rules apply (None: the catalog profile named by
    the TrainingSpec's ``framework``, megatron-core by default).
    """

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero_stage: int | None = None
    micro_batch_size: int | None = None
    recompute: str | None = None
    recompute_num_layers: int | None = None
    offload_layers: int | None = None
    sequence_parallel: bool | None = None
    vpp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    distributed_optimizer: bool | None = None
    first_stage_layers: int | None = None  # with last_stage_layers: pins the pipeline split
    last_stage_layers: int | None = None
    max_tp: int | None = None
    max_pp: int | None = None
    max_micro_batch_size: int = 64
    max_vpp: int = 16
    max_cp: int = 16
    max_ep: int | None = None
    allow_cross_node_tp: bool = False
    objective: str = "throughput"
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    max_gpus: int | None = None
    deadline_s: float | None = None
    headroom_bytes: float = 0.0
    headroom_fraction: float = 0.0
    keep: int = KEEP
    framework: FrameworkProfile | None = None

    def __post_init__(self) -> None:
        for pin, bound, name in ((self.tp, self.max_tp, "tp"), (self.pp, self.max_pp, "pp"),
                                 (self.micro_batch_size, self.max_micro_batch_size, "micro-batch-size"),
                                 (self.vpp, self.max_vpp, "vpp"), (self.cp, self.max_cp, "cp"),
                                 (self.ep, self.max_ep, "ep")):
            if pin is not None and bound is not None and pin > bound:
                raise UsageError(f"--{name} {pin} contradicts --max-{name} {bound}")


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


def _vpp_values(num_layers: int, pps: np.ndarray, max_vpp: int) -> np.ndarray:
    """vpp axis: the divisors of the layer count (even splits), and every vpp with which an
    uneven split of a pp in ``pps`` interleaves (e.g. Llama-3 405B, 126 layers, pp=16 as
    7+..+7: vpp 2 and 4, (126 + 2)/16 = 8 per rank). Ascending int64."""
    values = set(divisors(num_layers).tolist())
    for pp in pps.tolist():
        for f, la in uneven_splits(num_layers, pp):
            values.update(uneven_vpp_options(num_layers, pp, f, la, max_vpp))
    return np.array(sorted(values), dtype=np.int64)


def build_grid(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
               opts: SearchOptions) -> Grid:
    """The space as a broadcast grid (planner.grid): parallel splits x knob axes.

    tp: powers of two up to the NVLink domain (up to the GPU count with --allow-cross-node-tp);
    cp: powers of two up to ``max_cp``; pp: divisors of the layer count, and powers of two up to
    it that have an uneven split; each pp with its even split (where pp divides the layers) and
    every uneven split space.uneven_splits lists (a pinned pp is taken as given); dp = gpus/(tp*cp*pp), or
    with ``max_gpus`` every divisor of the global batch (no other dp splits it) such that
    tp*cp*pp*dp is whole nodes within the budget;
    zero_stage 0-3; micro_batch_size: divisors of the global batch up to
    ``max_micro_batch_size``; recompute none/selective/selective+/full; SP on/off; vpp: divisors of the
    layer count up to ``max_vpp``, and those an uneven split interleaves with
    (space.uneven_vpp_options); distributed optimizer off unless pinned.
    """
    budget = opts.max_gpus if opts.max_gpus is not None else gpus
    top = budget if opts.allow_cross_node_tp else min(nvlink_domain(hw), budget)
    tps = axis(2 ** np.arange(0, int(np.log2(max(top, 1))) + 1), opts.tp, opts.max_tp)
    L = model.num_layers  # pp: divisors of L (even splits), powers of two up to L (uneven splits)
    pps = np.union1d(divisors(L), 2 ** np.arange(0, int(np.log2(L)) + 1))
    pps = axis(np.array([p for p in pps.tolist() if L % p == 0 or uneven_splits(L, p)], dtype=np.int64),
                opts.pp, opts.max_pp)
    cps = axis(2 ** np.arange(0, int(np.log2(max(opts.max_cp, 1))) + 1), opts.cp)
    if opts.max_gpus is None:
        split = parallel_splits(tps, pps, gpus=gpus, cps=cps, num_layers=L)
    else:
        dps = axis(divisors(training.global_batch_size), opts.dp)
        split = parallel_splits(tps, pps, dps=dps, max_gpus=opts.max_gpus,
                                gpus_per_node=hw.gpus_per_node, cps=cps, num_layers=L)
    if opts.dp is not None:
        keep = split["dp"] == opts.dp
        split = {k: v[keep] for k, v in split.items()}
    if opts.first_stage_layers is not None or opts.last_stage_layers is not None:
        split = pinned_split(split, L, opts.first_stage_layers, opts.last_stage_layers)
    if model.moe is not None:
        split = expert_mesh(split, model.moe.num_experts, opts.ep, opts.etp, opts.max_ep)
    knobs = dict(
        zero_stage=axis(np.arange(4), opts.zero_stage),
        micro_batch_size=axis(divisors(training.global_batch_size), opts.micro_batch_size,
                               opts.max_micro_batch_size),
        recompute=axis(np.arange(4), None if opts.recompute is None else RECOMPUTE_CODES[opts.recompute]),
        sequence_parallel=np.array([False, True]) if opts.sequence_parallel is None
        else np.array([opts.sequence_parallel]),
        vpp=axis(_vpp_values(L, pps, opts.max_vpp), opts.vpp, opts.max_vpp),
        distributed_optimizer=np.array([bool(opts.distributed_optimizer)]),
    )
    fixed = {name: value for name, value in (("recompute_num_layers", opts.recompute_num_layers),
                                             ("offload_layers", opts.offload_layers))
             if value is not None}
    return Grid(split, knobs, fixed)


def enumerate_space(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                    opts: SearchOptions) -> Candidates:
    """The whole space of ``build_grid`` written out as flat Candidates (for tests and tools)."""
    grid = build_grid(model, hw, training, gpus, opts)
    return grid.flat(np.arange(grid.size))


def check_inputs(gpus: int, hw: HardwareProfile, flag: str = "--gpus") -> None:
    """Reject GPU counts that are non-positive, absurd, or not whole nodes (UsageError;
    planner.inputs.gpu_count, the one check)."""
    gpu_count(gpus, hw, flag)


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
    if passed.fitting == 0:
        if passed.miss_index < 0:
            rule = next((r for r, n in passed.alive_after.items() if n == 0), "")
            raise UsageError(nothing_valid_message(model, training, gpus or opts.max_gpus, rule,
                                                    grid))
        flat = grid.flat(np.array([passed.miss_index]))
        if passed.miss_offload:
            flat = flat.replace(offload_layers=np.array([passed.miss_offload]))
        miss = evaluate(model, hw, training, flat)
        n = miss.candidates.layout(0).gpus
        hint = fit_hint(model, hw, training, opts.max_gpus or n, opts)
        raise NoFitError(no_fit_message(model, hw, n, miss, usable, hint), closest=miss,
                         usable=usable, to_fit=hint)
    if not any(part.size for part in passed.pool_score):  # none meets the deadline, or ever ends
        raise never_done_error(training, gpus or opts.max_gpus) if passed.fastest_index < 0 else \
            _deadline_error(model, hw, training, grid, passed, gpus or opts.max_gpus, opts, tokens)
    scores, index = np.concatenate(passed.pool_score), np.concatenate(passed.pool_index)
    # The best ``keep`` and every exact tie at the cut (the pool's order depends on the scan's
    # path, the grid index does not), at most TIE_LIMIT x keep; the tie rule below picks.
    order = np.lexsort((index, -scores))
    cut = scores[order[min(opts.keep, scores.size) - 1]]
    chosen = order[scores[order] >= cut][:TIE_LIMIT * opts.keep]
    at = np.sort(index[chosen])
    best = as_scanned(grid, passed, at)
    est = evaluate(model, hw, training, best)
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
    # Best first; exact ties: no activation offload (no host memory, no host-link traffic), the
    # lower ZeRO stage (less traffic), then less memory.
    order = np.lexsort((est.memory["total"], cand.zero_stage, np.asarray(cand.offload_layers) > 0,
                        -score))[:opts.keep]
    return SearchResult(ranked=est.take(order), enumerated=grid.size, pruned=passed.pruned,
                        fitting=passed.fitting, objective=opts.objective,
                        seconds=time.perf_counter() - started, usable=usable,
                        checkpoint=None if ck is None else ck.take(order))


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
    from .cost.offload import check_offload_hardware
    from .cost.precision import check_precision
    from .frameworks.rules import check_model, profile_for
    check_model(profile_for(training, opts.framework), model, training)
    check_precision(hw, training)
    check_offload_hardware(hw, opts.offload_layers or 0)


def _deadline_error(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
                    passed: Scan, gpus: int, opts: SearchOptions, tokens: float) -> DeadlineError:
    """No fitting layout meets --deadline: the error names the fastest and its time to train."""
    from .render.fmt import seconds as duration
    fastest = evaluate(model, hw, training, as_scanned(grid, passed, np.array([passed.fastest_index])))
    layout = fastest.candidates.layout(0)
    budget = f"{tokens:.3g}".replace("e+", "e")
    within = "on" if opts.max_gpus is None else "on at most"
    return DeadlineError(
        f"no layout of {model.name} {within} {gpus:,} x {hw.gpu.name} trains {budget} tokens "
        f"within {duration(opts.deadline_s)}: the fastest, {layout.short()} on {layout.gpus:,} "
        f"GPUs, is expected to take {duration(passed.fastest_s)} with failures and checkpoints; "
        f"allow more GPUs or a later deadline", fastest=fastest, seconds=passed.fastest_s)


def check_layout(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                 fields: dict[str, Any], allow_cross_node_tp: bool = False,
                 framework: FrameworkProfile | None = None) -> Layout:
    """The Layout of ``fields`` if it is valid for this model, system, batch and framework
    (UsageError if not).

    The checks ``plan3d estimate``, ``--plan`` and ``regress`` apply: whole nodes (search.check_inputs),
    tp*cp*pp*dp = gpus (tp, cp, pp default to 1, dp to gpus/(tp*cp*pp); an error names the
    product of the degrees given, degrees.split_problem), the Layout schema, what the framework
    can build (frameworks.rules.check_model) and every rule of space.constraint_masks (the
    framework's included), with the "tp within the NVLink domain" rule waived when
    ``allow_cross_node_tp``.
    """
    from .catalog import validate
    from .cost.precision import check_precision
    from .frameworks.rules import check_model, profile_for
    check_model(profile_for(training, framework), model, training)
    check_precision(hw, training)
    check_inputs(gpus, hw)
    data = dict(fields)
    given = {k: data[k] for k in SPLIT_DEGREES if data.get(k) is not None}
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given.values()):
        # the degrees not given are 1, except dp, which takes what the others leave
        problem = split_problem(gpus, given, exact="dp" in given)
        if problem:
            raise UsageError(problem)
        if "dp" not in given:
            data["dp"] = gpus // math.prod(given.values())
        data.update({k: 1 for k in ("tp", "cp", "pp") if k not in given})
    layout = validate(Layout, data, "layout")
    if layout.gpus != gpus:  # e.g. dp absent and a degree of another type: the schema passed it
        raise UsageError(split_problem(gpus, layout.model_dump(), exact=True))
    per_stage = model.num_layers // layout.pp
    if layout.first_stage_layers and model.num_layers % (layout.pp * layout.vpp) == 0 and \
            layout.first_stage_layers == layout.last_stage_layers == per_stage:
        layout = layout.model_copy(update=dict(first_stage_layers=0, last_stage_layers=0))  # even
    masks = constraint_masks(model, training, nvlink_domain(hw), Candidates.from_layouts([layout]),
                             allow_cross_node_tp, framework)
    broken = rules_broken(masks)
    if broken:
        hint = ""
        f, la = default_uneven_split(model.num_layers, layout.pp)
        if LAYERS_RULE in broken and f > 0 and _uneven_fits(
                model, training, hw, layout.model_copy(update=dict(first_stage_layers=f, last_stage_layers=la)),
                framework):
            hint = (f" (an uneven split would do: {f} layers on the first stage and {la} on the last,"
                    f" --first-stage-layers {f} --last-stage-layers {la})")
        if TP_RULE in broken:
            hint += f" ({CROSS_NODE_HINT})"
        rules = profile_for(training, framework)
        if MOE_SP_RULE in broken and not rules.rules.sequence_parallel:
            hint += f" ({rules.display} has no sequence parallelism: its MoE layouts need tp = 1)"
        if UNEVEN_RULE in broken:
            hint += f" ({uneven_problem(model.num_layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers, layout.vpp)})"
        raise UsageError(f"layout {layout.short()} breaks: {'; '.join(broken)}{hint}")
    from .cost.offload import check_host_memory
    check_host_memory(model, hw, training, Candidates.from_layouts([layout]))
    return layout


def _uneven_fits(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile, layout: Layout,
                 framework: FrameworkProfile | None = None) -> bool:
    """Whether ``layout`` (with its uneven split filled in) passes every rule but the fit."""
    masks = constraint_masks(model, training, nvlink_domain(hw), Candidates.from_layouts([layout]),
                             True, framework)
    return all(bool(np.all(ok)) for ok in masks.values())
