"""torchtitan settings for a plan: command-line overrides (0.3+) or a TOML job file (0.2.x).

torchtitan 0.3.0 replaced TOML job files by typed Python config functions (pytorch/torchtitan PR
#2386; release notes of v0.3.0: "typed Python configuration") launched as
``python -m torchtitan.train --module <model module> --config <config function>`` plus
``--section.field value`` overrides; 0.2.x reads ``--job.config_file job.toml``.
Option names were checked in pytorch/torchtitan:
  overrides: torchtitan/config/configs.py at commit 0014ac2ca45a (TrainingConfig,
             ParallelismConfig, ActivationCheckpointConfig of the Python-config era);
  TOML:      torchtitan/config/job_config.py at commit 000204a4a8bf (Training, Parallelism,
             ActivationCheckpoint), and pipeline_parallel_{first,last}_stage_less_layers from
             PR #1416 (merged 2025-07, before v0.2.0 of 2025-10).
Later main (after 0.3) renamed the batch fields (PR #4121 "fold batch dim": token counts instead
of local/global batch size; num_pp_microbatches): the overrides fit 0.3, not those versions.

Mapping: tp -> tensor_parallel_degree; pp -> pipeline_parallel_degree with schedule 1F1B
(vpp = 1) or Interleaved1F1B (vpp > 1) and L/(pp*vpp) layers per stage (first/last stage "less
layers" set to 0, so stages = pp*vpp as in Megatron; an uneven split: the middle stages' count
with the edge stages "less layers", interleaved only for the embedding-and-loss split, one layer
less on the first and the last virtual stage); ZeRO-3 -> FSDP, data_parallel_shard_degree
= dp; ZeRO-0 -> DDP, data_parallel_replicate_degree = dp. Gradient dtype ->
training.mixed_precision_reduce.
Batch: with pp > 1 all m micro-batches of a DP rank run in one pipeline step
(local_batch_size = B/dp, pipeline_parallel_microbatch_size = b); with pp = 1 the local batch is
b and torchtitan accumulates B/(dp*b) steps (global_batch_size = B).
Recompute: none/selective/full -> activation_checkpoint.mode (selective is torchtitan's per-op
SAC, which plan3d costs: 0.2.x TOML also gets selective_ac_option "op"; 0.3's SelectiveAC is
per-op). torchtitan's TP always uses
sequence parallelism in 0.2.x (norms sharded on the sequence); 0.3 has enable_sequence_parallel.
What torchtitan cannot run (ZeRO-1/2, fp16, tied
embeddings with PP, 1F1B with fewer micro-batches than stages, other interleaved uneven splits)
is refused before this module runs, by the torchtitan framework profile's rules
(planner.frameworks.rules.check_plan), the same rules ``--framework torchtitan`` searches with.
Experts: ep -> expert_parallel_degree, where torchtitan's mesh can hold it (expert_parallel).
The architecture comes from the model flavour (--module/--config): no option sets it, so a
comment names every model field with this plan's value.
Checkpoints: checkpoint.enable (0.2.x: enable_checkpoint), checkpoint.interval (common.
save_interval, formulas.md 12) and checkpoint.async_mode "async" (DCP async_save) or "disabled"
(torchtitan/components/checkpoint.py CheckpointManager.Config at commit 0014ac2ca45a; 0.2.x
job_config.py Checkpoint at 000204a4a8bf). torchtitan's DCP checkpoint of bf16 mixed-precision
training holds fp32 parameters and Adam's moments, 12 B per parameter; a plan of another
framework's state (Megatron's 14 B) gets a comment saying so (the interval scales with the
square root of the save time).
"""

from __future__ import annotations

from ..errors import UsageError
from ..plan import Plan
from .common import (Export, describe, interval_note, layers_per_virtual_stage, microbatches,
                     rope_note, save_interval, unwritten_note)
from ..cost.memory import state_bytes

