"""The search's options: pins (one allowed value) and bounds of the layout axes, the objective,
the GPU count or budget, the memory headroom; and ``search_options``, the one check of options
given by a user (flags, a regress case, --why-not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dataclasses

from ..cost.estimate import least_reserve
from ..errors import UsageError
from ..framework_spec import FrameworkProfile
from ..inputs import Label, check_integers, check_numbers, flag
from ..layout import RECOMPUTE_CODES
from .objective import OBJECTIVES, check_room, parse_headroom

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




_SEARCH_INTS = ("tp", "pp", "dp", "micro_batch_size", "vpp", "cp", "ep", "etp", "max_ep", "max_tp", "max_pp",
                "max_micro_batch_size", "max_vpp", "max_cp", "max_gpus", "keep")
_SEARCH_BOOLS = ("sequence_parallel", "distributed_optimizer", "allow_cross_node_tp")


# pins whose bound has a default (search.SearchOptions): --cp 32 searches cp 32 without --max-cp
DEFAULT_BOUNDS = (("micro_batch_size", "max_micro_batch_size"), ("vpp", "max_vpp"), ("cp", "max_cp"))


def default_bound(bound: str) -> int:
    """The default of one of DEFAULT_BOUNDS' bounds (search.SearchOptions: max_cp 16, ...)."""
    return SearchOptions.__dataclass_fields__[bound].default


def raised_bounds(pins: dict[str, Any], bounds: dict[str, Any]) -> dict[str, int]:
    """{bound: pin} for each pin of DEFAULT_BOUNDS above its bound's default where ``bounds``
    does not set that bound (absent or None): `--cp 32` searches cp 32 without --max-cp; a
    bound the user set stays, and the pin then contradicts it."""
    out = {}
    for pin, bound in DEFAULT_BOUNDS:
        default = default_bound(bound)
        value = pins.get(pin)
        if bounds.get(bound) is None and isinstance(value, int) and \
                not isinstance(value, bool) and value > default:
            out[bound] = value
    return out


def search_options(hw, training, given: dict[str, Any], headroom: str | None = None,
                   label: Label = flag, model=None):
    """search.SearchOptions of ``given`` (its field names; None = not given), checked: degrees,
    bounds and counts positive integers, ZeRO stage 0-3, recompute and objective by name,
    flags booleans, tokens and price positive, each pin within its bound, and the memory
    headroom (``headroom`` as the user wrote it, '4GiB' or '10%', or ``headroom_bytes`` /
    ``headroom_fraction`` given) leaving more than the least reserve of ``training``'s framework
    on ``hw``'s GPU (cost.estimate.least_reserve), and, given ``model``, the expert pins
    (check_expert_pins). UsageError naming the field with ``label``."""
    given = {k: v for k, v in given.items() if v is not None}
    given.update(raised_bounds(given, given))
    known = {f.name for f in dataclasses.fields(SearchOptions)}
    for name in given:
        if name not in known:
            raise UsageError(f"unknown search option {label(name)} (known: "
                             f"{', '.join(label(k) for k in sorted(known))})")
    check_integers({k: given.get(k) for k in _SEARCH_INTS}, label=label)
    check_integers({k: given.get(k) for k in ("recompute_num_layers", "offload_layers")},
                   allow_zero=True, label=label)
    if model is not None:
        check_expert_pins(model, given, label)
    if given.get("recompute_num_layers") and given.get("recompute", "full") != "full":
        raise UsageError(f"{label('recompute_num_layers')} recomputes N layers per chunk in full: it "
                         f"needs {label('recompute')} full, got {given['recompute']}")
    check_numbers({k: given.get(k) for k in ("tokens", "price_per_gpu_hour")}, label=label)
    _check_choices(given, label, RECOMPUTE_CODES, OBJECTIVES)
    if headroom is not None:
        given["headroom_bytes"], given["headroom_fraction"] = parse_headroom(headroom)
    shown = f"{label('min_memory_headroom')} {headroom.strip()}" if headroom is not None \
        else _headroom_text(given, label)
    check_room(shown, given.get("headroom_bytes", 0.0), given.get("headroom_fraction", 0.0),
               float(hw.gpu.hbm_capacity), least_reserve(hw, training), hw.gpu.name)
    return SearchOptions(**given)


def check_expert_pins(model, given: dict[str, Any], label: Label = flag) -> None:
    """UsageError when ``given`` pins ep / etp / max_ep above 1 for a model without experts (the
    pin would do nothing), or pins an ep that does not divide the model's routed experts
    (Megatron-Core places num_experts / ep experts on each EP rank: --num-experts must be a
    multiple of --expert-model-parallel-size: megatron/training/arguments.py L1655-1658,
    transformer_config.py L1595-1596, as cited in reference/moe.md)."""
    pinned = [k for k in ("ep", "etp", "max_ep") if given.get(k) not in (None, 1)]
    if pinned and model.moe is None:
        raise UsageError(f"{', '.join(label(k) for k in pinned)} "
                         f"{'applies' if len(pinned) == 1 else 'apply'} to mixture-of-experts "
                         f"models; {model.name} has no experts")
    ep = given.get("ep")
    if ep is not None and model.moe is not None and model.moe.num_experts % ep:
        raise UsageError(f"{label('ep')} {ep} does not divide the {model.moe.num_experts} experts "
                         f"of {model.name}: each EP rank holds num_experts/ep experts")


def _check_choices(given: dict[str, Any], label: Label, recompute, objectives) -> None:
    """ZeRO stage, recompute, objective, booleans and a headroom given as numbers."""
    zero = given.get("zero_stage")
    if zero is not None and (isinstance(zero, bool) or zero not in (0, 1, 2, 3)):
        raise UsageError(f"{label('zero_stage')} must be 0, 1, 2 or 3, got {zero!r}")
    if given.get("recompute") is not None and given["recompute"] not in recompute:
        raise UsageError(f"{label('recompute')} must be none, selective or full, got "
                         f"{given['recompute']!r}")
    if given.get("objective") is not None and given["objective"] not in objectives:
        raise UsageError(f"{label('objective')} must be one of {', '.join(objectives)}, got "
                         f"{given['objective']!r}")
    for name in _SEARCH_BOOLS:
        if name in given and not isinstance(given[name], bool):
            raise UsageError(f"{label(name)} must be true or false, got {given[name]!r}")
    check_numbers({"headroom_bytes": given.get("headroom_bytes")}, allow_zero=True, label=label)
    fraction = given.get("headroom_fraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 <= fraction < 1):
        raise UsageError(f"{label('headroom_fraction')} must be a number from 0 up to (not "
                         f"including) 1, got {fraction!r}")


def _headroom_text(given: dict[str, Any], label: Label) -> str:
    """How a headroom given as numbers is named in the no-room error."""
    if given.get("headroom_fraction"):
        return f"{label('headroom_fraction')} {given['headroom_fraction']:g}"
    return f"{label('headroom_bytes')} {given.get('headroom_bytes', 0):g}"
