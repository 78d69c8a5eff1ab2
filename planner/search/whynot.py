"""``--why-not "tp=4,pp=16"``: judge a user's (partial) layout against the search's winner.

Unspecified dimensions take their best completion (a search with the given ones pinned). The
verdict is one of: ``invalid`` (the rules it breaks, each named as the search names it),
``no-fit`` (the closest completion and how far over HBM it is), ``winner`` (it is the best), or
``slower`` (by how much, and which step-time terms account for the gap).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np

from ..cost import Estimate
from ..errors import NoFitError, UsageError
from ..explain import term_deltas
from ..inputs import MAX_GPUS
from .options import SearchOptions
from .grid import build_grid
from .run import search
from ..cost.collectives import nvlink_domain
from .. import fmt
from .refusal import no_split_reason
from ..layout.split import (MAX_EDGE_SHORTFALL, default_uneven_split, uneven_problem, uneven_vpp_options)
from .rules import UNEVEN_RULE, constraint_masks
from ..layout import RECOMPUTE_CODES
from ..specs import HardwareProfile, ModelSpec, TrainingSpec

_KEYS = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp", "ep": "ep", "etp": "etp",
         "distopt": "distributed_optimizer",
         "distributed_optimizer": "distributed_optimizer", "zero": "zero_stage", "zero_stage": "zero_stage",
         "mbs": "micro_batch_size", "micro_batch_size": "micro_batch_size", "vpp": "vpp",
         "recompute": "recompute", "sp": "sequence_parallel", "sequence_parallel": "sequence_parallel",
         "recompute_num_layers": "recompute_num_layers", "offload": "offload_layers",
         "offload_layers": "offload_layers"}
_SHORT = {"distributed_optimizer": "distopt", "zero_stage": "zero", "micro_batch_size": "mbs",
          "sequence_parallel": "sp", "offload_layers": "offload"}  # field -> the key as written in --why-not
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


_SPLIT_PRINTED = re.compile(r"\(\s*(\d+)\s*\+\s*(?:\.\.\s*\+\s*)?(\d+)\s+layers\s*\)")
_SPLIT_VALUE = re.compile(r"^(\d+)\+(?:\.\.\+)?(\d+)$")


def _put(pins: dict[str, object], name: str, value: object, text: str) -> None:
    """Record pin ``name`` (None: only check it is new); UsageError if given twice."""
    if name in pins:
        raise UsageError(f"--why-not: {_SHORT.get(name, name)} is given twice in {text!r}; "
                         "give each dimension once")
    if value is not None:
        pins[name] = value


def _layers_count(value: str, what: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_GPUS:
        raise UsageError(f"--why-not: {what} needs a whole number of layers, got {value!r}")
    return int(value)


def _split_pins(pins: dict[str, object], value: str, text: str) -> None:
    """first_stage_layers and last_stage_layers of ``split=F+..+L`` (or F+L)."""
    match = _SPLIT_VALUE.match(value.replace(" ", ""))
    if not match:
        raise UsageError(f"--why-not: split is the first and last stages' layers, e.g. "
                         f"split=12+..+10 (or 32+29 on two stages), got {value!r}")
    first, last = (_layers_count(v, "split") for v in match.groups())
    if first == 0 or last == 0:
        raise UsageError(f"--why-not: a split's stages hold at least one layer, got {value!r}")
    _put(pins, "first_stage_layers", first, text)
    _put(pins, "last_stage_layers", last, text)


def parse_layout(text: str) -> dict[str, object]:
    """``"tp=4,pp=16,sp=1,recompute=full"`` -> SearchOptions pins. UsageError on anything odd.

    Keys: tp, cp, pp, dp, zero (zero_stage), distopt (distributed_optimizer: 1/0), mbs
    (micro_batch_size), vpp, recompute (none/selective/selective+/full, or full:N: the first N
    layers of each model chunk), recompute_num_layers (full recompute of the first N layers of
    each model chunk; 0 = every layer), offload (offload_layers: activations of N layers in host
    memory; 0 = none), sp (sequence_parallel: 1/0), split (an uneven pipeline split, the first
    and last stages' layers: 12+..+10, or 32+29 on two stages). A layout as the tables print it
    reads too: ``tp=1 cp=4 pp=4 (12+..+10 layers) dp=4 ep=8 zero=1 mbs=1 vpp=1 recompute=full:43
    sp`` (a bare sp or distopt is 1).
    """
    pins: dict[str, object] = {}
    spaced = re.sub(r"\s*=\s*", "=", text.strip())  # "tp = 8" reads as "tp=8"
    spaced = _SPLIT_PRINTED.sub(r"split=\1+\2", spaced)  # "(12+..+10 layers)" as printed
    for part in filter(None, (p.strip() for p in spaced.replace(" ", ",").split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        if not sep and key in ("sp", "distopt"):  # as the tables print them
            sep, value = "=", "1"
        if key == "split" and sep:
            _split_pins(pins, value, text)
            continue
        if key == "recompute" and value.startswith("full:"):
            _put(pins, "recompute_num_layers", _layers_count(value[5:], "recompute=full:N"), text)
            value = "full"
        if not sep or key not in _KEYS or not value:
            raise UsageError(f"--why-not: cannot read {part!r}; write e.g. 'tp=4,pp=16' "
                             f"(keys: {', '.join(sorted(set(_KEYS)))})")
        name = _KEYS[key]
        _put(pins, name, None, text)
        if name == "recompute":
            if value not in RECOMPUTE_CODES:
                raise UsageError(f"--why-not: recompute must be none, selective, selective+ or full, got {value!r}")
            pins[name] = value
        elif name in ("sequence_parallel", "distributed_optimizer"):
            if value not in _TRUE | _FALSE:
                raise UsageError(f"--why-not: {key} must be 1, true, yes or on (or 0, false, no, "
                                 f"off), got {value!r}")
            pins[name] = value in _TRUE
        else:
            zero_ok = name in ("zero_stage", "recompute_num_layers", "offload_layers")
            if not (value.isascii() and value.isdigit()) or int(value) <= 0 and not zero_ok:
                kind = "an integer, 0 or more" if zero_ok else "a positive integer"
                raise UsageError(f"--why-not: {key} must be {kind}, got {value!r}")
            if int(value) > MAX_GPUS:
                raise UsageError(f"--why-not: {key} {int(value):,} is beyond what plan3d models "
                                 f"(at most {MAX_GPUS:,})")
            pins[name] = int(value)
            if name == "zero_stage" and pins[name] > 3:
                raise UsageError(f"--why-not: zero must be 0, 1, 2 or 3, got {value!r}")
    if not pins:
        raise UsageError("--why-not needs at least one dimension, e.g. 'tp=4,pp=16'")
    return pins


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

    def to_dict(self) -> dict:
        """JSON with the same keys for every verdict (None where one does not apply): layout,
        status, reasons, completion and winner (estimate objects; a completion that does not
        fit has no times), slower_by, time_deltas_s, to_fit (refusal.FitHint.to_dict: the
        fewest GPUs on which a completion fits, for a no-fit verdict)."""
        slower = self.winner is not None
        return {"layout": self.text, "status": self.status, "reasons": self.reasons,
                "completion": None if self.completion is None else
                self.completion.to_dict(0, usable=self.usable),
                "winner": None if self.winner is None else self.winner.to_dict(0),
                "slower_by": self.slower_by if slower else None,
                "time_deltas_s": dict(self.deltas) if slower else None,
                "to_fit": None if self.to_fit is None else self.to_fit.to_dict()}


def broken_rules(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
                 opts: SearchOptions) -> list[str]:
    """Rules that NO completion of the pinned layout passes (each checked on its own); if each
    can be met alone but not together, the rule after which nothing remained. [] when valid."""
    grid = build_grid(model, hw, training, gpus, opts)
    if grid.size == 0:
        free = replace(opts, first_stage_layers=None, last_stage_layers=None)
        if free != opts and build_grid(model, hw, training, gpus, free).size:
            return [_split_reason(model, opts)]
        return [no_split_reason(model, hw, gpus, opts)]
    masks = constraint_masks(model, training, nvlink_domain(hw), grid.candidates(),
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
    if opts.offload_layers:  # a pinned offload within the host memory and the host link's room
        from ..cost.offload import check_host_memory, offload_runs
        runs = np.broadcast_to(offload_runs(model, hw, training, grid.candidates()), grid.shape)
        if not (runs & alive).any():
            try:
                check_host_memory(model, hw, training, grid.flat(np.flatnonzero(alive.ravel())[:1]))
            except UsageError as exc:
                return [str(exc)]
    return []


def _split_reason(model: ModelSpec, opts: SearchOptions) -> str:
    """Why no layout has the pinned pipeline split: on a pinned pp, space.uneven_problem's
    reason, else that the search does not try it (space.uneven_splits); without pp, that no pp
    the search tries splits the layers so."""
    first, last = opts.first_stage_layers, opts.last_stage_layers
    shown = f"split {first}{'+' if opts.pp == 2 else '+..+'}{last}"
    if not opts.pp:
        return f"{shown}: no pp the search tries splits the {model.num_layers} layers so"
    problem = uneven_problem(model.num_layers, opts.pp, first, last, opts.vpp or 1)
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


_FLAGS = {"sequence_parallel": ("--sequence-parallel", "--no-sequence-parallel"),
          "distributed_optimizer": ("--distributed-optimizer", "--no-distributed-optimizer")}


def _flag(name: str, value: object) -> str:
    """The search flag that pins ``name`` to ``value``, as the user would have typed it."""
    if name in _FLAGS:
        return _FLAGS[name][0 if value else 1]
    return f"--{name.replace('_', '-')} {value}"


# the fields Layout.short() always prints: a layout with all of them is a printed one, whose
# omitted fields have their printed defaults (no sp, cp 1, ...), not free values
_PRINTED = {"tp", "pp", "dp", "zero_stage", "micro_batch_size", "vpp", "recompute"}


def printed_defaults(model: ModelSpec, pins: dict[str, object]) -> dict[str, object]:
    """``pins`` with the fields Layout.short() leaves out when they are at their default set
    to it, when ``pins`` has every field it always prints (a row pasted from a table): sp and
    distopt off, cp 1, ep and etp 1 (MoE), no offload, recompute=full every layer, and the
    even split where pp divides the layers. Otherwise ``pins`` as given (the rest is free)."""
    if not _PRINTED <= set(pins):
        return pins
    out = dict(pins)
    defaults = {"cp": 1, "sequence_parallel": False, "distributed_optimizer": False,
                "offload_layers": 0}
    if model.moe is not None:
        defaults.update(ep=1, etp=1)
    if out["recompute"] == "full":
        defaults["recompute_num_layers"] = 0
    pp = int(out["pp"])
    if pp > 1 and model.num_layers % pp == 0:
        defaults["first_stage_layers"] = defaults["last_stage_layers"] = model.num_layers // pp
    for name, value in defaults.items():
        out.setdefault(name, value)
    return out


def check_pins(pins: dict[str, object], opts: SearchOptions) -> None:
    """UsageError naming both when a --why-not value contradicts a search pin or lies above a
    search bound (--max-tp ...): the search never considers that layout, so there is nothing
    to compare it with."""
    for name, value in pins.items():
        pinned = getattr(opts, name)
        if pinned is not None and pinned != value:
            shown = int(value) if isinstance(value, bool) else value
            raise UsageError(f"--why-not {_SHORT.get(name, name)}={shown} contradicts the search pin "
                             f"{_flag(name, pinned)}; drop one of them")
        bound = getattr(opts, f"max_{name}", None)
        if bound is not None and value > bound:
            raise UsageError(f"--why-not {_SHORT.get(name, name)}={value} is above the search bound "
                             f"{_flag('max_' + name, bound)}; raise the bound or pick a smaller value")


def why_not(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
            opts: SearchOptions, text: str, currency: str = "USD") -> WhyNot:
    """Evaluate the layout ``text`` (unspecified dims: best completion) against the winner.

    ``currency``: the code of ``opts.price_per_gpu_hour``, named with costs in the reasons.
    UsageError when it contradicts a pin of ``opts`` (planner.whynot.check_pins), pins ep / etp on
    a model without experts or an ep that does not divide its experts (inputs.check_expert_pins),
    or is malformed.
    """
    from .options import check_expert_pins
    pins = printed_defaults(model, parse_layout(text))
    check_expert_pins(model, pins, label=lambda name: f"--why-not: {_SHORT.get(name, name)}")
    from .options import DEFAULT_BOUNDS, default_bound, raised_bounds
    # a bound at its default was not given (or given as the default): a pin above it raises it
    given = {b: getattr(opts, b) for _, b in DEFAULT_BOUNDS if getattr(opts, b) != default_bound(b)}
    opts = replace(opts, **raised_bounds(pins, given))
    check_pins(pins, opts)
    pinned = replace(opts, **pins)
    broken = broken_rules(model, hw, training, gpus, pinned)
    if broken:
        return WhyNot(text, "invalid", [_uneven_detail(model, pinned, rule) for rule in broken])
    try:
        mine = search(model, hw, training, gpus, pinned).ranked.take(np.array([0]))
    except NoFitError as exc:
        try:  # only if other layouts fit is the verdict about this one alone
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
    best = search(model, hw, training, gpus, opts).ranked.take(np.array([0]))
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
        return WhyNot(text, "winner", [], mine, best)
    digits = max(2, min(6, 3 - int(np.floor(np.log10(max(min(t_mine, t_best), 1e-9))))))
    reasons = [f"its best completion runs {tps_mine:,.0f} tokens/s against the winner's "
               f"{tps_best:,.0f} ({t_mine:.{digits}f} s vs {t_best:.{digits}f} s per step)"]
    if opts.objective != "throughput":
        unit = fmt.seconds if key == "time_to_train_s" else (lambda v: fmt.money(v, currency))
        reasons.append(f"by {opts.objective}: {unit(float(mine.throughput[key][0]))} against "
                       f"{unit(float(best.throughput[key][0]))} on {mine.candidates.layout(0).gpus} "
                       f"vs {best.candidates.layout(0).gpus} GPUs")
    return WhyNot(text, "slower", reasons, mine, best, tps_best / tps_mine - 1.0,
                  term_deltas(mine, 0, best, 0))


def _uneven_detail(model: ModelSpec, opts: SearchOptions, rule: str) -> str:
    """``rule``, with the split and the vpp values that work when it is the uneven-split rule
    and pp is pinned."""
    if rule != UNEVEN_RULE or not opts.pp:
        return rule
    if opts.first_stage_layers is not None and opts.last_stage_layers is not None:
        problem = uneven_problem(model.num_layers, opts.pp, opts.first_stage_layers,
                                 opts.last_stage_layers, opts.vpp or 1)
        if problem:
            return f"{rule} ({problem})"
    first, last = default_uneven_split(model.num_layers, opts.pp)
    if first <= 0:
        return rule
    works = uneven_vpp_options(model.num_layers, opts.pp, first, last, opts.max_vpp)
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
