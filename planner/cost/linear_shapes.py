"""The linear layers a block runs in FP8, as the weight shapes one GPU holds: what the FP8
libraries check their GEMM operands against (search.fp8_rules).

A weight is (out, in) on one GPU: a column-parallel layer (QKV, MLA up-projections, fc1) splits
``out`` over tp, a row-parallel one (the out-projection, fc2) splits ``in``; experts split over
etp. The output layer, the router and the attention core are not FP8 linears (Megatron-Core's
output layer and router are not Transformer Engine modules; fp8_hardware.md 2.4). Routed experts
are left out: their token counts change every step and the frameworks pad them (Megatron-Core
--moe-router-padding-for-fp8, torchtitan's padded token dispatcher), so only their widths are
static.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec
from . import model_counts as mc
from .blocks import kv_heads_per_rank


def fp8_linear_shapes(model: ModelSpec, tp, etp) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{layer name: (out, in)} per GPU of every FP8 linear layer of ``model`` at tensor-parallel
    size ``tp`` and expert tensor-parallel size ``etp`` (arrays, e.g. a Candidates' fields; float
    arrays broadcast over them; a width that does not divide evenly is fractional, so no
    divisibility test passes it; tp = etp = 1 gives the global shapes). Attention: MHA/GQA ``qkv`` ((n/t + 2 g')d,
    h) with g' = max(g, t)/t KV heads per rank (blocks.kv_heads_per_rank) and ``proj`` (h,
    n d/t); MLA ``q_down`` (r_q, h) or ``q`` (n(d_n + d_r)/t, h) without a q latent, ``kv_down``
    (r_kv + d_r, h), ``q_up`` (n(d_n + d_r)/t, r_q), ``kv_up`` (n(d_n + d_v)/t, r_kv), ``proj``
    (h, n d_v/t). Dense MLP ``fc1`` (glu_out f/t, h) and ``fc2`` (h, f/t); MoE routed experts
    ``expert_fc1`` (glu_out F/etp, h), ``expert_fc2`` (h, F/etp) and shared experts
    (glu_out S F_s/t, h), (h, S F_s/t) as one MLP of S experts (Megatron-Core's
    moe_shared_expert_intermediate_size)."""
    tp = np.asarray(tp, dtype=np.float64)
    etp = np.asarray(etp, dtype=np.float64)
    h, n, glu = float(model.hidden_size), model.num_attention_heads, mc.fc1_outputs(model)
    out: dict[str, tuple] = {}
    if model.attention_kind == "mla":
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            out["q_down"] = (np.full_like(tp, m.q_lora_rank), np.full_like(tp, h))
            out["q_up"] = (n * qk / tp, np.full_like(tp, m.q_lora_rank))
        else:
            out["q"] = (n * qk / tp, np.full_like(tp, h))
        out["kv_down"] = (np.full_like(tp, m.kv_lora_rank + m.qk_rope_head_dim), np.full_like(tp, h))
        out["kv_up"] = (n * (m.qk_nope_head_dim + m.v_head_dim) / tp, np.full_like(tp, m.kv_lora_rank))
        out["proj"] = (np.full_like(tp, h), n * m.v_head_dim / tp)
    else:
        d = model.kv_channels
        out["qkv"] = ((n / tp + 2 * kv_heads_per_rank(model, tp)) * d, np.full_like(tp, h))
        out["proj"] = (np.full_like(tp, h), n * d / tp)
    if mc.has_dense_mlp(model):
        out["fc1"] = (glu * model.ffn / tp, np.full_like(tp, h))
        out["fc2"] = (np.full_like(tp, h), model.ffn / tp)
    if model.moe is not None:
        moe = model.moe
        out["expert_fc1"] = (glu * moe.ffn_hidden_size / etp, np.full_like(etp, h))
        out["expert_fc2"] = (np.full_like(etp, h), moe.ffn_hidden_size / etp)
        if moe.shared_experts:
            width = moe.shared_experts * moe.shared_ffn
            out["shared_fc1"] = (glu * width / tp, np.full_like(tp, h))
            out["shared_fc2"] = (np.full_like(tp, h), width / tp)
    return out
