"""torchtitan settings for a plan: command-line overrides (0.3.0) or a TOML job file (0.2.2).

Each format targets one torchtitan release on PyPI, named in the export's first comments:
  overrides: torchtitan 0.3.0 (typed Python configs: ``python -m torchtitan.train --module
             <model module> --config <config function>`` plus ``--section.field value``);
             names read in its wheel: torchtitan/config/configs.py (TrainingConfig,
             ParallelismConfig), components/checkpointer/base.py and dcp.py (checkpoint
             Config: enable, interval, async_mode) and trainer.py Trainer.Config, whose
             activation_checkpoint is a tyro subcommand (SelectiveAC / FullAC / None, written
             ``activation-checkpoint:full``, last: torchtitan/distributed/activation_checkpoint.py
             L332-337; 0.3.0's own message spells it so, distributed/minimal_async_ep/api.py L140);
  TOML:      torchtitan 0.2.2 (``--job.config_file job.toml``); names read in its wheel:
             torchtitan/config/job_config.py (JobConfig: Training, Parallelism, Checkpoint,
             ActivationCheckpoint, Model, Quantize), which ConfigManager._dict_to_dataclass
             checks ("Invalid field names"). tests/data/torchtitan_0.2_toml_options.txt lists
             them.

Mapping: tp -> tensor_parallel_degree; pp -> pipeline_parallel_degree with the plan's schedule
under torchtitan's name (torchtitan_parallelism.SCHEDULE_NAMES: 1F1B, Interleaved1F1B, GPipe,
LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) and L/(pp*vpp) layers per stage
(first/last stage "less layers" set to 0, so stages = pp*vpp as in Megatron; an uneven split:
the middle stages' count with the edge stages "less layers", interleaved only for the
embedding-and-loss split, one layer less on the first and the last virtual stage); ZeRO-3 -> FSDP, data_parallel_shard_degree
= dp; ZeRO-0 -> DDP, data_parallel_replicate_degree = dp. Gradients: training.
mixed_precision_reduce float32, the only value either release takes (Literal["float32"]): a
plan with bf16 gradients is refused.
Batch: with pp > 1 all m micro-batches of a DP rank run in one pipeline step
(local_batch_size = B/dp, pipeline_parallel_microbatch_size = b); with pp = 1 the local batch is
b and torchtitan accumulates B/(dp*b) steps (global_batch_size = B).
Recompute: none/selective/full -> activation_checkpoint (selective is torchtitan's per-op SAC,
which plan3d costs: the 0.2.2 TOML also gets selective_ac_option "op"; 0.3.0's SelectiveAC is
per-op). torchtitan 0.2.2's TP always uses sequence parallelism (norms sharded on the
sequence); 0.3.0 has enable_sequence_parallel.
FP8 (the recipe the estimate costed, cost.precision: per-tensor current scaling, torchao's
"tensorwise"): 0.2.2 model.converters ["quantize.linear.float8"] with [quantize.linear.float8]
recipe_name "tensorwise"; 0.3.0 has only rowwise float8 recipes (float8.py
Float8LinearConverter.Config recipe_name Literal["rowwise", "rowwise_with_gw_hp"]) and refuses
it, as 0.2.2 does for experts (its grouped-GEMM float8 is rowwise). MXFP8: 0.2.2
quantize.linear.mx (+ quantize.grouped_mm.mx for experts); 0.3.0 a Python converter (a note).
What torchtitan cannot run (ZeRO-1/2, fp16, tied
embeddings with PP, 1F1B with fewer micro-batches than stages, other interleaved uneven splits)
is refused before this module runs, by the torchtitan framework profile's rules
(planner.search.framework_rules.check_plan), the same rules ``--framework torchtitan`` searches
with.
Experts: ep -> expert_parallel_degree, where torchtitan's mesh can hold it (expert_parallel).
The architecture comes from the model flavour (--module/--config): no option sets it, so a
comment names every model field with this plan's value.
The software switches (layout software axes; _software):
  tp_comm_overlap  async TP: 0.3.0 --compile.enable --compile.components model,loss
                   --compile.enable_async_tensor_parallel (configs.py L291-312: CompileConfig
                   raises without compile.enable and "model" in compile.components); 0.2.2
                   parallelism.enable_async_tensor_parallel with [compile] enable and components
                   (job_config.py L357, L721-727; distributed/tensor_parallel.py L16-23)
  moe_dispatcher   alltoall = the "standard" all-to-all; 0.2.2 parallelism.
                   expert_parallel_comm_backend "standard" | "deepep" (job_config.py L474-483;
                   DeepEP needs ep > 1 and etp = 1: models/deepseek_v3/infra/parallelize.py
                   L100-111), no HybridEP; 0.3.0 takes the backend in the model registry's
                   Python (moe_comm_backend "standard" | "deepep" | "hybridep" |
                   "minimal_async_ep": models/common/config_utils.py L362-425), not as an
                   option: a note; no all-gather dispatcher in either (refused)
  moe_a2a_overlap  none: Megatron-Core's combined 1F1B EP overlap is not torchtitan's (refused)
  cuda_graphs      none: 0.3.0 captures each micro-batch's forward and backward by default
                   (training.disable_cuda_graphs False, configs.py L66-77; trainer.py L179-210
                   refuses it with pp > 1 and with an EP dispatcher that syncs the host), so
                   --training.disable_cuda_graphs is written; full_iteration: 0.3.0's graph
                   (forward and backward, no optimizer step, as Megatron-Core's full_iteration),
                   refused with pp > 1 or ep > 1; 0.2.2 has no CUDA graphs; layers: neither
                   release graphs single layers (refused)
Checkpoints: checkpoint.enable, checkpoint.interval (common.save_interval, formulas.md 12) and
checkpoint.async_mode "async" (DCP async_save) or "disabled", in both releases.
torchtitan's DCP checkpoint of bf16 mixed-precision training holds fp32 parameters and Adam's
moments, 12 B per parameter; a plan of another framework's state (Megatron's 14 B) gets a
comment saying so (the interval scales with the square root of the save time).
"""

