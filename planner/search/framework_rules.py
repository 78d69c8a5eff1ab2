"""A framework profile's rules as named, vectorized masks of the search space, and the checks
every consumer of a plan shares: the search (search.rules.constraint_masks calls framework_masks), a
layout given by hand (search.check_layout) and each export (check_plan), so a search for a
framework never proposes a plan that its export refuses.

Each rule is named with the framework's display name ("DeepSpeed: ..."); a rule that cannot
prune for a profile (e.g. ZeRO stages 0-3 all allowed) is left out, so the search lists only
what the framework really restricts. Masks broadcast like the candidates' arrays.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..framework_spec import FrameworkProfile
from ..layout import BY_NAME, RECOMPUTE_CODES
from ..layout.split import uneven_interleave_ok, uneven_layout_ok
from ..specs import ModelSpec, TrainingSpec
from .software_rules import software_masks
from ..catalog import framework_profiles, resolve_framework
from ..cost.offload import offload_allowed
from ..layout import Candidates
from .fp8_rules import fp8_masks
from .job_rules import job_masks, job_problems

# Megatron-Core's interleaved uneven split (layout.split.uneven_interleave_ok), after its name
UNEVEN_INTERLEAVE_RULE = ("an interleaved uneven pipeline split needs every stage's layers "
                          "divisible by vpp (pp > 2) or the embedding-and-loss form")

# Megatron-Core's --pipeline-model-parallel-layout (layout.split.uneven_layout_ok)
UNEVEN_LAYOUT_RULE = ("an interleaved uneven pipeline split needs a layer in every model chunk "
                      "(at least vpp layers per stage)")

# The framework each export target runs (plan3d export --to TARGET checks that framework's rules).
TARGET_FRAMEWORK = {"megatron": "megatron-core", "nemo": "megatron-core", "deepspeed": "deepspeed",
                    "torchtitan": "torchtitan"}


def profile_for(training: TrainingSpec, given: FrameworkProfile | None = None) -> FrameworkProfile:
    """The framework profile whose rules apply: ``given``, else the catalog profile named by
    ``training.framework`` (megatron-core by default). UsageError when that name is not in the
    catalog (a profile from a file must be passed as ``given``)."""
    if given is not None:
        if given.name != training.framework:
            raise UsageError(f"the training was resolved for framework {training.framework} but "
                             f"the rules of {given.name} were given")
        return given
    profiles = framework_profiles()
    if training.framework not in profiles:
        raise UsageError(f"framework {training.framework!r} is not a shipped profile; pass its "
                         "profile file with --framework FILE")
    return profiles[training.framework]


def framework_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec,
                    c) -> dict[str, np.ndarray]:
    """{rule name: bool mask (True = allowed)} of the framework's layout rules (Rules in
    planner.framework_spec), of the job settings against the layout (job_rules.job_masks) and
    of the FP8 GEMM shapes (fp8_rules.fp8_masks), for candidates ``c`` (Candidates or a
    broadcast grid block)."""
    r, d = profile.rules, profile.display
    m = np.asarray(c.num_microbatches(training.global_batch_size), dtype=np.float64)
    tp, pp, vpp, cp = (np.asarray(x) for x in (c.tp, c.pp, c.vpp, c.cp))
    out: dict[str, np.ndarray] = {}
    if not r.tensor_parallel:
        out[f"{d} has no tensor parallelism (tp = 1)"] = tp == 1
    if not r.sequence_parallel:
        out[f"{d} has no sequence parallelism"] = ~np.asarray(c.sequence_parallel)
    if not r.pipeline_parallel:
        out[f"{d} has no pipeline parallelism (pp = 1)"] = pp == 1
    if r.context_parallel == "none":
        out[f"{d} has no context parallelism (cp = 1)"] = cp == 1
    elif r.context_parallel == "ulysses":
        out[f"{d} has no Megatron-style context parallelism (ring attention over cp ranks; its "
            "Ulysses all-to-all is another kind): cp = 1"] = cp == 1
    g = model.kv_heads
    if r.kv_heads_tp == "divides":
        out[f"{d}: tp divides the KV heads"] = g % tp == 0
    else:
        out[f"{d}: tp divides the KV heads or is a multiple of them"] = (g % tp == 0) | (tp % g == 0)
    out.update(_pipeline_masks(profile, model, c, m, pp, vpp))
    out.update(schedule_masks(profile, c))
    out.update(_sharding_masks(profile, c, pp))
    codes = [RECOMPUTE_CODES[x] for x in r.recompute]
    if len(codes) < len(RECOMPUTE_CODES):
        out[f"{d} offers recompute {' / '.join(r.recompute)}"] = np.isin(c.recompute, codes)
    out.update(_offload_masks(profile, model, training, c))
    if not r.recompute_num_layers:
        out[f"{d} recomputes every layer in full (no recompute_num_layers N > 0)"] = \
            np.asarray(c.recompute_num_layers) == 0
    if not r.expert_parallel:
        out[f"{d} has no expert parallelism (ep = 1)"] = np.asarray(c.ep) == 1
    elif model.moe is not None:
        out.update(_expert_masks(profile, c))
    if model.moe is not None and r.max_zero_stage_with_moe < 3:  # whatever ep is
        out[f"{d}: MoE layers need ZeRO stage {r.max_zero_stage_with_moe} or lower"] = \
            np.asarray(c.zero_stage) <= r.max_zero_stage_with_moe
    if model.moe is not None and not r.moe_zero3_model_parallel:
        out[f"{d}: MoE layers with ZeRO-3 need tp = 1 and etp = 1"] = \
            (np.asarray(c.zero_stage) < 3) | ((tp == 1) & (np.asarray(c.etp) == 1))
    if model.tie_embeddings and not r.tied_embeddings_with_pp:
        out[f"{d}: tied embeddings need pp = 1"] = pp == 1
    if model.mtp_layers and not r.mtp_with_pp_or_cp:
        out[f"{d}: multi-token prediction (MTP) layers need pp = 1 and cp = 1"] = (pp == 1) & (cp == 1)
    out.update(job_masks(profile, model, training, c))
    out.update(fp8_masks(profile, model, training, c))
    return out


def _offload_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec, c) -> dict:
    """Activation offload of N layers (offload_layers): offered by the framework at all; with
    Megatron-Core pp = 1 and no recomputation (cost.offload.offload_allowed); fewer layers than
    the model has; not beside Megatron-Core's fine-grained offload of the routed experts'
    activations (moe_activation_offload: transformer_config.py L2127-2130 refuses both)."""
    r, d = profile.rules, profile.display
    offload = np.asarray(c.offload_layers)
    out: dict[str, np.ndarray] = {"offload_layers fewer than the layers": offload < model.num_layers}
    if "activations" not in r.offload:
        out[f"{d} has no activation offload (offload_layers = 0)"] = offload == 0
    elif np.any(offload > 0):
        out[f"{d}: activation offload needs pp = 1 and no recomputation"] = \
            (offload == 0) | offload_allowed(c)
    if training.moe_activation_offload and model.moe is not None:
        out[f"{d} cannot combine fine-grained activation offloading (moe_activation_offload) with "
            "whole-layer offloading (offload_layers, transformer_config.py L2127-2130)"] = offload == 0
    return out


def _pipeline_masks(profile: FrameworkProfile, model: ModelSpec, c, m, pp, vpp) -> dict:
    """Interleaving, micro-batches against stages, and the uneven split forms."""
    r, d = profile.rules, profile.display
    out: dict[str, np.ndarray] = {}
    flat = vpp == 1
    if not r.interleaving:
        out[f"{d} has no interleaved pipeline schedule (vpp = 1)"] = flat
    elif r.interleaved_microbatches == "at_least_pp":
        out[f"{d}: interleaving needs pp >= {r.interleaving_min_pp} and >= pp micro-batches"] = \
            flat | ((pp >= r.interleaving_min_pp) & (m >= pp))
    elif r.interleaved_microbatches == "multiple_of_pp":
        out[f"{d}: interleaving needs pp >= {r.interleaving_min_pp} and micro-batches a multiple "
            "of pp"] = flat | ((pp >= r.interleaving_min_pp) & (m % pp == 0))
    else:  # PyTorch ScheduleInterleaved1F1B: rounds = max(1, m // pp), m % rounds == 0; and
        # m >= pp, which PyTorch does not check but torchtitan warns about and plan3d's
        # interleaved schedule assumes
        rounds = np.maximum(1.0, np.floor(m / pp))
        out[f"{d}: interleaved 1F1B needs >= pp micro-batches, a multiple of m // pp"] = \
            flat | ((pp >= r.interleaving_min_pp) & (m >= pp) & (m % rounds == 0))
    if r.pipeline_microbatches == "at_least_pp":
        out[f"{d}: 1F1B needs micro-batches >= pipeline stages"] = (pp == 1) | ~flat | (m >= pp)
    uneven = np.asarray(c.first_stage_layers) > 0
    if r.uneven_split == "none":
        out[f"{d} splits the pipeline evenly only"] = ~uneven
    elif r.uneven_split == "megatron":
        out[f"{d}: {UNEVEN_INTERLEAVE_RULE}"] = ~uneven | flat | \
            uneven_interleave_ok(model.num_layers, c)
    elif r.uneven_split == "layout":
        out[f"{d}: {UNEVEN_LAYOUT_RULE}"] = ~uneven | flat | \
            uneven_layout_ok(model.num_layers, c)
    elif r.uneven_split == "edge_stages":
        out[f"{d}: an interleaved uneven split only as one layer less on the first and last "
            "stage (embedding and loss)"] = ~uneven | flat | c.embedding_loss_split(model.num_layers)
    return out


def schedule_masks(profile: FrameworkProfile, c) -> dict:
    """The pipeline schedules the framework runs (Rules.pipeline_schedules, with its source):
    {rule: mask}, or {} where it runs every schedule plan3d knows. The two that vpp implies
    (1F1B, interleaved 1F1B) are the interleaving rules' (_pipeline_masks), and the schedule of
    a layout with pp = 1 is 1F1B, which every framework runs."""
    names = profile.rules.pipeline_schedules
    choices = BY_NAME["pipeline_schedule"].choices
    if set(choices) <= set(names):
        return {}
    code = np.asarray(c.pipeline_schedule)
    implied = code <= choices.index("interleaved-1f1b")
    return {f"{profile.display} runs the pipeline schedules {', '.join(names)}":
            np.isin(code, [choices.index(name) for name in names]) | implied | (np.asarray(c.pp) == 1)}


def _expert_masks(profile: FrameworkProfile, c) -> dict:
    """Expert tensor parallelism and where the ep ranks come from (Rules.expert_tensor_parallel,
    expert_ranks)."""
    r, d = profile.rules, profile.display
    ep = np.asarray(c.ep)
    out: dict[str, np.ndarray] = {}
    if not r.expert_tensor_parallel:
        out[f"{d} has no expert tensor parallelism (etp = 1)"] = np.asarray(c.etp) == 1
    if r.expert_ranks == "data":
        out[f"{d}: ep divides the data-parallel size"] = np.asarray(c.dp) % ep == 0
    elif r.expert_ranks == "fsdp_cp_tp":
        fsdp = np.where(np.asarray(c.zero_stage) >= 3, np.asarray(c.dp), 1)
        out[f"{d}: ep divides FSDP degree x cp x tp (DDP replicas hold no experts)"] = \
            (fsdp * np.asarray(c.cp) * np.asarray(c.tp)) % ep == 0
    return out


def offered_zero(rules, zero_stage, pp) -> np.ndarray:
    """Whether the framework ``rules`` (FrameworkProfile.rules) offer ZeRO stage ``zero_stage``
    with ``pp`` pipeline stages: a stage it offers, at most max_zero_stage_with_pp when pp > 1.
    Broadcast bool array."""
    zero = np.asarray(zero_stage)
    return np.isin(zero, rules.zero_stages) & ((np.asarray(pp) == 1) | (zero <= rules.max_zero_stage_with_pp))


def default_zero_stage(rules, pp: int) -> int:
    """The ZeRO stage a layout takes when none is given: 1 (ZeRO-1, the distributed optimizer's
    memory) where the framework offers it with ``pp`` stages, else the highest stage it offers
    there (torchtitan: 3, FSDP; Megatron-LM 2021: 0)."""
    offered = [z for z in range(4) if bool(offered_zero(rules, z, pp))]
    return 1 if 1 in offered else max(offered, default=1)


def _sharding_masks(profile: FrameworkProfile, c, pp) -> dict:
    """ZeRO stages offered, ZeRO with PP, Megatron's distributed optimizer (the two parts of
    offered_zero, each a named rule)."""
    r, d = profile.rules, profile.display
    out: dict[str, np.ndarray] = {}
    if len(r.zero_stages) < 4:
        out[f"{d} offers ZeRO stages {', '.join(map(str, sorted(r.zero_stages)))}"] = \
            offered_zero(r, c.zero_stage, 1)
    if r.max_zero_stage_with_pp < 3:
        stages = " and ".join(f"ZeRO-{z}" for z in range(r.max_zero_stage_with_pp + 1, 4))
        out[f"{d}: {stages} need pp = 1"] = \
            offered_zero(r.model_copy(update={"zero_stages": [0, 1, 2, 3]}), c.zero_stage, pp)
    if not r.distributed_optimizer:
        out[f"{d} has no distributed optimizer (Megatron's; use zero_stage 1)"] = \
            ~np.asarray(c.distributed_optimizer)
    return out


def model_problems(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec) -> list[str]:
    """What in the model or the training the framework cannot build at all, in words ([] if
    nothing): attention kind, position embedding, activation, norm, dtype, an FP8 precision its
    FP8 library does not run, Megatron-Core's MoE dispatchers and EP overlap outside Megatron
    profiles and what Megatron-Core refuses in them (job_rules.job_problems), a RoPE base that
    must be an integer."""
    r, d = profile.rules, profile.display
    problems = []
    for what, have, allowed in (("attention", model.attention_kind, r.attention),
                                ("position embedding", model.position_embedding, r.position_embedding),
                                ("activation", model.activation, r.activation),
                                ("norm", model.norm, r.norm), ("training dtype", training.dtype, r.dtypes)):
        if have not in allowed:
            problems.append(f"{d} has no {have} {what} ({model.name} uses it; {d} takes "
                            f"{', '.join(allowed)})" if what != "training dtype" else
                            f"{d} does not train in {have} (it takes {', '.join(allowed)})")
    library = profile.runtime.fp8_library
    if training.precision != "bf16" and library == "none":
        problems.append(f"{d} trains without FP8 (its profile's runtime.fp8_library is none), "
                        f"not in {training.precision}")
    elif training.precision == "fp8-blockwise" and library == "torchao":
        problems.append(f"{d} (torchao) has no 1x128 / 128x128 block-scaled FP8 recipe; use fp8 "
                        "(float8 rowwise) or mxfp8")
    if training.moe_capacity_factor is not None and not r.moe_token_drop:
        problems.append(f"{d} has no token dropping with a capacity factor (moe_capacity_factor, "
                        "--moe-capacity-factor): its MoE layers are dropless")
    problems += job_problems(profile, model, training)  # the MoE job settings
    theta = model.rope_theta
    if r.integer_rope_base and model.position_embedding == "rope" and theta is not None \
            and not float(theta).is_integer():
        problems.append(f"{d} takes an integer RoPE base, but {model.name} has rope_theta {theta!r}")
    return problems


def check_model(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec) -> None:
    """UsageError naming the first model_problems entry, with the frameworks that can."""
    problems = model_problems(profile, model, training)
    if problems:
        raise UsageError(f"{problems[0]}; choose another --framework (plan3d frameworks lists them)")


def broken_rules(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec, layout,
                 hw=None) -> list[str]:
    """The framework rules one ``layout`` (specs.Layout) breaks, model problems first; with
    ``hw`` (HardwareProfile) also those of its software switches on that hardware."""
    c = Candidates.from_layouts([layout])
    masks = framework_masks(profile, model, training, c)
    masks.update(software_masks(profile, model, training, c, hw))
    return model_problems(profile, model, training) + \
        [rule for rule, ok in masks.items() if not bool(np.all(ok))]


def check_plan(target: str, plan) -> None:
    """UsageError when the framework that export ``target`` writes for cannot run ``plan``
    (specs.Plan): the rules it breaks, and how to get a plan it runs."""
    profile = resolve_framework(TARGET_FRAMEWORK[target])
    broken = broken_rules(profile, plan.model, plan.training, plan.layout, plan.hardware)
    if broken:
        remedy = ("export to another target" if model_problems(profile, plan.model, plan.training)
                  else f"search with --framework {profile.name} for a plan it runs")
        raise UsageError(f"{profile.display} cannot run this plan ({plan.layout.short()}): "
                         f"{'; '.join(broken)}; {remedy}")