SOURCE_03 = "pytorch/torchtitan @0014ac2ca45a torchtitan/config/configs.py"
SOURCE_02 = "pytorch/torchtitan @000204a4a8bf torchtitan/config/job_config.py (+ PR #1416)"
ORDER_NOTE = ("rank order: torchtitan's ParallelDims mesh [pp, dp_replicate, dp_shard, cp, tp] "
              "(tp fastest, then cp, dp, pp): the same TP/CP/DP/PP groups as Megatron's "
              "tp-cp-ep-dp-pp that the cost model assumed; see `plan3d placement --order torchtitan`")


def torchtitan_settings(plan: Plan, fmt: str) -> tuple[dict[str, dict[str, object]], list[str]]:
    """({section: {field: value}}, comments) for ``plan``; ``fmt`` is "overrides" or "toml"."""
    lay, tr = plan.layout, plan.training
    m = microbatches(plan)
    notes: list[str] = []
    par: dict[str, object] = {"tensor_parallel_degree": lay.tp}
    if lay.tp > 1 and not lay.sequence_parallel:
        if fmt == "toml":
            notes.append("the plan has TP without sequence parallelism, but torchtitan 0.2.x TP "
                         "always shards norms on the sequence (SP): memory will be lower and TP "
                         "traffic different from the estimate")
        else:
            par["enable_sequence_parallel"] = False
    if lay.sharding_stage == 0:
        par["data_parallel_replicate_degree"] = lay.dp
        par["data_parallel_shard_degree"] = 1
    else:  # ZeRO-3 (the rules admit 0 and 3)
        par["data_parallel_replicate_degree"] = 1
        par["data_parallel_shard_degree"] = lay.dp
    par["pipeline_parallel_degree"] = lay.pp
    if lay.pp > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if lay.vpp > 1 else "1F1B"
        if (lay.first_stage_layers or lay.last_stage_layers) and lay.vpp > 1:
            # torchtitan shortens only the first and the last virtual stage: the embedding-and-
            # loss split (first = last = middle - 1) is that, one layer each (the only
            # interleaved uneven split the rules admit)
            k = (plan.model.num_layers + 2) // (lay.pp * lay.vpp)
            par["pipeline_parallel_layers_per_stage"] = k
            par["pipeline_parallel_first_stage_less_layers"] = 1
            par["pipeline_parallel_last_stage_less_layers"] = 1
        elif lay.first_stage_layers or lay.last_stage_layers:  # uneven: middle stages hold k
            f, la, L = lay.first_stage_layers, lay.last_stage_layers, plan.model.num_layers
            k = max(f, la, int(lay.stage_layers(L)[1]))
            par["pipeline_parallel_layers_per_stage"] = k
            par["pipeline_parallel_first_stage_less_layers"] = k - f
            par["pipeline_parallel_last_stage_less_layers"] = k - la
        else:
            par["pipeline_parallel_layers_per_stage"] = layers_per_virtual_stage(plan)
            par["pipeline_parallel_first_stage_less_layers"] = 0
            par["pipeline_parallel_last_stage_less_layers"] = 0
        par["pipeline_parallel_microbatch_size"] = lay.micro_batch_size
        local = m * lay.micro_batch_size
    else:
        local = lay.micro_batch_size
    par["context_parallel_degree"] = lay.cp
    if plan.model.moe is not None:
        par["expert_parallel_degree"] = expert_parallel(plan, fmt, par["data_parallel_shard_degree"])
    training = {"local_batch_size": local, "global_batch_size": tr.global_batch_size,
                "seq_len": tr.seq_length, "mixed_precision_param": "bfloat16",
                "mixed_precision_reduce": "float32" if tr.grad_bytes == 4 else "bfloat16"}
    ac: dict[str, object] = {"mode": lay.recompute}
    if lay.recompute == "selective" and fmt == "toml":
        # 0.2.x defaults selective_ac_option to "2" (every other layer); plan3d costs per-op SAC
        ac["selective_ac_option"] = "op"
    if not tr.flash_attention:
        notes.append("the plan assumed attention without flash attention (scores stored); "
                     "torchtitan's SDPA / FlexAttention use flash kernels: memory will be lower")
    if plan.model.position_embedding == "alibi":
        notes.append("the model uses ALiBi: the torchtitan model code must implement it "
                     "(its Llama-style models use RoPE)")
    rope = rope_note(plan, "the model flavour (its model args fix rope_theta; there is no "
                     "training option for it)", "the flavour's rope_theta")
    if rope:
        notes.append(rope)
    notes += _model_notes(plan)
    return {"training": training, "parallelism": par, "activation_checkpoint": ac,
            **_precision(plan, fmt, notes), **_checkpoint(plan, fmt, notes)}, notes