from __future__ import annotations

from ..errors import UsageError
from ..plan import Plan
from .common import (Export, comment_lines, describe, interval_note, no_connections_requirement,
                     rope_note, save_interval, unwritten_note)
from .torchtitan_parallelism import RELEASE, parallelism_section
from ..cost.memory import state_bytes
from ..search.framework_rules import profile_for

SOURCE_03 = ("torchtitan 0.3.0 (PyPI) torchtitan/config/configs.py, trainer.py Trainer.Config, "
             "components/checkpointer/dcp.py")
SOURCE_02 = "torchtitan 0.2.2 (PyPI) torchtitan/config/job_config.py JobConfig"
ORDER_NOTE = ("rank order: torchtitan's ParallelDims mesh [pp, dp_replicate, dp_shard, cp, tp] "
              "(tp fastest, then cp, dp, pp): the same TP/CP/DP/PP groups as Megatron's "
              "tp-cp-ep-dp-pp that the cost model assumed; see `plan3d placement --order torchtitan`")


def torchtitan_settings(plan: Plan, fmt: str) -> tuple[dict[str, dict[str, object]], list[str]]:
    """({section: {field: value}}, comments) for ``plan``; ``fmt`` is "overrides" (0.3.0) or
    "toml" (0.2.2). UsageError for what the release cannot run as costed (bf16 gradient
    reduction, an FP8 recipe it lacks, an expert mesh it cannot build)."""
    lay, tr = plan.layout, plan.training
    notes: list[str] = []
    if tr.grad_bytes != 4:
        _bf16_gradients(plan, notes)
    par, local = parallelism_section(plan, fmt, notes)
    training = {"local_batch_size": local, "global_batch_size": tr.global_batch_size,
                "seq_len": tr.seq_length, "mixed_precision_param": "bfloat16",
                "mixed_precision_reduce": "float32"}
    ac: dict[str, object] = {"mode": lay.recompute}
    if lay.recompute == "selective" and fmt == "toml":
        # 0.2.2 defaults selective_ac_option to "2" (every other layer); plan3d costs per-op SAC
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
    notes.append(no_connections_requirement("torchtitan"))
    software = _software(plan, fmt, notes)
    training.update(software.pop("training", {}))
    par.update(software.pop("parallelism", {}))
    return {"training": training, "parallelism": par, **software, **_precision(plan, fmt, notes),
            **_checkpoint(plan, fmt, notes), "activation_checkpoint": ac}, notes


