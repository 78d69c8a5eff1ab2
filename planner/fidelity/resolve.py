"""``--resolve search``: what a run's source leaves unknown becomes the planner's best choice.

Each setting neither the row nor its facts state (RunCase.unknown: micro-batch, vpp,
recomputation, ZeRO stage / distributed optimizer, sequence parallelism, expert TP, the uneven
pipeline split, EP all-to-all overlap, gradient dtype) is searched over, everything stated is
pinned, and the framework profile's rules apply (planner.search): the run is then predicted with
the fastest layout that fits and is consistent with its source. A run that did run and for
which no such layout fits is a FALSE OOM of the cost model (the data is right: the run ran).

Training settings are not search axes, so each combination of the unknown ones (EP overlap
on/off, gradient dtype fp32/bf16) is searched and the fastest kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from ..errors import NoFitError, UsageError
from ..frameworks.profile import GRAD_BYTES
from ..search.options import SearchOptions
from ..search.run import search
from ..layout import Layout
from ..layout.axes import SOLVED_FIELDS
from ..specs import TrainingSpec
from .runs import RunCase
from ..catalog import resolve_framework
from ..cost.step import estimate_layout

LAYOUT_PINS = ("micro_batch", "vpp", "recompute", "zero_stage", "distributed_optimizer",
               "sequence_parallel", "etp")
PIN_NAMES = {"micro_batch": "micro_batch_size"}
TRAINING_CHOICES = {"moe_a2a_overlap": (False, True), "grad_dtype": ("fp32", "bf16")}


@dataclass
class Resolution:
    """What ``resolve`` did to a run: ``status`` resolved | false-oom | outside-space | stated
    (nothing unknown), and the one-line ``note`` listed with the run."""

    status: str
    note: str


def _options(case: RunCase) -> SearchOptions:
    """Every stated layout setting pinned; the unknown ones free (the distributed optimizer
    stays as stated: the search costs it as ZeRO-1); no activation offload unless stated."""
    lay = case.layout
    pins = {k: getattr(lay, k) for k in ("tp", "pp", "dp", "cp", "ep")}
    for key in LAYOUT_PINS:
        if key not in case.unknown:
            name = PIN_NAMES.get(key, key)
            pins[name] = getattr(lay, name)
    if lay.distributed_optimizer:
        pins["distributed_optimizer"], pins["zero_stage"] = True, 0
    # a solved axis is a setting a source names when it used it: pinned as the run states it
    # (a search free to offload made runs that did not fit "fit" at a slower step, hiding a false
    # OOM), the recompute layers only where the run states its recomputation
    for name in SOLVED_FIELDS:
        if name != "recompute_num_layers" or "recompute" not in case.unknown:
            pins[name] = getattr(lay, name)
    return SearchOptions(**pins, keep=64, framework=resolve_framework(case.training.framework))


def _trainings(case: RunCase) -> list[tuple[TrainingSpec, str]]:
    """The run's TrainingSpec with every combination of its unknown training settings, each
    with its description ("moe_a2a_overlap=True grad_dtype=bf16")."""
    keys = [k for k in TRAINING_CHOICES if k in case.unknown
            and (k != "moe_a2a_overlap" or case.model.moe is not None)]
    out = []
    for values in product(*(TRAINING_CHOICES[k] for k in keys)):
        update, words = {}, []
        for key, value in zip(keys, values):
            words.append(f"{key}={value}")
            if key == "grad_dtype":
                update["grad_bytes"] = GRAD_BYTES[value]
            else:
                update[key] = value
        out.append((case.training.model_copy(update=update), " ".join(words)))
    return out


def _matches_split(layout: Layout, case: RunCase) -> bool:
    """Whether a searched layout keeps the run's stated pipeline split (any split when unknown)."""
    return "split" in case.unknown or (layout.first_stage_layers, layout.last_stage_layers) == \
        (case.layout.first_stage_layers, case.layout.last_stage_layers)


def resolve(case: RunCase) -> Resolution:
    """Replace ``case.layout`` / ``case.training`` by the fastest fitting layout consistent with
    what the run states (in place; ``case.resolution`` is set to the status). Runs with nothing
    unknown are left as they are."""
    result = _resolve(case)
    case.resolution = result.status
    if result.status in ("false-oom", "outside-space"):
        case.assumptions.append(result.note)
    return result


def _resolve(case: RunCase) -> Resolution:
    if case.skipped or not case.unknown:
        return Resolution("stated", "")
    best, why_not = None, ""
    for training, words in _trainings(case):
        try:
            result = search(case.model, case.hardware, training, case.gpus, _options(case))
        except NoFitError:
            continue
        except UsageError as exc:
            why_not = str(exc)
            continue
        est = result.ranked
        matching = [i for i in range(len(est)) if _matches_split(est.candidates.layout(i), case)]
        if not matching:
            why_not = "the stated pipeline split is not one the search enumerates"
            continue
        step = float(est.time["step"][matching[0]])
        if best is None or step < best[0]:
            best = (step, est.candidates.layout(matching[0]), training, words)
    if best is None and why_not:
        return _resolve_in_place(case, why_not)
    if best is None:
        return Resolution("false-oom", "FALSE OOM: no layout consistent with the source fits")
    _, case.layout, case.training, words = best
    chosen = " ".join(f"{k}={_value(case.layout, k)}" for k in case.unknown
                      if k not in TRAINING_CHOICES and k != "distributed_optimizer")
    stale = tuple(f"{k}=" for k in case.unknown) + ("pipeline split",)
    case.assumptions[:] = [a for a in case.assumptions if not a.startswith(stale)]
    note = f"resolved by search: {' '.join(x for x in (chosen, words) if x)}"
    case.assumptions.append(note)
    return Resolution("resolved", note)


RECOMPUTE_CHOICES = ("none", "selective", "selective+", "full")


def _resolve_in_place(case: RunCase, why_not: str) -> Resolution:
    """A run whose stated layout the search cannot enumerate (e.g. a pipeline layout string the
    uneven-split rule does not express): its layout is kept as stated and only the unknown
    recomputation and training settings are tried, each combination costed directly; the
    fastest that fits is kept (a FALSE OOM if none fits)."""
    recomputes = RECOMPUTE_CHOICES if "recompute" in case.unknown else (case.layout.recompute,)
    best = None
    for training, words in _trainings(case):
        for rc in recomputes:
            layout = case.layout.model_copy(update={"recompute": rc})
            est = estimate_layout(case.model, case.hardware, training, layout)
            step = float(est.time["step"][0])
            if bool(est.fits[0]) and (best is None or step < best[0]):
                best = (step, layout, training, words)
    note = f"not in plan3d's search space ({why_not}); evaluated as stated"
    if best is None:  # evaluated as stated: the accuracy table reports it as "no fit"
        return Resolution("outside-space", f"{note}; no recomputation or training choice fits")
    _, case.layout, case.training, words = best
    chosen = " ".join(x for x in (f"recompute={case.layout.recompute}" if "recompute" in case.unknown
                                  else "", words) if x)
    return Resolution("outside-space", f"{note}, with {chosen}" if chosen else note)


def _value(layout: Layout, key: str) -> object:
    if key == "split":
        return layout.split_label
    if key == "recompute":  # full:N when the search recomputes only N layers per chunk
        return layout.recompute_label
    return getattr(layout, PIN_NAMES.get(key, key))
