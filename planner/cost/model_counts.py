"""Model-level layer pattern and parameter counts: dense or MoE, MHA/GQA or MLA, MTP (formulas.md 11).

Scalar functions of a ModelSpec (no layout): which layers are MoE and which use the sliding
window, the parameters of each layer kind, totals and active counts. The per-GPU cost model
divides these by its degrees; nothing here knows a layout.

Counts are exact for the Hugging Face implementations (biases, attention sinks, QK norms, MLA's
latent norms included) and use the real (unpadded) vocabulary, as published counts do. Sources:
DeepSeek-V2 (arXiv:2405.04434) Sec. 2.1 for MLA; DeepSeek-V3 (arXiv:2412.19437) Sec. 2.2 and
Megatron-LM @ d98e8a64ddf3 ``megatron/core/transformer/multi_token_prediction.py`` for MTP;
Megatron-LM ``megatron/training/theoretical_memory_usage.py`` (routed experts E*glu*h*F, router
h*E, shared experts, MLA terms); transformers @ 008e57439125 / 02b8f42b4240 model code for the
extra weights (GPT-OSS biases and sinks, Qwen3 per-head and OLMoE full-width QK norms).
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec

# The kinds of transformer blocks the cost model prices (blocks.block_kinds): attention over
# the whole sequence or a sliding window, a dense MLP, an MoE layer.
ATTENTION, WINDOW, MLP, MOE = "attention", "attention_window", "mlp", "moe"


def glu_factor(model: ModelSpec) -> int:
    """Weight matrices per MLP, in units of h*f: 3 for a gated MLP (SwiGLU), 2 otherwise."""
    return 3 if model.activation == "swiglu" else 2


def fc1_outputs(model: ModelSpec) -> int:
    """Column outputs of fc1 per unit of MLP width: 2 (gate and up) for SwiGLU, 1 otherwise
    (glu_factor - 1; fc2 is the other matrix)."""
    return glu_factor(model) - 1


def _norm_width(model: ModelSpec, width: int) -> int:
    """Parameters of one norm over ``width`` features: 2*width (LayerNorm) or width (RMSNorm)."""
    return (2 if model.norm == "layernorm" else 1) * width


def norm_params(model: ModelSpec) -> int:
    """Parameters of ONE norm over the hidden size: 2h (LayerNorm gamma, beta) or h (RMSNorm)."""
    return _norm_width(model, model.hidden_size)


# ----------------------------------------------------------------------------- layer pattern


def moe_layer_mask(model: ModelSpec) -> np.ndarray:
    """(L,) bool: layer i (0-based) is MoE. All False for a dense model.

    MoE iff i >= first_dense_layers and (i - first_dense_layers + 1) % layer_freq == 0
    (model_schema.MoESpec; DeepSeek ``first_k_dense_replace``, Llama 4 ``interleave_moe_layer_step``).
    """
    i = np.arange(model.num_layers)
    if model.moe is None:
        return np.zeros(model.num_layers, dtype=bool)
    f, k = model.moe.first_dense_layers, model.moe.layer_freq
    return (i >= f) & ((i - f + 1) % k == 0)


def has_dense_mlp(model: ModelSpec) -> bool:
    """Whether some layer has a dense MLP (of width ``model.ffn``): a layer moe_layer_mask
    leaves dense (every layer of a dense model; leading dense layers, MoE every k-th layer)."""
    return not bool(moe_layer_mask(model).all())


def window_layer_mask(model: ModelSpec) -> np.ndarray:
    """(L,) bool: layer i (0-based) attends over the sliding window. All False without one.

    ``window_layers``: all (default), even (0, 2, ...; GPT-OSS), odd (1, 3, ...) or a list.
    """
    L = model.num_layers
    if model.sliding_window is None:
        return np.zeros(L, dtype=bool)
    which = model.window_layers or "all"
    i = np.arange(L)
    if which == "all":
        return np.ones(L, dtype=bool)
    if which in ("even", "odd"):
        return i % 2 == (0 if which == "even" else 1)
    mask = np.zeros(L, dtype=bool)
    mask[list(which)] = True
    return mask


def mtp_layer_kind(model: ModelSpec) -> tuple[bool, bool]:
    """(is MoE, uses the window) of each MTP module's decoder layer: the last layer's kind
    (Megatron-LM ``multi_token_prediction.py``: the MTP block takes the decoder's last layer spec)."""
    return bool(moe_layer_mask(model)[-1]), bool(window_layer_mask(model)[-1])


def layer_counts_in_range(model: ModelSpec, start, stop) -> dict[str, np.ndarray]:
    """Dense, MoE and windowed layers among layers [start, stop) (0-based, stop exclusive).

    ``start``/``stop``: ints or integer arrays of any (broadcastable) shape, e.g. each pipeline
    stage's first layer and one past its last; 0 <= start <= stop <= L, else ValueError.
    Returns {"dense", "moe", "window", "layers"} as int64 arrays of the broadcast shape. MTP
    layers are not decoder layers and are never in a range (mtp_layers; Megatron puts them on
    the last pipeline stage).
    """
    start, stop = np.broadcast_arrays(np.asarray(start, dtype=np.int64),
                                      np.asarray(stop, dtype=np.int64))
    if (start < 0).any() or (stop > model.num_layers).any() or (start > stop).any():
        raise ValueError(f"layer ranges must satisfy 0 <= start <= stop <= {model.num_layers}")
    moe = np.concatenate([[0], np.cumsum(moe_layer_mask(model))])
    win = np.concatenate([[0], np.cumsum(window_layer_mask(model))])
    n_moe = moe[stop] - moe[start]
    layers = stop - start
    return {"dense": layers - n_moe, "moe": n_moe, "window": win[stop] - win[start],
            "layers": layers}


def stage_layer_counts(model: ModelSpec, layers_per_stage) -> dict[str, np.ndarray]:
    """Per pipeline stage (in order), its dense, MoE and windowed layers.

    ``layers_per_stage``: (pp,) layer counts summing to num_layers (an even or uneven split;
    with interleaving pass the model chunks in pipeline order). Returns layer_counts_in_range's
    dict of (pp,) arrays. ValueError if the counts do not sum to num_layers or are negative.
    """
    counts = np.asarray(layers_per_stage, dtype=np.int64)
    if (counts < 0).any() or counts.sum() != model.num_layers:
        raise ValueError(f"stage layer counts {counts.tolist()} must be >= 0 and sum to "
                         f"num_layers ({model.num_layers})")
    stop = np.cumsum(counts)
    return layer_counts_in_range(model, stop - counts, stop)


# ----------------------------------------------------------------------------- per-layer parameters


def gqa_attention_params(model: ModelSpec) -> int:
    """MHA/GQA/MQA attention of one layer (formulas.md 11.1).

    Q, K, V, O weights 2*h*d*(n + g); + biases (n + 2g)*d + h with ``bias`` (GPT-OSS: q, k, v, o),
    (n + 2g)*d with ``qkv_bias`` (Qwen2: q, k, v);
    + n sink logits with ``attention_sinks``; + QK norms: per_head 2 norms of d (Qwen3),
    full norms of n*d and g*d (OLMoE).
    """
    h, d, n, g = model.hidden_size, model.kv_channels, model.num_attention_heads, model.kv_heads
    p = 2 * h * d * (n + g)
    if model.bias or model.qkv_bias:
        p += (n + 2 * g) * d + (h if model.bias else 0)
    if model.attention_sinks:
        p += n
    if model.qk_norm == "per_head":
        p += 2 * _norm_width(model, d)
    elif model.qk_norm == "full":
        p += _norm_width(model, n * d) + _norm_width(model, g * d)
    return p


def mla_attention_params(model: ModelSpec) -> int:
    """Multi-head latent attention of one layer (DeepSeek-V2 Sec. 2.1; formulas.md 11.1).

    q: h*r_q + norm(r_q) + r_q*n*(d_n + d_r), or h*n*(d_n + d_r) when q_lora_rank is null;
    kv: h*(r_kv + d_r) (latent and the shared RoPE key) + norm(r_kv) + r_kv*n*(d_n + d_v);
    o: n*d_v*h. DeepSeek-V3: 187,107,328.
    """
    h, n, m = model.hidden_size, model.num_attention_heads, model.mla
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank is None:
        q = h * n * qk
    else:
        q = h * m.q_lora_rank + _norm_width(model, m.q_lora_rank) + m.q_lora_rank * n * qk
    kv = (h * (m.kv_lora_rank + m.qk_rope_head_dim) + _norm_width(model, m.kv_lora_rank)
          + m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim))
    return q + kv + n * m.v_head_dim * h