def _software(plan: Plan, fmt: str, notes: list[str]) -> dict[str, dict[str, object]]:
    """The plan's software switches as torchtitan settings ({section: {field: value}}, the
    training and parallelism entries merged by the caller; module docstring), notes into
    ``notes``; UsageError for what the release lacks."""
    lay, release, moe = plan.layout, RELEASE[fmt], plan.model.moe is not None
    out: dict[str, dict[str, object]] = {"training": {}, "parallelism": {}}
    if lay.moe_a2a_overlap:
        raise UsageError(f"torchtitan {release} has no EP communication overlap (Megatron-Core's "
                         "--overlap-moe-expert-parallel-comm); plan with --no-moe-a2a-overlap")
    if lay.cuda_graphs == "layers":
        raise UsageError(f"torchtitan {release} does not graph single layers (--cuda-graphs "
                         "layers is Megatron-Core's); plan with --cuda-graphs none")
    if lay.cuda_graphs == "full_iteration":
        if fmt == "toml" or lay.pp > 1 or (moe and lay.ep > 1):
            why = ("torchtitan 0.2.2 has no CUDA graphs" if fmt == "toml" else
                   "torchtitan 0.3.0 refuses CUDA graphs with "
                   + ("pipeline parallelism" if lay.pp > 1 else "an EP dispatcher that syncs the "
                      "host (only HybridEP with a non-blocking capacity or MinimalAsyncEP)")
                   + " (trainer.py L179-210)")
            raise UsageError(f"{why}; plan with --cuda-graphs none")
        out["training"]["disable_cuda_graphs"] = False
        notes.append("CUDA graphs: torchtitan 0.3.0 captures each micro-batch's forward and "
                     "backward in one graph (training.disable_cuda_graphs false), as the "
                     "estimate's full_iteration graph")
    elif fmt == "overrides":
        out["training"]["disable_cuda_graphs"] = True
        notes.append("CUDA graphs: off (--training.disable_cuda_graphs), as the estimate assumed; "
                     "torchtitan 0.3.0 captures each micro-batch's forward and backward by "
                     "default, and refuses that with pp > 1 or an EP dispatcher that syncs the "
                     "host (configs.py L66-77, trainer.py L179-210)")
    if lay.tp_comm_overlap:
        out["compile"] = {"enable": True, "components": ["model", "loss"]}
        if fmt == "overrides":
            out["compile"]["enable_async_tensor_parallel"] = True
        else:
            out["parallelism"]["enable_async_tensor_parallel"] = True
        notes.append("TP communication overlap: torchtitan's async TP, which needs torch.compile "
                     "of the model (compile.enable, \"model\" in compile.components): Inductor "
                     "fuses each TP all-gather with its matmuls and each matmul with its "
                     "reduce-scatter; the estimate costed Transformer Engine's userbuffers "
                     "overlap, and compiling also fuses the elementwise operations")
    if moe:
        out["parallelism"].update(_comm_backend(plan, fmt, notes))
    return {k: v for k, v in out.items() if v}


