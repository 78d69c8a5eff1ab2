"""The inputs of the planner as pydantic models: ModelSpec, HardwareProfile, TrainingSpec.

All quantities are SI inside (bytes, bytes/s, seconds). YAML files may write quantities with
units ("80 GiB", "400 Gb/s", "5 us"), parsed strictly by planner.units; a serialized spec writes
them back in the shortest exact unit form, so a dump reloads to identical numbers (field types in
planner.quantities). The hardware schema lives in planner.hardware_spec and is re-exported here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .checkpoint_spec import CheckpointSpec
from .hardware_spec import (Efficiency, GPUSpec, HardwareProfile, HostLink,  # noqa: F401 (re-export)
                            HostMemory, InterNode, IntraNode, Storage, StorageLink)
from .quantities import NAME_PATTERN, Bandwidth, Bytes, Count, Fraction, Seconds, _Strict  # noqa: F401
from .model_schema import MLASpec, MoESpec, WindowLayers, check_architecture


# ----------------------------------------------------------------------------- models


class TrainingDefaults(_Strict):
    """A model's training defaults, as published (used when the user gives no flags)."""

    seq_length: int = Field(gt=0, le=10_000_000)
    global_batch_size: int = Field(gt=0, le=100_000_000)
    tokens: Count | None = Field(default=None, gt=0)  # 2e12, 2.0e+12 or "2T"


