"""A layout as text, read back: ``tp=4,pp=16,sp=1`` or a row as the tables print it
(``tp=1 cp=4 pp=4 (12+..+10 layers) dp=4 ep=8 zero=1 mbs=1 vpp=1 recompute=full:43 sp``),
by the keys and values of the axes table (axes.KEYS); --why-not reads its layout with it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np

from ..errors import UsageError
from ..inputs import MAX_GPUS
from .axes import AXES, BY_NAME, KEYS, REQUIRED, Axis

_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}
_SPLIT_PRINTED = re.compile(r"\(\s*(\d+)\s*\+\s*(?:\.\.\s*\+\s*)?(\d+)\s+layers\s*\)")
_SPLIT_VALUE = re.compile(r"^(\d+)\+(?:\.\.\+)?(\d+)$")
WHERE = "--why-not"


def key_of(name: str) -> str:
    """How the short form (and --why-not) names an axis field: zero for zero_stage, mbs, sp, ..."""
    keys = BY_NAME[name].keys
    return keys[0] if keys else name


def _put(pins: dict[str, object], name: str, value: object, text: str) -> None:
    """Record pin ``name`` (None: only check it is new); UsageError if given twice."""
    if name in pins:
        raise UsageError(f"{WHERE}: {key_of(name)} is given twice in {text!r}; give each "
                         "dimension once")
    if value is not None:
        pins[name] = value


def _layers_count(value: str, what: str) -> int:
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_GPUS:
        raise UsageError(f"{WHERE}: {what} needs a whole number of layers, got {value!r}")
    return int(value)


def _split_pins(pins: dict[str, object], value: str, text: str) -> None:
    """first_stage_layers and last_stage_layers of ``split=F+..+L`` (or F+L)."""
    match = _SPLIT_VALUE.match(value.replace(" ", ""))
    if not match:
        raise UsageError(f"{WHERE}: split is the first and last stages' layers, e.g. "
                         f"split=12+..+10 (or 32+29 on two stages), got {value!r}")
    first, last = (_layers_count(v, "split") for v in match.groups())
    if first == 0 or last == 0:
        raise UsageError(f"{WHERE}: a split's stages hold at least one layer, got {value!r}")
    _put(pins, "first_stage_layers", first, text)
    _put(pins, "last_stage_layers", last, text)


def _value(axis: Axis, key: str, value: str) -> object:
    """One axis's value from its text: a choice by name, a bool as 1/true/yes/on, an int in range."""
    if axis.kind is str:
        if value not in axis.choices:
            raise UsageError(f"{WHERE}: {key} must be {axis.words}, got {value!r}")
        return value
    if axis.kind is bool:
        if value not in _TRUE | _FALSE:
            raise UsageError(f"{WHERE}: {key} must be 1, true, yes or on (or 0, false, no, off), "
                             f"got {value!r}")
        return value in _TRUE
    if not (value.isascii() and value.isdigit()) or int(value) < axis.minimum:
        kind = "an integer, 0 or more" if axis.minimum == 0 else "a positive integer"
        raise UsageError(f"{WHERE}: {key} must be {kind}, got {value!r}")
    if int(value) > MAX_GPUS:
        raise UsageError(f"{WHERE}: {key} {int(value):,} is beyond what plan3d models (at most "
                         f"{MAX_GPUS:,})")
    if axis.maximum is not None and int(value) > axis.maximum:
        values = [str(v) for v in range(axis.minimum, axis.maximum + 1)]
        raise UsageError(f"{WHERE}: {key} must be {', '.join(values[:-1])} or {values[-1]}, got "
                         f"{value!r}")
    return int(value)


def parse_layout(text: str) -> dict[str, object]:
    """``"tp=4,pp=16,sp=1,recompute=full"`` -> search pins by axis name. UsageError on anything odd.

    Keys: each axis's (axes.KEYS): tp, cp, pp, dp, ep, etp, zero (zero_stage), distopt
    (distributed_optimizer: 1/0), mbs (micro_batch_size), vpp, recompute (none/selective/
    selective+/full, or full:N: the first N layers of each model chunk), recompute_num_layers,
    offload (activations of N layers in host memory; 0 = none), sp
    (sequence_parallel: 1/0), split (an uneven pipeline split, the first and last stages'
    layers: 12+..+10, or 32+29 on two stages). A layout as the tables print it reads too (a bare
    sp or distopt is 1; "(12+..+10 layers)" is the split).
    """
    pins: dict[str, object] = {}
    spaced = re.sub(r"\s*=\s*", "=", text.strip())  # "tp = 8" reads as "tp=8"
    spaced = _SPLIT_PRINTED.sub(r"split=\1+\2", spaced)  # "(12+..+10 layers)" as printed
    for part in filter(None, (p.strip() for p in spaced.replace(" ", ",").split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        axis = KEYS.get(key)
        if not sep and axis is not None and axis.kind is bool:  # as the tables print them
            sep, value = "=", "1"
        if key == "split" and sep:
            _split_pins(pins, value, text)
            continue
        if key == "recompute" and value.startswith("full:"):
            _put(pins, "recompute_num_layers", _layers_count(value[5:], "recompute=full:N"), text)
            value = "full"
        if not sep or axis is None or not value:
            raise UsageError(f"{WHERE}: cannot read {part!r}; write e.g. 'tp=4,pp=16' "
                             f"(keys: {', '.join(sorted(KEYS))})")
        _put(pins, axis.name, None, text)
        pins[axis.name] = _value(axis, key, value)
    if not pins:
        raise UsageError(f"{WHERE} needs at least one dimension, e.g. 'tp=4,pp=16'")
    return pins


def printed_defaults(model, pins: dict[str, object]) -> dict[str, object]:
    """``pins`` with the axes Layout.short() leaves out when they are at their default set to
    it, when ``pins`` has every axis it always prints (a row pasted from a table): each other
    axis at its default (sp and distopt off, cp 1, no offload; ep and etp 1 for an MoE model)
    or at what the others imply (the pipeline schedule vpp implies), recompute=full every layer, and the even split where pp divides the layers. Otherwise
    ``pins`` as given (the rest is free)."""
    if not {a.name for a in AXES if a.always} <= set(pins):
        return pins
    out = dict(pins)
    expert = ("ep", "etp")
    solved = ("first_stage_layers", "last_stage_layers", "recompute_num_layers")
    for a in AXES:
        if a.always or a.default is REQUIRED or a.name in solved or \
                (a.name in expert and model.moe is None):
            continue
        if a.implied is not None:  # left out where the other axes imply it (the schedule by vpp)
            if a.name not in out:
                out[a.name] = a.value(int(np.ravel(a.implied(SimpleNamespace(vpp=np.asarray(out["vpp"]))))[0]))
            continue
        out.setdefault(a.name, a.default)
    if out["recompute"] == "full":
        out.setdefault("recompute_num_layers", 0)
    pp = int(out["pp"])
    if pp > 1 and model.num_layers % pp == 0:
        out.setdefault("first_stage_layers", model.num_layers // pp)
        out.setdefault("last_stage_layers", model.num_layers // pp)
    return out


def pin_flag(name: str, value: object) -> str:
    """The search flag that pins axis (or bound) ``name`` to ``value``, as a user types it:
    --sequence-parallel / --no-sequence-parallel, --micro-batch-size 4, --max-cp 16."""
    axis = BY_NAME.get(name)
    if axis is not None and axis.kind is bool:
        on, off = axis.flag.split("/")
        return on if value else off
    flag = axis.flag if axis is not None else f"--{name.replace('_', '-')}"
    return f"{flag} {value}"
