"""Parameter counts and FLOPs (formulas.md sections 1, 4 and 11).

Conventions: 2 FLOPs per multiply-add; a training step runs each GEMM three times (forward,
input-gradient, weight-gradient). Arrays have shape (N,) over candidates; ``tp`` enters through
the padded vocabulary and the KV-head replication rule.

The per-layer functions here (attention_weights, mlp_weights, layer_params_per_gpu, ...) are
those of a dense MHA/GQA layer, used by the per-GPU cost model. Model-level counts of MoE, MLA,
MTP and sliding-window models live in ``model_counts`` (parameters, layer pattern) and
``model_flops`` (FLOPs); total_params, model_flops_per_step and recompute_flops_per_step below
cover every model through them and give the dense results unchanged.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec
from . import model_counts, model_flops
from .model_flops import padded_vocab  # noqa: F401 (its one definition; re-exported)


def attention_weights(model: ModelSpec) -> int:
    """Q, K, V, O weights of one layer: 2*h*d_h*(a + g) (formulas.md 1.1)."""
    h, d, a, g = model.hidden_size, model.kv_channels, model.num_attention_heads, model.kv_heads
    return 2 * h * d * (a + g)


def mlp_weights(model: ModelSpec) -> int:
    """MLP weights of one layer: 2*h*f (GeLU) or 3*h*f (SwiGLU)."""
    return (3 if model.activation == "swiglu" else 2) * model.hidden_size * model.ffn


def layer_biases(model: ModelSpec) -> int:
    """Bias parameters of one layer if ``bias``: QKV (a+2g)*d_h, O h, MLP f+h (GeLU) or 2f+h;
    with ``qkv_bias`` only the QKV ones."""
    h, d, a, g, f = (model.hidden_size, model.kv_channels, model.num_attention_heads,
                     model.kv_heads, model.ffn)
    if not model.bias:
        return (a + 2 * g) * d if model.qkv_bias else 0
    return (a + 2 * g) * d + h + (2 * f if model.activation == "swiglu" else f) + h


def norm_params(model: ModelSpec) -> int:
    """Parameters of ONE norm: 2h (LayerNorm gamma, beta) or h (RMSNorm)."""
    return (2 if model.norm == "layernorm" else 1) * model.hidden_size


def layer_params(model: ModelSpec) -> int:
    """All parameters of one transformer layer (two norms included)."""
    return attention_weights(model) + mlp_weights(model) + layer_biases(model) + 2 * norm_params(model)


def total_params(model: ModelSpec) -> int:
    """P = L*layer + final norm + V*h*(1 if tied else 2) + learned positions (formulas.md 1.2).

    Uses the real (unpadded) vocabulary, as published counts do. GPT-3 175B: 174.6e9. MoE, MLA
    and the extra weights (QK norms, sinks) by layer kind: model_counts.total_params (11.1).
    """
    return model_counts.total_params(model)


def _plain_dense(model: ModelSpec) -> bool:
    """A dense MHA/GQA model without window or MTP: the formulas of section 4 apply as written."""
    return (model.moe is None and model.attention_kind != "mla" and model.sliding_window is None
            and model.mtp_layers == 0)


def layer_params_per_gpu(model: ModelSpec, tp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU parameters of one layer under TP, as (tp_sharded, replicated), float arrays.

    GEMM weights divide by tp, except K/V when g < tp: each rank keeps one KV head, so K/V weights
    per GPU are 2*h*d_h*max(g, tp)/tp (formulas.md 1.3). Column-parallel biases divide by tp;
    row-parallel output biases (2h) and the norms are replicated.
    """
    h, d, a, g, f = (model.hidden_size, model.kv_channels, model.num_attention_heads,
                     model.kv_heads, model.ffn)
    tp = np.asarray(tp, dtype=np.float64)
    kv = np.maximum(g, tp)
    gemm = (2 * h * d * a + 2 * h * d * kv + mlp_weights(model)) / tp
    replicated = 2.0 * norm_params(model)
    if model.bias:
        column_bias = (a * d + 2 * d * kv + (2 * f if model.activation == "swiglu" else f)) / tp
        gemm = gemm + column_bias
        replicated += 2 * h
    elif model.qkv_bias:
        gemm = gemm + (a * d + 2 * d * kv) / tp
    return gemm, np.broadcast_to(replicated, tp.shape).astype(np.float64)


