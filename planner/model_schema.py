"""The model schema's blocks for mixture-of-experts, MLA and sliding-window attention.

``MoESpec`` (the ``moe:`` block), ``MLASpec`` (the ``mla:`` block) and ``check_architecture``,
the cross-field rules ``ModelSpec`` applies to them. The layer pattern they describe (which
layers are MoE, which use the window) is computed in ``planner.cost.model_counts``; the rules
here use the same arithmetic so that every accepted model has at least one MoE layer and only
valid window layers.

Sources of the conventions (each field's docstring says which config key it mirrors):
- Megatron-LM @ d98e8a64ddf3 ``megatron/core/transformer/transformer_config.py`` (num_moe_experts,
  moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size, moe_layer_freq,
  multi_latent_attention, q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim,
  v_head_dim, mtp_num_layers, window_size);
- Hugging Face transformers @ 008e57439125 configuration classes (DeepseekV3Config
  ``first_k_dense_replace``, Llama4TextConfig ``interleave_moe_layer_step``, Qwen3MoeConfig
  ``decoder_sparse_step``, GptOssConfig ``layer_types``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from .quantities import STRICT


class _Block(BaseModel):
    model_config = STRICT  # as quantities._Strict


class MoESpec(_Block):
    """Mixture-of-experts MLPs (the ``moe:`` block of a model YAML).

    - ``num_experts`` E: routed experts per MoE layer (HF ``num_local_experts`` /
      ``num_experts`` / ``n_routed_experts``; Megatron ``--num-experts``).
    - ``router_topk`` k: routed experts each token is sent to (HF ``num_experts_per_tok``).
    - ``ffn_hidden_size`` F: intermediate width of ONE routed expert (for swiglu: of each of
      gate and up; HF ``moe_intermediate_size``, Mixtral/OLMoE/GPT-OSS ``intermediate_size``).
    - ``shared_experts``: always-active experts per MoE layer (DeepSeek ``n_shared_experts``,
      Llama 4: 1); default 0.
    - ``shared_ffn_hidden_size``: width of ONE shared expert; default ``ffn_hidden_size``
      (Megatron's ``moe_shared_expert_intermediate_size`` is shared_experts times this).
    - ``first_dense_layers``: leading layers with a dense MLP of the model's
      ``ffn_hidden_size`` (DeepSeek ``first_k_dense_replace``); default 0.
    - ``layer_freq`` k_f: after those, every k_f-th layer is MoE: layer i (0-based) is MoE iff
      i >= first_dense_layers and (i - first_dense_layers + 1) % k_f == 0. With k_f = 2 and no
      dense lead that is layers 1, 3, 5, ... as Llama 4 Maverick's HF ``moe_layers =
      range(step - 1, L, step)``; default 1 (every layer after the dense lead).
    """

    num_experts: int = Field(gt=0, le=1_000_000)
    router_topk: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0, le=10_000_000)
    shared_experts: int = Field(default=0, ge=0, le=1_000)
    shared_ffn_hidden_size: int | None = Field(default=None, gt=0, le=10_000_000)
    first_dense_layers: int = Field(default=0, ge=0)
    layer_freq: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "MoESpec":
        if self.router_topk > self.num_experts:
            raise ValueError(f"router_topk ({self.router_topk}) is larger than num_experts "
                             f"({self.num_experts})")
        if self.shared_experts == 0 and self.shared_ffn_hidden_size is not None:
            raise ValueError("shared_ffn_hidden_size is set but shared_experts is 0; set "
                             "shared_experts or remove shared_ffn_hidden_size")
        return self

    @property
    def shared_ffn(self) -> int:
        """Width of one shared expert (``shared_ffn_hidden_size``, default the routed width)."""
        return self.shared_ffn_hidden_size or self.ffn_hidden_size


class MLASpec(_Block):
    """Multi-head latent attention (DeepSeek-V2 arXiv:2405.04434 Sec. 2.1; the ``mla:`` block).

    Field names are the HF DeepSeek config keys (Megatron: q_lora_rank, kv_lora_rank,
    qk_head_dim, qk_pos_emb_head_dim, v_head_dim). ``q_lora_rank`` must be given and may be
    null: null = queries are not compressed (DeepSeek-V2-Lite, HF config ``"q_lora_rank":
    null``), the query projection is then h x n*(qk_nope + qk_rope).
    """

    q_lora_rank: int | None = Field(gt=0)
    kv_lora_rank: int = Field(gt=0)
    qk_nope_head_dim: int = Field(gt=0)
    qk_rope_head_dim: int = Field(ge=0)
    v_head_dim: int = Field(gt=0)


WindowLayers = Literal["all", "even", "odd"] | list[int]


def moe_layer_count(num_layers: int, moe: MoESpec) -> int:
    """Number of MoE layers among ``num_layers`` (MoESpec's pattern): (L - f) // k_f."""
    return max(num_layers - moe.first_dense_layers, 0) // moe.layer_freq


def check_architecture(m) -> None:
    """The cross-field rules of the MoE, MLA and window fields of ModelSpec ``m``.

    Raises ValueError (pydantic turns it into one line naming the model file) when: an ``mla``
    block is given without ``attention_type: mla`` or the reverse; ``attention_type`` mha/gqa
    contradicts the head counts; MLA is combined with num_kv_heads, head_dim, bias, qk_norm or
    attention sinks (not part of MLA); ``first_dense_layers`` >= num_layers or the pattern
    leaves no MoE layer; the dense layers need ``ffn_hidden_size`` (swiglu) and it is missing;
    ``window_layers`` without ``sliding_window``, or an index outside 0..L-1 / repeated.
    """
    _check_attention(m)
    L = m.num_layers
    if m.moe is not None:
        f, k = m.moe.first_dense_layers, m.moe.layer_freq
        if f >= L:
            raise ValueError(f"moe.first_dense_layers ({f}) must be smaller than num_layers ({L})")
        if moe_layer_count(L, m.moe) == 0:
            raise ValueError(f"moe.layer_freq {k} after {f} dense layers leaves no MoE layer in "
                             f"{L} layers")
        dense = f > 0 or k > 1
        if dense and m.activation == "swiglu" and m.ffn_hidden_size is None:
            raise ValueError("ffn_hidden_size is required for the dense layers (moe."
                             "first_dense_layers or moe.layer_freq > 1) with activation: swiglu")
    elif m.activation == "swiglu" and m.ffn_hidden_size is None:
        raise ValueError("ffn_hidden_size is required for activation: swiglu")
    _check_window(m)


def _check_attention(m) -> None:
    kind = m.attention_type
    if m.mla is not None and kind != "mla":
        raise ValueError("an mla block needs attention_type: mla")
    if kind == "mla":
        if m.mla is None:
            raise ValueError("attention_type mla needs the mla block (q_lora_rank, kv_lora_rank, "
                             "qk_nope_head_dim, qk_rope_head_dim, v_head_dim)")
        if m.num_kv_heads not in (None, m.num_attention_heads):
            raise ValueError("num_kv_heads does not apply to MLA (every head has its own "
                             "keys and values); remove it")
        for field, bad in (("head_dim", m.head_dim is not None), ("bias", m.bias or m.qkv_bias),
                           ("qk_norm", m.qk_norm != "none"), ("attention_sinks", m.attention_sinks)):
            if bad:
                raise ValueError(f"{field} is not supported with attention_type mla (the mla "
                                 "block gives the head dims); remove it")
        return
    g, a = m.num_kv_heads or m.num_attention_heads, m.num_attention_heads
    if kind == "mha" and g != a:
        raise ValueError(f"attention_type mha needs num_kv_heads = num_attention_heads ({a}), "
                         f"got {g}; use gqa")
    if kind == "gqa" and g == a:
        raise ValueError(f"attention_type gqa needs fewer KV heads than attention heads ({a}); "
                         "set num_kv_heads or use mha")


def _check_window(m) -> None:
    if m.window_layers is not None and m.sliding_window is None:
        raise ValueError("window_layers is set but sliding_window is not")
    if isinstance(m.window_layers, list):
        L = m.num_layers
        bad = [i for i in m.window_layers if not 0 <= i < L]
        if bad:
            raise ValueError(f"window_layers index {bad[0]} is outside 0..{L - 1} "
                             "(layers count from 0)")
        if len(set(m.window_layers)) != len(m.window_layers):
            raise ValueError("window_layers lists a layer twice")
        if not m.window_layers:
            raise ValueError("window_layers is an empty list; remove sliding_window instead")
