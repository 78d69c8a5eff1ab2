"""The activation bytes a decoder layer's blocks save per token on one GPU (attention, sliding-
window attention, dense MLP, MoE MLP), by recomputation mode: what the backward pass reads, as
cost.memory holds it in flight. Korthikanti et al. 2022 Sec. 4 (formulas.md 3.1-3.2); moe.md 5.2
(what an MoE block saves), 5.4 (MLA); Megatron-LM @ d98e8a64ddf3. Float arrays broadcast over
candidates; the blocks themselves are cost.blocks'.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from . import model_counts as mc
from . import precision
from .blocks import ROUTER_BYTES_PER_SCORE, block_kinds, kv_heads_per_rank, qk_norm_elements, routed_factor
from .model_counts import ATTENTION, MLP, MOE, WINDOW
from .per_op_checkpoint import per_op_saved_per_token

MAP_BYTES_PER_ROW = 12.0  # fp32 permuted prob + int64 row index per routed row (moe.md 5.2)


def activation_bytes_per_token(model: ModelSpec, training: TrainingSpec, c, recompute) -> dict[str, np.ndarray]:
    """Bytes one block saves for the backward per token (of s*b/cp on the GPU), by recompute
    code (0 none, 1 selective: core attention, 2 full, 3 selective+: layernorm, moe_act and
    mla_up_proj, Megatron-Core's --recompute-modules). {kind: array}

    Replicated terms R are split by SP, sharded ones S by TP (formulas.md 3.2):
    attention: R = 2h norm input + 2h QKV input (dropped by layernorm) + h dropout mask;
      S = Q, K, V 2*d*(n + 2g') + out-proj input 2*n*d + QK-norm inputs 2*d*(n + g') (Qwen3,
      OLMoE; qk_norm_elements) + the fp32 log-sum-exp 4n (flash) or the scores (2 + 3 with
      dropout)*n*s (no flash; dropped by core_attn). MLA (moe.md 5.4):
      R = 2h norm input + 2h down-projection input (layernorm) + latents 4*r_q + 4*r_kv + 2*d_r;
      S = q, k, v 2n(2(d_n + d_r) + d_v) (dropped by mla_up_proj) + output 2n*d_v + 4n.
    dense MLP: R = 2h norm input + 2h fc1 input (layernorm) + h mask; S = 2*glu_in*f + 2f.
    MoE (moe.md 5.2, on the SP shard T = tokens/t): R = 2h norm input + 2h MoE input
      (layernorm); per token of T: router state 12E, dispatched tokens 2*k*g*etp*h, fc1 output
      2*k*g*glu_in*F, fc2 input 2*k*g*F (dropped by moe_act), probs and maps 12*k*g*etp, shared
      experts 2*(glu_in + 1)*F_sh (g = moe_imbalance on the busiest rank); with
      training.moe_activation_offload the dispatched tokens and fc1 output are in host memory.
    Full recompute keeps the layer input, 2h/sp on the attention block, nothing on the MLP.
    FP8 with Transformer Engine (precision.linear_input_bytes q = 1 + scales, fp8_hardware.md
    3.2): the inputs of linear layers (QKV / down-projection, fc1, fc2, the experts' dispatched
    rows and fc2 inputs) are saved in FP8, q bytes instead of 2, and the out-projection keeps an
    FP8 copy of the attention output beside attention's own, +q*n*d_v.
    """
    h, tp, sp = model.hidden_size, np.asarray(c.tp, dtype=np.float64), c.sp_divisor
    rc = np.asarray(recompute)
    if training.selective_recompute == "per_op" and np.any(rc == 1):
        plain = activation_bytes_per_token(model, training.model_copy(
            update={"selective_recompute": "core_attention"}), c, np.where(rc == 1, 0, rc))
        per_op = per_op_saved_per_token(model, training, c)
        return {k: np.where(rc == 1, per_op.get(k, v), v) for k, v in plain.items()}
    light = rc == 3  # layernorm, moe_act, mla_up_proj dropped
    core = rc == 1
    full = rc == 2
    mask = float(h) if model.dropout > 0 else 0.0
    q = precision.linear_input_bytes(training)  # a linear input as saved: 2, or FP8 1 + scales
    norm_out = np.where(light, 0.0, q * h)
    out = {}
    rep, shard = _attention_saved(model, training, tp, norm_out, core, light)
    out[ATTENTION] = np.where(full, 2.0 * h / sp, rep / sp + shard / tp)
    if WINDOW in block_kinds(model):
        out[WINDOW] = out[ATTENTION]
    f = model.ffn
    mlp = (2.0 * h + norm_out + mask) / sp + (2.0 * mc.fc1_outputs(model) * f + q * f) / tp
    if MLP in block_kinds(model):
        out[MLP] = np.where(full, 0.0, mlp)
    if model.moe is not None:
        m, g = model.moe, routed_factor(training)
        glu_in, F = mc.fc1_outputs(model), m.ffn_hidden_size
        offload = 0.0 if training.moe_activation_offload else 1.0  # expert_fc1 and moe_act inputs
        per_row = offload * (q * c.etp * h + 2.0 * glu_in * F) + np.where(light, 0.0, q * F) \
            + MAP_BYTES_PER_ROW * c.etp
        shard_t = ROUTER_BYTES_PER_SCORE * m.num_experts + m.router_topk * g * per_row \
            + (2.0 * glu_in + q) * m.shared_experts * m.shared_ffn
        out[MOE] = np.where(full, 0.0, (2.0 * h + norm_out) / sp + shard_t / tp)
    return out


def _attention_saved(model: ModelSpec, training: TrainingSpec, tp, norm_out, core, light):
    """(R, S) bytes per token the attention block saves (see activation_bytes_per_token)."""
    h, n = model.hidden_size, model.num_attention_heads
    q = precision.linear_input_bytes(training)
    o_copy = q if q < 2.0 else 0.0  # TE FP8: the out-projection's FP8 copy of the output
    if model.attention_kind == "mla":
        m = model.mla
        latents = 4.0 * (m.q_lora_rank or 0) + 4.0 * m.kv_lora_rank + 2.0 * m.qk_rope_head_dim
        qkv = 2.0 * n * (2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + m.v_head_dim)
        shard = np.where(light, 0.0, qkv) + (2.0 + o_copy) * n * m.v_head_dim + 4.0 * n
        return 2.0 * h + norm_out + latents, shard
    d, g = model.kv_channels, kv_heads_per_rank(model, tp) * tp  # g' = max(g, t), over the TP group
    dropout = model.dropout > 0
    shard = 2.0 * d * (n + 2 * g) + (2.0 + o_copy) * n * d + qk_norm_elements(model, g) * 2.0
    if training.flash_attention:
        scores = 4.0 * n
    else:
        scores = np.where(core, 0.0, (5.0 if dropout else 2.0) * n * training.seq_length)
    return 2.0 * h + norm_out + (h if dropout else 0.0), shard + scores