def attention_params(model: ModelSpec) -> int:
    """One layer's attention block (MLA or MHA/GQA), without the layer's norms."""
    return mla_attention_params(model) if model.attention_kind == "mla" else gqa_attention_params(model)


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """One MLP (dense, one routed or one shared expert) of width ``ffn``: glu*h*ffn, + biases
    2*ffn + h (gated) or ffn + h with ``bias`` (GPT-OSS experts: gate_up 2F, down h)."""
    h = model.hidden_size
    p = glu_factor(model) * h * ffn
    if model.bias:
        p += fc1_outputs(model) * ffn + h
    return p


def dense_mlp_params(model: ModelSpec) -> int:
    """The MLP of one dense layer (width ``ffn_hidden_size``)."""
    return mlp_params(model, model.ffn)


def expert_params(model: ModelSpec) -> int:
    """ONE routed expert (width moe.ffn_hidden_size). DeepSeek-V3: 3*7168*2048 = 44,040,192.
    0 for a dense model."""
    return mlp_params(model, model.moe.ffn_hidden_size) if model.moe else 0


def routed_expert_params_per_layer(model: ModelSpec) -> int:
    """All E routed experts of one MoE layer (what expert parallelism shards)."""
    return model.moe.num_experts * expert_params(model) if model.moe else 0


