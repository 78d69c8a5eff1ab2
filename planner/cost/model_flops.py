"""Model FLOPs of MoE, MLA, MTP and sliding-window models, as Megatron counts them (formulas.md 11.2).

Scalar functions of a ModelSpec. Conventions of Megatron-LM @ d98e8a64ddf3
``megatron/training/training.py::num_floating_point_operations`` and Megatron-Bridge @
067f987df03b ``src/megatron/bridge/training/utils/flop_utils.py``: 2 FLOPs per multiply-add; a
training step runs every GEMM 3 times (forward, input gradient, weight gradient); only the
router_topk active experts count; the router GEMM, softmax/top-k, permutation, norms and RoPE do
not count; attention projections count Megatron's weights (MLA: its latent norms too, the "+1"
terms); the attention core counts what causal attention computes (below). Functions named
``*_per_token`` / ``*_per_sequence`` return FORWARD FLOPs; ``model_flops_per_token`` the
3-pass total.

Attention core of one layer, forward, per sequence of s tokens: 2 GEMMs (QK^T, AV) =
2*n*(d_qk + d_v)*s*c, with c the average keys per query (keys_per_query): s/2 for causal
attention over all earlier tokens (Megatron since 2025-03, commit 8873b55d6a), and for a causal
window of w keys (the query itself included) each query at position i = 1..s sees min(i, w)
keys: c = w - w*(w - 1)/(2s) for w < s (Megatron-Bridge's SWA count), never more than s/2.
"""

from __future__ import annotations

import numpy as np

from . import model_counts as mc
from ..specs import ModelSpec


