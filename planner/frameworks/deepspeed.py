"""A DeepSpeed ``ds_config.json`` for a plan, plus where DeepSpeed takes the TP/PP sizes.

Keys checked in deepspeedai/DeepSpeed at commit 088be892c749: deepspeed/runtime/constants.py
(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps, bf16.enabled,
fp16.enabled) and deepspeed/runtime/zero/config.py (zero_optimization.stage, overlap_comm).

DeepSpeed's batch identity: train_batch_size = micro_batch * gradient_accumulation_steps * DP
size, with DP = world / (tp * pp) when a model-parallel unit is given; under pipeline
parallelism the accumulation steps are the micro-batches of one pipeline step. So
train_batch_size = B, train_micro_batch_size_per_gpu = b, gradient_accumulation_steps = m.

The JSON has no field for TP or PP sizes: PP is ``deepspeed.pipe.PipelineModule(num_stages=pp)``
(or Megatron-DeepSpeed's ``--pipeline-model-parallel-size``), TP comes from the model code (e.g.
Megatron-DeepSpeed's ``--tensor-model-parallel-size``). Those go to ``Export.notes`` (stderr),
since JSON has no comments. What DeepSpeed cannot run (ZeRO-2/3 with PP, interleaving, ring CP,
an uneven split) is refused before this module runs, by the deepspeed framework profile's rules
(planner.search.framework_rules.check_plan), the same rules ``--framework deepspeed`` searches with.
MoE: where AutoEP can run the plan (tp = etp = 1; the only path at ZeRO-3) the ds_config gets
``expert_parallel`` {enabled, autoep_size = ep} (deepspeedai/DeepSpeed @edaa72212672
runtime/config.py EXPERT_PARALLEL, module_inject/auto_ep_config.py parse_autoep_config); else a
note gives the arguments of the model code's ``deepspeed.moe.layer.MoE`` (num_experts, k,
ep_size, expert tensor parallelism, dropless routing; deepspeed/moe/layer.py). Either way the
expert groups come from the data-parallel ranks (the deepspeed profile's rule: ep divides dp)
and a note says how the optimizer gets the MoE parameter groups DeepSpeed requires.
Software switches (layout software axes): DeepSpeed's only token dispatch is its all-to-all
(deepspeed/moe/sharded_moe.py; AutoEP's all_to_all_single, module_inject/auto_ep_layer.py
L95-130 @edaa72212672); it has no GEMM-level TP communication overlap (Domino is a model
implementation, not a ds_config switch), no Megatron-Core EP overlap and no CUDA graphs the
deepspeed profile offers: a plan with any of them is refused (check_software; the deepspeed
profile's rules refuse them first, search.software_rules).
"""

from __future__ import annotations

import json

from ..errors import UsageError
from ..plan import Plan
from .common import (RANK_ORDER_NOTE, Export, describe, interval_note, microbatches,
                     no_connections_requirement, rope_note, save_interval, unwritten_note)

SOURCE = "deepspeedai/DeepSpeed @088be892c749 deepspeed/runtime/constants.py, runtime/zero/config.py"


def check_software(plan: Plan) -> None:
    """UsageError naming the layout's software switches DeepSpeed lacks (module docstring)."""
    lay = plan.layout
    lacks = [what for on, what in (
        (lay.tp_comm_overlap, "TP communication overlap (--no-tp-comm-overlap)"),
        (plan.model.moe is not None and lay.moe_dispatcher != "alltoall",
         f"{lay.moe_dispatcher} token dispatcher: its MoE layers dispatch with an all-to-all "
         "(--moe-dispatcher alltoall)"),
        (lay.moe_a2a_overlap, "EP communication overlap (--no-moe-a2a-overlap)"),
        (lay.cuda_graphs != "none", "CUDA graphs (--cuda-graphs none)")) if on]
    if lacks:
        raise UsageError(f"DeepSpeed has no {'; no '.join(lacks)}; search with --framework "
                         "deepspeed for a plan it runs")


