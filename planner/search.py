"""Enumerate -> prune (divisibility, topology, fit) -> evaluate -> rank -> explain.

The space is a broadcast grid of numpy arrays (planner.grid), pruned by named masks
(space.constraint_masks) and evaluated by the vectorized cost model in blocks of about CHUNK
layouts; each block keeps only its best. No Python loop over candidates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import objective
from .cost import Estimate, evaluate
from .cost.collectives import nvlink_domain
from .errors import NoFitError, UsageError
from .grid import Grid, parallel_splits
from .scan import CHUNK, FIT_RULE, FLAT_COST, Scan, scan  # noqa: F401 (re-exported)
from .space import (LAYERS_RULE, TP_RULE, UNEVEN_RULE, Candidates, constraint_masks,
                    default_uneven_split, divisors, uneven_problem, uneven_splits,
                    uneven_vpp_options)
from .framework_spec import FrameworkProfile
from .specs import RECOMPUTE_CODES, HardwareProfile, Layout, ModelSpec, TrainingSpec
from .units import format_gib

MAX_GPUS = 1_000_000
CROSS_NODE_HINT = "pass --allow-cross-node-tp to let tp span nodes"


KEEP = 256  # fitting layouts kept, best first, for the tables, the runner-up and exports
TIE_LIMIT = 16  # exact ties at the keep cut re-evaluated for the tie rule: at most this x keep


@dataclass(frozen=True)
class SearchOptions:
    """Pins (a single allowed value) and bounds of the search dimensions; None = free.

    The distributed optimizer costs what ZeRO-1 costs (planner.cost.context), so unless pinned
    the search leaves it off and ZeRO-1 stands for both.

    ``objective``: throughput | time-to-train | cost (planner.objective); ``tokens`` overrides
    the model's training token budget; ``price_per_gpu_hour`` prices cost. ``max_gpus``: use at
    most this many GPUs in whole nodes, the search also picks the count. ``headroom_bytes`` /
    ``headroom_fraction``: memory per GPU that a layout must leave free beyond the framework's
    reserve. ``framework``: the profile whose rules apply (None: the catalog profile named by
    the TrainingSpec's ``framework``, megatron-core by default).
    """

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero_stage: int | None = None
    micro_batch_size: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    vpp: int | None = None
    cp: int | None = None
    distributed_optimizer: bool | None = None
    max_tp: int | None = None
    max_pp: int | None = None
    max_micro_batch_size: int = 64
    max_vpp: int = 16
    max_cp: int = 16
    allow_cross_node_tp: bool = False
    objective: str = "throughput"
    tokens: float | None = None
    price_per_gpu_hour: float | None = None
    max_gpus: int | None = None
    headroom_bytes: float = 0.0
    headroom_fraction: float = 0.0
    keep: int = KEEP
    framework: FrameworkProfile | None = None

    def __post_init__(self) -> None:
        for pin, bound, name in ((self.tp, self.max_tp, "tp"), (self.pp, self.max_pp, "pp"),
                                 (self.micro_batch_size, self.max_micro_batch_size, "micro-batch-size"),
                                 (self.vpp, self.max_vpp, "vpp"), (self.cp, self.max_cp, "cp")):
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


def _axis(values: np.ndarray, pin: int | None, upper: int | None = None) -> np.ndarray:
    if pin is not None:
        return np.array([pin], dtype=np.int64)
    if upper is not None:
        values = values[values <= upper]
    return values.astype(np.int64)


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
    ``max_micro_batch_size``; recompute none/selective/full; SP on/off; vpp: divisors of the
    layer count up to ``max_vpp``, and those an uneven split interleaves with
    (space.uneven_vpp_options); distributed optimizer off unless pinned.
    """
    budget = opts.max_gpus if opts.max_gpus is not None else gpus
    top = budget if opts.allow_cross_node_tp else min(nvlink_domain(hw), budget)
    tps = _axis(2 ** np.arange(0, int(np.log2(max(top, 1))) + 1), opts.tp, opts.max_tp)
    L = model.num_layers  # pp: divisors of L (even splits), powers of two up to L (uneven splits)
    pps = np.union1d(divisors(L), 2 ** np.arange(0, int(np.log2(L)) + 1))
    pps = _axis(np.array([p for p in pps.tolist() if L % p == 0 or uneven_splits(L, p)], dtype=np.int64),
                opts.pp, opts.max_pp)
    cps = _axis(2 ** np.arange(0, int(np.log2(max(opts.max_cp, 1))) + 1), opts.cp)
    if opts.max_gpus is None:
        split = parallel_splits(tps, pps, gpus=gpus, cps=cps, num_layers=L)
    else:
        dps = _axis(divisors(training.global_batch_size), opts.dp)
        split = parallel_splits(tps, pps, dps=dps, max_gpus=opts.max_gpus,
                                gpus_per_node=hw.gpus_per_node, cps=cps, num_layers=L)
    if opts.dp is not None:
        keep = split["dp"] == opts.dp
        split = {k: v[keep] for k, v in split.items()}
    knobs = dict(
        zero_stage=_axis(np.arange(4), opts.zero_stage),
        micro_batch_size=_axis(divisors(training.global_batch_size), opts.micro_batch_size,
                               opts.max_micro_batch_size),
        recompute=_axis(np.arange(3), None if opts.recompute is None else RECOMPUTE_CODES[opts.recompute]),
        sequence_parallel=np.array([False, True]) if opts.sequence_parallel is None
        else np.array([opts.sequence_parallel]),
        vpp=_axis(_vpp_values(L, pps, opts.max_vpp), opts.vpp, opts.max_vpp),
        distributed_optimizer=np.array([bool(opts.distributed_optimizer)]),
    )
    return Grid(split, knobs)


def enumerate_space(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                    opts: SearchOptions) -> Candidates:
    """The whole space of ``build_grid`` written out as flat Candidates (for tests and tools)."""
    grid = build_grid(model, hw, training, gpus, opts)
    return grid.flat(np.arange(grid.size))


def check_inputs(gpus: int, hw: HardwareProfile, flag: str = "--gpus") -> None:
    """Reject GPU counts that are non-positive, absurd, or not whole nodes (UsageError)."""
    if gpus <= 0:
        raise UsageError(f"{flag} must be positive, got {gpus}")
    if gpus > MAX_GPUS:
        raise UsageError(f"{flag} {gpus} is beyond what plan3d models (at most {MAX_GPUS:,})")
    g = hw.gpus_per_node
    if gpus > g and gpus % g:
        raise UsageError(f"{flag} {gpus} is not a whole number of {g}-GPU nodes of {hw.name}; "
                         f"use a multiple of {g}")


def search(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
           opts: SearchOptions = SearchOptions()) -> SearchResult:
    """Rank every valid layout that fits by the objective (exact ties: lower ZeRO stage, then less memory).

    ``gpus`` fixes the count; with ``opts.max_gpus`` (and gpus None) the count is searched too.
    The grid is evaluated in blocks of about CHUNK layouts; each block keeps its best ``keep``
    (with its ties), and the best overall are re-evaluated as flat arrays at the end. Raises UsageError when no layout can use
    these GPUs/batch at all (the rule that removed the last candidates is named), NoFitError
    when valid layouts exist but none fits in HBM (with the closest miss).
    """
    started = time.perf_counter()
    if opts.keep < 1:
        raise UsageError(f"the search must keep at least one layout, got keep={opts.keep}")
    tokens = opts.tokens if opts.tokens is not None else training.tokens
    objective.check(opts.objective, tokens if opts.objective != "throughput" else 1.0,
                    opts.price_per_gpu_hour)
    if opts.max_gpus is not None:
        check_inputs(opts.max_gpus, hw, "--max-gpus")
    elif gpus is None:
        raise UsageError("give a GPU count (--gpus) or a budget (--max-gpus)")
    else:
        check_inputs(gpus, hw)
    from .frameworks.rules import check_model, profile_for
    check_model(profile_for(training, opts.framework), model, training)
    grid = build_grid(model, hw, training, gpus, opts)
    if grid.size == 0:
        raise UsageError(_no_split_message(model, hw, gpus or opts.max_gpus, opts))
    usable = objective.usable_memory(float(hw.gpu.hbm_capacity), opts.headroom_bytes,
                                     opts.headroom_fraction)
    passed = scan(model, hw, training, grid, opts, usable, tokens)
    if passed.fitting == 0:
        if passed.miss_index < 0:
            rule = next((r for r, n in passed.alive_after.items() if n == 0), "")
            raise UsageError(_nothing_valid_message(model, training, gpus or opts.max_gpus, rule,
                                                    grid))
        miss = evaluate(model, hw, training, grid.flat(np.array([passed.miss_index])))
        raise NoFitError(_no_fit_message(model, hw, miss.candidates.layout(0).gpus, miss, usable),
                         closest=miss, usable=usable)
    scores, index = np.concatenate(passed.pool_score), np.concatenate(passed.pool_index)
    # The best ``keep`` and every exact tie at the cut (the pool's order depends on the scan's
    # path, the grid index does not), at most TIE_LIMIT x keep; the tie rule below picks.
    order = np.lexsort((index, -scores))
    cut = scores[order[min(opts.keep, scores.size) - 1]]
    chosen = order[scores[order] >= cut][:TIE_LIMIT * opts.keep]
    est = evaluate(model, hw, training, grid.flat(np.sort(index[chosen])))
    cand = est.candidates
    gpus_flat = np.asarray(cand.gpus, dtype=np.float64)
    if opts.objective != "throughput" or opts.tokens is not None:  # asked for: time, cost
        objective.annotate(est.throughput, gpus_flat, tokens, opts.price_per_gpu_hour)
    score = objective.score(opts.objective, est.throughput["tokens_per_s"], gpus_flat, tokens,
                            opts.price_per_gpu_hour)
    # Best first; exact ties: the lower ZeRO stage (less traffic), then less memory.
    order = np.lexsort((est.memory["total"], cand.zero_stage, -score))[:opts.keep]
    return SearchResult(ranked=est.take(order), enumerated=grid.size, pruned=passed.pruned,
                        fitting=passed.fitting, objective=opts.objective,
                        seconds=time.perf_counter() - started, usable=usable)


def _no_split_message(model: ModelSpec, hw: HardwareProfile, gpus: int, opts: SearchOptions) -> str:
    if None not in (opts.tp, opts.pp, opts.dp):
        n = opts.tp * opts.pp * opts.dp * (opts.cp or 1)
        if opts.cp is not None and n != gpus:
            return f"tp*cp*pp*dp = {n} but --gpus is {gpus}"
        if opts.cp is None and n != gpus:
            more = "" if n > gpus else f" (and no cp up to {opts.max_cp} makes up the rest)"
            return f"tp*pp*dp = {n} but --gpus is {gpus}{more}"
    if opts.dp is not None and gpus % opts.dp:
        return f"--dp {opts.dp} does not divide {gpus} GPUs"
    pins = ", ".join(f"{k}={getattr(opts, k)}" for k in ("tp", "cp", "pp", "dp")
                     if getattr(opts, k) is not None)
    pinned = f" with {pins}" if pins else ""
    return (f"no layout of {model.name} can use {gpus} GPUs{pinned}: tp (a power of two up to "
            f"{nvlink_domain(hw)}) times cp times pp (a divisor of {model.num_layers} layers) must "
            f"divide {gpus}")


def _nothing_valid_message(model: ModelSpec, training: TrainingSpec, gpus: int, rule: str,
                           grid: Grid) -> str:
    if rule == "global batch divisible by dp*micro_batch_size":
        dps = sorted(set(grid.split["dp"].tolist()))
        mbs = sorted(set(grid.knobs["micro_batch_size"].tolist()))
        if len(mbs) == 1 and any(training.global_batch_size % d == 0 for d in dps):
            return (f"--micro-batch-size {mbs[0]} does not divide the per-replica batch "
                    f"{training.global_batch_size}/dp for any dp in {{{', '.join(map(str, dps))}}}")
        return (f"global batch size {training.global_batch_size} is not divisible by any "
                f"data-parallel degree available on {gpus} GPUs (dp in {{{', '.join(map(str, dps))}}}); "
                f"choose a batch that is a multiple of one of them")
    hint = f" ({CROSS_NODE_HINT})" if rule == TP_RULE else ""
    return f"no layout of {model.name} on {gpus} GPUs passes the rule '{rule}'{hint}"


def _no_fit_message(model: ModelSpec, hw: HardwareProfile, gpus: int, miss: Estimate,
                    usable: float | None = None) -> str:
    """The closest miss, its largest memory term, and the remedy that targets that term.
    ``usable``: the bytes a layout may use (capacity less the --min-memory-headroom)."""
    gib = 2.0**30
    mem = {k: float(v[0]) for k, v in miss.memory.items()}
    total, cap = mem["total"], mem["capacity"]
    usable = cap if usable is None else usable
    of = f"{format_gib(cap)} GiB" if usable == cap else \
        f"{usable / gib:.1f} GiB usable (of {format_gib(cap)} GiB, after the headroom)"
    layout = miss.candidates.layout(0)
    states = mem["weights"] + mem["gradients"] + mem["optimizer"]
    if states >= mem["activations"]:
        # States shrink ~1/N with ZeRO-3 over more GPUs; round the need up to whole nodes.
        # Only a sane count is named: none when the rest alone fills the usable memory, or
        # when the count is beyond what plan3d models.
        g, room = hw.gpus_per_node, usable - (total - states)
        need = np.ceil(gpus * states / room / g) * g if room > 0 else np.inf
        count = f" (roughly {int(need):,} or more by memory alone)" if need <= MAX_GPUS else ""
        remedy = (f"model states ({states / gib:.1f} GiB) dominate: use more GPUs{count} or GPUs "
                  f"with more memory")
        if room <= 0:
            remedy = (f"even without model states, the rest ({(total - states) / gib:.1f} GiB) "
                      f"exceeds the usable {usable / gib:.1f} GiB: "
                      f"{'leave less headroom or ' if usable < cap else ''}use GPUs with more memory")
    else:
        remedy = (f"activations ({mem['activations'] / gib:.1f} GiB) dominate: use a shorter "
                  f"sequence, more tensor/pipeline parallelism (more GPUs) or GPUs with more memory")
    return (f"no layout of {model.name} fits on {gpus} x {hw.gpu.name}: the closest, "
            f"{layout.short()}, needs {total / gib:.1f} GiB of {of} per GPU "
            f"({(total - usable) / gib:.1f} GiB over); {remedy}")


def check_layout(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                 fields: dict[str, Any], allow_cross_node_tp: bool = False,
                 framework: FrameworkProfile | None = None) -> Layout:
    """The Layout of ``fields`` if it is valid for this model, system, batch and framework
    (UsageError if not).

    The checks ``plan3d estimate``, ``--plan`` and ``regress`` apply: whole nodes (search.check_inputs), tp*cp*pp*dp = gpus
    (dp defaults to gpus/(tp*cp*pp)), the Layout schema, what the framework can build
    (frameworks.rules.check_model) and every rule of space.constraint_masks (the framework's
    included), with the "tp within the NVLink domain" rule waived when ``allow_cross_node_tp``.
    """
    from .catalog import validate
    from .frameworks.rules import check_model, profile_for
    check_model(profile_for(training, framework), model, training)
    check_inputs(gpus, hw)
    data = dict(fields)
    tp, pp, cp = data.get("tp", 1), data.get("pp", 1), data.get("cp", 1)
    if (all(isinstance(x, int) and x > 0 for x in (tp, pp, cp))) and "dp" not in data:
        what = "tp*pp" if cp == 1 else "tp*cp*pp"
        if gpus % (tp * cp * pp):
            raise UsageError(f"{what} = {tp * cp * pp} does not divide {gpus} GPUs")
        data["dp"] = gpus // (tp * cp * pp)
    layout = validate(Layout, data, "layout")
    per_stage = model.num_layers // layout.pp
    if layout.first_stage_layers and model.num_layers % (layout.pp * layout.vpp) == 0 and \
            layout.first_stage_layers == layout.last_stage_layers == per_stage:
        layout = layout.model_copy(update=dict(first_stage_layers=0, last_stage_layers=0))  # even
    if layout.gpus != gpus:
        what = "tp*pp*dp" if layout.cp == 1 else "tp*cp*pp*dp"
        raise UsageError(f"layout {what} = {layout.gpus} but gpus is {gpus}")
    masks = constraint_masks(model, training, nvlink_domain(hw), Candidates.from_layouts([layout]),
                             allow_cross_node_tp, framework)
    broken = [rule for rule, ok in masks.items() if not np.all(ok)]
    if broken:
        hint = ""
        f, la = default_uneven_split(model.num_layers, layout.pp)
        if LAYERS_RULE in broken and f > 0 and _uneven_fits(
                model, training, hw, layout.model_copy(update=dict(first_stage_layers=f, last_stage_layers=la)),
                framework):
            hint = f" (an uneven split would do: first_stage_layers {f}, last_stage_layers {la})"
        if TP_RULE in broken:
            hint += f" ({CROSS_NODE_HINT})"
        if UNEVEN_RULE in broken:
            hint += f" ({uneven_problem(model.num_layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers, layout.vpp)})"
        raise UsageError(f"layout {layout.short()} breaks: {'; '.join(broken)}{hint}")
    return layout


def _uneven_fits(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile, layout: Layout,
                 framework: FrameworkProfile | None = None) -> bool:
    """Whether ``layout`` (with its uneven split filled in) passes every rule but the fit."""
    masks = constraint_masks(model, training, nvlink_domain(hw), Candidates.from_layouts([layout]),
                             True, framework)
    return all(bool(np.all(ok)) for ok in masks.values())
