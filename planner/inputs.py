"""The one path that checks what a user gives plan3d, for every command.

search, sweep, estimate (flags and --plan), --why-not, regress (its cases), export / placement /
validate (plans) and accuracy / calibrate (the training of each run) check their inputs here, so
a value one command refuses is refused by all of them with the same words:

- ``check_numbers``: sizes, degrees, counts, prices, budgets: finite, > 0 (or >= 0), at most
  what plan3d models;
- ``gpu_count``: a GPU count is whole nodes beyond one node;
- ``training_spec`` / ``check_training``: a TrainingSpec from the model's defaults and what was
  given (sequence length and batch in range, no sequence beyond learned positions);
- ``search_options``: the pins and bounds of a search (types, ranges, ZeRO stage, pins within
  bounds, the memory headroom);
- the split of a layout over the GPUs: degrees.split_problem (the product that fails), and
  search.check_layout for one whole layout.

``label`` maps a field name to the words an error uses for it: the CLI flag (``--seq-length``,
the default) or a file's field (``training.seq_length`` in a regress case or a plan).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .errors import UsageError

MAX_GPUS = 1_000_000  # no GPU count, degree or count plan3d models is larger (int64 headroom)
MAX_SEQ_LENGTH = 10_000_000
MAX_BATCH = 100_000_000
# Training tokens: 1e16 is some 300x the largest published pre-training set (Qwen3: 36T); above
# it the times to train overflow the tables without meaning anything.
MAX_TOKENS = 1e16
_TOP = {"seq_length": MAX_SEQ_LENGTH, "global_batch_size": MAX_BATCH, "tokens": MAX_TOKENS}

Label = Callable[[str], str]


def flag(name: str) -> str:
    """The CLI flag of a field name: ``micro_batch_size`` -> ``--micro-batch-size``."""
    return f"--{name.replace('_', '-')}"


def field_of(prefix: str) -> Label:
    """A label for a file's fields: ``field_of('training')('seq_length')`` -> 'training.seq_length'."""
    return lambda name: f"{prefix}.{name}"


def check_numbers(values: dict[str, Any], allow_zero: bool = False, label: Label = flag) -> None:
    """UsageError unless each given value (None = not given) is a number, finite, > 0 (>= 0 with
    ``allow_zero``) and at most what plan3d models: MAX_SEQ_LENGTH for seq_length, MAX_BATCH for
    global_batch_size, MAX_TOKENS for tokens, MAX_GPUS for any other integer (a larger one would
    overflow the cost model's int64 arrays). Integers are shown with separators, other numbers
    short (-2e+12)."""
    for name, value in values.items():
        if value is None:
            continue
        shown = label(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UsageError(f"{shown} must be a number, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{shown} must be a finite number, got {value}")
        text = f"{value:,}" if isinstance(value, int) else f"{value:g}"
        if value < 0 or (value == 0 and not allow_zero):
            raise UsageError(f"{shown} must be {'0 or more' if allow_zero else 'positive'}, got {text}")
        top = _TOP.get(name, MAX_GPUS)
        if (isinstance(value, int) or name in _TOP) and value > top:
            limit = f"{top:,}" if isinstance(top, int) else f"{top:g}"
            raise UsageError(f"{shown} {text} is beyond what plan3d models (at most {limit})")


def check_integers(values: dict[str, Any], allow_zero: bool = False, label: Label = flag) -> None:
    """check_numbers, and each given value must be a whole number (an int, not 8.0 or '8')."""
    for name, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise UsageError(f"{label(name)} must be a whole number, got {value!r}")
    check_numbers(values, allow_zero, label)


def gpu_count(gpus: Any, hw, label: str = "--gpus") -> int:
    """``gpus`` if it is a count plan3d can plan for on ``hw``: a positive integer, at most
    MAX_GPUS, a whole number of nodes beyond one node (UsageError otherwise)."""
    check_integers({"gpus": gpus}, label=lambda _: label)
    g = hw.gpus_per_node
    if gpus > g and gpus % g:
        raise UsageError(f"{label} {gpus} is not a whole number of {g}-GPU nodes of {hw.name}; "
                         f"use a multiple of {g}")
    return gpus


def training_spec(model, given: dict[str, Any] | None = None, label: Label = flag,
                  where: str = "training"):
    """The TrainingSpec of ``model``'s training defaults overridden by ``given`` (TrainingSpec
    fields; None values are not given), checked: sequence length and global batch positive
    integers in range, tokens positive, the schema (catalog.validate, ``where`` names it), and
    check_training. UsageError naming the field with ``label``."""
    from .catalog import validate
    from .specs import TrainingSpec
    given = {k: v for k, v in (given or {}).items() if v is not None}
    check_integers({k: given.get(k) for k in ("seq_length", "global_batch_size")}, label=label)
    check_numbers({"tokens": given.get("tokens")}, label=label)
    defaults = {"seq_length": model.training.seq_length,
                "global_batch_size": model.training.global_batch_size,
                "tokens": model.training.tokens}
    spec = validate(TrainingSpec, {**defaults, **given}, where)
    check_training(model, spec, label)
    return spec


def check_training(model, training, label: Label = flag) -> None:
    """UsageError when ``training`` cannot train ``model``: a sequence longer than the model's
    learned position embeddings (a model with RoPE or ALiBi has no such limit)."""
    limit = model.max_position_embeddings
    seq = training.seq_length
    if model.position_embedding == "learned" and limit and seq > limit:
        raise UsageError(f"{label('seq_length')} {seq} exceeds the {limit} learned position "
                         f"embeddings of {model.name}")


_SEARCH_INTS = ("tp", "pp", "dp", "micro_batch_size", "vpp", "cp", "ep", "etp", "max_ep", "max_tp", "max_pp",
                "max_micro_batch_size", "max_vpp", "max_cp", "max_gpus", "keep")
_SEARCH_BOOLS = ("sequence_parallel", "distributed_optimizer", "allow_cross_node_tp")


# pins whose bound has a default (search.SearchOptions): --cp 32 searches cp 32 without --max-cp
DEFAULT_BOUNDS = (("micro_batch_size", "max_micro_batch_size"), ("vpp", "max_vpp"), ("cp", "max_cp"))


def default_bound(bound: str) -> int:
    """The default of one of DEFAULT_BOUNDS' bounds (search.SearchOptions: max_cp 16, ...)."""
    from .search import SearchOptions
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
    import dataclasses

    from .cost.estimate import least_reserve
    from .objective import OBJECTIVES, check_room, parse_headroom
    from .search import SearchOptions
    from .layout import RECOMPUTE_CODES
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