def padded_vocab(vocab_size: int, tp, divisible_by: int = 128):
    """V_p = ceil(V / (128*tp)) * 128*tp (Megatron ``vocab_utils.py``). Shape of ``tp``
    (int64 array; a 0-d array for an int)."""
    multiple = divisible_by * np.asarray(tp)
    return -(-vocab_size // multiple) * multiple


def vocab_per_rank(model: ModelSpec, tp) -> np.ndarray:
    """Vocabulary rows one TP rank holds of the vocab-parallel embedding and output layer (its
    logits columns): V_p(t)/t, float array of the shape of ``tp``."""
    tp = np.asarray(tp)
    return padded_vocab(model.vocab_size, tp).astype(np.float64) / tp


def keys_per_query(seq_length: int, window: int | None = None, causal: bool = True) -> float:
    """Average keys each query attends to in a sequence of ``seq_length`` tokens.

    causal, no window: s/2 (Megatron's causal convention); causal window w < s: mean of
    min(i, w) over i = 1..s = w - w(w-1)/(2s), capped at s/2 so a window never costs more than
    none; w >= s: s/2. ``causal=False``: s (the full score matrix, as Narayanan 2021 and
    Korthikanti 2022 count; the window is then ignored too).
    Mistral 7B, s = 8192, w = 4096: 4096 - 4096*4095/16384 = 3072.25 (full causal 4096).
    """
    s = float(seq_length)
    if not causal:
        return s
    if window is None or window >= seq_length:
        return s / 2
    w = float(window)
    return min(w - w * (w - 1) / (2 * s), s / 2)


def _core_dims(model: ModelSpec) -> tuple[int, int, int]:
    """(heads, query/key head dim, value head dim) of the attention core."""
    if model.attention_kind == "mla":
        m = model.mla
        return model.num_attention_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return model.num_attention_heads, model.kv_channels, model.kv_channels


def attention_core_flops_per_sequence(model: ModelSpec, seq_length: int, windowed: bool = False,
                                      causal: bool = True) -> float:
    """Forward FLOPs of ONE layer's attention core (QK^T and AV) for one sequence.

    2*n*(d_qk + d_v)*s*c, c = keys_per_query(s, w if ``windowed`` else None, causal). GQA/MHA:
    d_qk = d_v = head_dim, so 4*n*d*s*c (causal, no window: 2*s^2*n*d, the dense formula).
    MLA: d_qk = qk_nope + qk_rope, d_v = v_head_dim (no weight absorption in training).
    ``windowed`` is ignored when the model has no sliding_window. FLOPs (float).
    """
    n, dqk, dv = _core_dims(model)
    window = model.sliding_window if windowed else None
    return 2.0 * n * (dqk + dv) * seq_length * keys_per_query(seq_length, window, causal)


def attention_core_flops_per_sequence_model(model: ModelSpec, seq_length: int,
                                            causal: bool = True) -> float:
    """Forward attention-core FLOPs of the whole model (every layer with its own window, and
    the MTP modules' layers) for one sequence."""
    windowed = int(mc.window_layer_mask(model).sum())
    full = model.num_layers - windowed
    _, mtp_window = mc.mtp_layer_kind(model)
    if model.mtp_layers:
        windowed += model.mtp_layers * mtp_window
        full += model.mtp_layers * (not mtp_window)
    return (full * attention_core_flops_per_sequence(model, seq_length, False, causal)
            + windowed * attention_core_flops_per_sequence(model, seq_length, True, causal))


def attention_proj_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of ONE layer's attention projections, Megatron's count.

    GQA: 2*(h*(n*d + 2*g*d) + n*d*h) (no biases, sinks or QK norms). MLA: 2*P_mla with the
    latent norms (Megatron's "+1" terms): 2 * 187,107,328 for DeepSeek-V3.
    """
    if model.attention_kind == "mla":
        return 2.0 * mc.mla_attention_params(model)
    h, d, n, g = model.hidden_size, model.kv_channels, model.num_attention_heads, model.kv_heads
    return 2.0 * (h * (n * d + 2 * g * d) + n * d * h)


def dense_mlp_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of ONE dense layer's MLP: 2*glu*h*f."""
    return 2.0 * mc.glu_factor(model) * model.hidden_size * model.ffn


def expert_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of ONE routed expert per token routed to it: 2*glu*h*F (0 if dense)."""
    if not model.moe:
        return 0.0
    return 2.0 * mc.glu_factor(model) * model.hidden_size * model.moe.ffn_hidden_size


def shared_expert_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of ONE MoE layer's shared experts: 2*glu*h*shared*F_sh."""
    if not model.moe or not model.moe.shared_experts:
        return 0.0
    return 2.0 * mc.glu_factor(model) * model.hidden_size * model.moe.shared_experts * \
        model.moe.shared_ffn


def moe_mlp_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of ONE MoE layer's MLP as Megatron counts it: router_topk routed
    experts + the shared experts (no router). 0 if dense."""
    if not model.moe:
        return 0.0
    return model.moe.router_topk * expert_flops_per_token(model) + shared_expert_flops_per_token(model)


def router_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of ONE MoE layer's router GEMM, 2*h*E: hardware work that model
    FLOPs leave out (formulas.md 11.2; 0.3 % of DeepSeek-V3's total)."""
    return 2.0 * model.hidden_size * model.moe.num_experts if model.moe else 0.0


def layer_gemm_flops_per_token(model: ModelSpec, moe: bool) -> float:
    """Forward GEMM FLOPs per token of ONE decoder layer of the given kind (``moe`` True: an MoE
    layer with its active experts; False: a dense layer), without the attention core."""
    mlp = moe_mlp_flops_per_token(model) if moe else dense_mlp_flops_per_token(model)
    return attention_proj_flops_per_token(model) + mlp


def mtp_proj_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs per token of the MTP modules' own terms, Megatron's 2*D*(2h^2 + 3h)
    (eh_proj and the norms' "+1" placeholders); their decoder layers and heads are elsewhere."""
    h = model.hidden_size
    return 2.0 * model.mtp_layers * (2 * h * h + 3 * h)


def body_gemm_flops_per_token(model: ModelSpec) -> float:
    """Forward GEMM FLOPs per token of every decoder layer by kind and of the MTP modules (a
    layer of the last layer's kind + their projection each); the logits not included."""
    dense, n_moe = mc.layer_kind_counts(model)
    mtp_moe, _ = mc.mtp_layer_kind(model)
    layers = dense * layer_gemm_flops_per_token(model, False) + \
        n_moe * layer_gemm_flops_per_token(model, True)
    layers += model.mtp_layers * layer_gemm_flops_per_token(model, mtp_moe)
    return layers + mtp_proj_flops_per_token(model)


def logits_flops_per_token(model: ModelSpec, tp=1):
    """Forward FLOPs per token of the output layer over the padded vocabulary V_p(tp)
    (Megatron's --make-vocab-size-divisible-by 128 x tp), once per head: 2*h*V_p*(1 + D).
    A float for an int ``tp``, a float array of its shape for an array."""
    vocab = np.asarray(padded_vocab(model.vocab_size, tp), dtype=np.float64)
    out = 2.0 * model.hidden_size * vocab * (1 + model.mtp_layers)
    return float(out) if out.ndim == 0 else out


def model_gemm_flops_per_token(model: ModelSpec, tp: int = 1) -> float:
    """Forward GEMM FLOPs per token of the whole model: body_gemm_flops_per_token + logits."""
    return body_gemm_flops_per_token(model) + logits_flops_per_token(model, tp)


def model_flops_per_token(model: ModelSpec, seq_length: int, tp: int = 1, causal: bool = True) -> float:
    """Model FLOPs per token of one training step (forward + backward, 3 GEMM passes): what
    Megatron-Bridge divides by for TFLOP/s (formulas.md 11.2). Sequences of ``seq_length`` tokens.

    3*(model_gemm_flops_per_token + attention_core_flops_per_sequence_model / s).
    DeepSeek-V3 at s = 4096 (MTP 1): 259.99e9; Mistral 7B at s = 8192: 47.49e9.
    """
    core = attention_core_flops_per_sequence_model(model, seq_length, causal) / seq_length
    return 3.0 * (model_gemm_flops_per_token(model, tp) + core)


def model_flops_per_step(model: ModelSpec, seq_length: int, global_batch_size: int,
                         tp, causal: bool = True) -> np.ndarray:
    """Model FLOPs of one optimizer step, no recomputation (formulas.md 4.1, 11.2), float array
    of the shape of ``tp`` (the padded vocabulary depends on it): B*s*model_flops_per_token.

    Dense: 6*B*s*[L*(2*h*d*(n + g) + glu*h*f) + h*V_p] + 3*B*L*2*n*d*s^2 (causal half);
    ``causal=False`` counts the full s^2 (Narayanan 2021, Korthikanti 2022, PaLM)."""
    tokens = float(global_batch_size) * seq_length
    gemm = body_gemm_flops_per_token(model) + logits_flops_per_token(model, np.asarray(tp))
    core = attention_core_flops_per_sequence_model(model, seq_length, causal)
    return 3.0 * tokens * gemm + 3.0 * global_batch_size * core


def recompute_flops_per_step(model: ModelSpec, seq_length: int, global_batch_size: int,
                             recompute, causal: bool = True, full_share=1.0) -> np.ndarray:
    """Extra hardware FLOPs of recomputation per step (formulas.md 4.2), shape of ``recompute``.

    full (code 2): one more forward of every decoder layer and MTP module (GEMMs + attention
    core), not the logits; of ``full_share`` of the layers where the block method recomputes
    N per chunk (LayoutDegrees.recomputed_layers / L; the mean layer's FLOPs); selective
    (code 1): one more forward of the attention core; other codes: 0."""
    attention = global_batch_size * attention_core_flops_per_sequence_model(model, seq_length, causal)
    layers = float(global_batch_size) * seq_length * body_gemm_flops_per_token(model) + attention
    recompute = np.asarray(recompute)
    return np.where(recompute == 2, full_share * layers, np.where(recompute == 1, attention, 0.0))
