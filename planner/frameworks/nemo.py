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
The model's architecture goes to the provider's fields (``model.num_layers``, MoE, MLA, MTP,
windows, biases, norm epsilon, RoPE base, expert-parallel degrees): planner.frameworks.nemo_model,
checked against the same field list.
Checkpoints: ``checkpoint.save_interval`` (common.save_interval, formulas.md 12),
``checkpoint.ckpt_format`` (torch_dist; fsdp_dtensor with Megatron-FSDP),
``checkpoint.async_save`` and, with torch_dist, ``checkpoint.fully_parallel_load``: the fields of
Megatron-LM's CheckpointConfig (NVIDIA/Megatron-LM @ d98e8a64ddf3
megatron/training/config/training_config.py) that Bridge's CheckpointConfig extends
(NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b src/megatron/bridge/training/config.py, which
defaults use_persistent_ckpt_worker to True and asserts that async_save has ``save`` set).
Megatron-FSDP (ZeRO-2/3): ddp.use_megatron_fsdp with the sharding strategy, the distributed
optimizer on in ddp and optimizer (Bridge turns both on for Megatron-FSDP v1, training/config.py
L1081-1085) and model.gradient_accumulation_fusion false (Bridge's FSDP performance recipes).
Environment: ``env_vars`` CUDA_DEVICE_MAX_CONNECTIONS where the plan needs it
(megatron.connections; ConfigContainer.env_vars, config.py L965 @067f987df03b).
Comments are wrapped at 80 columns (common.comment_lines).
"""

from __future__ import annotations

import yaml

from ..cost.precision import FP8_PARAM_GATHER
from ..errors import UsageError
from ..plan import Plan
from ..cost.checkpoint import MEGATRON_FSDP_STRATEGY, megatron_ckpt_format
from ..cost.model_flops import padded_vocab
from .common import (ARCHITECTURE_FIELDS, RANK_ORDER_NOTE, Export, comment_lines, describe,
                     interval_note, microbatches, recompute_modules, rope_note, save_interval,
                     unwritten_note)
from .megatron import connections, environment_comments, pipeline_split
from .megatron_model import moe_args
from .megatron_software import megatron_software
from .nemo_model import job_fields, model_comments, model_fields, software_fields

SOURCE = ("NVIDIA-NeMo/Megatron-Bridge docs/megatron-lm-to-megatron-bridge.md @167ba2ad3210, "
          "src/megatron/bridge/recipes/llama/llama3.py @6f6f95e09fc9; model provider fields: "
          "@067f987df03b conversion/model_bridge.py CONFIG_MAPPING, gpt_provider.py")


class _FlowScalarListsDumper(yaml.SafeDumper):
    """yaml.SafeDumper writing a list of scalars on one line, [0, 0, 0, 1, ...] (a 61-layer
    moe_layer_freq was 61 lines), and every other value as block YAML."""


def _scalar_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = all(isinstance(v, (bool, int, float, str)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowScalarListsDumper.add_representer(list, _scalar_list)


def checkpoint_fields(plan: Plan, ck: dict | None) -> dict[str, object]:
    """The ``checkpoint`` section for the plan's checkpoint estimate ``ck`` (empty without)."""
    if ck is None:
        return {}
    fsdp = plan.layout.zero_stage in MEGATRON_FSDP_STRATEGY
    out: dict[str, object] = {"save_interval": ck["interval_steps"],
                              "ckpt_format": megatron_ckpt_format(plan.layout.zero_stage),
                              "async_save": bool(ck["async"])}
    if not fsdp:
        out["fully_parallel_load"] = True
    return out


# Megatron-Bridge's mixed-precision presets (NVIDIA-NeMo/Megatron-Bridge @ 05097809
# src/megatron/bridge/training/mixed_precision.py, registered by function name): plan3d's
# precision -> the preset's suffix after "<dtype>_with_" ("<dtype>_mixed" for 16-bit).
BRIDGE_PRESETS = {"fp8": "fp8_current_scaling_mixed", "fp8-blockwise": "fp8_subchannel_scaling_mixed",
                  "mxfp8": "mxfp8_mixed"}


def mixed_precision_preset(training) -> str:
    """The Bridge preset of the training's dtype and precision: bf16_mixed, fp16_mixed,
    bf16_with_fp8_current_scaling_mixed (tensorwise, FP8 parameter gather), ..._subchannel_...
    (blockwise, no parameter gather), bf16_with_mxfp8_mixed (MXFP8, gather into the reused
    gradient buffer). UsageError for a preset that gathers FP8 parameters beside optimizer CPU
    offload, where plan3d gathers 16-bit ones (precision.fp8_param_gather): the preset is a name
    whose fp8_param_gather no recipe field overrides."""
    dtype = "bf16" if training.dtype == "bf16" else "fp16"
    if training.precision == "bf16":
        return f"{dtype}_mixed"
    preset = f"{dtype}_with_{BRIDGE_PRESETS[training.precision]}"
    if training.precision in FP8_PARAM_GATHER and training.optimizer_offload_fraction > 0:
        raise UsageError(f"Megatron-Bridge's mixed_precision preset {preset} gathers FP8 "
                         "parameters, which optimizer CPU offload cannot run beside (Megatron-LM "
                         "arguments.py L1888-1891); set fp8_param_gather=False in the recipe's "
                         "MixedPrecisionConfig, or export --to megatron (no --fp8-param-gather)")
    return preset


def nemo_fields(plan: Plan, ck: dict | None = None) -> dict[str, dict[str, object]]:
    """{section: {field: value}} for ``plan`` (None = unset / YAML null); ``ck`` the plan's
    checkpoint estimate (common.save_interval) for the checkpoint section."""
    lay, tr = plan.layout, plan.training
    split = pipeline_split(plan, int(microbatches(plan)))
    moe_args(plan)  # the same Megatron-Core rules as the Megatron-LM export (UsageError)
    recompute = {"none": (None, None, None, None),
                 "selective": ("selective", None, None, ["core_attn"]),
                 "selective+": ("selective", None, None, recompute_modules(plan.model)),
                 "full": ("full", "block", lay.recompute_num_layers, None) if lay.recompute_num_layers
                 else ("full", "uniform", 1, None)}[lay.recompute]
    fsdp = lay.zero_stage in MEGATRON_FSDP_STRATEGY
    job = job_fields(plan)
    software = software_fields(plan)
    return {
        "model": {
            "tensor_model_parallel_size": lay.tp,
            "pipeline_model_parallel_size": lay.pp,
            "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
            **_split_fields(plan, split),
            "context_parallel_size": lay.cp,
            "sequence_parallel": lay.sequence_parallel,
            "seq_length": tr.seq_length,
            "recompute_granularity": recompute[0],
            "recompute_method": recompute[1],
            "recompute_num_layers": recompute[2],
            "recompute_modules": recompute[3],
            **_offload_fields(lay.offload_layers),
            **model_fields(plan, int(padded_vocab(plan.model.vocab_size, lay.tp))),
            **software["model"],
            **job.get("model", {}),
            **({"gradient_accumulation_fusion": False} if fsdp else {}),
        },
        "train": {"micro_batch_size": lay.micro_batch_size,
                  "global_batch_size": tr.global_batch_size},
        "dataset": {"seq_length": tr.seq_length},
        "ddp": {
            # Megatron-FSDP v1 runs the distributed optimizer too (fsdp_env)
            "use_distributed_optimizer": bool(lay.sharding_stage >= 1),
            "use_megatron_fsdp": fsdp,
            "data_parallel_sharding_strategy": MEGATRON_FSDP_STRATEGY.get(lay.zero_stage, "no_shard"),
            "overlap_grad_reduce": tr.overlap_grad_reduce,
            "overlap_param_gather": tr.overlap_grad_reduce and bool(lay.sharding_stage >= 1),
            "grad_reduce_in_fp32": tr.grad_bytes == 4,
        },
        "optimizer": {"use_distributed_optimizer": bool(lay.sharding_stage >= 1),
                      **job.get("optimizer", {})},
        "comm_overlap": software["comm_overlap"],
        **{k: software[k] for k in ("rng", "rerun_state_machine") if k in software},
        "mixed_precision": mixed_precision_preset(tr),
        **({"checkpoint": checkpoint_fields(plan, ck)} if ck is not None else {}),
        **env_fields(plan),
    }


def env_fields(plan: Plan) -> dict[str, dict[str, object]]:
    """{"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": n}} where the plan needs it
    (megatron.connections: 32 with Megatron-FSDP, which Megatron-Bridge asserts is not 1,
    training/config.py L1110-1111 @067f987df03b; 1 for TP/CP before Blackwell; 32 for EP
    overlap), else {}. ConfigContainer.env_vars (config.py L965) are defaults set before the
    run's config is finalized (apply_environment_variables, L1971-1989)."""
    value = connections(plan).value
    return {} if value is None else {"env_vars": {"CUDA_DEVICE_MAX_CONNECTIONS": int(value)}}


def env_comments(plan: Plan) -> list[str]:
    """What env_fields sets and why (megatron.connections, with Megatron-Bridge's own check for
    Megatron-FSDP), and that a value the launcher already exports wins: Bridge applies env_vars
    with os.environ.setdefault (training/config.py L1989 @067f987df03b)."""
    env = connections(plan)
    if env.value is None:
        return environment_comments(plan)
    if plan.layout.zero_stage in MEGATRON_FSDP_STRATEGY:
        why = ("Megatron-Bridge asserts it is not 1 with Megatron-FSDP (training/config.py "
               "L1110-1111)")
    elif env.value == "1":
        why = ("Megatron-Core's TP layers want it for the backward overlap the estimate assumed "
               "(tensor_parallel/layers.py L909-923 warn otherwise; Megatron-LM asserts it, "
               "arguments.py L1477-1479)")
    else:
        why = env.why[0]
    return ([f"environment: env_vars CUDA_DEVICE_MAX_CONNECTIONS={env.value}: {why}; a value "
             "your launcher or shell exports wins over env_vars (Bridge applies them with "
             "os.environ.setdefault, training/config.py L1989), so "
             + ("unset it there" if env.value != "1" else "set 1 there or nothing")]
            + env.why[1:])


def _split_fields(plan: Plan, split) -> dict[str, object]:
    """The pipeline split as TransformerConfig fields of the model provider, the names
    Megatron-Bridge maps Megatron-LM's flags to (NVIDIA-NeMo/Megatron-Bridge @067f987df03b
    scripts/translate_mlm_to_bridge.py BRIDGE_TO_MLM_EXTRA: num_layers_in_first/last_pipeline_stage
    = --decoder-first/last-pipeline-num-layers, microbatch_group_size_per_vp_stage =
    --microbatch-group-size-per-virtual-pipeline-stage; account_for_embedding/loss_in_pipeline_split
    as the Llama 3.1 405B recipe sets them, recipes/llama/llama3.py; pipeline_model_parallel_layout
    as the DeepSeek-V3 recipe, recipes/deepseek/deepseek_v3.py): what
    megatron.pipeline_split says the Megatron-LM export writes as flags; none for an even split."""
    lay = plan.layout
    out: dict[str, object] = {}
    if split.microbatch_group:
        out["microbatch_group_size_per_vp_stage"] = split.microbatch_group
    if split.form == "embedding_loss":
        out.update(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    elif split.form == "first_last":
        out.update(num_layers_in_first_pipeline_stage=lay.first_stage_layers,
                   num_layers_in_last_pipeline_stage=lay.last_stage_layers)
    elif split.form == "layout":
        out["pipeline_model_parallel_layout"] = split.layout
    return out


def _offload_fields(layers: int) -> dict[str, object]:
    """Megatron-Core's activation offload as Bridge's model fields (TransformerConfig
    cpu_offloading, cpu_offloading_weights, cpu_offloading_num_layers; set together in
    Megatron-Bridge @067f987df perf_recipes/llama/gb200/llama3.py, Llama 3 70B on 64 GB200:
    20 layers); none when the plan offloads nothing."""
    if not layers:
        return {}
    return {"cpu_offloading": True, "cpu_offloading_weights": False,
            "cpu_offloading_num_layers": layers}


def _override(section: str, key: str, value: object) -> str:
    """One Hydra override; env_vars in the form Megatron-Bridge's recipe-usage.md gives
    ('++env_vars={NAME:value}', quoted for the shell)."""
    if section == "env_vars":
        return f"'++env_vars={{{key}:{value}}}'"
    text = "null" if value is None else (
        str(value).lower() if isinstance(value, bool) else
        "[" + ",".join(str(x) for x in value) + "]" if isinstance(value, list) else str(value))
    if any(ch in text for ch in "|*()[]{} "):  # shell metacharacters (a pipeline layout's "|", "*")
        return f"'{section}.{key}={text}'"
    return f"{section}.{key}={text}"


def _overrides(fields: dict[str, object]) -> list[str]:
    out = []
    for section, value in fields.items():
        if isinstance(value, dict):
            out += [_override(section, k, v) for k, v in value.items()]
        else:
            out.append(f"{section}={value}")
    return out


def export_nemo(plan: Plan) -> Export:
    """YAML of the ConfigContainer fields, with the same settings as Hydra overrides in a comment."""
    ck = save_interval(plan)
    fields = nemo_fields(plan, ck)
    overrides = _overrides(fields)
    comments = [
        f"Megatron-Bridge (NeMo) recipe fields for {describe(plan)}",
        f"field names: {SOURCE}",
        RANK_ORDER_NOTE + " (Megatron-Core, unless dist.use_tp_pp_dp_mapping is set)",
        f"model: {plan.model.name} as provider fields (they override the recipe's provider)",
        "as run_recipe.py overrides:",
        "  " + " ".join(overrides),
        interval_note(ck, plan).replace("set the checkpoint directory yourself",
                                        "set checkpoint.save (the directory) yourself"),
    ] + env_comments(plan)
    if plan.training.precision == "fp8":
        comments.append("mixed_precision bf16_with_fp8_current_scaling_mixed keeps the first and "
                        "the last transformer layer in BF16 (first_last_layers_bf16); the estimate "
                        "runs every layer in FP8, as Bridge's performance recipes do")
    theta = plan.model.rope_theta
    if plan.model.position_embedding == "rope" and (theta is None or not float(theta).is_integer()):
        comments.append(rope_note(plan, "the recipe's model provider (rotary_base is an int "
                                  "field)", "the provider's rotary base"))
    comments += model_comments(plan) + megatron_software(plan, "nemo").comments
    skipped = {"max_position_embeddings"} | ({"activation"} if plan.model.activation == "swiglu"
                                             else set()) | ({"qk_norm"} if plan.model.qk_norm == "full" else set())
    table = "; the learned position table has seq_length rows" \
        if plan.model.position_embedding == "learned" else ""
    note = unwritten_note(plan, "Megatron-Bridge", set(ARCHITECTURE_FIELDS) - skipped,
                          f"set them in the provider's Python or layer spec{table}")
    if note:
        comments.append(note)
    if plan.layout.zero_stage in MEGATRON_FSDP_STRATEGY:
        comments.append(f"ZeRO-{plan.layout.zero_stage} = Megatron-FSDP v1 with "
                        "data_parallel_sharding_strategy "
                        f"{MEGATRON_FSDP_STRATEGY[plan.layout.zero_stage]}, "
                        "use_distributed_optimizer true (Bridge turns it on for v1: "
                        "training/config.py L1081-1085 @067f987df03b) and "
                        "model.gradient_accumulation_fusion false (as Bridge's FSDP performance "
                        "recipes set it: perf_recipes/llama/gb200/llama3.py L226)")
    # PyYAML breaks a flow list after the column passes width: 76 keeps its lines within 80
    body = yaml.dump(fields, Dumper=_FlowScalarListsDumper, sort_keys=False,
                     default_flow_style=False, width=76)
    keys = [f"{section}.{k}" if isinstance(v, dict) else section
            for section, v in fields.items() for k in (v if isinstance(v, dict) else [section])]
    return Export("nemo", comment_lines(comments) + body, keys=keys)
