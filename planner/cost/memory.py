"""Per-GPU memory: weights, gradients, optimizer states, activations, buffers (formulas.md 1-3).

Everything in bytes, arrays broadcast over candidates. Pipeline ranks are named by kind:
``first`` (rank 0: embedding, most in-flight micro-batches), ``middle`` (rank 1: layers only;
with an uneven split it can hold the most) and ``last`` (rank pp-1: final norm, output layer,
logits and loss); with pp = 1 the one rank is first and last at once.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from . import flops, pipeline

OPTIMIZER_BYTES_PER_PARAM = 12.0  # fp32 master weights + Adam m + v (ZeRO paper K = 12)
RANK_KINDS = ("first", "middle", "last")


def rank_index(c, kind: str):
    """Pipeline rank of a rank kind: first 0, middle min(1, pp-1), last pp-1. Int array."""
    pp = np.asarray(c.pp)
    return {"first": np.zeros_like(pp), "middle": np.minimum(1, pp - 1), "last": pp - 1}[kind]


def rank_params(model: ModelSpec, c, rank) -> dict[str, np.ndarray]:
    """Parameters on one GPU of pipeline rank ``rank``, as the parts FSDP units hold. {part: array}

    ``layer``: one transformer layer (TP-sharded + replicated, flops.layer_params_per_gpu);
    ``layers``: how many the rank holds (LayoutDegrees.rank_layers); ``embedding``: the
    vocab-parallel word embedding V_p*h/tp plus learned positions (replicated), on rank 0;
    ``head``: the final norm and the output layer V_p*h/tp, on the last rank; the output layer
    exists even for tied embeddings when pp > 1 (Megatron keeps a copy, formulas.md 1.3).
    """
    h = model.hidden_size
    sharded, replicated = flops.layer_params_per_gpu(model, c.tp)
    rank = np.asarray(rank)
    vocab = flops.padded_vocab(model.vocab_size, c.tp).astype(np.float64)
    word = vocab * h / c.tp
    positions = float((model.max_position_embeddings or 0) * h) \
        if model.position_embedding == "learned" else 0.0
    output = np.where((np.asarray(c.pp) > 1) | (not model.tie_embeddings), word, 0.0)
    return {"layer": sharded + replicated, "layers": c.rank_layers(model.num_layers, rank),
            "embedding": np.where(rank == 0, word + positions, 0.0),
            "head": np.where(rank == np.asarray(c.pp) - 1, flops.norm_params(model) + output, 0.0)}


def stage_params(model: ModelSpec, c, kind: str) -> np.ndarray:
    """Parameters held by one GPU of the ``first``, ``middle`` or ``last`` pipeline rank."""
    return params_at(model, c, rank_index(c, kind))


def params_at(model: ModelSpec, c, rank) -> np.ndarray:
    """Parameters held by one GPU of pipeline rank ``rank`` (an index array), broadcast."""
    p = rank_params(model, c, rank)
    return p["layer"] * p["layers"] + p["embedding"] + p["head"]


def zero_divisors(c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What weights, gradients and optimizer states are divided by on one GPU (formulas.md 2.1):
    n = dp*cp (the gradient group, LayoutDegrees.grad_group) for the states the ZeRO stage
    shards (LayoutDegrees.sharding_stage: the distributed optimizer is stage 1), else 1.
    stage 1: optimizer; 2: + gradients; 3: + weights. Float arrays (weights, grads, optimizer)."""
    n = np.asarray(c.grad_group, dtype=np.float64)
    z = c.sharding_stage
    return np.where(z >= 3, n, 1.0), np.where(z >= 2, n, 1.0), np.where(z >= 1, n, 1.0)


