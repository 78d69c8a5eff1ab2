"""``--why-not "tp=4,pp=16"``: judge a user's (partial) layout against the search's winner.

Unspecified dimensions take their best completion (a search with the given ones pinned). The
verdict is one of: ``invalid`` (the rules it breaks, each named as the search names it),
``no-fit`` (the closest completion and how far over HBM it is), ``winner`` (it is the best), or
``slower`` (by how much, and which step-time terms account for the gap).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..cost import Estimate
from ..errors import NoFitError, UsageError
from ..explain import term_deltas
from .options import SearchOptions
from .grid import build_grid
from .run import search
from .. import fmt
from .refusal import no_split_reason
from ..layout.split import (MAX_EDGE_SHORTFALL, default_uneven_split, uneven_problem, uneven_vpp_options)
from .framework_rules import UNEVEN_INTERLEAVE_RULE, UNEVEN_LAYOUT_RULE, profile_for
from .rules import UNEVEN_RULE, constraint_masks
from ..layout import BY_NAME
from ..layout.parse import key_of, parse_layout, pin_flag, printed_defaults
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from ..cost.offload import check_host_memory, offload_runs
from .options import DEFAULT_BOUNDS, check_expert_pins, default_bound, raised_bounds

@dataclass
class WhyNot:
    """The verdict on one (partial) layout. Times in seconds, memory in bytes."""

    text: str
    status: str  # invalid | no-fit | winner | slower
    reasons: list[str] = field(default_factory=list)
    completion: Estimate | None = None
    winner: Estimate | None = None
    slower_by: float = 0.0  # fraction: score(winner)/score(completion) - 1 for throughput
    deltas: list[tuple[str, float]] = field(default_factory=list)
    usable: float | None = None  # bytes a layout may use per GPU (HBM less the headroom)
    to_fit: object = None  # refusal.FitHint: the fewest GPUs on which a completion fits
    tie_band: float | None = None  # the search's tie band (a fraction); None: a strict ranking
    fastest: object = None  # the search's fastest layout (Layout) where the tie pick is not it
    fastest_by: float | None = None  # how much faster it is than the pick (fraction of tokens/s)

    def to_dict(self) -> dict:
        """JSON with the same keys for every verdict (None where one does not apply): layout,
        status, reasons, completion and winner (estimate objects; a completion that does not
        fit has no times), slower_by, time_deltas_s, to_fit (refusal.FitHint.to_dict: the
        fewest GPUs on which a completion fits, for a no-fit verdict), tie_band (the search's,
        a fraction of the step; null with --strict-rank: a slower completion within it ties),
        fastest and fastest_by (the search's fastest layout and how much faster it is than the
        pick, where the tie preferences picked another; else null)."""
        slower = self.winner is not None
        return {"layout": self.text, "status": self.status, "reasons": self.reasons,
                "completion": None if self.completion is None else
                self.completion.to_dict(0, usable=self.usable),
                "winner": None if self.winner is None else self.winner.to_dict(0),
                "slower_by": self.slower_by if slower else None,
                "time_deltas_s": dict(self.deltas) if slower else None,
                "to_fit": None if self.to_fit is None else self.to_fit.to_dict(),
                "tie_band": self.tie_band,
                "fastest": None if self.fastest is None else self.fastest.short(),
                "fastest_by": self.fastest_by}


def broken_rules(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
                 opts: SearchOptions) -> list[str]:
    """Rules that NO completion of the pinned layout passes (each checked on its own); if each
    can be met alone but not together, the rule after which nothing remained. [] when valid."""
    grid = build_grid(model, hw, training, gpus, opts)
    if grid.size == 0:
        free = replace(opts, first_stage_layers=None, last_stage_layers=None)
        if free != opts and build_grid(model, hw, training, gpus, free).size:
            return [_split_reason(model, training, opts)]
        return [no_split_reason(model, hw, gpus, opts)]
    masks = constraint_masks(model, training, hw, grid.candidates(),
                             opts.allow_cross_node_tp, opts.framework)
    broken = [rule for rule, ok in masks.items() if not np.any(ok)]
    if broken:
        return broken
    rules = list(masks.items())
    prefix = [np.ones(grid.shape, dtype=bool)]  # prefix[i]: every rule before rule i passes
    for i, (rule, ok) in enumerate(rules):
        alive = prefix[-1] & np.broadcast_to(ok, grid.shape)
        if not alive.any():
            return [_together(rule, ok, rules[:i], prefix, grid.shape)]
        prefix.append(alive)
    # a pinned activation offload within the host memory and the host link's room
    runs = np.broadcast_to(offload_runs(model, hw, training, grid.candidates()), grid.shape)
    if not (runs & alive).any():
        try:
            check_host_memory(model, hw, training, grid.flat(np.flatnonzero(alive.ravel())[:1]))
        except UsageError as exc:
            return [str(exc)]
    return []


def _split_reason(model: ModelSpec, training: TrainingSpec, opts: SearchOptions) -> str:
    """Why no layout has the pinned pipeline split: on a pinned pp, space.uneven_problem's
    reason, else that the search does not try it (space.uneven_splits); without pp, that no pp
    the search tries splits the layers so."""
    first, last = opts.first_stage_layers, opts.last_stage_layers
    shown = f"split {first}{'+' if opts.pp == 2 else '+..+'}{last}"
    if not opts.pp:
        return f"{shown}: no pp the search tries splits the {model.num_layers} layers so"
    problem = uneven_problem(model.num_layers, opts.pp, first, last, opts.vpp or 1,
                             _form(training, opts))
    tried = (f"the two stages at most {MAX_EDGE_SHORTFALL} layers apart" if opts.pp == 2 else
             f"each edge stage at most {MAX_EDGE_SHORTFALL} layers lighter than a middle one")
    return f"{shown} on pp={opts.pp}: " + (problem or f"not among the splits the search tries ({tried})")


def _together(rule: str, ok, before: list, prefix: list, shape: tuple) -> str:
    """``rule`` (mask ``ok``) with the earlier rules it cannot be met together with: each
    earlier rule j without which some layout passes ``rule`` and every other earlier rule
    (prefix[j] & the rules after j), e.g. "DeepSpeed has no sequence parallelism, together
    with: MoE with tp > 1 needs sequence parallelism"."""
    target = np.broadcast_to(ok, shape)
    suffix = np.ones(shape, dtype=bool)  # the rules after j (and before ``rule``) pass
    culprits = []
    for j in range(len(before) - 1, -1, -1):
        if (prefix[j] & suffix & target).any():
            culprits.append(before[j][0])
        suffix = suffix & np.broadcast_to(before[j][1], shape)
    if not culprits:
        return f"{rule} (together with the rules before it)"
    return f"{rule}, together with: {'; '.join(reversed(culprits))}"