def shared_expert_params(model: ModelSpec) -> int:
    """All shared experts of one MoE layer: shared_experts * MLP(shared width)."""
    if not model.moe or not model.moe.shared_experts:
        return 0
    return model.moe.shared_experts * mlp_params(model, model.moe.shared_ffn)


def router_params(model: ModelSpec) -> int:
    """The router of one MoE layer: h*E (+ E bias with ``bias``, GPT-OSS). DeepSeek-V3's
    aux-loss-free e_score_correction_bias (E floats) is a buffer, not counted (as Megatron-LM's counter)."""
    if not model.moe:
        return 0
    E = model.moe.num_experts
    return model.hidden_size * E + (E if model.bias else 0)


def layer_norms_params(model: ModelSpec) -> int:
    """The two norms of one decoder layer (before attention and before the MLP)."""
    return 2 * _norm_width(model, model.hidden_size)


def dense_layer_params(model: ModelSpec) -> int:
    """One dense decoder layer: attention + norms + dense MLP."""
    return attention_params(model) + layer_norms_params(model) + dense_mlp_params(model)


def moe_layer_params(model: ModelSpec, active: bool = False) -> int:
    """One MoE decoder layer: attention + norms + router + shared experts + E routed experts
    (``active``: router_topk of them). DeepSeek-V3: 11,507,286,016 (active 760,332,800)."""
    if not model.moe:
        raise ValueError(f"{model.name} has no MoE layers")
    routed = model.moe.router_topk if active else model.moe.num_experts
    return (attention_params(model) + layer_norms_params(model) + router_params(model)
            + shared_expert_params(model) + routed * expert_params(model))


# ----------------------------------------------------------------------------- whole model


def layer_kind_counts(model: ModelSpec) -> tuple[int, int]:
    """(dense layers, MoE layers) of the main model (MTP modules not included)."""
    n_moe = int(moe_layer_mask(model).sum())
    return model.num_layers - n_moe, n_moe