class ModelSpec(_Strict):
    """A GPT/Llama-style decoder: dense, or mixture-of-experts (``moe``), MHA/GQA or MLA.

    Field names are the public schema of ``models/*.yaml``. ``ffn_hidden_size`` is the width of
    the MLP's intermediate layer (for SwiGLU: of each of gate and up, as Hugging Face's
    ``intermediate_size``); it defaults to 4*hidden_size for gelu and is required for swiglu.

    ``rope_theta`` is the RoPE base (theta, dimensionless; Su et al. 2021, "RoFormer",
    arXiv:2104.09864, eq. 15: theta_i = base^(-2(i-1)/d)): Hugging Face ``rope_theta``
    (``rotary_emb_base`` for GPT-NeoX), Megatron-LM ``--rotary-base``. It does not change any
    cost, only the trained architecture, so exports must carry it; None = not known (exports then
    say the framework's default applies). Only valid with ``position_embedding: rope``.
    ``rotary_percent`` is the fraction of each head's dimensions RoPE rotates (GPT-NeoX-20B 0.25,
    Black et al. 2022 Sec. 2.1; Hugging Face ``rotary_pct`` / ``partial_rotary_factor``,
    Megatron-LM ``--rotary-percent``), 1.0 = all; no cost effect, exports carry it.

    Mixture-of-experts, MLA, MTP and sliding windows (planner.model_schema has each block's
    fields and rules; planner.cost.model_counts the counts):

    - ``moe``: MoE MLPs (MoESpec). ``ffn_hidden_size`` is then the width of the dense layers'
      MLP (``moe.first_dense_layers``, or between MoE layers when ``moe.layer_freq`` > 1).
    - ``attention_type``: mha | gqa | mla; default (None) = mha or gqa from the head counts.
      ``mla`` (MLASpec) is required with mla and not allowed otherwise.
    - ``mtp_layers``: DeepSeek-V3 multi-token-prediction modules (Megatron ``mtp_num_layers``,
      HF ``num_nextn_predict_layers``); each is a projection 2h x h, three norms and one decoder
      layer of the last layer's kind; not part of the main count (formulas.md 11.1). Default 0.
    - ``sliding_window``: keys each query attends to (itself included; HF ``sliding_window``,
      Megatron ``window_size = (w - 1, 0)``) on the layers ``window_layers`` names: ``all``
      (default; Mistral 7B), ``even`` = 0, 2, 4, ... counting from 0 (GPT-OSS: HF
      ``layer_types`` starts with sliding_attention), ``odd`` = 1, 3, 5, ..., or a list of
      0-based layer indices.
    - ``qk_norm``: norms on queries and keys: ``per_head`` = one norm of head_dim each for q and
      k (Qwen3, HF ``q_norm``/``k_norm`` = RMSNorm(head_dim)), ``full`` = over the whole q and k
      projections, n*d and g*d (OLMoE, HF ``q_norm`` = RMSNorm(n*d), ``k_norm`` = RMSNorm(g*d)).
    - ``attention_sinks``: one learned sink logit per head per layer (GPT-OSS, HF ``sinks``,
      shape num_attention_heads; Megatron ``softmax_type="learnable"``).
    - ``swiglu_limit``: a clamped SwiGLU (GPT-OSS: HF GptOssConfig ``swiglu_limit`` 7.0): the
      gate clamped to at most it and the linear half to [-limit, limit] before the activation.
    - ``bias`` with ``moe``: experts (2F + h each for swiglu, F + h for gelu) and the router (E)
      have biases too, as GPT-OSS (HF ``gate_up_proj_bias``, ``down_proj_bias``, router bias).
    - ``qkv_bias``: only the Q, K, V projections have biases ((a + 2g)*d per layer) while
      ``bias`` is false (Qwen2: HF Qwen2Attention q/k/v ``bias=True``, o ``bias=False``;
      Megatron-LM ``--add-qkv-bias``). Implied by ``bias``; default false.
    - ``norm_epsilon``: the epsilon of every norm (HF ``rms_norm_eps`` / ``layer_norm_epsilon``
      / ``layer_norm_eps``, Megatron-LM ``--norm-epsilon``); no cost effect, exports carry it;
      None = not known (exports then say the framework's default applies).
    """

    name: str = Field(pattern=NAME_PATTERN)
    aliases: list[str] = []
    source: str = Field(min_length=1)
    num_layers: int = Field(gt=0, le=100_000)
    hidden_size: int = Field(gt=0, le=10_000_000)
    num_attention_heads: int = Field(gt=0, le=100_000)
    num_kv_heads: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    ffn_hidden_size: int | None = Field(default=None, gt=0)
    vocab_size: int = Field(gt=0, le=100_000_000)
    activation: Literal["gelu", "swiglu"] = "gelu"
    tie_embeddings: bool = False
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    bias: bool = False
    position_embedding: Literal["learned", "rope", "alibi"] = "rope"
    max_position_embeddings: int | None = Field(default=None, gt=0)
    rope_theta: float | None = Field(default=None, gt=0)
    rotary_percent: float = Field(default=1.0, gt=0, le=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    attention_type: Literal["mha", "gqa", "mla"] | None = None
    mla: MLASpec | None = None
    moe: MoESpec | None = None
    mtp_layers: int = Field(default=0, ge=0, le=64)
    sliding_window: int | None = Field(default=None, gt=0)
    window_layers: WindowLayers | None = None
    qk_norm: Literal["none", "per_head", "full"] = "none"
    attention_sinks: bool = False
    swiglu_limit: float | None = Field(default=None, gt=0)
    qkv_bias: bool = False
    norm_epsilon: float | None = Field(default=None, gt=0, lt=1)
    training: TrainingDefaults
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        a, g = self.num_attention_heads, self.kv_heads
        if a % g:
            raise ValueError(f"num_attention_heads ({a}) must be a multiple of num_kv_heads ({g})")
        if self.head_dim is None and self.hidden_size % a and self.attention_type != "mla":
            raise ValueError(f"hidden_size ({self.hidden_size}) is not divisible by "
                             f"num_attention_heads ({a}); set head_dim")
        check_architecture(self)
        if self.position_embedding == "learned" and self.max_position_embeddings is None:
            raise ValueError("max_position_embeddings is required for learned position embeddings")
        if self.rope_theta is not None and self.position_embedding != "rope":
            raise ValueError(f"rope_theta is set ({self.rope_theta:g}) but position_embedding is "
                             f"{self.position_embedding}, not rope; remove rope_theta")
        if self.qkv_bias and self.bias:
            raise ValueError("qkv_bias is implied by bias: true (every linear layer has biases); "
                             "remove qkv_bias")
        if self.rotary_percent != 1.0 and self.position_embedding != "rope":
            raise ValueError(f"rotary_percent is {self.rotary_percent:g} but position_embedding is "
                             f"{self.position_embedding}, not rope; remove rotary_percent")
        if self.swiglu_limit is not None and self.activation != "swiglu":
            raise ValueError(f"swiglu_limit clamps a SwiGLU, but the activation is "
                             f"{self.activation}; remove swiglu_limit")
        return self

    @property
    def kv_heads(self) -> int:
        """g: KV heads (= attention heads for MHA)."""
        return self.num_kv_heads or self.num_attention_heads

    @property
    def kv_channels(self) -> int:
        """d_h: head dimension (Megatron ``kv_channels``)."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def ffn(self) -> int:
        """f: dense MLP intermediate width (of the dense layers of an MoE model)."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def attention_kind(self) -> str:
        """mla, mha (g = a) or gqa (g < a, MQA included)."""
        if self.attention_type == "mla":
            return "mla"
        return "mha" if self.kv_heads == self.num_attention_heads else "gqa"


# ----------------------------------------------------------------------------- training + layout

class TrainingSpec(_Strict):
    """What is trained: sequence length and global batch (sequences per optimizer step).

    ``grad_bytes`` is 4 for Megatron's default fp32 main grads (2 with --grad-reduce-in-bf16);
    ``flash_attention`` drops the s^2 attention-score activations and halves causal attention work.
    The fields from ``flash_attention`` on are facts of the training framework: one function,
    planner.frameworks.profile.resolve_training, sets them from a framework profile and the
    user's overrides (--no-flash-attention, --grad-dtype, --allocator-reserve).
    """

    seq_length: int = Field(gt=0, le=10_000_000)
    global_batch_size: int = Field(gt=0, le=100_000_000)
    tokens: float | None = Field(default=None, gt=0)
    dtype: Literal["bf16", "fp16"] = "bf16"
    # Linear layers in FP8 (planner.cost.precision, fp8_hardware.md): per-tensor scaling (fp8),
    # 1x128/128x128 block scales (fp8-blockwise, DeepSeek-V3's recipe) or 1x32 E8M0 block scales
    # (mxfp8, Blackwell only); bf16: none. Attention, norms, router and output layer stay 16-bit.
    precision: Literal["bf16", "fp8", "fp8-blockwise", "mxfp8"] = "bf16"
    grad_bytes: Literal[2, 4] = 4
    flash_attention: bool = True
    overlap_grad_reduce: bool = True
    # Megatron-LM before Megatron-Core (2021-22): blocking p2p in the interleaved schedule, and
    # Narayanan 2021 Sec. 4.1 scatter/gather of the p2p tensor (s*b*h/t per rank without SP).
    overlap_p2p_comm: bool = True
    p2p_scatter_gather: bool = False
    # What ZeRO-3 gathers at a time: a transformer layer (FSDP / Megatron-FSDP wrapping) or one
    # module (DeepSpeed ZeRO-3 fetches per submodule).
    zero3_gather_unit: Literal["layer", "module"] = "layer"
    # Per-GPU rate (bytes received per second) at which the ZeRO-3 implementation itself moves
    # parameters and gradients, where that is slower than the links: None = link-bound (FSDP,
    # Megatron-FSDP, DeepSpeed since mid-2021). DeepSpeed <= 0.4.0 gathered each submodule's
    # parameters synchronously, with a device sync and a copy per gather (DeepSpeed PR #1188):
    # measured 21 GB/s per GPU even on one NVLink node (DeepSpeed issue #1174).
    zero3_throughput: float | None = Field(default=None, gt=0)
    # Overlap of the backward TP collectives with the weight-gradient GEMMs (Megatron's async
    # tensor-parallel all-reduce / SP all-gather); off for the synchronous f/g of 2019-21 Megatron.
    tp_backward_overlap: bool = True
    # Expert biases and a clamped SwiGLU as separate elementwise passes over the routed rows
    # (framework_spec.Runtime.moe_unfused_bias_glu; cost.blocks.elementwise_bytes_per_token).
    moe_unfused_bias_glu: bool = True
    # The library that runs FP8 in this framework: Transformer Engine (FP8 weight copies, FP8
    # inputs saved for backward, FP8 parameter all-gather), torchao (casts each step, saves the
    # 16-bit inputs), or none (no FP8 training).
    fp8_library: Literal["transformer-engine", "torchao", "none"] = "transformer-engine"
    # What selective recomputation (recompute code 1) saves: core_attention (Megatron: all but
    # the attention core, Korthikanti et al. 2022 sec. 4.2) or per_op (torchtitan's per-op
    # selective activation checkpointing: the block input, the outputs of every other matmul,
    # of attention and of reduce-scatters; cost.per_op_checkpoint.per_op_saved_per_token).
    selective_recompute: Literal["core_attention", "per_op"] = "core_attention"
    # Mixture of experts: the busiest EP rank's routed load over the mean (>= 1; 1 = balanced,
    # as the published benchmark runs force it: Megatron-Bridge performance-summary footnote
    # "token routing is force-balanced and token-dropless"); it scales the busiest rank's
    # received tokens, expert GEMMs, activations and all-to-all time (moe.md 4.2, 6).
    moe_imbalance: float = Field(default=1.0, ge=1.0, le=64.0)
    # Token dropping (Megatron-Core --moe-expert-capacity-factor with
    # --moe-pad-expert-input-to-capacity): None = dropless (the default); F = each expert takes
    # ceil(T*k/E * F) rows of each source rank's tokens, padded to that capacity, so the rows
    # every rank sends and computes are F x the balanced share whatever the routing and the host
    # never waits on the routed counts (moe_utils.py L1019-1080, token_dispatcher.py L446-449,
    # L517-538 @d98e8a64). It changes the model trained (tokens are dropped): an input, not a
    # search choice. The token dispatcher, the EP overlap and the CUDA graphs are layout axes.
    moe_capacity_factor: float | None = Field(default=None, gt=0, le=64)
    # Bytes of each of Adam's two moments per parameter: 4 (fp32, Megatron's default) or 2 (bf16:
    # Megatron-Core's precision-aware optimizer with --exp-avg-dtype/--exp-avg-sq-dtype bf16, as
    # Megatron-Bridge's DeepSeek-V3 recipe sets them; megatron/core/optimizer/optimizer_config.py).
    optimizer_moment_bytes: Literal[2, 4] = 4
    # Share of the optimizer states (fp32 master copy and moments) kept in host memory:
    # Megatron-Core's --optimizer-cpu-offload with --optimizer-offload-fraction (0 = none, the
    # default; 1 = all, the fraction's default once offloading is on; optimizer/
    # cpu_offloading/hybrid_optimizer.py). Only GPU memory is modelled: the host step and its
    # copies are taken as hidden (Yan et al. 2026 App. B.2 runs it on GB200's Grace CPU).
    optimizer_offload_fraction: float = Field(default=0.0, ge=0.0, le=1.0)
    # Megatron-Core's fine-grained activation offloading of the routed experts' fc1 input and
    # activation input (--fine-grained-activation-offloading, offload modules expert_fc1 and
    # moe_act): those saved tensors live in host memory between forward and backward; their
    # copies run on a side stream and are taken as hidden.
    moe_activation_offload: bool = False
    # The loss computed in place on the 16-bit logits (Transformer Engine's parallel cross
    # entropy, Megatron-Core --cross-entropy-fusion-impl te: its kernel writes the logits'
    # gradient into the logits tensor in forward and saves that tensor, 2 B per logit;
    # transformer_engine/pytorch/cross_entropy.py) instead of Megatron's vocab-parallel cross
    # entropy, which saves an fp32 softmax beside the bf16 logits (6 B per logit at its peak).
    cross_entropy_in_place: bool = False
    # Checkpoints and failures (planner.checkpoint_spec; cost.checkpoint, formulas.md 12): the
    # failure rate per GPU-hour, the restart time before the load, async or synchronous saves.
    checkpoint: CheckpointSpec = CheckpointSpec()
    # The training framework (a framework profile's name) and the facts of it that the cost model
    # reads beside the ones above: stored parameter bytes, a separate fp32 master copy, DeepSpeed's
    # fp32 gradient partition (ZeRO-1/2 with 16-bit gradients), FSDP2's gathered stage parameters
    # under PP, and the memory reserve (runtime + per NCCL communicator + allocator fraction of
    # the working set, formulas.md 3.10). Set together by frameworks.profile.resolve_training;
    # the defaults are megatron-core's.
    framework: str = Field(default="megatron-core", pattern=NAME_PATTERN)
    param_bytes: Literal[2, 4] = 2
    master_weights: bool = True
    fp32_grad_partition: bool = False
    pp_unsharded_params: bool = False
    # Bytes per logit (per token, vocabulary shard) held by the output layer and the loss at
    # the start of the backward: 6 = bf16 logits + fp32 softmax (Megatron's fused
    # vocab-parallel cross entropy); 12 in torchtitan (fp32 log-softmax output, its gradient
    # and the input gradient, framework_profiles/torchtitan.yaml).
    loss_bytes_per_logit: float = Field(default=6.0, gt=0, le=64)
    # The output layer and loss in that many chunks of the sequence, one after the other with
    # their backward (torchtitan's ChunkedLossWrapper: 8), 1 = at once (Megatron)
    loss_chunks: int = Field(default=1, ge=1, le=1024)
    reserve_runtime: float = Field(default=float(2**30), ge=0)  # bytes
    reserve_per_communicator: float = Field(default=float(600 * 2**20), ge=0)  # bytes
    reserve_allocator: float = Field(default=0.2, ge=0.0, le=2.0)