def check_pins(pins: dict[str, object], opts: SearchOptions) -> None:
    """UsageError naming both when a --why-not value contradicts a search pin or lies above a
    search bound (--max-tp ...): the search never considers that layout, so there is nothing
    to compare it with."""
    for name, value in pins.items():
        pinned = getattr(opts, name)
        if pinned is not None and pinned != value:
            shown = int(value) if isinstance(value, bool) else value
            raise UsageError(f"--why-not {key_of(name)}={shown} contradicts the search pin "
                             f"{pin_flag(name, pinned)}; drop one of them")
        bound = BY_NAME[name].bound
        limit = getattr(opts, bound) if bound else None
        if limit is not None and value > limit:
            raise UsageError(f"--why-not {key_of(name)}={value} is above the search bound "
                             f"{pin_flag(bound, limit)}; raise the bound or pick a smaller value")


def why_not(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
            opts: SearchOptions, text: str, currency: str = "USD") -> WhyNot:
    """Evaluate the layout ``text`` (unspecified dims: best completion) against the winner.

    ``currency``: the code of ``opts.price_per_gpu_hour``, named with costs in the reasons.
    UsageError when it contradicts a pin of ``opts`` (planner.whynot.check_pins), pins ep / etp on
    a model without experts or an ep that does not divide its experts (inputs.check_expert_pins),
    or is malformed.
    """
    pins = printed_defaults(model, parse_layout(text))
    check_expert_pins(model, pins, label=lambda name: f"--why-not: {key_of(name)}")
    # a bound at its default was not given (or given as the default): a pin above it raises it
    given = {b: getattr(opts, b) for _, b in DEFAULT_BOUNDS if getattr(opts, b) != default_bound(b)}
    opts = replace(opts, **raised_bounds(pins, given))
    check_pins(pins, opts)
    pinned = replace(opts, **pins)
    broken = broken_rules(model, hw, training, gpus, pinned)
    if broken:
        return WhyNot(text, "invalid", [_uneven_detail(model, training, pinned, rule) for rule in broken])
    try:
        mine = search(model, hw, training, gpus, pinned).ranked.take(np.array([0]))
    except NoFitError as exc:
        return _no_fit(model, hw, training, gpus, opts, text, exc)
    found = search(model, hw, training, gpus, opts)
    best = found.ranked.take(np.array([0]))
    band = None if found.strict else float(np.expm1(found.tie_band))
    fastest, fastest_by = _fastest(found)
    t_mine, t_best = float(mine.time["step"][0]), float(best.time["step"][0])
    tps_mine = float(mine.throughput["tokens_per_s"][0])
    tps_best = float(best.throughput["tokens_per_s"][0])
    same = mine.candidates.layout(0) == best.candidates.layout(0)
    key = {"throughput": "tokens_per_s", "time-to-train": "time_to_train_s", "cost": "cost"}
    key = key[opts.objective]
    if opts.objective == "throughput":
        beaten = tps_mine < tps_best
    else:  # lower is better; a tie in cost or time is not a loss
        beaten = float(mine.throughput[key][0]) > float(best.throughput[key][0])
    if same or not beaten:
        return WhyNot(text, "winner", [], mine, best, tie_band=band, fastest=fastest,
                      fastest_by=fastest_by)
    digits = max(2, min(6, 3 - int(np.floor(np.log10(max(min(t_mine, t_best), 1e-9))))))
    reasons = [f"its best completion runs {tps_mine:,.0f} tokens/s against the winner's "
               f"{tps_best:,.0f} ({t_mine:.{digits}f} s vs {t_best:.{digits}f} s per step)"]
    if opts.objective != "throughput":
        unit = fmt.seconds if key == "time_to_train_s" else (lambda v: fmt.money(v, currency))
        reasons.append(f"by {opts.objective}: {unit(float(mine.throughput[key][0]))} against "
                       f"{unit(float(best.throughput[key][0]))} on {mine.candidates.layout(0).gpus} "
                       f"vs {best.candidates.layout(0).gpus} GPUs")
    if band is not None:
        # the group forms around its reference layout: a completion within the tie band of it
        # ties (the group's members widened by unchecked terms aside)
        t_ref = float(found.ranked.time["step"][found.reference])
        if np.log(t_mine / t_ref) <= found.tie_band + 1e-12:
            reasons.append(f"within plan3d's {fmt.percent(band)} tie band of the top tie "
                           "group's reference: a tie within its error, the winner picked by "
                           "the tie preferences")
    return WhyNot(text, "slower", reasons, mine, best, tps_best / tps_mine - 1.0,
                  term_deltas(mine, 0, best, 0), tie_band=band, fastest=fastest,
                  fastest_by=fastest_by)


