"""Enumerate -> prune (divisibility, topology, fit) -> evaluate -> rank -> explain.

The space is built as numpy arrays (space.product), pruned by named masks (space.constraint_masks)
and evaluated in one vectorized call of the cost model. No Python loop over candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cost import Estimate, evaluate
from .errors import NoFitError, UsageError
from .space import Candidates, constraint_masks, divisors, product
from .specs import RECOMPUTE_CODES, HardwareProfile, Layout, ModelSpec, TrainingSpec

MAX_GPUS = 1_000_000
FIT_RULE = "does not fit in HBM"


@dataclass(frozen=True)
class SearchOptions:
    """Pins (a single allowed value) and bounds of the search dimensions; None = free."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    zero_stage: int | None = None
    micro_batch_size: int | None = None
    recompute: str | None = None
    sequence_parallel: bool | None = None
    vpp: int | None = None
    max_tp: int | None = None
    max_pp: int | None = None
    max_micro_batch_size: int = 64
    max_vpp: int = 16
    allow_cross_node_tp: bool = False

    def __post_init__(self) -> None:
        for pin, bound, name in ((self.tp, self.max_tp, "tp"), (self.pp, self.max_pp, "pp"),
                                 (self.micro_batch_size, self.max_micro_batch_size, "micro-batch-size"),
                                 (self.vpp, self.max_vpp, "vpp")):
            if pin is not None and bound is not None and pin > bound:
                raise UsageError(f"--{name} {pin} contradicts --max-{name} {bound}")


@dataclass
class SearchResult:
    """Fitting layouts ranked best first, and what was pruned (rule -> count, in order applied)."""

    ranked: Estimate
    enumerated: int
    pruned: dict[str, int] = field(default_factory=dict)
    closest_miss: Estimate | None = None


def _axis(values: np.ndarray, pin: int | None, upper: int | None = None) -> np.ndarray:
    if pin is not None:
        return np.array([pin], dtype=np.int64)
    if upper is not None:
        values = values[values <= upper]
    return values.astype(np.int64)


def enumerate_space(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                    opts: SearchOptions) -> Candidates:
    """All combinations of the free dimensions with dp = gpus / (tp * pp) integral.

    tp: powers of two up to the node (up to gpus with --allow-cross-node-tp); pp: divisors of the
    layer count; zero_stage 0-3; micro_batch_size: divisors of the global batch up to
    ``max_micro_batch_size``; recompute none/selective/full; SP on/off; vpp: divisors of the
    layer count up to ``max_vpp``.
    """
    top = gpus if opts.allow_cross_node_tp else min(hw.gpus_per_node, gpus)
    tps = 2 ** np.arange(0, int(np.log2(max(top, 1))) + 1)
    axes = dict(
        tp=_axis(tps, opts.tp, opts.max_tp),
        pp=_axis(divisors(model.num_layers), opts.pp, opts.max_pp),
        zero_stage=_axis(np.arange(4), opts.zero_stage),
        micro_batch_size=_axis(divisors(training.global_batch_size), opts.micro_batch_size,
                               opts.max_micro_batch_size),
        recompute=_axis(np.arange(3), None if opts.recompute is None else RECOMPUTE_CODES[opts.recompute]),
        sequence_parallel=np.array([False, True]) if opts.sequence_parallel is None
        else np.array([opts.sequence_parallel]),
        vpp=_axis(divisors(model.num_layers), opts.vpp, opts.max_vpp),
    )
    grid = product(**axes)
    keep = gpus % (grid["tp"] * grid["pp"]) == 0
    grid = {k: v[keep] for k, v in grid.items()}
    dp = gpus // (grid["tp"] * grid["pp"])
    if opts.dp is not None:
        keep = dp == opts.dp
        grid = {k: v[keep] for k, v in grid.items()}
        dp = dp[keep]
    return Candidates(dp=dp, **grid)


def check_inputs(gpus: int, hw: HardwareProfile) -> None:
    """Reject GPU counts that are non-positive, absurd, or not whole nodes (UsageError)."""
    if gpus <= 0:
        raise UsageError(f"--gpus must be positive, got {gpus}")
    if gpus > MAX_GPUS:
        raise UsageError(f"--gpus {gpus} is beyond what plan3d models (at most {MAX_GPUS:,})")
    g = hw.gpus_per_node
    if gpus > g and gpus % g:
        raise UsageError(f"--gpus {gpus} is not a whole number of {g}-GPU nodes of {hw.name}; "
                         f"use a multiple of {g}")


def search(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
           opts: SearchOptions = SearchOptions()) -> SearchResult:
    """Rank every valid layout that fits, by predicted tokens/s (ties: less memory first).

    Raises UsageError when no layout can use these GPUs/batch at all (the rule that removed the
    last candidates is named), NoFitError when valid layouts exist but none fits in HBM (with
    the closest miss and what would make it fit).
    """
    check_inputs(gpus, hw)
    space = enumerate_space(model, hw, training, gpus, opts)
    enumerated = len(space)
    pruned: dict[str, int] = {}
    if enumerated == 0:
        raise UsageError(_no_split_message(model, hw, gpus, opts))
    alive = np.ones(enumerated, dtype=bool)
    last_rule = ""
    for rule, ok in constraint_masks(model, training, hw.gpus_per_node, space,
                                     opts.allow_cross_node_tp).items():
        removed = alive & ~ok
        pruned[rule] = int(removed.sum())
        if removed.any() and not (alive & ok).any():
            last_rule = rule
        alive &= ok
    if not alive.any():
        raise UsageError(_nothing_valid_message(model, training, gpus, last_rule, space))
    est = evaluate(model, hw, training, space.take(alive))
    fits = est.fits
    pruned[FIT_RULE] = int((~fits).sum())
    if not fits.any():
        over = est.memory["total"] - est.memory["capacity"]
        miss = est.take(np.array([int(np.argmin(over))]))
        raise NoFitError(_no_fit_message(model, hw, gpus, miss))
    ok = est.take(fits)
    # Best throughput first; exact ties: the lower ZeRO stage (less traffic), then less memory.
    order = np.lexsort((ok.memory["total"], ok.candidates.zero_stage, -ok.throughput["tokens_per_s"]))
    return SearchResult(ranked=ok.take(order), enumerated=enumerated, pruned=pruned)


