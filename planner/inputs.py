"""The one path that checks what a user gives plan3d, for every command.

search, sweep, estimate (flags and --plan), --why-not, regress (its cases), export / placement /
validate (plans) and accuracy / calibrate (the training of each run) check their inputs here, so
a value one command refuses is refused by all of them with the same words:

- ``check_numbers``: sizes, degrees, counts, prices, budgets: finite, > 0 (or >= 0), at most
  what plan3d models;
- ``gpu_count``: a GPU count is whole nodes beyond one node;
- ``training_spec`` / ``check_training``: a TrainingSpec from the model's defaults and what was
  given (sequence length and batch in range, no sequence beyond learned positions);
- search.options.search_options: the pins and bounds of a search (types, ranges, ZeRO stage,
  pins within bounds, the memory headroom);
- the split of a layout over the GPUs: layout.degrees.split_problem (the product that fails),
  and search.check.check_layout for one whole layout.

``label`` maps a field name to the words an error uses for it: the CLI flag (``--seq-length``,
the default) or a file's field (``training.seq_length`` in a regress case or a plan).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .errors import UsageError
from .files import validate
from .specs import TrainingSpec

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
