"""Export a plan to a training framework's configuration (Megatron-LM, Megatron-Bridge/NeMo,
DeepSpeed, torchtitan). Each target lives in its own module; ``export_plan`` dispatches.

All exports assume Megatron's default rank order tp-cp-ep-dp-pp (TP fastest, then DP, then PP),
the order the cost model's placement() assumes; torchtitan's and DeepSpeed's default meshes give
the same groups for these plans (see planner.placement).
"""

from __future__ import annotations

from ..errors import UsageError
from ..specs import Plan
from .common import Export

TARGETS = ("megatron", "nemo", "deepspeed", "torchtitan")
DEFAULT_SUFFIX = {"megatron": ".args", "nemo": ".yaml", "deepspeed": ".json"}


def export_plan(plan: Plan, target: str, torchtitan_format: str = "overrides") -> Export:
    """The configuration of ``plan`` for ``target`` (one of TARGETS). UsageError if the target
    cannot express the plan; caveats are comments in ``Export.text`` or in ``Export.notes``."""
    if target == "megatron":
        from .megatron import export_megatron
        return export_megatron(plan)
    if target == "nemo":
        from .nemo import export_nemo
        return export_nemo(plan)
    if target == "deepspeed":
        from .deepspeed import export_deepspeed
        return export_deepspeed(plan)
    if target == "torchtitan":
        from .torchtitan import export_torchtitan
        return export_torchtitan(plan, torchtitan_format)
    raise UsageError(f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")


__all__ = ["Export", "TARGETS", "export_plan"]