def model_state_bytes(params: np.ndarray, c, training: TrainingSpec) -> dict[str, np.ndarray]:
    """Weights, gradients and optimizer states in bytes for ``params`` held per GPU (formulas.md 2.1).

    Per parameter, each divided by zero_divisors (n = dp*cp where the stage shards it):
    weights ``param_bytes`` (2 bf16; 4 where the fp32 parameter is its own master, FSDP2),
    gradients ``grad_bytes`` (4 fp32 main grads in Megatron, 2 16-bit), optimizer 8 (Adam m, v)
    + 4 for a separate fp32 master copy (``master_weights``). Megatron (2, 4, 12): stage 0
    18 B; stage 1 (distributed optimizer) 2 + 4 + 12/n; stage 2 2 + 16/n; stage 3 18/n.
    Framework terms (TrainingSpec, from the framework profile): ``fp32_grad_partition`` adds
    an fp32 gradient partition 4/n to 16-bit gradients at stages 1-2 (DeepSpeed ZeRO-2:
    2 + 18/n, its estimator after PR #5099); ``pp_unsharded_params`` adds the stage's bf16
    parameters, 2 B, at stage 3 with pp > 1 (FSDP2 does not reshard after forward under PP).
    """
    w, g, o = zero_divisors(c)
    stage = c.sharding_stage
    weights = params * float(training.param_bytes) / w
    if training.pp_unsharded_params:
        weights = weights + np.where((stage >= 3) & (np.asarray(c.pp) > 1), params * 2.0, 0.0)
    grads = params * float(training.grad_bytes) / g
    if training.fp32_grad_partition and training.grad_bytes < 4:
        grads = grads + np.where((stage == 1) | (stage == 2), params * 4.0 / o, 0.0)
    states = 8.0 + (4.0 if training.master_weights else 0.0)
    return {"weights": weights, "gradients": grads, "optimizer": params * states / o}


def layer_activation_terms(model: ModelSpec, training: TrainingSpec) -> tuple[float, float, float]:
    """Per-token bytes of one layer's saved activations, split as (R, S, scores_per_s) (formulas.md 3.2).

    R (replicated under TP without SP) = 4h norm inputs + 2h QKV input + 2h fc1 input + 2h
    dropout masks (if dropout); S (TP-sharded) = 2*d_h*(a+2g) Q,K,V + 2*a*d_h out-proj input +
    4f (GeLU) or 6f (SwiGLU); attention scores per token without flash attention:
    (2 softmax + 3 if dropout: mask 1 + output 2) * a * s, so the score term is scores_per_s * s.
    With flash attention only the fp32 log-sum-exp 4*a per token remains.
    MHA + GeLU(4h) + dropout reproduces Korthikanti's s*b*h*(34 + 5*a*s/h) exactly.
    """
    h, d, a, g, f = (model.hidden_size, model.kv_channels, model.num_attention_heads,
                     model.kv_heads, model.ffn)
    dropout = model.dropout > 0
    replicated = 8.0 * h + (2.0 * h if dropout else 0.0)
    sharded = 2.0 * d * (a + 2 * g) + 2.0 * a * d + (6.0 if model.activation == "swiglu" else 4.0) * f
    scores = (5.0 if dropout else 2.0) * a if not training.flash_attention else 0.0
    return replicated, sharded, scores


def activation_per_layer(model: ModelSpec, training: TrainingSpec, c,
                         recompute_mode: np.ndarray | None = None) -> np.ndarray:
    """Bytes saved by ONE layer for ONE micro-batch on one GPU, by recompute mode. Broadcast array.

    tokens = s*b/cp (LayoutDegrees.tokens_per_microbatch); none: tokens*(R/sp + (S + scores)/t)
    with sp = t under SP, else 1 (K and V of max(g, t)/t KV heads per rank: one each when t
    exceeds the KV heads, Megatron-Core's replication); selective: the same without the attention-score term
    (Korthikanti's core-attention recompute); full: only the layer input, 2*h per token (/t with
    SP). Scores: scores_per_s * s per token without flash attention (CP needs flash attention),
    the fp32 log-sum-exp 4*a per token with it.
    """
    s = training.seq_length
    tokens = c.tokens_per_microbatch(s)
    tp = np.asarray(c.tp, dtype=np.float64)
    rc = c.recompute if recompute_mode is None else recompute_mode
    rep, shard, scores_per_s = layer_activation_terms(model, training)
    if training.flash_attention:
        scores = 4.0 * model.num_attention_heads
    else:
        scores = np.where(rc >= 1, 0.0, scores_per_s * s)
    replicated_div = c.sp_divisor
    # tp a multiple of the KV heads (Megatron-Core): each rank keeps one KV head's K and V
    kv_replicas = 4.0 * model.kv_channels * (np.maximum(model.kv_heads, tp) - model.kv_heads)
    stored = tokens * (rep / replicated_div + (shard + kv_replicas + scores) / tp)
    full = tokens * 2.0 * model.hidden_size / replicated_div
    return np.where(rc == 2, full, stored)


