"""Export a plan to a training framework's configuration (Megatron-LM, Megatron-Bridge/NeMo,
DeepSpeed, torchtitan). Each target lives in its own module; ``export_plan`` dispatches.

All exports assume Megatron's default rank order tp-cp-ep-dp-pp (TP fastest, then DP, then PP),
the order the cost model's placement() assumes; torchtitan's and DeepSpeed's default meshes give
the same groups for these plans (see planner.placement).
"""

from __future__ import annotations

from ..errors import UsageError
from ..plan import Plan
from .common import Export
from ..catalog import framework_profiles, is_bare_name, resolve_framework
from ..search.framework_rules import check_plan, profile_for
from .deepspeed import export_deepspeed
from .megatron import export_megatron
from .nemo import export_nemo
from .torchtitan import export_torchtitan

TARGETS = ("megatron", "nemo", "deepspeed", "torchtitan")
DEFAULT_SUFFIX = {"megatron": ".args", "nemo": ".yaml", "deepspeed": ".json"}


def export_target(name: str | None, plan: Plan) -> str:
    """The exporter for ``--to NAME``: an export target (TARGETS), a framework profile's name
    or alias, or a framework profile file (its ``export``: megatron-core -> megatron, deepspeed,
    torchtitan); None: the plan's
    framework's (UsageError for a historical profile that has no exporter, or an unknown name)."""
    if name is None:
        profile = profile_for(plan.training, plan.framework)
        if profile.export is None:
            raise UsageError(f"the plan's framework {profile.name} has no exporter (it describes "
                             f"published runs); pass --to {' | '.join(TARGETS)}")
        return profile.export
    key = name.strip().lower()
    if key in TARGETS:
        return key
    if not is_bare_name(name):  # a framework profile file: its exporter
        profile = resolve_framework(name)
        if profile.export is None:
            raise UsageError(f"framework {profile.name} ({name}) has no exporter (its export "
                             f"field is empty); choose one of {', '.join(TARGETS)}")
        return profile.export
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
    the target runs cannot run the plan (search.framework_rules.check_plan: the same rules its
    search
    applies) or the target cannot express it; caveats are comments in ``Export.text`` or in
    ``Export.notes``."""
    if target not in TARGETS:
        raise UsageError(f"unknown export target {target!r}; choose one of {', '.join(TARGETS)}")
    profile = profile_for(plan.training, plan.framework)
    try:
        check_plan(target, plan)
    except UsageError as exc:
        raise UsageError(_own_remedy(str(exc), profile, target)) from None
    if target == "megatron":
        result = export_megatron(plan)
    elif target == "nemo":
        result = export_nemo(plan)
    elif target == "deepspeed":
        result = export_deepspeed(plan)
    else:
        result = export_torchtitan(plan, torchtitan_format)
    runs = TARGET_FRAMEWORK[target]
    if not _runs(profile, runs):  # the plan's estimate is for another framework's runtime
        result.notes.append(
            f"the plan was costed for {profile.display}"
            f"{'' if profile.display == profile.name else f' ({profile.name})'}: its memory and step "
            f"time follow that framework's runtime, not {target}'s; re-plan with --framework "
            f"{runs} for {target}'s estimate")
    return result


def _runs(profile, framework: str) -> bool:
    """Whether a plan of ``profile`` (a FrameworkProfile) was costed for the runtime of the
    framework profile named ``framework``: it is that profile (by name or alias), or its
    exporter targets the same runtime (megatron and nemo both run Megatron-Core: a plan made
    for megatron-core exports to Megatron-Bridge as it is)."""
    names = {profile.name, *(a.lower() for a in profile.aliases)}
    return framework in names or TARGET_FRAMEWORK.get(profile.export or "") == framework


def _own_remedy(message: str, profile, target: str) -> str:
    """rules.check_plan's refusal, without advising the search the plan already had: for a plan
    made for the target's framework its remedy ('search with --framework X ...') becomes
    'search again' (the plan was edited, or made by another plan3d)."""
    advice = f"; search with --framework {TARGET_FRAMEWORK[target]} for a plan it runs"
    if not (_runs(profile, TARGET_FRAMEWORK[target]) and message.endswith(advice)):
        return message
    return (message[: -len(advice)] + f"; the plan was made for {profile.name} but breaks these "
            "rules (edited by hand, or by another plan3d version): search again for a plan it runs")


# the framework profile whose runtime each target runs (export_target's inverse)
TARGET_FRAMEWORK = {"megatron": "megatron-core", "nemo": "megatron-core", "deepspeed": "deepspeed",
                    "torchtitan": "torchtitan"}


__all__ = ["Export", "TARGETS", "export_plan", "export_target"]
