"""torchtitan's per-op selective activation checkpointing, as costed for dense blocks: what one
block keeps for the backward and which share of its GEMMs it runs again (recompute code 1 with
``TrainingSpec.selective_recompute = "per_op"``; cost.blocks.activation_bytes_per_token and
cost.compute read it)."""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec
from .model_counts import ATTENTION, MLP, WINDOW


def per_op_modelled(model: ModelSpec) -> bool:
    """Whether per-op selective checkpointing is costed by its policy for ``model``: dense GQA/MHA
    blocks (MoE and MLA keep the core-attention costing, an approximation)."""
    return model.moe is None and model.attention_kind != "mla"


def per_op_saved_per_token(model: ModelSpec, c) -> dict[str, np.ndarray]:
    """Bytes per token (of s*b/cp) one dense block keeps under torchtitan's per-op selective
    activation checkpointing, recompute code 1 with ``selective_recompute = "per_op"``.
    {ATTENTION: array, MLP: array}; ValueError for MoE / MLA models (not modelled).

    The policy (pytorch/torchtitan torchtitan/parallelisms/parallelize_llama.py _save_list and
    _custom_policy @9dec370) saves, per transformer block, the outputs of aten.mm except every
    second one (counting the block's matmuls wq 1, wk 2, wv 3, wo 4, w1 5, w3 6, w2 7: wq, wv,
    w1, w2 kept), of SDPA (output + fp32 log-sum-exp) and of reduce_scatter_tensor (TP's
    row-parallel outputs under SP), and recomputes the rest; the checkpoint keeps the block
    input. In bf16 (2 B) with n heads, g' = max(g, t) KV heads, d = head dim, f = FFN width:
    attention: block input 2h/sp + (wq 2nd + wv 2g'd + SDPA out 2nd + 4n)/t + wo's
      reduce-scatter output 2h/sp when t > 1;
    MLP: w1 out 2f/t + w2 out 2h (the row-parallel partial sum is h wide on every TP rank) +
      its reduce-scatter output 2h/sp when t > 1.
    Under torchao Float8Linear the policy sees the same aten.mm (the Float8Tensor subclass
    dispatches it to _scaled_mm below the checkpoint's mode), so FP8 saves the same bytes.
    ValueError where not per_op_modelled (MoE, MLA).
    """
    if not per_op_modelled(model):
        raise ValueError("per-op selective recomputation is modelled for dense GQA/MHA blocks only")
    h, n, d, f = model.hidden_size, model.num_attention_heads, model.kv_channels, model.ffn
    tp = np.asarray(c.tp, dtype=np.float64)
    sp, g = c.sp_divisor, np.maximum(model.kv_heads, tp)
    scattered = np.where(tp > 1, 2.0 * h / sp, 0.0)
    attention = 2.0 * h / sp + (4.0 * n * d + 2.0 * g * d + 4.0 * n) / tp + scattered
    mlp = 2.0 * f / tp + 2.0 * h + scattered
    return {ATTENTION: attention, MLP: mlp}


def per_op_recomputed_gemm_share(model: ModelSpec, kind: str) -> float:
    """Share of a block's forward GEMM FLOPs per-op selective checkpointing runs again (the
    even matmuls, per_op_saved_per_token): attention wk + wo = (g + n)*d*h of 2*(n + g)*d*h =
    1/2; SwiGLU MLP w3 of w1, w3, w2 = 1/3; GeLU MLP fc2 of fc1, fc2 = 1/2; else 0."""
    if kind in (ATTENTION, WINDOW):
        return 0.5
    if kind == MLP:
        return 1.0 / 3.0 if model.activation == "swiglu" else 0.5
    return 0.0
