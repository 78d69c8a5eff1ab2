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


def export_target(name: str | None, plan: Plan) -> str:
    """The exporter for ``--to NAME``: an export target (TARGETS) or a framework profile's name
    or alias (its ``export``: megatron-core -> megatron, deepspeed, torchtitan); None: the plan's
    framework's (UsageError for a historical profile that has no exporter, or an unknown name)."""
    from ..catalog import framework_profiles
    if name is None:
        from .rules import profile_for
        profile = profile_for(plan.training, plan.framework)
        if profile.export is None:
            raise UsageError(f"the plan's framework {profile.name} has no exporter (it describes "
                             f"published runs); pass --to {' | '.join(TARGETS)}")
        return profile.export
    key = name.strip().lower()
    if key in TARGETS:
        return key
    for profile in framework_profiles().values():
        if key == profile.name or key in (a.lower() for a in profile.aliases):
            if profile.export is None:
                raise UsageError(f"framework {profile.name} has no exporter (it describes "
                                 f"published runs); choose one of {', '.join(TARGETS)}")
            return profile.export
    raise UsageError(f"unknown export target {name!r}; choose one of {', '.join(TARGETS)} or a "
                     "framework (megatron-core, deepspeed, torchtitan)")


def export_plan(plan: Plan, target: str, torchtitan_format: str = "overrides") -> Export:
    """The configuration of ``plan`` for ``target`` (one of TARGETS). UsageError if the framework
    the target runs cannot run the plan (frameworks.rules.check_plan: the same rules its search
    applies) or the target cannot express it; caveats are comments in ``Export.text`` or in
    ``Export.notes``."""
    if target not in TARGETS:
        raise UsageError(f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")
    from .rules import check_plan
    check_plan(target, plan)
    if target == "megatron":
        from .megatron import export_megatron
        return export_megatron(plan)
    if target == "nemo":
        from .nemo import export_nemo
        return export_nemo(plan)
    if target == "deepspeed":
        from .deepspeed import export_deepspeed
        return export_deepspeed(plan)
    from .torchtitan import export_torchtitan
    return export_torchtitan(plan, torchtitan_format)


__all__ = ["Export", "TARGETS", "export_plan", "export_target"]
