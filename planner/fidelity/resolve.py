"""``--resolve search``: what a run's source leaves unknown becomes the planner's best choice.

Each setting neither the row nor its facts state (RunCase.unknown: micro-batch, vpp,
recomputation, ZeRO stage / distributed optimizer, sequence parallelism, expert TP, the uneven
pipeline split, the training software's switches -- TP communication overlap, token dispatcher,
EP overlap, CUDA-graph scope --, gradient dtype) is searched over, everything stated is
pinned (a software switch the run states included), and the framework profile's rules apply
(planner.search): the run is then predicted with the fastest layout that fits and is
consistent with its source. A run that did run and for which no such layout fits is a FALSE
OOM of the cost model (the data is right: the run ran).

The gradient dtype is not a search axis, so each unknown one (fp32/bf16) is searched and the
fastest kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from types import SimpleNamespace

import numpy as np

from ..errors import NoFitError, UsageError
from ..frameworks.profile import GRAD_BYTES
from ..search.options import SearchOptions
from ..search.run import search
from ..layout import Layout
from ..layout import Candidates
from ..layout.axes import BY_NAME, SOFTWARE_FIELDS, SOLVED_FIELDS
from ..search.software_rules import software_masks
from ..specs import TrainingSpec
from .run_layout import moot_software
from .runs import RunCase
from ..catalog import resolve_framework
from ..cost.step import estimate_layout

LAYOUT_PINS = ("micro_batch", "vpp", "recompute", "zero_stage", "distributed_optimizer",
               "sequence_parallel", "etp")
PIN_NAMES = {"micro_batch": "micro_batch_size"}
TRAINING_CHOICES = {"grad_dtype": ("fp32", "bf16")}


@dataclass
class Resolution:
    """What ``resolve`` did to a run: ``status`` resolved | false-oom | outside-space | stated
    (nothing unknown), and the one-line ``note`` listed with the run."""

    status: str
    note: str


def _options(case: RunCase) -> SearchOptions:
    """Every stated layout setting pinned, the software switches the run states included; the
    unknown ones free (the distributed optimizer stays as stated: the search costs it as
    ZeRO-1); no activation offload unless stated."""
    lay = case.layout
    pins = {k: getattr(lay, k) for k in ("tp", "pp", "dp", "cp", "ep")}
    for key in LAYOUT_PINS + SOFTWARE_FIELDS:
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
    # strict: the fastest consistent layout, as measured runs are resolved (no tie preferences)
    return SearchOptions(**pins, keep=64, framework=resolve_framework(case.training.framework),
                         strict_rank=True)


def _trainings(case: RunCase) -> list[tuple[TrainingSpec, str]]:
    """The run's TrainingSpec with every combination of its unknown training settings, each
    with its description ("grad_dtype=bf16")."""
    keys = [k for k in TRAINING_CHOICES if k in case.unknown]
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
                      if k not in TRAINING_CHOICES and k != "distributed_optimizer"
                      and not moot_software(case.model, case.layout, k))
    stale = tuple(f"{k}=" for k in case.unknown) + ("pipeline split",)
    case.assumptions[:] = [a for a in case.assumptions if not a.startswith(stale)]
    note = f"resolved by search: {' '.join(x for x in (chosen, words) if x)}"
    case.assumptions.append(note)
    return Resolution("resolved", note)


RECOMPUTE_CHOICES = ("none", "selective", "selective+", "full")


def _resolve_in_place(case: RunCase, why_not: str) -> Resolution:
    """A run whose stated layout the search cannot enumerate (e.g. a pipeline layout string the
    uneven-split rule does not express): its layout is kept as stated and only the unknown
    recomputation, software switches (the values a free search tries, where the software
    rules allow them) and training settings are tried, each combination costed directly; the
    fastest that fits is kept (a FALSE OOM if none fits)."""
    recomputes = RECOMPUTE_CHOICES if "recompute" in case.unknown else (case.layout.recompute,)
    best = None
    for training, words in _trainings(case):
        for rc in recomputes:
            for software in _software_choices(case, training):
                layout = case.layout.model_copy(update={"recompute": rc, **software})
                est = estimate_layout(case.model, case.hardware, training, layout)
                step = float(est.time["step"][0])
                if bool(est.fits[0]) and (best is None or step < best[0]):
                    best = (step, layout, training, words)
    note = f"not in plan3d's search space ({why_not}); evaluated as stated"
    if best is None:  # evaluated as stated: the accuracy table reports it as "no fit"
        return Resolution("outside-space", f"{note}; no recomputation, software or training "
                          "choice fits")
    _, case.layout, case.training, words = best
    tried = [k for k in ("recompute",) + SOFTWARE_FIELDS if k in case.unknown
             and not moot_software(case.model, case.layout, k)]
    chosen = " ".join([f"{k}={_value(case.layout, k)}" for k in tried] + ([words] if words else []))
    return Resolution("outside-space", f"{note}, with {chosen}" if chosen else note)


def _software_choices(case: RunCase, training: TrainingSpec) -> list[dict]:
    """Every combination of the run's unknown software switches ({axis: value}) over the values
    a free search tries (layout.axes ``values``) that the software rules allow on its layout
    (search.software_rules); [{}] when it states them all."""
    profile = resolve_framework(training.framework)
    ctx = SimpleNamespace(model=case.model, training=training, hardware=case.hardware,
                          framework=profile, pps=np.array([case.layout.pp]), bound=None)
    keys = [k for k in SOFTWARE_FIELDS if k in case.unknown]
    out = []
    for codes in product(*(np.asarray(BY_NAME[k].values(ctx)).tolist() for k in keys)):
        software = {k: BY_NAME[k].value(code) for k, code in zip(keys, codes)}
        c = Candidates.from_layouts([case.layout.model_copy(update=software)])
        if all(bool(np.all(m)) for m in software_masks(profile, case.model, training, c,
                                                        case.hardware).values()):
            out.append(software)
    return out or [{}]


def _value(layout: Layout, key: str) -> object:
    if key == "split":
        return layout.split_label
    if key == "recompute":  # full:N when the search recomputes only N layers per chunk
        return layout.recompute_label
    return getattr(layout, PIN_NAMES.get(key, key))