def _comm_backend(plan: Plan, fmt: str, notes: list[str]) -> dict[str, object]:
    """The expert-parallel communication backend of the plan's token dispatcher (module
    docstring): 0.2.2's parallelism field, or {} with a note for 0.3.0 (a model-registry
    argument); UsageError for a dispatcher the release lacks."""
    lay, name, release = plan.layout, plan.layout.moe_dispatcher, RELEASE[fmt]
    backend = {"alltoall": "standard", "deepep": "deepep", "hybridep": "hybridep"}.get(name)
    if backend is None:
        raise UsageError(f"torchtitan {release} has no {name} token dispatcher (its expert-"
                         "parallel backends: standard all-to-all, deepep, hybridep"
                         + (" in 0.3.0" if fmt == "toml" else "")
                         + "); plan with --moe-dispatcher alltoall")
    if fmt == "toml":
        if backend == "hybridep":
            raise UsageError("torchtitan 0.2.2 has no HybridEP (parallelism."
                             "expert_parallel_comm_backend is 'standard' | 'deepep', job_config.py "
                             "L474-483); plan with --moe-dispatcher alltoall or deepep, or export "
                             "for 0.3.0 (--torchtitan-format overrides)")
        if backend == "deepep" and (lay.ep == 1 or lay.etp > 1):
            raise UsageError("torchtitan 0.2.2 runs DeepEP with ep > 1 and etp = 1 only "
                             "(models/deepseek_v3/infra/parallelize.py L100-111); the plan has "
                             f"ep={lay.ep} etp={lay.etp}")
        if backend == "deepep":
            notes.append("dispatcher: DeepEP (expert_parallel_comm_backend \"deepep\"), which "
                         "torchtitan 0.2.2's DeepSeek-V3 model code builds (models/deepseek_v3/"
                         "model/args.py L116); another model module must build its MoE layers "
                         "with models/moe build_moe(moe_impl=\"deepep\")")
        return {"expert_parallel_comm_backend": backend}
    if backend != "standard":
        notes.append(f"dispatcher: {name} is set in Python, not by option: the model registry's "
                     f"moe_comm_backend=\"{backend}\" (torchtitan 0.3.0 models/common/config_utils.py "
                     "L362-425)"
                     + ("; leave non_blocking_capacity_factor None (blocking and dropless, as "
                        "the estimate assumed)" if backend == "hybridep" else ""))
    return {}


def _bf16_gradients(plan: Plan, notes: list[str]) -> None:
    """torchtitan reduces gradients in float32 only (training.mixed_precision_reduce is
    Literal["float32"] in 0.2.2 job_config.py and 0.3.0 configs.py): UsageError for a plan
    costed for torchtitan with bf16 gradients (--grad-dtype bf16); a note for a plan of
    another framework's runtime (whose re-plan note export_plan adds)."""
    if profile_for(plan.training, plan.framework).export == "torchtitan":
        raise UsageError("torchtitan reduces gradients in float32 only (training."
                         "mixed_precision_reduce is Literal['float32'] in 0.2.2 job_config.py "
                         "and 0.3.0 configs.py); the plan has bf16 gradients: plan with "
                         "--grad-dtype fp32")
    notes.append("gradients: torchtitan reduces them in float32 only (mixed_precision_reduce); "
                 "the plan's bf16 gradients are its own framework's")


# The FP8 recipe plan3d costs for torchao (cost.precision: per-tensor current scaling, one
# scale per tensor, the per-tensor GEMM) is torchao's "tensorwise"; MXFP8 is torchao's MX.
# fp8-blockwise has no torchao recipe (the torchtitan profile's rules refuse it).
FP8_NAME = {"fp8": "per-tensor scaling (torchao tensorwise)", "mxfp8": "MXFP8 (torchao MX)"}


