"""The parallelism and batch fields of a Megatron-Bridge (NeMo's Megatron training library) recipe.

Megatron-Bridge configures a run with a ``ConfigContainer`` of dataclasses (model, train, ddp,
optimizer, dataset, mixed_precision, ...); a recipe sets them in Python and any field can be
overridden as ``section.field=value`` (Hydra/OmegaConf). Field names were checked in
NVIDIA-NeMo/Megatron-Bridge:
  docs/megatron-lm-to-megatron-bridge.md at commit 167ba2ad3210 (MLM flag -> Bridge field table);
  src/megatron/bridge/recipes/llama/llama3.py at commit 6f6f95e09fc9 (cfg.model.*_parallel_size,
  cfg.model.sequence_parallel, cfg.model.recompute_granularity, cfg.train.*_batch_size,
  cfg.dataset.seq_length, cfg.ddp.use_distributed_optimizer / use_megatron_fsdp /
  data_parallel_sharding_strategy / overlap_grad_reduce / overlap_param_gather / grad_reduce_in_fp32).
The model shape itself comes from the recipe's model provider (e.g. ``AutoBridge.from_hf_pretrained``)
and is not written here.
"""

from __future__ import annotations

import yaml

from ..errors import UsageError
from ..specs import Plan
from .common import RANK_ORDER_NOTE, Export, describe, microbatches, rope_note

SOURCE = ("NVIDIA-NeMo/Megatron-Bridge docs/megatron-lm-to-megatron-bridge.md @167ba2ad3210, "
          "src/megatron/bridge/recipes/llama/llama3.py @6f6f95e09fc9")
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}  # Megatron-FSDP strategies


def nemo_fields(plan: Plan) -> dict[str, dict[str, object]]:
    """{section: {field: value}} for ``plan`` (None = unset / YAML null)."""
    lay, tr = plan.layout, plan.training
    microbatches(plan)
    if lay.first_stage_layers or lay.last_stage_layers:
        raise UsageError("the plan splits the pipeline unevenly (first/last stage "
                         f"{lay.first_stage_layers}/{lay.last_stage_layers} layers), which the "
                         "Megatron-Bridge fields plan3d writes cannot express; export --to megatron")
    recompute = {"none": (None, None, None, None),
                 "selective": ("selective", None, None, ["core_attn"]),
                 "full": ("full", "uniform", 1, None)}[lay.recompute]
    fsdp = lay.zero_stage >= 2
    return {
        "model": {
            "tensor_model_parallel_size": lay.tp,
            "pipeline_model_parallel_size": lay.pp,
            "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
            "context_parallel_size": lay.cp,
            "sequence_parallel": lay.sequence_parallel,
            "seq_length": tr.seq_length,
            "recompute_granularity": recompute[0],
            "recompute_method": recompute[1],
            "recompute_num_layers": recompute[2],
            "recompute_modules": recompute[3],
        },
        "train": {"micro_batch_size": lay.micro_batch_size,
                  "global_batch_size": tr.global_batch_size},
        "dataset": {"seq_length": tr.seq_length},
        "ddp": {
            "use_distributed_optimizer": lay.zero_stage == 1 or lay.distributed_optimizer,
            "use_megatron_fsdp": fsdp,
            "data_parallel_sharding_strategy": SHARDING.get(lay.zero_stage, "no_shard"),
            "overlap_grad_reduce": tr.overlap_grad_reduce,
            "overlap_param_gather": tr.overlap_grad_reduce and (lay.zero_stage >= 1 or
                                                                lay.distributed_optimizer),
            "grad_reduce_in_fp32": tr.grad_bytes == 4,
        },
        "optimizer": {"use_distributed_optimizer": lay.zero_stage == 1 or lay.distributed_optimizer},
        "mixed_precision": "bf16_mixed" if tr.dtype == "bf16" else "16-mixed",
    }


def _overrides(fields: dict[str, object]) -> list[str]:
    out = []
    for section, value in fields.items():
        if isinstance(value, dict):
            for k, v in value.items():
                text = "null" if v is None else (str(v).lower() if isinstance(v, bool) else
                                                 "[" + ",".join(v) + "]" if isinstance(v, list) else str(v))
                out.append(f"{section}.{k}={text}")
        else:
            out.append(f"{section}={value}")
    return out


def export_nemo(plan: Plan) -> Export:
    """YAML of the ConfigContainer fields, with the same settings as Hydra overrides in a comment."""
    fields = nemo_fields(plan)
    overrides = _overrides(fields)
    comments = [
        f"Megatron-Bridge (NeMo) recipe fields for {describe(plan)}",
        f"field names: {SOURCE}",
        RANK_ORDER_NOTE + " (Megatron-Core, unless dist.use_tp_pp_dp_mapping is set)",
        "model shape: from your recipe's model provider; this plan's model is "
        f"{plan.model.name} ({plan.model.num_layers} layers, hidden {plan.model.hidden_size})",
        "as run_recipe.py overrides:",
        "  " + " ".join(overrides),
    ]
    rope = rope_note(plan, "the recipe's model provider (Megatron-Core rotary_base; not written "
                     "here: not in the Megatron-Bridge field list plan3d is checked against)",
                     "the provider's rotary base")
    if rope:
        comments.append(rope)
    if plan.layout.zero_stage >= 2:
        comments.append(f"ZeRO-{plan.layout.zero_stage} = Megatron-FSDP with "
                        f"data_parallel_sharding_strategy {SHARDING[plan.layout.zero_stage]}")
    body = yaml.safe_dump(fields, sort_keys=False, default_flow_style=False)
    keys = [o.split("=", 1)[0] for o in overrides]
    return Export("nemo", "".join(f"# {c}\n" for c in comments) + body, keys=keys)
