"""The framework schema: ``framework_profiles/*.yaml`` (and ``--framework FILE``) as pydantic models.

A framework profile describes one training software as plan3d needs it:

- ``rules`` -- what the framework can run: the layouts the search may propose for it
  (planner.search.framework_rules turns each into a named, vectorized mask of the search space) and
  the models it can build at all (attention kinds, position embeddings, ...).
- ``runtime`` -- how it runs a layout: flash attention, overlap of the TP / DP / PP
  communication, the pipeline p2p style, what ZeRO-3 gathers at a time and how fast.
- ``memory`` -- how it accounts model states: gradient dtype (by training dtype), stored
  parameter bytes, a separate fp32 master copy, DeepSpeed's fp32 gradient partition, FSDP2's
  unsharded stage parameters under PP.
- ``reserve`` -- memory a layout must leave to the runtime and the allocator: a fixed part per
  process, a part per NCCL communicator and a fraction of the working set (formulas.md 3.10).
- ``efficiency`` -- optional per-framework multipliers of the hardware efficiency factors, for
  ``plan3d calibrate`` to fit later; only 1.0 is accepted today (they are not applied yet).

Every fact carries its source: each block has a ``sources`` mapping with one entry per field
(the field name -> where the fact was read: repo@commit path, paper section, measurement), and
a block may not leave a field without one nor name a field it does not have. ``extends: NAME``
takes every block of another profile and overrides the fields given here (each with its new
source). planner.frameworks.profile resolves a TrainingSpec from a profile; SI units inside.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from .quantities import NAME_PATTERN, Bandwidth, Bytes, _Strict

# Activation recomputation modes, by code (the layout's recompute axis stores the code): none;
# selective = Megatron-Core's --recompute-modules core_attn (its default, Korthikanti et al.
# 2022's selective recomputation); full = every layer (--recompute-granularity full), or the
# first N layers of each model chunk (Layout.recompute_num_layers, --recompute-method block);
# selective+ = --recompute-modules layernorm moe_act mla_up_proj (the light modules that apply to
# the model, as Megatron-Bridge's MoE recipes set them; moe.md 5.3).
RECOMPUTE_MODES = ("none", "selective", "full", "selective+")
# The pipeline schedules a framework may run (Rules.pipeline_schedules; the layout axis's values,
# layout.axes, in this order: the first two are the ones vpp implies)
PIPELINE_SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe", "looped-bfs", "interleaved-zero-bubble",
                      "zbv", "dualpipev", "dualpipe")
# The schedules that place a rank's two stages in a V: rank r holds stages r and 2p-1-r
# (reference/pipeline_schedules.md §8, §11; torchtitan pipeline_parallel.py L558-567)
V_SHAPED_SCHEDULES = ("zbv", "dualpipev")
Recompute = Literal[RECOMPUTE_MODES]
SELECTIVE_PLUS_MODULES = ("layernorm", "moe_act", "mla_up_proj")
GradDtype = Literal["fp32", "bf16", "fp16"]
# MoE token dispatchers (Megatron-Core --moe-token-dispatcher-type alltoall | allgather, or flex
# with --moe-flex-dispatcher-backend deepep | hybridep; transformer_config.py L891-902 @d98e8a64)
MOE_DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
# CUDA-graph scopes: none (eager); layers (Transformer Engine graphs of each layer's static part:
# the whole layer of a dense model or a drop-and-pad MoE, attention + router + preprocess of a
# dropless MoE; --cuda-graph-impl transformer_engine); full_iteration (the whole step,
# --cuda-graph-impl full_iteration; transformer_config.py L1075-1088, L2795-2975)
CUDA_GRAPHS = ("none", "layers", "full_iteration")
# The Rules lists of model features (what the model code builds, not how the framework runs it)
MODEL_FEATURES = ("attention", "position_embedding", "activation", "norm")


class _Facts(_Strict):
    """A block of facts with a ``sources`` mapping: one non-empty source per fact field."""

    sources: dict[str, str]
    # Fields added after profiles were written (plans embed their profile): at their default
    # they need no source, and their source is this text
    DEFAULT_SOURCES: ClassVar[dict[str, str]] = {}

    @model_validator(mode="after")
    def _every_fact_sourced(self) -> "_Facts":
        fields = type(self).model_fields
        facts = [name for name in fields if name != "sources"]
        unknown = sorted(set(self.sources) - set(facts))
        if unknown:
            raise ValueError(f"sources names {unknown[0]!r}, which is not a field of this block "
                             f"(fields: {', '.join(facts)})")
        for name, text in self.DEFAULT_SOURCES.items():
            if not str(self.sources.get(name, "")).strip() and getattr(self, name) == fields[name].default:
                self.sources[name] = text
        missing = [name for name in facts if not str(self.sources.get(name, "")).strip()]
        if missing:
            raise ValueError(f"{missing[0]} has no source: add sources.{missing[0]} (where the "
                             "fact was read: repo@commit path, paper section, measurement)")
        return self


class Rules(_Facts):
    """What the framework can run. Layout rules (masks of the search,
    planner.search.framework_rules):

    - ``tensor_parallel`` / ``sequence_parallel`` / ``pipeline_parallel`` / ``expert_parallel``:
      whether tp > 1, SP, pp > 1, ep > 1 exist at all.
    - ``context_parallel``: ``ring`` (the ring attention plan3d costs, formulas.md 5.7),
      ``ulysses`` (head all-to-all: not what the cost model prices, so cp stays 1) or ``none``.
    - ``kv_heads_tp``: ``divides`` (tp divides the KV heads) or ``divides_or_multiple`` (also tp a
      multiple of them: each rank then computes one KV head, Megatron-Core).
    - ``interleaving``: interleaved 1F1B exists (vpp > 1); ``interleaving_min_pp``: the least pp
      it accepts; ``interleaved_microbatches``: ``at_least_pp`` (m >= pp), ``multiple_of_pp``
      (m % pp == 0) or ``pytorch_rounds`` (m >= pp and m % (m // pp) == 0: PyTorch's rounds;
      PyTorch itself admits m < pp, where torchtitan warns and plan3d's schedule model stops).
    - ``pipeline_microbatches``: ``any`` or ``at_least_pp`` (non-interleaved 1F1B needs m >= pp).
    - ``uneven_split``: ``none``, ``megatron`` (Megatron-Core's first/last stage counts, both
      interleaved forms), ``edge_stages`` (first/last stage shortened; interleaved only the
      embedding-and-loss form) or ``layout`` (Megatron-Core's --pipeline-model-parallel-layout:
      any stage counts, interleaved too, each model chunk at least one layer).
    - ``zero_stages``: the ZeRO stages it offers (1 = Megatron's distributed optimizer where
      that is the mechanism); ``max_zero_stage_with_pp``: the highest stage allowed with pp > 1;
      ``max_zero_stage_with_moe``: the highest stage allowed for a model with MoE layers (3, the
      default: no limit known); ``moe_zero3_model_parallel``: an MoE model at ZeRO-3 may use
      tp > 1 or etp > 1 (DeepSpeed's ZeRO-3 MoE path, AutoEP, takes tp = etp = 1);
      ``distributed_optimizer``: Megatron's --use-distributed-optimizer exists.
    - ``precision_aware_optimizer_sharded``: optimizer CPU offload and 16-bit Adam moments need
      a sharded optimizer (ZeRO >= 1) (job_rules.job_masks).
    - ``recompute``: the recomputation modes plan3d can cost that it offers;
      ``recompute_num_layers``: full recompute of only the first N layers of each model chunk
      (Megatron's block method; Layout.recompute_num_layers > 0); ``offload``: the
      offload kinds it offers (activations, optimizer, parameters: recorded for the cost model's
      offload terms, not a search axis yet).
    - ``expert_tensor_parallel``: experts may be tensor-parallel (etp > 1); ``expert_ranks``:
      where the ep ranks come from: ``expert_mesh`` (Megatron-Core's folded expert mesh, ep*etp
      dividing tp*cp*dp: the search's own expert rules), ``data`` (the data-parallel ranks
      only: ep divides dp, DeepSpeed-MoE) or ``fsdp_cp_tp`` (torchtitan 0.3: ep divides
      FSDP degree x cp x tp, the FSDP degree being dp under ZeRO-3 and 1 under DDP).
    - ``tied_embeddings_with_pp``: a model with tied embeddings may use pp > 1.
    - ``tp_comm_overlap``: TP communication overlapped with the GEMMs (Megatron-Core
      --tp-comm-overlap with Transformer Engine userbuffers; torchtitan's async TP);
      ``tp_comm_overlap_schedules_refused``: the pipeline schedules it cannot run beside it
      (torchtitan's async TP compiles the model, which PyTorch's zero-bubble and V schedules
      refuse).
    - ``moe_dispatchers``: the MoE token dispatchers it runs (MOE_DISPATCHERS);
      ``moe_a2a_overlap``: Megatron-Core's EP communication overlap (combined 1F1B).
    - ``moe_token_drop``: a capacity factor with padding (drop-and-pad token dropping).
    - ``cuda_graphs``: the CUDA-graph scopes it captures (CUDA_GRAPHS).
    - ``mtp_with_pp_or_cp``: a model with multi-token-prediction layers may use pp > 1 or cp > 1.
    - ``pipeline_schedules``: the pipeline schedules it runs (layout.axes.PIPELINE_SCHEDULES:
      1f1b, interleaved-1f1b, gpipe, looped-bfs, interleaved-zero-bubble, zbv, dualpipev,
      dualpipe; reference/pipeline_schedules.md framework support matrix); default the two
      that vpp implies (interleaved 1F1B only where ``interleaving``).
    Model rules (checked before a search; planner.search.framework_rules.model_problems):
    ``attention``, ``position_embedding``, ``activation``, ``norm``: the kinds it builds;
    ``dtypes``: the training dtypes; ``integer_rope_base``: the RoPE base must be an integer
    (Megatron-LM's --rotary-base is argparse type=int). ``model_code``: whose code builds the
    model: ``framework`` (Megatron-LM, llm-foundry: the framework's own model code, whose
    missing kinds are refused) or ``any`` (DeepSpeed, torchtitan: the model module the user
    brings; a rule may only name what the framework cannot run, so every model-feature list
    must then hold every kind: ValueError otherwise).
    """

    tensor_parallel: bool
    sequence_parallel: bool
    pipeline_parallel: bool
    context_parallel: Literal["none", "ring", "ulysses"]
    kv_heads_tp: Literal["divides", "divides_or_multiple"]
    interleaving: bool
    interleaving_min_pp: int = Field(ge=2)
    interleaved_microbatches: Literal["at_least_pp", "multiple_of_pp", "pytorch_rounds"]
    pipeline_microbatches: Literal["any", "at_least_pp"]
    uneven_split: Literal["none", "megatron", "edge_stages", "layout"]
    zero_stages: list[Literal[0, 1, 2, 3]] = Field(min_length=1)
    max_zero_stage_with_pp: Literal[0, 1, 2, 3]
    max_zero_stage_with_moe: Literal[0, 1, 2, 3] = 3
    moe_zero3_model_parallel: bool = True
    pipeline_schedules: list[Literal[PIPELINE_SCHEDULES]] = Field(
        default=["1f1b", "interleaved-1f1b"], min_length=1)
    DEFAULT_SOURCES: ClassVar[dict[str, str]] = {
        "max_zero_stage_with_moe": "no ZeRO stage limit for MoE layers is known in this framework",
        "tp_comm_overlap": "no TP communication overlap is known in this framework",
        "tp_comm_overlap_schedules_refused": "no pipeline schedule is known to refuse TP "
                                             "communication overlap",
        "moe_dispatchers": "its MoE layers dispatch tokens with an all-to-all",
        "moe_a2a_overlap": "no EP communication overlap is known in this framework",
        "moe_token_drop": "its MoE layers are dropless (no capacity factor plan3d costs)",
        "cuda_graphs": "no CUDA-graph capture is known in this framework",
        "model_code": "the framework builds the model from its own model code",
        "mtp_with_pp_or_cp": "no limit on MTP layers with pipeline or context parallelism is known",
        "moe_zero3_model_parallel": "no limit on TP or ETP for MoE layers under ZeRO-3 is known",
        "precision_aware_optimizer_sharded": "no sharding is known to be needed for optimizer "
                                             "offload or 16-bit optimizer moments",
        "pipeline_schedules": "no schedule beyond the ones vpp implies (1F1B, interleaved 1F1B) is "
                              "recorded for this framework"}
    distributed_optimizer: bool
    recompute: list[Recompute] = Field(min_length=1)
    recompute_num_layers: bool
    offload: list[Literal["activations", "optimizer", "parameters"]]
    precision_aware_optimizer_sharded: bool = False
    expert_parallel: bool
    expert_tensor_parallel: bool
    expert_ranks: Literal["expert_mesh", "data", "fsdp_cp_tp"]
    tied_embeddings_with_pp: bool
    tp_comm_overlap: bool = False
    tp_comm_overlap_schedules_refused: list[Literal[PIPELINE_SCHEDULES]] = []
    moe_dispatchers: list[Literal[MOE_DISPATCHERS]] = Field(default=["alltoall"], min_length=1)
    moe_a2a_overlap: bool = False
    moe_token_drop: bool = False
    cuda_graphs: list[Literal[CUDA_GRAPHS]] = Field(default=["none"], min_length=1)
    mtp_with_pp_or_cp: bool = True
    attention: list[Literal["mha", "gqa", "mla"]] = Field(min_length=1)
    position_embedding: list[Literal["learned", "rope", "alibi"]] = Field(min_length=1)
    activation: list[Literal["gelu", "swiglu"]] = Field(min_length=1)
    norm: list[Literal["layernorm", "rmsnorm"]] = Field(min_length=1)
    dtypes: list[Literal["bf16", "fp16"]] = Field(min_length=1)
    integer_rope_base: bool
    model_code: Literal["framework", "any"] = "framework"

    @model_validator(mode="after")
    def _no_model_feature_of_foreign_code(self) -> "Rules":
        """A framework that runs the user's model code (``model_code: any``) cannot refuse a
        model feature: each model-feature list holds every kind of its schema."""
        if self.model_code != "any":
            return self
        for name in MODEL_FEATURES:
            kinds = list(typing.get_args(typing.get_args(type(self).model_fields[name].annotation)[0]))
            missing = [k for k in kinds if k not in getattr(self, name)]
            if missing:
                raise ValueError(
                    f"{name}: this framework runs the model code it is given (model_code: any), so "
                    f"it cannot refuse {', '.join(missing)}: a rule names what the framework cannot "
                    f"run; list every kind ({', '.join(kinds)})")
        return self


class Runtime(_Facts):
    """How the framework runs a layout (each a TrainingSpec field of the same name).

    ``moe_unfused_bias_glu``: routed experts with biases or a clamped SwiGLU (GPT-OSS) run
    those as separate elementwise passes over the routed rows (Megatron-Core's TEGroupedMLP
    without the Transformer Engine op fuser: the clamp and a concatenation before the fused
    activation, fc2's bias added per local expert in a Python loop; cost.blocks)."""

    flash_attention: bool
    tp_backward_overlap: bool
    overlap_grad_reduce: bool
    overlap_p2p_comm: bool
    p2p_scatter_gather: bool
    zero3_gather_unit: Literal["layer", "module"]
    zero3_throughput: Bandwidth | None = Field(default=None, gt=0)
    fp8_library: Literal["transformer-engine", "torchao", "none"]
    selective_recompute: Literal["core_attention", "per_op"]
    moe_unfused_bias_glu: bool = False
    DEFAULT_SOURCES: ClassVar[dict[str, str]] = {
        "moe_unfused_bias_glu": "no unfused expert-bias or clamped-GLU pass is known in this "
                                "framework"}


class Memory(_Facts):
    """How the framework accounts model states (formulas.md 2.1).

    ``gradients``: the gradient (accumulation and reduction) dtype by training dtype, e.g.
    {bf16: fp32, fp16: fp16}; ``param_bytes``: the stored parameter (2: bf16 with a separate
    fp32 master; 4: fp32 parameters that are their own master, FSDP2 in torchtitan);
    ``master_weights``: the optimizer keeps a separate fp32 master copy (4 B);
    ``fp32_grad_partition``: with 16-bit gradients, ZeRO stages 1-2 also hold an fp32 gradient
    partition of 4/N B (DeepSpeed ``stage_1_and_2.py``); ``pp_unsharded_params``: with ZeRO-3
    and pp > 1 the stage's bf16 parameters stay gathered from forward to backward (FSDP2's
    reshard_after_forward off under PP), 2 B per parameter; ``loss_bytes_per_logit``: bytes
    per logit (per token, on the vocabulary shard) the output layer and loss hold at the start
    of the backward (formulas.md 3.6); ``loss_chunks``: the sequence is split into that many
    chunks for the output layer and the loss, each chunk's logits made, its loss taken and its
    backward run before the next (torchtitan's ChunkedLossWrapper), so the per-logit bytes
    are held for 1/loss_chunks of the tokens, beside an fp32 gradient accumulator of the
    hidden states (1 = the whole sequence at once)."""

    gradients: dict[Literal["bf16", "fp16"], GradDtype]
    param_bytes: Literal[2, 4]
    master_weights: bool
    fp32_grad_partition: bool
    pp_unsharded_params: bool
    loss_bytes_per_logit: float = Field(gt=0, le=64)
    loss_chunks: int = Field(default=1, ge=1, le=1024)
    DEFAULT_SOURCES: ClassVar[dict[str, str]] = {
        "loss_chunks": "the output layer and the loss run on the whole sequence at once"}

    @model_validator(mode="after")
    def _both_dtypes(self) -> "Memory":
        if set(self.gradients) != {"bf16", "fp16"}:
            raise ValueError("gradients must give the gradient dtype for both bf16 and fp16 training")
        return self


class Reserve(_Facts):
    """Memory per GPU a layout must leave free for the runtime and the allocator (formulas.md
    3.10): ``runtime`` (CUDA context, library workspaces, HBM the driver keeps) + ``per_communicator``
    x the NCCL communicators the rank uses + ``allocator`` x the working set (activations and
    transient buffers: what the caching allocator allocates and frees every step)."""

    runtime: Bytes = Field(ge=0)
    per_communicator: Bytes = Field(ge=0)
    allocator: float = Field(ge=0.0, le=2.0)


class EfficiencyMultipliers(_Strict):
    """Per-framework multipliers of the hardware profile's efficiency factors (schema only)."""

    matmul: float = 1.0
    attention: float = 1.0
    communication: float = 1.0
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _not_applied_yet(self) -> "EfficiencyMultipliers":
        for name in ("matmul", "attention", "communication"):
            if getattr(self, name) != 1.0:
                raise ValueError(f"{name}: framework efficiency multipliers are not applied by the "
                                 "cost model yet; only 1.0 is accepted (calibrate per framework "
                                 "comes later)")
        return self


class FrameworkProfile(_Strict):
    """One training framework: ``rules``, ``runtime``, ``memory``, ``reserve`` (and optional
    ``efficiency``), every fact with its source. ``export``: the exporter ``plan3d export``
    uses by default for plans of this framework (megatron | nemo | deepspeed | torchtitan), or
    None for historical profiles that describe published runs. ``display``: the name used in
    rule names and messages ("Megatron-Core")."""

    name: str = Field(pattern=NAME_PATTERN)
    aliases: list[str] = []
    display: str = Field(min_length=1)
    description: str = Field(min_length=1)
    source: str = Field(min_length=1)
    export: Literal["megatron", "nemo", "deepspeed", "torchtitan"] | None = None
    rules: Rules
    runtime: Runtime
    memory: Memory
    reserve: Reserve
    efficiency: EfficiencyMultipliers | None = None


def merge_extends(data: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """A profile's raw mapping with ``extends`` resolved against ``base`` (the parent's raw
    mapping, already resolved): top-level fields are taken from ``data`` where given, else from
    ``base`` (name and aliases never inherited); each fact block is the parent's block updated
    with the fields and sources ``data`` gives. Raw YAML values in, raw values out. ValueError
    when a block changes a fact without giving its own source for it."""
    out = {k: v for k, v in base.items() if k not in ("name", "aliases")}
    for key, value in data.items():
        if key == "extends":
            continue
        if key in ("rules", "runtime", "memory", "reserve") and isinstance(value, dict) \
                and isinstance(base.get(key), dict):
            known = _BLOCKS[key].model_fields
            unknown = [k for k in value if k not in known]
            if unknown:  # before the sources: a misspelt fact is not a fact without a source
                raise ValueError(f"{key}.{unknown[0]}: unknown field (the {key} facts: "
                                 f"{', '.join(k for k in known if k != 'sources')})")
            sources = value.get("sources") if isinstance(value.get("sources"), dict) else {}
            unsourced = [k for k in value if k != "sources" and not str(sources.get(k, "")).strip()]
            if unsourced:
                raise ValueError(f"{key}.{unsourced[0]} changes the fact of {data['extends']} "
                                 f"without a source: add {key}.sources.{unsourced[0]}")
            block = dict(base[key])
            block.update({k: v for k, v in value.items() if k != "sources"})
            block["sources"] = {**base[key].get("sources", {}), **value.get("sources", {})}
            out[key] = block
        else:
            out[key] = value
    return out


_BLOCKS = {"rules": Rules, "runtime": Runtime, "memory": Memory, "reserve": Reserve}
