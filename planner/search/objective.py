"""What a search optimises: throughput, time to train, or cost; and the memory safety margin.

- throughput: tokens/s of the whole job (higher is better).
- time-to-train: T_train = tokens / (tokens/s), seconds, for the model's training token budget
  (``training.tokens``, overridable). At a fixed GPU count it ranks like throughput; with a GPU
  budget (``--max-gpus``) too.
- cost: GPU-hours x price = gpus * T_train / 3600 s * price (currency per GPU-hour); lower is
  better. It prefers the layout with the most tokens/s per GPU, which differs from throughput
  when the search also picks the GPU count.
T_train is the expected wall-clock time with failures and checkpoints: tokens / (tokens/s x
goodput), goodput the share of wall-clock time that advances training (cost.checkpoint,
formulas.md 12.5), so a larger cluster, which fails more often, pays for it here.
A deadline (``--deadline``) keeps only the layouts whose T_train meets it: the others score -inf.
All arrays broadcast; SI inside (seconds, bytes).
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import UsageError
from ..units import GIB, format_gib
from ..cost.checkpoint import goodput_of
from ..units import parse_quantity

OBJECTIVES = ("throughput", "time-to-train", "cost")


def check(objective: str, tokens: float | None, price_per_gpu_hour: float | None) -> None:
    """UsageError (one line) if the objective lacks what it needs or an input is out of range."""
    if objective not in OBJECTIVES:
        raise UsageError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if tokens is not None and not 0 < tokens < float("inf"):
        raise UsageError(f"--tokens must be a positive, finite number, got {tokens:g}")
    if price_per_gpu_hour is not None and not 0 < price_per_gpu_hour < float("inf"):
        raise UsageError(f"--price-per-gpu-hour must be a positive, finite number, got "
                         f"{price_per_gpu_hour:g}")
    if objective in ("time-to-train", "cost") and tokens is None:
        raise UsageError(f"--objective {objective} needs a training token budget: the model gives "
                         "none, pass --tokens")
    if objective == "cost" and price_per_gpu_hour is None:
        raise UsageError("--objective cost needs --price-per-gpu-hour")


def check_budget(objective: str, tokens: float | None, price_per_gpu_hour: float | None,
                 deadline_s: float | None, step_tokens: float | None = None) -> None:
    """check() with the token budget the search has (``tokens``: --tokens, else the model's;
    None: none): a deadline or a price needs one too (a price is for the whole run), and a
    budget is at least one optimizer step's ``step_tokens`` (global batch x sequence length)
    when that is given. UsageError."""
    check(objective, tokens if objective != "throughput" else 1.0, price_per_gpu_hour)
    if tokens is not None and step_tokens is not None and tokens < step_tokens:
        raise UsageError(f"a training budget of {tokens:,.6g} tokens is less than one optimizer "
                         f"step ({step_tokens:,.0f} tokens: global batch x sequence length); "
                         "give the run's total tokens (--tokens 2T, or training.tokens in the "
                         "model file)")
    if deadline_s is not None and tokens is None:
        raise UsageError("--deadline needs a training token budget: the model gives none, pass --tokens")
    if price_per_gpu_hour is not None and tokens is None:
        raise UsageError("--price-per-gpu-hour prices the whole training run, which needs a token "
                         "budget: the model gives none, pass --tokens")


def step_tokens(training) -> float:
    """Tokens of one optimizer step: global batch x sequence length (a TrainingSpec)."""
    return float(training.global_batch_size) * training.seq_length


def reports_training(opts) -> bool:
    """Whether a search (SearchOptions ``opts``) reports the time to train, GPU-hours and, with
    a price, the cost of its layouts (annotate): the objective or a deadline needs them
    (needs_goodput), or --tokens or --price-per-gpu-hour asks for them."""
    return needs_goodput(opts.objective, opts.deadline_s) or opts.tokens is not None \
        or opts.price_per_gpu_hour is not None


def needs_goodput(objective: str, deadline_s: float | None) -> bool:
    """Whether scoring needs the goodput (expected wall-clock time): time-to-train, cost, or a
    deadline."""
    return objective != "throughput" or deadline_s is not None


def wall_time(tokens: float, tokens_per_s, goodput=1.0) -> np.ndarray:
    """Expected wall-clock time to train ``tokens``: tokens / (tokens/s x goodput), seconds."""
    with np.errstate(divide="ignore", over="ignore"):  # goodput 0 or ~1e-300 (restarts outlast the MTBF): never done
        return tokens / (np.asarray(tokens_per_s) * goodput)


def gpu_hours(gpus, t_train_s):
    """GPU-hours of a run: gpus x its wall-clock seconds / 3600. Broadcast array."""
    return gpus * t_train_s / 3600.0


def score(objective: str, tokens_per_s: np.ndarray, gpus: np.ndarray, tokens: float | None,
          price_per_gpu_hour: float | None, goodput=1.0,
          deadline_s: float | None = None) -> np.ndarray:
    """Higher-is-better score: tokens/s, -T_train (s), or -cost (currency), T_train with the
    ``goodput`` (wall_time); -inf where T_train exceeds ``deadline_s``. Broadcast shape."""
    t_train = wall_time(tokens or 1.0, tokens_per_s, goodput)
    if objective == "throughput":
        out = tokens_per_s
    elif objective == "time-to-train":
        out = -t_train
    else:
        out = -(gpu_hours(gpus, t_train) * (price_per_gpu_hour or 1.0))
    if deadline_s is not None:
        out = np.where(t_train <= deadline_s, out, -np.inf)
    return out


def layout_scores(model, hw, training, c, step_s, tokens_per_s, opts,
                  tokens: float | None) -> tuple[np.ndarray, np.ndarray | None]:
    """(score, T_train or None) of evaluated layouts ``c`` for the search options ``opts``
    (objective, price, deadline): the goodput (cost.checkpoint) is computed only where the
    objective or a deadline needs it. UsageError if it is needed and the hardware profile has
    no storage block."""
    if not needs_goodput(opts.objective, opts.deadline_s):
        return score(opts.objective, tokens_per_s, c.gpus, tokens, opts.price_per_gpu_hour), None
    goodput = goodput_of(model, hw, training, c, step_s)
    t_train = wall_time(tokens, tokens_per_s, goodput)
    return score(opts.objective, tokens_per_s, c.gpus, tokens, opts.price_per_gpu_hour, goodput,
                 opts.deadline_s), t_train


def annotate(throughput: dict[str, np.ndarray], gpus: np.ndarray, tokens: float | None,
             price_per_gpu_hour: float | None, goodput=None) -> None:
    """Add ``goodput``, ``time_to_train_s`` (expected wall-clock, wall_time), ``gpu_hours``
    (gpus x that time) with a token budget, and ``cost`` with a price. ``goodput`` None: 1."""
    if tokens is None:
        return
    goodput = np.ones_like(throughput["tokens_per_s"]) if goodput is None else goodput
    t_train = wall_time(tokens, throughput["tokens_per_s"], goodput)
    throughput["goodput"] = goodput
    throughput["time_to_train_s"] = t_train
    throughput["gpu_hours"] = gpu_hours(gpus, t_train)
    if price_per_gpu_hour is not None:
        throughput["cost"] = throughput["gpu_hours"] * price_per_gpu_hour


def parse_deadline(text: str | None) -> float | None:
    """``--deadline``: '30d', '720h', '90 min', '1.5d' -> seconds; None -> None. UsageError
    (one line) for a bare number, another unit, zero or a negative value."""
    if text is None:
        return None
    try:
        seconds = parse_quantity(str(text), "time", None)
    except UsageError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise UsageError(f"--deadline must be a positive duration with its unit, e.g. '30d', "
                         f"'720h' or '90min' (units: d, h, min, s), got {text!r}")
    return seconds


_HEADROOM = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(%|[A-Za-z]+)?\s*$")


def parse_headroom(text: str | None) -> tuple[float, float]:
    """``"4GiB"`` -> (4*2^30 bytes, 0); ``"10%"`` -> (0, 0.10). None -> (0, 0). UsageError else.

    Bytes units as planner.units accepts them (GiB, GB, MiB, ...); a bare number has no unit
    and is refused (is ``4`` GiB, bytes or percent?).
    """
    if text is None:
        return 0.0, 0.0
    match = _HEADROOM.match(str(text))
    if not match:
        raise UsageError(f"--min-memory-headroom must look like '4GiB' or '10%', got {text!r}")
    value, unit = float(match.group(1)), match.group(2)
    if unit == "%":
        if value >= 100:
            raise UsageError(f"--min-memory-headroom {text} leaves no memory to use")
        return 0.0, value / 100.0
    if unit is None:
        raise UsageError(f"--min-memory-headroom: {text.strip()} needs a unit, e.g. "
                         f"'{text.strip()}GiB' or '{text.strip()}%'")
    return parse_quantity(f"{match.group(1)} {unit}", "bytes", "--min-memory-headroom"), 0.0


def parse_share(text: str | None, flag: str) -> float | None:
    """A share given as '10%', '10 %' or 0.1 -> 0.1; None -> None. UsageError (naming ``flag``)
    unless it is from 0 up to (not including) 1 (100%)."""
    if text is None:
        return None
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise UsageError(f"{flag} must be a share of HBM from 0 up to (not including) 100%, e.g. "
                         f"'10%' or 0.1, got {text!r}")
    return value


def check_headroom(text: str | None, capacity: float, framework_overhead: float,
                   gpu_name: str) -> tuple[float, float]:
    """``parse_headroom``, then refuse a headroom that leaves no more than the least reserve any
    layout keeps (``framework_overhead``, bytes: the framework profile's runtime reserve plus the
    hardware profile's optional extra allowance; formulas.md 3.10) of ``capacity`` (bytes of
    HBM): no layout could fit, so say so before searching. The headroom is kept free on top of
    each layout's reserve. UsageError."""
    headroom_bytes, headroom_fraction = parse_headroom(text)
    if text is not None:
        check_room(f"--min-memory-headroom {text.strip()}", headroom_bytes, headroom_fraction,
                   capacity, framework_overhead, gpu_name)
    return headroom_bytes, headroom_fraction