# torchao recipes torchtitan runs for plan3d's FP8 precisions (fp8-blockwise has none: the
# torchtitan profile's rules refuse it): float8 "rowwise" (its default; the tensorwise recipe is
# gone from 0.3's Float8LinearConverter) and MXFP8.
TITAN_FP8 = {"fp8": ("float8", "rowwise"), "mxfp8": ("mx", "mxfp8")}


def _precision(plan: Plan, fmt: str, notes: list[str]) -> dict[str, dict[str, object]]:
    """FP8 for the plan's precision: 0.2.x TOML ``model.converters`` with the ``[float8]`` /
    ``[mx]`` recipe (job_config.py @000204a4a8bf Model.converters, Float8, MX); 0.3 configures
    quantization in Python (model_registry(quantization=[...]), torchtitan @0014ac2
    components/quantization/float8.md, mx.py): a note names the converter. {} in BF16."""
    if plan.training.precision not in TITAN_FP8:
        return {}
    converter, recipe = TITAN_FP8[plan.training.precision]
    moe = plan.model.moe is not None
    if fmt == "toml":
        notes.append(f"{plan.training.precision}: torchao {recipe}; all communication stays in "
                     "high precision (torchtitan's float8.md), as the estimate assumed")
        return {"model": {"converters": [converter]},
                converter: {"recipe_name": recipe, "filter_fqns": ["output"]}}
    cls = "Float8" if converter == "float8" else "MXFP8"
    extra = f", {cls}GroupedExpertsConverter.Config(model_compile_enabled=True)" if moe else ""
    arg = 'recipe_name="rowwise", filter_fqns=["output"], ' if converter == "float8" else ""
    notes.append(f"{plan.training.precision}: torchtitan 0.3 sets quantization in Python, not by "
                 f"option: model_registry(..., quantization=[{cls}LinearConverter.Config({arg}"
                 f"model_compile_enabled=True){extra}]) (torchao {recipe}; communication in high "
                 "precision, as the estimate assumed)")
    return {}


def _checkpoint(plan: Plan, fmt: str, notes: list[str]) -> dict[str, dict[str, object]]:
    """{"checkpoint": its fields} for the plan's save interval (common.save_interval), or {}
    without an estimate; the interval's comment and the format caveat go to ``notes``."""
    ck = save_interval(plan)
    notes.append(interval_note(ck, plan))
    if ck is None:
        return {}
    planned = sum(state_bytes(plan.training))
    if planned != 12.0:  # a plan of another framework's state, exported to torchtitan
        notes.append(f"torchtitan's checkpoint holds fp32 parameters and Adam's moments (12 B per "
                     f"parameter), the interval was estimated for the plan's {planned:g} B")
    return {"checkpoint": {"enable_checkpoint" if fmt == "toml" else "enable": True,
                           "interval": ck["interval_steps"],
                           "async_mode": "async" if ck["async"] else "disabled"}}


def _model_notes(plan: Plan) -> list[str]:
    """The architecture the flavour must have (every model field, by name)."""
    out = []
    arch = unwritten_note(plan, "torchtitan", (), "the model flavour fixes the architecture: "
                          "pick or write one with these values")
    if arch:
        out.append(arch)
    return out