def activation_bytes_by_stage(model: ModelSpec, training: TrainingSpec, c,
                              kinds: tuple[str, ...] = ("first", "last"),
                              ranks: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Peak activation bytes on the ``first``, ``middle`` and ``last`` pipeline ranks. {kind: array}
    (``ranks``: {label: pipeline rank index array} instead of ``kinds``, e.g. every rank of one
    layout: {"rank": np.arange(pp)}, broadcast against ``c``.)

    in-flight layers (pipeline.inflight_layers, the rank's own chunk sizes) x per-layer bytes;
    with full recompute add the working set of one layer recomputed in backward (formulas.md
    3.3). Edge buffers (3.6): rank 0, per micro-batch in flight on its first chunk, 8 B/token of
    ids (+ 1 B/token*h embedding dropout mask, /sp); the last rank, for the micro-batch in
    backward: final-norm and output-layer inputs 2*2*h per token (/sp), bf16 logits 2*V_p/t and
    fp32 softmax 4*V_p/t per token. Per-layer terms shared by the ranks are computed once.
    """
    h = model.hidden_size
    tokens = c.tokens_per_microbatch(training.seq_length)
    m = c.num_microbatches(training.global_batch_size)
    per_layer = activation_per_layer(model, training, c)
    working = np.where(c.recompute == 2,
                       activation_per_layer(model, training, c, np.zeros_like(c.recompute)), 0.0)
    sp_div = c.sp_divisor
    vocab = flops.padded_vocab(model.vocab_size, c.tp).astype(np.float64)
    last_edge = tokens * (4.0 * h / sp_div + 6.0 * vocab / c.tp)
    out = {}
    targets = ranks if ranks is not None else {kind: rank_index(c, kind) for kind in kinds}
    for kind, rank in targets.items():
        total = pipeline.inflight_layers(c, model.num_layers, m, rank) * per_layer + working
        held_first = pipeline.inflight_first_chunk(c, m, rank)
        first_edge = held_first * tokens * (8.0 + (h / sp_div if model.dropout > 0 else 0.0))
        is_first = rank == 0
        is_last = rank == np.asarray(c.pp) - 1
        out[kind] = total + np.where(is_first, first_edge, 0.0) + np.where(is_last, last_edge, 0.0)
    return out


def activation_bytes(model: ModelSpec, training: TrainingSpec, c, kind: str) -> np.ndarray:
    """Peak activation bytes on one pipeline rank kind (``first``, ``middle`` or ``last``).
    See activation_bytes_by_stage."""
    return activation_bytes_by_stage(model, training, c, (kind,))[kind]


def transient_bytes(model: ModelSpec, training: TrainingSpec, c) -> np.ndarray:
    """Buffers beside states and activations (formulas.md 3.8), bytes. Broadcast array.

    SP all-gather buffer of one full hidden state 2*(s/cp)*b*h; ZeRO-3 keeps two gather units'
    weights (bf16, current + prefetched) and one unit's full gradients before the reduce-scatter
    (formulas.md 2.2). The unit is a transformer layer for FSDP-style wrapping
    (``zero3_gather_unit = "layer"``) or the largest single module for DeepSpeed ZeRO-3, which
    fetches parameters per submodule (``"module"``; DeepSpeed's own estimator,
    ``estimate_zero3_model_states_mem_needs``, charges 4 B x the largest layer's parameters).
    """
    h = model.hidden_size
    gather = np.where(c.sequence_parallel, 2.0 * c.tokens_per_microbatch(training.seq_length) * h, 0.0)
    sharded, replicated = flops.layer_params_per_gpu(model, c.tp)
    unit = sharded + replicated
    if training.zero3_gather_unit == "module":
        # largest GEMM weight per GPU: fused QKV h*d_h*(a+2g)/t, or fc1 h*f/t (GeLU) /
        # fused gate+up 2*h*f/t (SwiGLU)
        d, a, g = model.kv_channels, model.num_attention_heads, model.kv_heads
        fc1 = (2 if model.activation == "swiglu" else 1) * h * model.ffn
        unit = max(h * d * (a + 2 * g), fc1) / np.asarray(c.tp, dtype=np.float64)
    fsdp = np.where(c.sharding_stage >= 3, unit * (2 * 2.0 + training.grad_bytes), 0.0)
    return gather + fsdp