def check_room(shown: str, headroom_bytes: float, headroom_fraction: float, capacity: float,
               framework_overhead: float, gpu_name: str) -> None:
    """Refuse a GPU whose ``capacity`` (bytes of HBM) is no more than the least reserve any
    layout keeps (``framework_overhead``, bytes: the framework profile's runtime reserve plus the
    hardware profile's optional extra allowance, formulas.md 3.10), whatever the headroom: the
    hardware profile's gpu.hbm_capacity is named. Then refuse a headroom that leaves no more than
    that reserve: no layout could fit, so say so before searching. ``shown`` names the headroom
    as the user gave it ('--min-memory-headroom 4GiB'). UsageError."""
    if capacity <= framework_overhead:
        raise UsageError(f"gpu.hbm_capacity of {gpu_name} is {format_gib(capacity)} GiB, no more than "
                         f"its {framework_overhead / GIB:.1f} GiB runtime reserve: no layout can fit "
                         "(check the hardware profile)")
    usable = usable_memory(capacity, headroom_bytes, headroom_fraction)
    if usable <= framework_overhead:
        raise UsageError(f"{shown} leaves {max(usable, 0.0) / GIB:.1f} "
                         f"GiB of the {format_gib(capacity)} GiB per {gpu_name}, no more than its "
                         f"{framework_overhead / GIB:.1f} GiB runtime reserve: no layout can fit")


def usable_memory(capacity: float, headroom_bytes: float, headroom_fraction: float) -> float:
    """Bytes a layout may use per GPU: capacity - max(headroom bytes, fraction * capacity)."""
    return capacity - max(headroom_bytes, headroom_fraction * capacity)