def expert_parallel(plan: Plan, fmt: str, dp_shard: int) -> int:
    """``parallelism.expert_parallel_degree`` = ep, or UsageError naming what torchtitan lacks.

    0.3 (configs.py L240-248; distributed/parallel_dims.py: sparse mesh [pp, dp_replicate,
    efsdp, ep] with efsdp = dp_shard*cp*tp/ep): EP borrows ranks from FSDP, CP and TP, and the
    experts are not tensor-parallel (etp = 1). 0.2.x (job_config.py L344-350, parallel_dims.py
    L56-58: ep % cp == 0 and dp_shard*cp % ep == 0; experiments/llama4/infra/parallelize.py:
    ExpertTensorParallel / TensorParallel on the experts when tp > 1): EP borrows from FSDP and
    CP only, and the experts are sharded over the attention TP (etp = tp)."""
    lay = plan.layout
    if fmt == "toml":
        if lay.etp != lay.tp:
            raise UsageError(f"torchtitan 0.2.x shards experts over the attention TP (etp = tp = "
                             f"{lay.tp}); this plan has etp={lay.etp}: use the overrides (0.3) "
                             "or a plan with etp = tp")
        if lay.ep % lay.cp or (dp_shard * lay.cp) % lay.ep:
            raise UsageError(f"torchtitan 0.2.x needs ep % cp == 0 and (FSDP degree * cp) % ep "
                             f"== 0; this plan has ep={lay.ep} cp={lay.cp} FSDP degree {dp_shard}")
        return lay.ep
    if lay.etp != 1:
        raise UsageError(f"torchtitan 0.3 has no expert tensor parallelism (ParallelismConfig has "
                         f"expert_parallel_degree only; experts are not TP-sharded); this plan "
                         f"has etp={lay.etp}")
    if (dp_shard * lay.cp * lay.tp) % lay.ep:
        raise UsageError(f"torchtitan 0.3 takes expert parallel ranks from FSDP x CP x TP = "
                         f"{dp_shard * lay.cp * lay.tp} (data_parallel_shard_degree {dp_shard}); "
                         f"ep={lay.ep} does not divide it (ZeRO-0 replicas cannot hold experts)")
    return lay.ep


def _value(v: object, toml: bool) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_value(x, True) for x in v) + "]" if toml else ",".join(map(str, v))
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"' if toml else v
    return str(v)


def export_torchtitan(plan: Plan, fmt: str = "overrides") -> Export:
    """Overrides (torchtitan 0.3) one per line with `` \\``, or a TOML job file (0.2.x)."""
    if fmt not in ("overrides", "toml"):
        raise UsageError(f"--torchtitan-format must be overrides or toml, got {fmt!r}")
    settings, notes = torchtitan_settings(plan, fmt)
    keys = [f"{s}.{k}" for s, fields in settings.items() for k in fields]
    if fmt == "toml":
        head = [f"torchtitan 0.2.x job file (TOML; run with --job.config_file) for {describe(plan)}",
                f"option names: {SOURCE_02}; does not fit torchtitan 0.3+ (Python configs)",
                ORDER_NOTE,
                "merge into your model's job file: [model], [optimizer], [lr_scheduler] and "
                "the checkpoint folder are not set here"] + notes
        body = []
        for section, fields in settings.items():
            body.append(f"[{section}]")
            body += [f"{k} = {_value(v, True)}" for k, v in fields.items()]
            body.append("")
        return Export("torchtitan", "".join(f"# {c}\n" for c in head) + "\n".join(body), keys=keys)
    head = [f"torchtitan 0.3 command-line overrides for {describe(plan)}",
            f"option names: {SOURCE_03}; for 0.2.x use --torchtitan-format toml",
            ORDER_NOTE,
            "append to: python -m torchtitan.train --module <your model module> --config <config fn>"] + notes
    lines = []
    for section, fields in settings.items():
        for k, v in fields.items():
            if isinstance(v, bool):  # tyro booleans are flags: --x.flag / --x.no_flag
                lines.append(f"--{section}.{'' if v else 'no_'}{k}")
            else:
                lines.append(f"--{section}.{k} {_value(v, False)}")
    text = "".join(f"# {c}\n" for c in head) + " \\\n".join(lines) + "\n"
    return Export("torchtitan", text, keys=keys)
