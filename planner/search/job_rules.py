"""What a framework refuses in a plan's job settings (TrainingSpec: optimizer CPU offload, 16-bit
optimizer moments and fine-grained activation offload), as named
masks of the layout and as model problems: the rules search, estimate, ``--plan`` and every
export share (framework_rules.framework_masks and model_problems call them), so no consumer
prices a plan another refuses.

Sources: NVIDIA/Megatron-LM @ d98e8a64ddf3 megatron/core/optimizer/__init__.py L1057-1060 (the
precision-aware optimizer, which optimizer CPU offload and 16-bit moments need, only with the
distributed optimizer), megatron/core/transformer/transformer_config.py L2127-2130 (fine-grained activation offloading
beside --cpu-offloading-num-layers). The dispatcher and EP overlap are layout axes, ruled in
search.software_rules.
"""

from __future__ import annotations

import numpy as np

from ..cost.offload import uses_host_memory
from ..framework_spec import FrameworkProfile
from ..specs import ModelSpec, TrainingSpec


def megatron_core(profile: FrameworkProfile) -> bool:
    """Whether the profile runs Megatron-Core (its exports are Megatron-LM's or Bridge's), the
    framework whose job settings (dispatchers, EP overlap, fine-grained offloading) plan3d models."""
    return profile.export in ("megatron", "nemo")


def job_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec,
              c) -> dict[str, np.ndarray]:
    """{rule name: bool mask (True = allowed)} of the job settings against the layout ``c``:
    the precision-aware optimizer (optimizer CPU offload, 16-bit Adam moments) without a sharded
    optimizer, for a profile with ``precision_aware_optimizer_sharded``; Megatron-Core's
    fine-grained MoE activation offload beside whole-layer offload. (Optimizer CPU offload
    beside FP8 parameter gathering, which Megatron-LM refuses, is not a rule: such a job gathers
    16-bit parameters, precision.fp8_param_gather.)"""
    r, d = profile.rules, profile.display
    out: dict[str, np.ndarray] = {}
    aware = training.optimizer_offload_fraction > 0 or training.optimizer_moment_bytes < 4
    if aware and r.precision_aware_optimizer_sharded:
        out[f"{d}: optimizer CPU offload and 16-bit optimizer moments (the precision-aware "
            "optimizer) need the distributed optimizer (ZeRO >= 1)"] = np.asarray(c.sharding_stage) >= 1
    if training.moe_activation_offload and model.moe is not None and megatron_core(profile):
        out[f"{d}: fine-grained MoE activation offload excludes whole-layer offloading "
            "(no layer offloaded)"] = ~uses_host_memory(c)
    return out


def job_problems(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec) -> list[str]:
    """What in the job settings the framework cannot run whatever the layout, in words ([] if
    nothing): Megatron-Core's fine-grained MoE activation offload outside Megatron-Core. (The
    dispatcher and EP overlap are layout axes: search.software_rules.)"""
    if model.moe is None or megatron_core(profile) or not training.moe_activation_offload:
        return []
    return [f"{profile.display} has no Megatron-Core fine-grained MoE activation offload "
            "(moe_activation_offload)"]