def _precision(plan: Plan, fmt: str, notes: list[str]) -> dict[str, dict[str, object]]:
    """The quantization settings of the plan's FP8 precision ({} in BF16): 0.2.2 TOML
    model.converters with [quantize.linear.float8] recipe_name "tensorwise" or
    [quantize.linear.mx] (job_config.py Model.converters, Float8Linear, MXLinear; converter
    names registered in components/quantization/float8.py L238-239, mx.py L171-172), experts
    with [quantize.grouped_mm.mx]; 0.3.0 configures MXFP8 in Python (a note). UsageError
    where the release has no such recipe: fp8 in 0.3.0 (rowwise only) and for 0.2.2's experts
    (its grouped-GEMM float8 is rowwise)."""
    precision, moe = plan.training.precision, plan.model.moe is not None
    if precision not in FP8_NAME:
        return {}
    name = FP8_NAME[precision]
    if precision == "fp8" and (fmt == "overrides" or moe):
        where = ("torchtitan 0.3.0 has only rowwise float8 recipes (Float8LinearConverter."
                 "Config recipe_name 'rowwise' | 'rowwise_with_gw_hp')" if fmt == "overrides" else
                 "torchtitan 0.2.2 quantizes experts with rowwise float8 only "
                 "(Float8GroupedMMConverter)")
        raise UsageError(f"{where}; the plan was costed with {name}: "
                         + ("export with --torchtitan-format toml (0.2.2 has tensorwise)"
                            if fmt == "overrides" and not moe else "plan in bf16 or mxfp8"))
    notes.append(f"{precision}: {name}; all communication stays in high precision "
                 "(torchtitan's float8.md), as the estimate assumed")
    if fmt == "overrides":  # mxfp8
        extra = ", MXFP8GroupedExpertsConverter.Config(model_compile_enabled=True)" if moe else ""
        notes.append("torchtitan 0.3.0 sets quantization in Python, not by option: "
                     "model_registry(..., converters=[MXFP8LinearConverter.Config("
                     f"model_compile_enabled=True){extra}])")
        return {}
    if precision == "fp8":
        return {"model": {"converters": ["quantize.linear.float8"]},
                "quantize.linear.float8": {"recipe_name": "tensorwise", "filter_fqns": ["output"]}}
    out: dict[str, dict[str, object]] = {
        "model": {"converters": ["quantize.linear.mx"] + ["quantize.grouped_mm.mx"] * moe},
        "quantize.linear.mx": {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}}
    if moe:
        out["quantize.grouped_mm.mx"] = {"recipe_name": "mxfp8", "fqns": ["experts"]}
    return out


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
    return {"checkpoint": {"enable": True,
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


def _value(v: object, toml: bool) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_value(x, True) for x in v) + "]" if toml else ",".join(map(str, v))
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"' if toml else v
    return str(v)


def export_torchtitan(plan: Plan, fmt: str = "overrides") -> Export:
    """Overrides for torchtitan 0.3.0, one per line with `` \\`` (``fmt`` "overrides"), or a
    TOML job file for torchtitan 0.2.2 ("toml"); comments wrapped at 80 columns. UsageError for
    another ``fmt`` or what the release cannot run (torchtitan_settings)."""
    if fmt not in RELEASE:
        raise UsageError(f"--torchtitan-format must be overrides or toml, got {fmt!r}")
    settings, notes = torchtitan_settings(plan, fmt)
    return _toml(plan, settings, notes) if fmt == "toml" else _overrides(plan, settings, notes)


def _toml(plan: Plan, settings: dict[str, dict[str, object]], notes: list[str]) -> Export:
    """The 0.2.2 job file: [section] tables (dotted for quantize.linear.*), key = value."""
    head = [f"torchtitan {RELEASE['toml']} job file (TOML; run with --job.config_file) for "
            f"{describe(plan)}",
            f"targets torchtitan {RELEASE['toml']} (pip install torchtitan=={RELEASE['toml']}); "
            f"option names: {SOURCE_02}; 0.3.0 and later take Python configs instead",
            ORDER_NOTE,
            "merge into your model's job file: [model] name and flavor, [optimizer], "
            "[lr_scheduler] and the checkpoint folder are not set here"] + notes
    body = []
    for section, fields in settings.items():
        body.append(f"[{section}]")
        body += [f"{k} = {_value(v, True)}" for k, v in fields.items()]
        body.append("")
    keys = [f"{s}.{k}" for s, fields in settings.items() for k in fields]
    return Export("torchtitan", comment_lines(head) + "\n".join(body), keys=keys)


def _overrides(plan: Plan, settings: dict[str, dict[str, object]], notes: list[str]) -> Export:
    """The 0.3.0 command line: --section.field value (booleans as tyro flags --x.flag /
    --x.no_flag), then the activation-checkpoint subcommand, which tyro takes last."""
    release = RELEASE["overrides"]
    head = [f"torchtitan {release} command-line overrides for {describe(plan)}",
            f"targets torchtitan {release} (pip install torchtitan=={release}); option names: "
            f"{SOURCE_03}; for 0.2.2 use --torchtitan-format toml",
            ORDER_NOTE,
            "append to: python -m torchtitan.train --module <your model module> --config "
            "<config fn>"] + notes
    lines, keys = [], []
    for section, fields in settings.items():
        if section == "activation_checkpoint":
            continue
        for k, v in fields.items():
            keys.append(f"{section}.{k}")
            if isinstance(v, bool):
                lines.append(f"--{section}.{'' if v else 'no_'}{k}")
            else:
                lines.append(f"--{section}.{k} {_value(v, False)}")
    mode = str(settings["activation_checkpoint"]["mode"])
    lines.append(f"activation-checkpoint:{mode}")
    keys.append(f"activation-checkpoint:{mode}")
    text = comment_lines(head) + " \\\n".join(lines) + "\n"
    return Export("torchtitan", text, keys=keys)
