"""Per-GPU memory: weights, gradients, optimizer states, activations, buffers (formulas.md 1-3).

Everything in bytes, arrays of shape (N,). Stages: ``first`` (rank 0: embedding, most in-flight
micro-batches) and ``last`` (rank pp-1: final norm, output layer, logits and loss); with pp = 1
the one stage holds both ends. Middle stages never hold more than the first one.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from ..space import Candidates
from . import flops, pipeline

OPTIMIZER_BYTES_PER_PARAM = 12.0  # fp32 master weights + Adam m + v (ZeRO paper K = 12)


def stage_params(model: ModelSpec, c: Candidates, stage: str) -> np.ndarray:
    """Parameters held by one GPU of the ``first`` or ``last`` pipeline stage. (N,) float

    Layers L/pp per stage (each (tp-sharded + replicated), flops.layer_params_per_gpu); the first
    stage adds the vocab-parallel word embedding V_p*h/tp and learned positions (replicated); the
    last adds the final norm and the output layer V_p*h/tp, which exists even for tied embeddings
    when pp > 1 (Megatron keeps a copy on the last stage, formulas.md 1.3).
    """
    h = model.hidden_size
    sharded, replicated = flops.layer_params_per_gpu(model, c.tp)
    split = pipeline.stage_layers(model.num_layers, c)  # uneven pipeline splits (None: even)
    if split is None:
        layers = model.num_layers / c.pp * (sharded + replicated)
    else:
        layers = split[{"first": 0, "middle": 1, "last": 2}[stage]] * (sharded + replicated)
        if stage == "middle":
            return layers
    vocab = flops.padded_vocab(model.vocab_size, c.tp).astype(np.float64)
    embedding = vocab * h / c.tp
    positions = float((model.max_position_embeddings or 0) * h) \
        if model.position_embedding == "learned" else 0.0
    first_extra = embedding + positions
    output_layer = np.where((c.pp > 1) | (not model.tie_embeddings), embedding, 0.0)
    last_extra = flops.norm_params(model) + output_layer
    single = c.pp == 1
    if stage == "first":
        return layers + first_extra + np.where(single, last_extra, 0.0)
    return layers + last_extra + np.where(single, first_extra, 0.0)


def model_state_bytes(params: np.ndarray, zero_stage: np.ndarray, dp: np.ndarray,
                      training: TrainingSpec) -> dict[str, np.ndarray]:
    """Weights, gradients and optimizer states in bytes for ``params`` held per GPU (formulas.md 2.1).

    bf16 weights (2 B), main grads ``grad_bytes`` (4 B fp32 by default in Megatron), optimizer
    12 B (fp32 master + Adam m, v). ZeRO over the DP group of size n = dp:
    stage 0: 2 + g + 12 (Megatron DDP: 18 B); stage 1 (distributed optimizer): 2 + g + 12/n;
    stage 2: 2 + (g + 12)/n; stage 3 (FSDP): (2 + g + 12)/n.
    """
    n = np.asarray(dp, dtype=np.float64)
    w_b, g_b = 2.0, float(training.grad_bytes)
    return {
        "weights": params * w_b / np.where(zero_stage >= 3, n, 1.0),
        "gradients": params * g_b / np.where(zero_stage >= 2, n, 1.0),
        "optimizer": params * OPTIMIZER_BYTES_PER_PARAM / np.where(zero_stage >= 1, n, 1.0),
    }


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


def activation_per_layer(model: ModelSpec, training: TrainingSpec, c: Candidates,
                         recompute_mode: np.ndarray | None = None) -> np.ndarray:
    """Bytes saved by ONE layer for ONE micro-batch on one GPU, by recompute mode. (N,)

    none: tokens*(R + S/t + scores/t) without SP, tokens*(R + S + scores)/t with SP;
    selective: the same without the attention-score term (Korthikanti's core-attention recompute);
    full: only the layer input, 2*h per token (/t with SP).
    """
    s, b = training.seq_length, c.micro_batch_size.astype(np.float64)
    tokens = s * b
    tp = c.tp.astype(np.float64)
    rc = c.recompute if recompute_mode is None else recompute_mode
    sp = c.sequence_parallel
    rep, shard, scores_per_s = layer_activation_terms(model, training)
    scores = scores_per_s * s if not training.flash_attention else 4.0 * model.num_attention_heads
    scores = np.where(rc >= 1, 0.0 if not training.flash_attention else scores, scores)
    replicated_div = np.where(sp, tp, 1.0)
    stored = tokens * (rep / replicated_div + (shard + scores) / tp)
    full = tokens * 2.0 * model.hidden_size / replicated_div
    return np.where(rc == 2, full, stored)


def activation_bytes_by_stage(model: ModelSpec, training: TrainingSpec, c: Candidates,
                              stages: tuple[str, ...] = ("first", "last")) -> dict[str, np.ndarray]:
    """Peak activation bytes on the ``first``, ``last`` (and ``middle``) pipeline ranks. {stage: (N,)}

    in-flight layers (pipeline.inflight_layers) x per-layer bytes; with full recompute add the
    working set of one layer recomputed in backward (formulas.md 3.3). Edge buffers (3.6):
    first stage per in-flight micro-batch 8 B/token ids (+ 1 B/token*h embedding dropout mask);
    last stage, for the micro-batch in backward: final-norm and output-layer inputs 2*2*h per
    token (/t with SP), bf16 logits 2*V_p/t and fp32 softmax 4*V_p/t per token. ``middle`` is
    rank 1 of an uneven split: no embedding, no output layer. The per-layer terms shared by the
    stages are computed once.
    """
    s, h = training.seq_length, model.hidden_size
    tokens = s * c.micro_batch_size.astype(np.float64)
    m = c.num_microbatches(training.global_batch_size)
    split = pipeline.stage_layers(model.num_layers, c)  # uneven: scale to the stage's layers
    per_layer = activation_per_layer(model, training, c)
    working = np.where(c.recompute == 2,
                       activation_per_layer(model, training, c, np.zeros_like(c.recompute)), 0.0)
    sp_div = np.where(c.sequence_parallel, c.tp, 1).astype(np.float64)
    vocab = flops.padded_vocab(model.vocab_size, c.tp).astype(np.float64)
    last_edge = tokens * (4.0 * h / sp_div + 6.0 * vocab / c.tp)
    single = c.pp == 1
    ranks = {"first": np.zeros_like(c.pp), "middle": np.minimum(1, c.pp - 1), "last": c.pp - 1}
    out = {}
    for stage in stages:
        layers = pipeline.inflight_layers(model.num_layers, c.pp, c.vpp, m, ranks[stage])
        if split is not None:
            layers = layers * split[("first", "middle", "last").index(stage)] / (model.num_layers / c.pp)
        total = layers * per_layer + working
        if stage == "middle":
            out[stage] = total
            continue
        microbatches_first = np.where(c.vpp > 1, np.ceil(layers / (model.num_layers / c.pp)),
                                      np.minimum(c.pp, m))
        first_edge = microbatches_first * tokens * (8.0 + (h / sp_div if model.dropout > 0 else 0.0))
        if stage == "first":
            out[stage] = total + first_edge + np.where(single, last_edge, 0.0)
        else:
            out[stage] = total + last_edge + np.where(single, first_edge, 0.0)
    return out


def activation_bytes(model: ModelSpec, training: TrainingSpec, c: Candidates,
                     stage: str) -> np.ndarray:
    """Peak activation bytes on one pipeline rank (``first``, ``middle`` or ``last``). (N,)
    See activation_bytes_by_stage."""
    return activation_bytes_by_stage(model, training, c, (stage,))[stage]


def transient_bytes(model: ModelSpec, training: TrainingSpec, c: Candidates) -> np.ndarray:
    """Buffers beside states and activations (formulas.md 3.8), bytes. (N,)

    SP all-gather buffer of one full hidden state 2*s*b*h; ZeRO-3 keeps two gather units'
    weights (bf16, current + prefetched) and one unit's full gradients before the reduce-scatter
    (formulas.md 2.2). The unit is a transformer layer for FSDP-style wrapping
    (``zero3_gather_unit = "layer"``) or the largest single module for DeepSpeed ZeRO-3, which
    fetches parameters per submodule (``"module"``; DeepSpeed's own estimator,
    ``estimate_zero3_model_states_mem_needs``, charges 4 B x the largest layer's parameters).
    """
    s, h = training.seq_length, model.hidden_size
    b = c.micro_batch_size.astype(np.float64)
    gather = np.where(c.sequence_parallel, 2.0 * s * b * h, 0.0)
    sharded, replicated = flops.layer_params_per_gpu(model, c.tp)
    unit = sharded + replicated
    if training.zero3_gather_unit == "module":
        # largest GEMM weight per GPU: fused QKV h*d_h*(a+2g)/t, or fc1 h*f/t (GeLU) /
        # fused gate+up 2*h*f/t (SwiGLU)
        h_, d, a, g = model.hidden_size, model.kv_channels, model.num_attention_heads, model.kv_heads
        fc1 = (2 if model.activation == "swiglu" else 1) * h_ * model.ffn
        unit = max(h_ * d * (a + 2 * g), fc1) / c.tp.astype(np.float64)
    fsdp = np.where(c.zero_stage >= 3, unit * (2 * 2.0 + training.grad_bytes), 0.0)
    return gather + fsdp