def position_embedding_params(model: ModelSpec) -> int:
    """Learned absolute positions s_max*h (GPT-2/3 style); 0 for RoPE, ALiBi or none."""
    if model.position_embedding != "learned":
        return 0
    return (model.max_position_embeddings or 0) * model.hidden_size


def embedding_params(model: ModelSpec) -> int:
    """Input embedding V*h + untied output layer V*h + learned positions (s_max*h)."""
    h = model.hidden_size
    return model.vocab_size * h * (1 if model.tie_embeddings else 2) + position_embedding_params(model)


def _model_params(model: ModelSpec, active: bool) -> int:
    dense, n_moe = layer_kind_counts(model)
    layers = dense * dense_layer_params(model)
    if n_moe:
        layers += n_moe * moe_layer_params(model, active)
    return layers + _norm_width(model, model.hidden_size) + embedding_params(model)


def total_params(model: ModelSpec) -> int:
    """All parameters of the main model: layers + final norm + embeddings (formulas.md 1.2, 11.1).

    MTP modules are not included (DeepSeek-V3's 671B excludes them; mtp_params). Dense models:
    L*layer + final norm + V*h*(1 or 2) + positions, as before MoE support. DeepSeek-V3
    671,026,404,352; Mixtral-8x7B 46,702,792,704.
    """
    return _model_params(model, active=False)


def active_params(model: ModelSpec, input_embedding: bool = True) -> int:
    """Parameters a token uses: total with E routed experts replaced by router_topk (formulas.md 11.1).

    Two published conventions (formulas.md 11.1): ``input_embedding=True`` counts both embedding
    matrices (Mixtral 12.9B, Qwen3 22B/3.3B, OLMoE 1.3B, DeepSeek-V3 37B);
    ``input_embedding=False`` leaves out the input lookup table, which does no matmul (OpenAI's
    gpt-oss 5.1B/3.6B, DeepSeek's 36.7B and V2-Lite's 2.4B). With tied embeddings the one
    matrix is the output layer and is kept either way. Dense models: total_params.
    """
    p = _model_params(model, active=True)
    if not input_embedding and not model.tie_embeddings:
        p -= model.vocab_size * model.hidden_size
    return p


def mtp_projection_params(model: ModelSpec) -> int:
    """ONE MTP module's eh_proj, 2h*h (concatenated [h; embedding] -> h; TP-sharded)."""
    return 2 * model.hidden_size * model.hidden_size


def mtp_norm_params(model: ModelSpec) -> int:
    """ONE MTP module's three norms (enorm, hnorm, the head's final norm): 3 x norm_params."""
    return 3 * norm_params(model)


def mtp_module_params(model: ModelSpec) -> int:
    """ONE MTP module's own weights: eh_proj 2h*h, three norms (enorm, hnorm, the head's norm),
    one decoder layer of the last layer's kind; embedding and output head are shared
    (Megatron-LM ``multi_token_prediction.py``; DeepSeek-V3 Sec. 2.2). DeepSeek-V3: 11,610,067,968."""
    is_moe, _ = mtp_layer_kind(model)
    layer = moe_layer_params(model) if is_moe else dense_layer_params(model)
    return mtp_projection_params(model) + mtp_norm_params(model) + layer


def mtp_params(model: ModelSpec) -> int:
    """Unique weights of all mtp_layers MTP modules (DeepSeek-V3: 11.61B; README_WEIGHTS 11.5B)."""
    return model.mtp_layers * mtp_module_params(model)


def mtp_params_with_shared_embeddings(model: ModelSpec) -> int:
    """MTP weights as DeepSeek's "14B" / "685B" count them: each module's unique weights plus a
    second copy of the embedding and output head stored with it (V*h*(1 or 2) per module;
    formulas.md 11.1). DeepSeek-V3: 13,463,426,048."""
    copies = model.vocab_size * model.hidden_size * (1 if model.tie_embeddings else 2)
    return model.mtp_layers * (mtp_module_params(model) + copies)
