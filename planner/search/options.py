"""The search's options: pins (one allowed value) and bounds of the layout axes, the objective,
the GPU count or budget, the memory headroom; and ``search_options``, the one check of options
given by a user (flags, a regress case, --why-not)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..cost.estimate import least_reserve
from ..errors import UsageError
from ..framework_spec import FrameworkProfile  # noqa: F401 (an option's type)
from ..inputs import Label, check_integers, check_numbers, flag
from ..layout.axes import AXES, BOUNDS
from .objective import OBJECTIVES, check_room, parse_headroom

KEEP = 256  # fitting layouts kept, best first, for the tables, the runner-up and exports
TIE_LIMIT = 16  # exact ties at the keep cut re-evaluated for the tie rule: at most this x keep


# The search's own options (beside each axis's pin and bound): name, type, default
_OPTIONS = (("allow_cross_node_tp", bool, False), ("objective", str, "throughput"),
            ("tokens", "float | None", None), ("price_per_gpu_hour", "float | None", None),
            ("max_gpus", "int | None", None), ("deadline_s", "float | None", None),
            ("headroom_bytes", float, 0.0), ("headroom_fraction", float, 0.0), ("keep", int, KEEP),
            ("framework", "FrameworkProfile | None", None), ("min_free", "float | None", None),
            ("strict_rank", bool, False))


def _check_bounds(self) -> None:
    for axis in AXES:
        pin = getattr(self, axis.name)
        bound = getattr(self, axis.bound) if axis.bound else None
        if pin is not None and bound is not None and pin > bound:
            raise UsageError(f"{axis.flag} {pin} contradicts {flag(axis.bound)} {bound}")


SearchOptions = dataclasses.make_dataclass(
    "SearchOptions",
    [(a.name, f"{a.kind.__name__} | None", None) for a in AXES]
    + [(a.bound, "int | None" if a.bound_default is None else int, a.bound_default)
       for a in AXES if a.bound] + list(_OPTIONS),
    frozen=True, namespace={"__post_init__": _check_bounds})
SearchOptions.__module__ = __name__
SearchOptions.__doc__ = """Pins (a single allowed value) and bounds of the search's axes; None = free.

A field per axis of the layout (layout.axes.AXES: its pin) and per axis bound (max_tp, max_pp,
max_micro_batch_size 64, max_vpp 16, max_cp 16, max_ep), then the search's own options. The
distributed optimizer costs what ZeRO-1 costs, so unless pinned the search leaves it off and
ZeRO-1 stands for both. A solved axis (the recompute or the offloaded layers) pinned is fixed
for every layout; free, the scan takes the least N that fits (cost.recompute, cost.offload:
full recompute of the first N layers of each model chunk; activations of N layers in host
memory where the framework offers it, pp 1 and no recomputation); 0: never. A pinned
first_stage_layers / last_stage_layers pins the pipeline split (an even split matches when
every stage holds that many layers).

``objective``: throughput | time-to-train | cost (search.objective); ``tokens`` overrides the
model's training token budget; ``price_per_gpu_hour`` prices cost; ``deadline_s``: keep only
layouts whose expected time to train (failures and checkpoints counted) is at most this many
seconds. ``max_gpus``: a budget of at most this many GPUs (any positive integer); the search
also picks the count, whole nodes within it or, below one node, a divisor of a node.
``headroom_bytes`` / ``headroom_fraction``: memory per GPU that a layout must leave free beyond
the framework's reserve. ``framework``: the profile whose rules apply (None: the catalog
profile named by the TrainingSpec's ``framework``, megatron-core by default). ``min_free``: the
share of HBM a layout should leave free to be preferred inside a tie group (search.ties; None:
the memory band's, search.bands.Bands.min_free); ``strict_rank``: rank by the objective alone,
with no tie groups (search.ties).
"""

_SEARCH_INTS = tuple(a.name for a in AXES if a.kind is int and a.minimum > 0 and a.maximum is None) \
    + tuple(a.bound for a in AXES if a.bound) + ("max_gpus", "keep")
_SEARCH_COUNTS = tuple(a.name for a in AXES if a.kind is int and a.minimum == 0 and a.maximum is None)
_SEARCH_BOOLS = tuple(a.name for a in AXES if a.kind is bool) + ("allow_cross_node_tp", "strict_rank")
# pins whose bound has a default: --cp 32 searches cp 32 without --max-cp
DEFAULT_BOUNDS = tuple((a.name, a.bound) for a in AXES if a.bound_default is not None)


def default_bound(bound: str) -> int:
    """The default of one of DEFAULT_BOUNDS' bounds (layout.axes: max_cp 16, ...)."""
    return BOUNDS[bound].bound_default


def raised_bounds(pins: dict[str, Any], bounds: dict[str, Any]) -> dict[str, int]:
    """{bound: pin} for each pin of DEFAULT_BOUNDS above its bound's default where ``bounds``
    does not set that bound (absent or None): `--cp 32` searches cp 32 without --max-cp; a
    bound the user set stays, and the pin then contradicts it."""
    out = {}
    for pin, bound in DEFAULT_BOUNDS:
        value = pins.get(pin)
        if bounds.get(bound) is None and isinstance(value, int) and \
                not isinstance(value, bool) and value > default_bound(bound):
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
    check_integers({k: given.get(k) for k in _SEARCH_COUNTS}, allow_zero=True, label=label)
    if model is not None:
        check_expert_pins(model, given, label)
    if given.get("recompute_num_layers") and given.get("recompute", "full") != "full":
        raise UsageError(f"{label('recompute_num_layers')} recomputes N layers per chunk in full: it "
                         f"needs {label('recompute')} full, got {given['recompute']}")
    check_numbers({k: given.get(k) for k in ("tokens", "price_per_gpu_hour")}, label=label)
    _check_choices(given, label)
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


def _check_choices(given: dict[str, Any], label: Label) -> None:
    """Bounded integers (ZeRO stage), choices (recompute) and the objective by name, booleans
    and a headroom given as numbers."""
    for a in AXES:
        value = given.get(a.name)
        if value is not None and a.kind is int and a.maximum is not None and \
                (isinstance(value, bool) or value not in range(a.minimum, a.maximum + 1)):
            values = list(map(str, range(a.minimum, a.maximum + 1)))
            raise UsageError(f"{label(a.name)} must be {', '.join(values[:-1])} or {values[-1]}, "
                             f"got {value!r}")
        if value is not None and a.kind is str and value not in a.choices:
            raise UsageError(f"{label(a.name)} must be {a.words}, got {value!r}")
    if given.get("objective") is not None and given["objective"] not in OBJECTIVES:
        raise UsageError(f"{label('objective')} must be one of {', '.join(OBJECTIVES)}, got "
                         f"{given['objective']!r}")
    for name in _SEARCH_BOOLS:
        if name in given and not isinstance(given[name], bool):
            raise UsageError(f"{label(name)} must be true or false, got {given[name]!r}")
    check_numbers({"headroom_bytes": given.get("headroom_bytes")}, allow_zero=True, label=label)
    free = given.get("min_free")
    if free is not None and (isinstance(free, bool) or not isinstance(free, (int, float))
                             or not 0 <= free < 1):
        raise UsageError(f"{label('min_free')} must be a share of HBM from 0 up to (not including) "
                         f"1, e.g. 0.1 or 10%, got {free!r}")
    if free is not None and given.get("strict_rank"):
        raise UsageError(f"{label('min_free')} picks inside the top tie group, which "
                         f"{label('strict_rank')} turns off: give one of them")
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