def ds_config(plan: Plan) -> dict:
    """The ds_config dictionary for ``plan`` (one the deepspeed profile's rules accept)."""
    check_software(plan)
    lay, tr = plan.layout, plan.training
    m = microbatches(plan)
    cfg: dict = {
        "train_batch_size": tr.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.micro_batch_size,
        "gradient_accumulation_steps": m,
        # Megatron's distributed optimizer shards what ZeRO-1 shards
        "zero_optimization": {"stage": int(lay.sharding_stage),
                              "overlap_comm": tr.overlap_grad_reduce},
    }
    cfg["bf16" if tr.dtype == "bf16" else "fp16"] = {"enabled": True}
    if autoep(plan):
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": int(lay.ep)}
    if lay.recompute == "full":  # every layer (the profile's rules refuse recompute_num_layers)
        # deepspeed/runtime/activation_checkpointing/config.py keys: no partitioning or CPU
        # copies of the checkpoints (plan3d costs neither); number_checkpoints = the
        # checkpoints per stage (one per layer), which contiguous_memory_optimization sizes
        cfg["activation_checkpointing"] = {
            "partition_activations": False, "cpu_checkpointing": False,
            "contiguous_memory_optimization": False,
            "number_checkpoints": int(plan.model.num_layers // lay.pp),
            "synchronize_checkpoint_boundary": False, "profile": False}
    return cfg


def _flatten(d: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in d.items():
        keys += _flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return keys


def export_deepspeed(plan: Plan) -> Export:
    """ds_config.json text; the parallel sizes and caveats as notes."""
    cfg = ds_config(plan)
    lay = plan.layout
    notes = [
        f"DeepSpeed config for {describe(plan)}; keys: {SOURCE}",
        f"tensor parallel: tp={lay.tp} is set by the model code, e.g. Megatron-DeepSpeed "
        f"--tensor-model-parallel-size {lay.tp}" + (" --sequence-parallel" if lay.sequence_parallel else ""),
        RANK_ORDER_NOTE + "; DeepSpeed's PipeModelDataParallelTopology uses axes [pipe, data, model] "
        "(model fastest), the same placement",
    ]
    if lay.pp > 1:
        notes.insert(1, f"pipeline: pp={lay.pp} is not a ds_config key; pass it as deepspeed.pipe."
                     f"PipelineModule(num_stages={lay.pp}) or Megatron-DeepSpeed "
                     f"--pipeline-model-parallel-size {lay.pp}")
    if lay.recompute == "full":
        notes.append("recompute=full: activation_checkpointing configures DeepSpeed's checkpoint "
                     "function; the model still calls it: deepspeed.pipe.PipelineModule("
                     "activation_checkpoint_interval=1) (every layer), or Megatron-DeepSpeed "
                     "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1")
    elif lay.recompute != "none":
        notes.append(f"recompute={lay.recompute}: ds_config has no switch for it; enable it in the "
                     "model (deepspeed.checkpointing.checkpoint, or Megatron-DeepSpeed "
                     "--recompute-granularity)")
    rope = rope_note(plan, "the model code (ds_config has no model architecture; e.g. "
                     "Megatron-DeepSpeed --rotary-base)", "the model code's default")
    if rope:
        notes.append(rope)
    if plan.training.grad_bytes == 4:
        notes.append("fp32 gradients: DeepSpeed accumulates in the model dtype unless "
                     "data_types.grad_accum_dtype is \"fp32\"; set it (not written here)")
    arch = unwritten_note(plan, "ds_config", (), "the model code sets the architecture")
    if arch:
        notes.append(arch)
    if plan.model.moe is not None:
        notes.append(moe_note(plan))
    notes.append(no_connections_requirement("DeepSpeed"))
    ck = save_interval(plan)
    sync = "" if ck is None or not ck["async"] else (
        " (engine.save_checkpoint blocks until written unless you configure an asynchronous "
        "checkpoint engine; plan with --sync-save to cost a blocking save)")
    notes.append(interval_note(ck, plan).replace(
        "set the checkpoint directory yourself", "ds_config has no interval: call "
        "engine.save_checkpoint every that many steps in your training loop" + sync))
    text = json.dumps(cfg, indent=2) + "\n"
    return Export("deepspeed", text, notes=notes, keys=_flatten(cfg))


AUTOEP = "DeepSpeed @edaa72212672 docs/_pages/config-json.md (Expert Parallel (AutoEP))"


def autoep(plan: Plan) -> bool:
    """Whether the plan's experts run as DeepSpeed's AutoEP layers: an MoE model at tp = etp = 1
    (AutoEP refuses TP from the model code, AutoTP and expert TP: runtime/engine.py L587-590,
    L1894-1915), the only MoE path DeepSpeed runs at ZeRO-3."""
    return plan.model.moe is not None and plan.layout.tp == 1 and plan.layout.etp == 1


def moe_note(plan: Plan) -> str:
    """How DeepSpeed runs the plan's experts: AutoEP from the ds_config, else the model code's
    deepspeed.moe.layer.MoE arguments; and the optimizer's MoE parameter groups."""
    moe, lay = plan.model.moe, plan.layout
    if autoep(plan):
        how = (f"experts: expert_parallel (AutoEP, autoep_size {lay.ep}) replaces the model's MoE "
               "layers; set expert_parallel.preset_model for your model (mixtral, qwen3_moe, "
               f"deepseek_v2, deepseek_v3) or its *_pattern keys ({AUTOEP})")
    else:
        how = (f"experts: AutoEP runs tp = etp = 1 only, so build each MoE layer as "
               f"deepspeed.moe.layer.MoE(num_experts={moe.num_experts}, k={moe.router_topk}, "
               f"ep_size={lay.ep}, enable_expert_tensor_parallelism={lay.etp > 1}, "
               "drop_tokens=False) in the model code (ZeRO 0-2 only)")
    return (f"{how}. The optimizer needs the experts in their own parameter groups: an optimizer "
            "section in ds_config makes the engine build them (runtime/engine.py L2026-2030); "
            "your own optimizer takes deepspeed.moe.utils."
            "split_params_into_different_moe_groups_for_optimizer(...) (ZeRO-1/2 assert it, "
            "zero/stage_1_and_2.py L779-780). The estimate assumed Megatron-Core's dropless "
            "routing and grouped GEMMs")
