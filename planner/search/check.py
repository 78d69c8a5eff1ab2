"""One layout given by hand (estimate's flags, a plan, a regress case): is it valid for this
model, system, batch and framework? The search's own rules, on one layout."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..files import validate
from ..cost.offload import check_host_memory
from ..cost.precision import check_precision
from ..errors import UsageError
from ..framework_spec import FrameworkProfile
from ..inputs import gpu_count
from ..layout import Candidates, Layout
from ..layout.degrees import SPLIT_DEGREES, split_problem
from ..layout.split import default_uneven_split, uneven_problem
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .fp8_rules import FP8_SHAPE_TAG, fp8_hint
from .framework_rules import UNEVEN_INTERLEAVE_RULE, UNEVEN_LAYOUT_RULE, check_model, profile_for
from .rules import LAYERS_RULE, MOE_SP_RULE, TP_RULE, UNEVEN_RULE, constraint_masks, rules_broken

CROSS_NODE_HINT = "pass --allow-cross-node-tp to let tp span nodes"

def check_inputs(gpus: int, hw: HardwareProfile, flag: str = "--gpus") -> None:
    """Reject GPU counts that are non-positive, absurd, or not whole nodes (UsageError;
    planner.inputs.gpu_count, the one check)."""
    gpu_count(gpus, hw, flag)


def check_layout(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                 fields: dict[str, Any], allow_cross_node_tp: bool = False,
                 framework: FrameworkProfile | None = None) -> Layout:
    """The Layout of ``fields`` if it is valid for this model, system, batch and framework
    (UsageError if not).

    The checks ``plan3d estimate``, ``--plan`` and ``regress`` apply: whole nodes (search.check_inputs),
    tp*cp*pp*dp = gpus (tp, cp, pp default to 1, dp to gpus/(tp*cp*pp); an error names the
    product of the degrees given, degrees.split_problem), the Layout schema, what the framework
    can build (search.framework_rules.check_model) and every rule of search.rules.constraint_masks
    (the
    framework's included), with the "tp within the NVLink domain" rule waived when
    ``allow_cross_node_tp``.
    """
    check_model(profile_for(training, framework), model, training)
    check_precision(hw, training)
    check_inputs(gpus, hw)
    data = dict(fields)
    given = {k: data[k] for k in SPLIT_DEGREES if data.get(k) is not None}
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given.values()):
        # the degrees not given are 1, except dp, which takes what the others leave
        problem = split_problem(gpus, given, exact="dp" in given)
        if problem:
            raise UsageError(problem)
        if "dp" not in given:
            data["dp"] = gpus // math.prod(given.values())
        data.update({k: 1 for k in ("tp", "cp", "pp") if k not in given})
    layout = validate(Layout, data, "layout")
    if layout.gpus != gpus:  # e.g. dp absent and a degree of another type: the schema passed it
        raise UsageError(split_problem(gpus, layout.model_dump(), exact=True))
    per_stage = model.num_layers // layout.pp
    if layout.first_stage_layers and model.num_layers % (layout.pp * layout.vpp) == 0 and \
            layout.first_stage_layers == layout.last_stage_layers == per_stage:
        layout = layout.model_copy(update=dict(first_stage_layers=0, last_stage_layers=0))  # even
    masks = constraint_masks(model, training, hw, Candidates.from_layouts([layout]),
                             allow_cross_node_tp, framework)
    broken = rules_broken(masks)
    if broken:
        hint = ""
        f, la = default_uneven_split(model.num_layers, layout.pp)
        if LAYERS_RULE in broken and f > 0 and _uneven_fits(
                model, training, hw, layout.model_copy(update=dict(first_stage_layers=f, last_stage_layers=la)),
                framework):
            hint = (f" (an uneven split would do: {f} layers on the first stage and {la} on the last,"
                    f" --first-stage-layers {f} --last-stage-layers {la})")
        if TP_RULE in broken:
            hint += f" ({CROSS_NODE_HINT})"
        rules = profile_for(training, framework)
        if MOE_SP_RULE in broken and not rules.rules.sequence_parallel:
            hint += f" ({rules.display} has no sequence parallelism: its MoE layouts need tp = 1)"
        if any(FP8_SHAPE_TAG in rule for rule in broken):
            hint += f" ({fp8_hint(model, training, Candidates.from_layouts([layout]))})"
        if any(r == UNEVEN_RULE or r.endswith((UNEVEN_INTERLEAVE_RULE, UNEVEN_LAYOUT_RULE)) for r in broken):
            hint += f" ({uneven_problem(model.num_layers, layout.pp, layout.first_stage_layers, layout.last_stage_layers, layout.vpp, rules.rules.uneven_split)})"
        raise UsageError(f"layout {layout.short()} breaks: {'; '.join(broken)}{hint}")
    check_host_memory(model, hw, training, Candidates.from_layouts([layout]))
    return layout


def _uneven_fits(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile, layout: Layout,
                 framework: FrameworkProfile | None = None) -> bool:
    """Whether ``layout`` (with its uneven split filled in) passes every rule but the fit."""
    masks = constraint_masks(model, training, hw, Candidates.from_layouts([layout]),
                             True, framework)
    return all(bool(np.all(ok)) for ok in masks.values())