def _no_split_message(model: ModelSpec, hw: HardwareProfile, gpus: int, opts: SearchOptions) -> str:
    if None not in (opts.tp, opts.pp, opts.dp) and opts.tp * opts.pp * opts.dp != gpus:
        return f"tp*pp*dp = {opts.tp * opts.pp * opts.dp} but --gpus is {gpus}"
    if opts.dp is not None and gpus % opts.dp:
        return f"--dp {opts.dp} does not divide {gpus} GPUs"
    pins = ", ".join(f"{k}={getattr(opts, k)}" for k in ("tp", "pp", "dp") if getattr(opts, k) is not None)
    pinned = f" with {pins}" if pins else ""
    return (f"no layout of {model.name} can use {gpus} GPUs{pinned}: tp (a power of two up to "
            f"{hw.gpus_per_node}) times pp (a divisor of {model.num_layers} layers) must divide {gpus}")


def _nothing_valid_message(model: ModelSpec, training: TrainingSpec, gpus: int, rule: str,
                           space: Candidates) -> str:
    if rule == "global batch divisible by dp*micro_batch_size":
        dps = sorted(set(space.dp.tolist()))
        mbs = sorted(set(space.micro_batch_size.tolist()))
        if len(mbs) == 1 and any(training.global_batch_size % d == 0 for d in dps):
            return (f"--micro-batch-size {mbs[0]} does not divide the per-replica batch "
                    f"{training.global_batch_size}/dp for any dp in {{{', '.join(map(str, dps))}}}")
        return (f"global batch size {training.global_batch_size} is not divisible by any "
                f"data-parallel degree available on {gpus} GPUs (dp in {{{', '.join(map(str, dps))}}}); "
                f"choose a batch that is a multiple of one of them")
    return f"no layout of {model.name} on {gpus} GPUs passes the rule '{rule}'"


def _no_fit_message(model: ModelSpec, hw: HardwareProfile, gpus: int, miss: Estimate) -> str:
    """The closest miss, its largest memory term, and the remedy that targets that term."""
    gib = 2.0**30
    mem = {k: float(v[0]) for k, v in miss.memory.items()}
    total, cap = mem["total"], mem["capacity"]
    layout = miss.candidates.layout(0)
    states = mem["weights"] + mem["gradients"] + mem["optimizer"]
    if states >= mem["activations"]:
        # States shrink ~1/N with ZeRO-3 over more GPUs; round the need up to whole nodes.
        g = hw.gpus_per_node
        need = int(np.ceil(gpus * states / max(cap - (total - states), 1.0) / g) * g)
        remedy = (f"model states ({states / gib:.1f} GiB) dominate: use more GPUs (roughly "
                  f"{need:,} or more by memory alone) or GPUs with more memory")
    else:
        remedy = (f"activations ({mem['activations'] / gib:.1f} GiB) dominate: use a shorter "
                  f"sequence, more tensor/pipeline parallelism (more GPUs) or GPUs with more memory")
    return (f"no layout of {model.name} fits on {gpus} x {hw.gpu.name}: the closest, "
            f"{layout.short()}, needs {total / gib:.1f} GiB of {cap / gib:.0f} GiB per GPU "
            f"({(total - cap) / gib:.1f} GiB over); {remedy}")


def check_layout(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                 fields: dict[str, Any], allow_cross_node_tp: bool = False) -> Layout:
    """The Layout of ``fields`` if it is valid for this model, system and batch (UsageError if not).

    The checks ``plan3d estimate``, ``--plan`` and ``regress`` apply: whole nodes (search.check_inputs), tp*pp*dp = gpus
    (dp defaults to gpus/(tp*pp)), the Layout schema, and every rule of space.constraint_masks,
    with the "tp within a node" rule waived when ``allow_cross_node_tp``.
    """
    from .catalog import validate
    check_inputs(gpus, hw)
    data = dict(fields)
    tp, pp = data.get("tp", 1), data.get("pp", 1)
    if isinstance(tp, int) and isinstance(pp, int) and tp > 0 and pp > 0 and "dp" not in data:
        if gpus % (tp * pp):
            raise UsageError(f"tp*pp = {tp * pp} does not divide {gpus} GPUs")
        data["dp"] = gpus // (tp * pp)
    layout = validate(Layout, data, "layout")
    if layout.gpus != gpus:
        raise UsageError(f"layout tp*pp*dp = {layout.gpus} but gpus is {gpus}")
    masks = constraint_masks(model, training, hw.gpus_per_node, Candidates.from_layouts([layout]),
                             allow_cross_node_tp)
    broken = [rule for rule, ok in masks.items() if not ok[0]]
    if broken:
        raise UsageError(f"layout {layout.short()} breaks: {'; '.join(broken)}")
    return layout