def _fastest(found) -> tuple:
    """(the fastest layout, how much faster than the pick: a fraction of tokens/s) of a
    search result where the tie preferences picked another; (None, None) where they did not."""
    j = found.fastest
    if found.strict or j <= 0:
        return None, None
    tps = found.ranked.throughput["tokens_per_s"]
    return found.ranked.candidates.layout(j), float(tps[j] / tps[0] - 1.0)


def _no_fit(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
            opts: SearchOptions, text: str, exc: NoFitError) -> WhyNot:
    """The verdict on a layout none of whose completions fits (``exc``, the pinned search's):
    about this layout alone where other layouts fit, else what fits at all with its values."""
    try:
        search(model, hw, training, gpus, opts)
    except NoFitError as none:  # nothing fits at all: say so, and what fits with the pins
        reasons = [str(none)]
        if exc.to_fit is None and none.to_fit is not None:
            reasons.append("with these values no count of GPUs has a completion that fits")
        elif exc.to_fit is not None and (none.to_fit is None or _layout(none.to_fit) !=
                                         _layout(exc.to_fit)):
            reasons.append(f"with these values, {exc.to_fit.text()}")
        return WhyNot(text, "no-fit", reasons, usable=exc.usable, to_fit=exc.to_fit)
    return WhyNot(text, "no-fit", [_closest_miss(exc)], exc.closest, usable=exc.usable,
                  to_fit=exc.to_fit)


def _form(training: TrainingSpec, opts: SearchOptions) -> str:
    """How the framework interleaves an uneven split (layout.split.UNEVEN_FORMS)."""
    return profile_for(training, opts.framework).rules.uneven_split


def _uneven_detail(model: ModelSpec, training: TrainingSpec, opts: SearchOptions, rule: str) -> str:
    """``rule``, with the split and the vpp values that work when it is the uneven-split rule
    and pp is pinned."""
    if not (rule == UNEVEN_RULE or rule.endswith((UNEVEN_INTERLEAVE_RULE, UNEVEN_LAYOUT_RULE))) \
            or not opts.pp:
        return rule
    form = _form(training, opts)
    if opts.first_stage_layers is not None and opts.last_stage_layers is not None:
        problem = uneven_problem(model.num_layers, opts.pp, opts.first_stage_layers,
                                 opts.last_stage_layers, opts.vpp or 1, form)
        if problem:
            return f"{rule} ({problem})"
    first, last = default_uneven_split(model.num_layers, opts.pp)
    if first <= 0:
        return rule
    works = uneven_vpp_options(model.num_layers, opts.pp, first, last, opts.max_vpp or 16, form)
    return (f"{rule} ({model.num_layers} layers on pp={opts.pp} split {first}+..+{last}; "
            f"vpp {', '.join(map(str, works))} would do)")


def _layout(hint):
    return hint.estimate.candidates.layout(0)


def _closest_miss(exc: NoFitError) -> str:
    """'its closest completion, <layout>, needs X GiB of Y GiB per GPU (Z GiB over), while
    other layouts fit; with these values, <the fewest GPUs on which one fits>', from the
    search's NoFitError (closest miss, usable bytes, to_fit)."""
    total = float(exc.closest.memory["total"][0])
    cap = float(exc.closest.memory["capacity"][0])
    of = f"{fmt.capacity(cap)} GiB" if exc.usable == cap else \
        f"{fmt.gib(exc.usable)} usable (of {fmt.capacity(cap)} GiB, after the headroom)"
    hint = f"; with these values, {exc.to_fit.text()}" if exc.to_fit is not None else \
        "; with these values no count of GPUs has a completion that fits"
    return (f"its closest completion, {exc.closest.candidates.layout(0).short()}, needs "
            f"{fmt.gib(total)} of {of} per GPU ({fmt.gib(total - exc.usable)} over), "
            f"while other layouts fit{hint}")
