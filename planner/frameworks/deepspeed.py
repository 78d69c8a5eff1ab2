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
since JSON has no comments. DeepSpeed's PipelineEngine asserts ZeRO stage < 2
(deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline
parallelism"), so pp > 1 with ZeRO-2/3 is a UsageError. A mixture-of-experts model is a
UsageError too: DeepSpeed's MoE is a layer of the model code (deepspeed/moe/layer.py ``MoE``
with ``ep_size``), not a ds_config key.
"""

from __future__ import annotations

import json

from ..errors import UsageError
from ..specs import Plan
from .common import (RANK_ORDER_NOTE, Export, describe, interval_note, microbatches, rope_note,
                     save_interval, unwritten_note)

SOURCE = "deepspeedai/DeepSpeed @088be892c749 deepspeed/runtime/constants.py, runtime/zero/config.py"


def ds_config(plan: Plan) -> dict:
    """The ds_config dictionary for ``plan``. UsageError for pp > 1 with ZeRO-2/3."""
    lay, tr = plan.layout, plan.training
    m = microbatches(plan)
    if lay.first_stage_layers or lay.last_stage_layers:
        raise UsageError("the plan splits the pipeline unevenly (first/last stage "
                         f"{lay.first_stage_layers}/{lay.last_stage_layers} layers); DeepSpeed "
                         "partitions PipelineModule layers in code, not in ds_config")
    if plan.model.moe is not None:
        raise UsageError(f"{plan.model.name} is a mixture of experts: DeepSpeed's MoE lives in "
                         "the model code (deepspeed.moe.layer.MoE, ep_size), not in ds_config; "
                         "export --to megatron, nemo or torchtitan")
    if lay.cp > 1:
        raise UsageError(f"DeepSpeed has no Megatron-style context parallelism (ring attention "
                         f"over cp ranks); this plan has cp={lay.cp}")
    if lay.pp > 1 and lay.zero_stage >= 2:
        raise UsageError(f"DeepSpeed's pipeline engine does not support ZeRO-{lay.zero_stage} "
                         f"(it requires stage < 2 when pp > 1); this plan has pp={lay.pp}")
    cfg: dict = {
        "train_batch_size": tr.global_batch_size,
        "train_micro_batch_size_per_gpu": lay.micro_batch_size,
        "gradient_accumulation_steps": m,
        # Megatron's distributed optimizer shards what ZeRO-1 shards
        "zero_optimization": {"stage": 1 if lay.distributed_optimizer else lay.zero_stage,
                              "overlap_comm": tr.overlap_grad_reduce},
    }
    cfg["bf16" if tr.dtype == "bf16" else "fp16"] = {"enabled": True}
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
    if lay.vpp > 1:
        notes.append(f"vpp={lay.vpp}: DeepSpeed's pipeline engine runs plain 1F1B; it has no "
                     "interleaved schedule, so the bubble will be larger than estimated")
    if lay.recompute != "none":
        notes.append(f"recompute={lay.recompute}: ds_config has no switch for it; enable it in the "
                     "model (deepspeed.checkpointing.checkpoint, or Megatron-DeepSpeed "
                     "--recompute-granularity)")
    rope = rope_note(plan, "the model code (ds_config has no model architecture; e.g. "
                     "Megatron-DeepSpeed --rotary-base)", "the model code's default")
    if rope:
        notes.append(rope)
    if plan.training.grad_bytes == 2:
        notes.append("grad_bytes 2 (bf16 gradient reduction) is not set here")
    arch = unwritten_note(plan, "ds_config", (), "the model code sets the architecture")
    if arch:
        notes.append(arch)
    notes.append(interval_note(save_interval(plan), plan).replace(
        "set the checkpoint directory yourself", "ds_config has no interval: call "
        "engine.save_checkpoint every that many steps in your training loop"))
    text = json.dumps(cfg, indent=2) + "\n"
    return Export("deepspeed", text, notes=notes, keys=_flatten(cfg))
