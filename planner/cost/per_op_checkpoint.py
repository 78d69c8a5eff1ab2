"""torchtitan's per-op selective activation checkpointing (SAC): what one block keeps for the
backward and which of its GEMMs it runs again (recompute code 1 with
``TrainingSpec.selective_recompute = "per_op"``; cost.block_activations.activation_bytes_per_token and
cost.compute read it), for dense, MoE, GQA/MHA and MLA blocks alike.

The policy as pytorch/torchtitan @b5bcd76c66d0 writes it (torchtitan/distributed/
activation_checkpoint.py L31-94 _get_default_save_ops and L209-287 SelectiveAC._wrap_block), one
checkpoint context per transformer block (its op counter restarts in every block):

- MUST_SAVE the outputs of torch's compute-intensive ops (torch/_functorch/partitioners.py
  get_default_op_list, torch 2.13.0: mm, bmm, addmm, convolution, the SDPA flash and efficient
  kernels, _scaled_mm), of every SDPA variant, FlexAttention, aten.max, topk and linear, and of
  the collectives reduce_scatter_tensor and all_to_all_single (and DeepEP / HybridEP dispatch and
  combine); and device-to-host copies;
- except every second aten.mm / aten.linear of the block (counted in forward order, 1-based:
  the odd ones are saved, the even ones recomputed);
- force-recompute any mm of the router gate's shape (force_recompute_mm_shapes_by_fqns
  ["moe.router.gate"]), uncounted;
- recompute everything else: norms, RoPE, activations, the token permutations (aten.index),
  and the routed experts' grouped GEMMs, since torch._grouped_mm is in neither list (torchtitan
  0.2.2's explicit save list, deepseek_v3/infra/parallelize.py L33-48, has no grouped mm either).

So a block keeps its input (the checkpoint's), the odd matmuls' outputs, attention's output
and fp32 log-sum-exp, the router's top-k, the MoE dispatch and combine all-to-all outputs (EP
> 1) and the TP reduce-scatter outputs; in the backward it re-runs the even matmuls, the router
gate and every routed-expert GEMM. Matmul order as torchtitan's models run them
(models/common/attention.py QKVLinear wq, wk, wv then wo; models/deepseek_v3/model.py Attention:
wq or wq_a, wq_b; wkv_a, wkv_b; wo; models/common/feed_forward.py w1, w3, w2; models/common/
moe.py: router gate, routed experts, then the shared experts' FeedForward).
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from . import model_counts as mc
from .model_counts import ATTENTION, MLP, MOE, WINDOW

TOPK_BYTES = 12.0  # router top-k per (token, choice): fp32 score + int64 expert id, MUST_SAVE


def attention_matmuls(model: ModelSpec, tp) -> list[tuple[np.ndarray, np.ndarray]]:
    """The attention block's aten.mm in forward order, each (output bytes per token, forward
    FLOPs per token / 2) on one GPU of the TP group (``tp`` array). MHA/GQA: wq n d/t, wk and wv
    g' d/t each (g' = max(g, t), one KV head per rank below t), wo h (the row-parallel partial
    sum is h wide on every rank). MLA: wq_a r_q and wkv_a r_kv + d_r replicated (torchtitan's TP
    gathers the attention input and keeps the low-rank projections whole,
    deepseek_v3/sharding.py L96-133), wq_b (or wq) n(d_n + d_r)/t, wkv_b n(d_n + d_v)/t, wo h."""
    tp = np.asarray(tp, dtype=np.float64)
    h, n = float(model.hidden_size), model.num_attention_heads
    if model.attention_kind == "mla":
        m = model.mla
        q, kv = n * (m.qk_nope_head_dim + m.qk_rope_head_dim), n * (m.qk_nope_head_dim + m.v_head_dim)
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        first = [(2.0 * m.q_lora_rank + 0 * tp, h * m.q_lora_rank + 0 * tp),
                 (2.0 * q / tp, m.q_lora_rank * q / tp)] if m.q_lora_rank else [(2.0 * q / tp, h * q / tp)]
        return first + [(2.0 * latent + 0 * tp, h * latent + 0 * tp),
                        (2.0 * kv / tp, m.kv_lora_rank * kv / tp),
                        (2.0 * h + 0 * tp, n * m.v_head_dim * h / tp)]
    d, g = model.kv_channels, np.maximum(model.kv_heads, tp)
    return [(2.0 * n * d / tp, h * n * d / tp), (2.0 * g * d / tp, h * g * d / tp),
            (2.0 * g * d / tp, h * g * d / tp), (2.0 * h + 0 * tp, n * d * h / tp)]


def mlp_matmuls(model: ModelSpec, width: float, tp) -> list[tuple[np.ndarray, np.ndarray]]:
    """A FeedForward of ``width`` (the dense FFN, or an MoE layer's shared experts together) in
    forward order, each (output bytes, FLOPs / 2) per token on one GPU: SwiGLU w1 and w3 width/t,
    w2 h; GeLU fc1 width/t, fc2 h. [] for width 0."""
    if not width:
        return []
    tp = np.asarray(tp, dtype=np.float64)
    h = float(model.hidden_size)
    up = (2.0 * width / tp, h * width / tp)
    down = (2.0 * h + 0 * tp, h * width / tp)
    return [up, up, down] if mc.fc1_outputs(model) == 2 else [up, down]


def _ffn_matmuls(model: ModelSpec, kind: str, tp) -> list:
    """The matmuls of a block's FFN part: the dense MLP, or the MoE layer's shared experts (the
    router gate is force-recomputed and uncounted; routed experts are grouped GEMMs, not mm)."""
    if kind == MOE:
        moe = model.moe
        return mlp_matmuls(model, moe.shared_experts * moe.shared_ffn if moe.shared_experts else 0, tp)
    return mlp_matmuls(model, model.ffn, tp)


def _saved(matmuls: list, offset: int) -> object:
    """Output bytes of the odd-numbered matmuls (the policy's MUST_SAVE) of ``matmuls``, counted
    from ``offset`` + 1 (the block's matmuls before them)."""
    return sum(b for i, (b, _) in enumerate(matmuls, start=offset + 1) if i % 2 == 1)


def per_op_saved_per_token(model: ModelSpec, training: TrainingSpec, c) -> dict[str, np.ndarray]:
    """Bytes per token (of s*b/cp) one block keeps under torchtitan's per-op SAC (module
    docstring), bf16 activations (2 B), recompute code 1 with ``selective_recompute = "per_op"``:
    {ATTENTION (and WINDOW): array, MLP: array, MOE: array}, the kinds the model has.

    attention: block input 2h/sp + the odd matmuls' outputs (attention_matmuls) + attention's
      output 2 n d_v/t and fp32 log-sum-exp 4n/t + wo's reduce-scatter output 2h/sp when t > 1;
    MLP: the odd matmuls of w1, w3, w2, counted after the attention's (4 matmuls for MHA/GQA
      and MLA without a q latent: w1 and w2 saved; 5 with it: w3 saved) + reduce-scatter 2h/sp;
    MoE (per token of T = s*b/(cp*t), so /t here): the router's top-k 12k; with ep > 1 the
      dispatch all-to-all output (the rows this rank receives, gamma*k*etp with gamma
      training.moe_imbalance, h wide) and the
      combine all-to-all output (the k rows it sent back, h wide); the shared experts' odd
      matmuls; reduce-scatter 2h/sp when t > 1. Routed experts keep nothing.
    Under torchao Float8Linear the policy sees the same aten.mm (the Float8 subclass dispatches
    to _scaled_mm below the checkpoint's mode), so FP8 saves the same bytes.
    """
    h, n = model.hidden_size, model.num_attention_heads
    tp = np.asarray(c.tp, dtype=np.float64)
    sp = c.sp_divisor
    scattered = np.where(tp > 1, 2.0 * h / sp, 0.0)
    attn = attention_matmuls(model, tp)
    d_v = model.mla.v_head_dim if model.attention_kind == "mla" else model.kv_channels
    out = {ATTENTION: 2.0 * h / sp + _saved(attn, 0) + (2.0 * n * d_v + 4.0 * n) / tp + scattered}
    if model.sliding_window is not None:
        out[WINDOW] = out[ATTENTION]
    if mc.has_dense_mlp(model):
        out[MLP] = _saved(_ffn_matmuls(model, MLP, tp), len(attn)) + scattered
    if model.moe is not None:
        moe = model.moe
        k = float(moe.router_topk)
        a2a = np.where(np.asarray(c.ep) > 1, 2.0 * h * k * (training.moe_imbalance * np.asarray(c.etp) + 1.0), 0.0)
        out[MOE] = (TOPK_BYTES * k + a2a) / tp + _saved(_ffn_matmuls(model, MOE, tp), len(attn)) + scattered
    return out


def per_op_recomputed_gemm_share(model: ModelSpec, kind: str, tp) -> np.ndarray:
    """Share of a block's forward GEMM FLOPs that per-op SAC runs again in the backward: its
    even matmuls' FLOPs over all of them (attention_matmuls; the FFN's counted after the
    attention's). MHA/GQA attention: wk + wo = (g' + n)d h of 2(n + g')d h = 1/2; SwiGLU MLP
    after 4 attention matmuls: w3 of w1, w3, w2 = 1/3; GeLU: fc2 of fc1, fc2 = 1/2; an MoE
    block's shared experts likewise (its router and routed experts are recomputed whole:
    compute.block_times). Float array of ``tp``'s shape."""
    attn = attention_matmuls(model, tp)
    mm = attn if kind in (ATTENTION, WINDOW) else _ffn_matmuls(model, kind, tp)
    offset = 0 if kind in (ATTENTION, WINDOW) else len(attn)
    if not mm:
        return np.zeros(np.shape(np.asarray(tp, dtype=np.float64)))
    total = sum(f for _, f in mm)
    return sum(f for i, (_, f) in enumerate(mm, start=offset + 1) if i % 2 == 0) / total