def gemm_flops_per_token_layer(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Forward GEMM FLOPs per token per layer on one GPU: 2 * (GEMM weights per GPU). (N,)"""
    h, d, a, g = model.hidden_size, model.kv_channels, model.num_attention_heads, model.kv_heads
    tp = np.asarray(tp, dtype=np.float64)
    return 2.0 * (2 * h * d * a + 2 * h * d * np.maximum(g, tp) + mlp_weights(model)) / tp


def attention_flops_per_sequence_layer(model: ModelSpec, seq_length: int, causal: bool) -> float:
    """Forward core-attention FLOPs per sequence per layer (QK^T and AV): 4*s^2*a*d_h, halved if causal.

    A dense MHA/GQA layer over the full causal context: it ignores ``sliding_window`` and MLA's
    head dims. model_flops.attention_core_flops_per_sequence is the general form (window, MLA).
    """
    full = 4.0 * seq_length**2 * model.num_attention_heads * model.kv_channels
    return full / 2 if causal else full


def model_flops_per_step(model: ModelSpec, seq_length: int, global_batch_size: int,
                         tp: np.ndarray, causal: bool = True) -> np.ndarray:
    """Model FLOPs of one optimizer step (formulas.md 4.1, 11.2), no recomputation. Shape of ``tp``.

    F = 6*T*[L*(h*d_h*(a+2g) + a*d_h*h + k*h*f) + h*V_p] + 3*B*L*attention_fwd, T = B*s tokens.
    ``causal=True`` counts the causal half of attention (Megatron-LM since 2025-03, commit
    8873b55d6a); ``causal=False`` the full s^2 (Narayanan 2021, Korthikanti 2022, PaLM).
    Megatron counts the padded vocabulary V_p, which depends on tp. MoE (active experts), MLA,
    MTP and sliding windows (attention over the window): the layer sums of model_flops (11.2).
    """
    h = model.hidden_size
    tokens = float(global_batch_size) * seq_length
    vocab = padded_vocab(model.vocab_size, tp).astype(np.float64)
    if not _plain_dense(model):
        gemm = 3.0 * tokens * (model_flops.body_gemm_flops_per_token(model)
                               + 2.0 * h * vocab * (1 + model.mtp_layers))
        core = model_flops.attention_core_flops_per_sequence_model(model, seq_length, causal)
        return gemm + 3.0 * global_batch_size * core
    per_token_layer = attention_weights(model) + mlp_weights(model)
    gemm = 6.0 * tokens * (model.num_layers * per_token_layer + h * vocab)
    attention = 3.0 * global_batch_size * model.num_layers * \
        attention_flops_per_sequence_layer(model, seq_length, causal)
    return gemm + attention


def recompute_flops_per_step(model: ModelSpec, seq_length: int, global_batch_size: int,
                             recompute: np.ndarray, causal: bool = True,
                             full_share=1.0) -> np.ndarray:
    """Extra hardware FLOPs of recomputation per step (formulas.md 4.2). (N,)

    full (code 2): one more forward of every layer (GEMMs + attention), not the logits; of
    ``full_share`` of the layers where the block method recomputes N per chunk
    (LayoutDegrees.recomputed_layers / L; the mean layer's FLOPs).
    selective (code 1): one more forward of the attention core. MoE, MLA, MTP and windows:
    the layer sums of model_flops (active experts, the window's keys).
    """
    tokens = float(global_batch_size) * seq_length
    if not _plain_dense(model):
        attention = global_batch_size * model_flops.attention_core_flops_per_sequence_model(
            model, seq_length, causal)
        layers = tokens * model_flops.body_gemm_flops_per_token(model) + attention
        return np.where(recompute == 2, full_share * layers, np.where(recompute == 1, attention, 0.0))
    attention = global_batch_size * model.num_layers * \
        attention_flops_per_sequence_layer(model, seq_length, causal)
    layers = 2.0 * tokens * model.num_layers * (attention_weights(model) + mlp_weights(model)) + attention
    return np.where(recompute == 2, full_share * layers, np.where(recompute == 1, attention, 0.0))
