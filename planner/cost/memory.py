"""Per-GPU memory: weights, gradients, optimizer states, activations, buffers (formulas.md 1-3).

Everything in bytes, arrays broadcast over candidates. Pipeline ranks are named by kind:
``first`` (rank 0: embedding, most in-flight micro-batches), ``middle`` (rank 1: layers only;
with an uneven split it can hold the most) and ``last`` (rank pp-1: final norm, output layer,
logits and loss); with pp = 1 the one rank is first and last at once.
"""

from __future__ import annotations

import numpy as np

from ..layout.degrees import cached_per_candidates
from ..specs import ModelSpec, TrainingSpec
from . import model_counts as mc
from . import pipeline, precision
from .model_flops import vocab_per_rank
from . import blocks
from .block_activations import activation_bytes_per_token
from .blocks import block_kinds

OPTIMIZER_BYTES_PER_PARAM = 12.0  # fp32 master weights + Adam m + v (ZeRO paper K = 12)
MASTER_BYTES = 4.0  # a separate fp32 master copy of a 16-bit parameter


def state_bytes(training: TrainingSpec) -> tuple[float, float, float]:
    """(weights, master copy, Adam moments) bytes per parameter of the model and optimizer state
    the framework keeps (before any sharding): weights ``param_bytes`` (2 bf16; 4 where the fp32
    parameter is its own master, FSDP2), the fp32 master 4 when ``master_weights``, moments
    2 x ``optimizer_moment_bytes`` (8 in fp32; 4 with the bf16 moments of Megatron's
    precision-aware optimizer). Megatron: (2, 4, 8); torchtitan: (4, 0, 8). The memory model
    and the checkpoint size both read this."""
    master = MASTER_BYTES if training.master_weights else 0.0
    return float(training.param_bytes), master, 2.0 * float(training.optimizer_moment_bytes)
RANK_KINDS = ("first", "middle", "last")


def rank_index(c, kind: str):
    """Pipeline rank of a rank kind: first 0, middle min(1, pp-1), last pp-1. Int array."""
    pp = np.asarray(c.pp)
    return {"first": np.zeros_like(pp), "middle": np.minimum(1, pp - 1), "last": pp - 1}[kind]


@cached_per_candidates(1)
def rank_params(model: ModelSpec, c, rank) -> dict[str, np.ndarray]:
    """Parameters on one GPU of pipeline rank ``rank``, by part. {part: array}

    ``dense``: the rank's blocks (blocks.rank_blocks x blocks.block_params: TP-sharded +
    replicated), reduced and sharded over the dp*cp group; ``experts``: its routed experts
    (E*P_e/(ep*etp) per MoE block), over the expert-data-parallel group (edp); ``layers``: its
    decoder layers and ``layer`` their mean dense parameters (FSDP units); ``embedding``: the
    vocab-parallel word embedding V_p*h/tp plus learned positions, on rank 0; ``head``: the final
    norm and the output layer V_p*h/tp, on the last rank (the output layer also for tied
    embeddings when pp > 1: Megatron keeps a copy, formulas.md 1.3), and the MTP modules'
    projection 2h*h/tp and norms (Megatron puts MTP on the last stage; their layers are blocks);
    ``output``: the output layer's part of ``head`` (a copy of the embedding when tied). The
    pipeline schedule places them (pipeline.holds_embedding, holds_head: the V shapes put the
    head on rank 0) and DualPipe doubles the blocks (pipeline.param_copies).
    """
    h = model.hidden_size
    rank = np.asarray(rank)
    counts = blocks.rank_blocks(model, c, rank)
    per_block = blocks.block_params(model, c)
    copies = pipeline.param_copies(c)  # DualPipe: two stages' parameters on every rank
    dense = copies * sum(counts[k] * (per_block[k][0] + per_block[k][1]) for k in counts)
    experts = copies * sum(counts[k] * per_block[k][2] for k in counts)
    layers = copies * c.rank_layers(model.num_layers, rank)
    word = vocab_per_rank(model, c.tp) * h
    positions = float(mc.position_embedding_params(model))
    last = pipeline.holds_head(c, rank)  # rank pp-1; rank 0 in the V shapes (ZB-V, DualPipeV)
    output = np.where((np.asarray(c.pp) > 1) | (not model.tie_embeddings), word, 0.0)
    mtp = model.mtp_layers * (mc.mtp_projection_params(model) / np.asarray(c.tp, dtype=np.float64)
                              + mc.mtp_norm_params(model))
    return {"dense": dense, "experts": experts, "layers": layers,
            "layer": dense / np.maximum(layers, 1),
            "embedding": np.where(pipeline.holds_embedding(c, rank), word + positions, 0.0),
            "head": np.where(last, mc.norm_params(model) + output + mtp, 0.0),
            "output": np.where(last, output, 0.0)}


def non_expert_params(p: dict) -> np.ndarray:
    """The parameters of a rank_params result that are not routed experts: its blocks'
    (``dense``), the embedding's and the head's, the ones reduced and sharded over the dp*cp
    group (zero_divisors "dense"). Array (or float) of the result's shape."""
    return p["dense"] + p["embedding"] + p["head"]


def stage_params(model: ModelSpec, c, kind: str) -> np.ndarray:
    """Parameters held by one GPU of the ``first``, ``middle`` or ``last`` pipeline rank."""
    p = rank_params(model, c, rank_index(c, kind))
    return non_expert_params(p) + p["experts"]


def zero_divisors(c, group: str = "dense") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What weights, gradients and optimizer states are divided by on one GPU (formulas.md 2.1):
    the sharding group n for the states the ZeRO stage shards (LayoutDegrees.sharding_stage:
    the distributed optimizer is stage 1), else 1: stage 1 the optimizer; 2 + gradients; 3 +
    weights. n = dp*cp (LayoutDegrees.grad_group) for dense parameters, edp for ``group=
    "expert"`` (Megatron-Core reduces and shards expert parameters over the expert-data-parallel
    group, moe.md 3.3). Float arrays (weights, grads, optimizer)."""
    n = np.asarray(c.grad_group if group == "dense" else c.edp, dtype=np.float64)
    z = c.sharding_stage
    return np.where(z >= 3, n, 1.0), np.where(z >= 2, n, 1.0), np.where(z >= 1, n, 1.0)


def model_state_bytes(params: np.ndarray, c, training: TrainingSpec,
                      experts=0.0, linear=0.0, hw=None) -> dict[str, np.ndarray]:
    """Weights, gradients and optimizer states in bytes for ``params`` dense and ``experts``
    expert parameters held per GPU (formulas.md 2.1; moe.md 5.1).

    Per parameter, each divided by zero_divisors of its group (n = dp*cp for dense parameters,
    edp for experts, where the stage shards it): weights ``param_bytes`` (2 bf16; 4 where the
    fp32 parameter is its own master, FSDP2), gradients ``grad_bytes`` (4 fp32 main grads in
    Megatron, 2 16-bit), optimizer 2 x ``optimizer_moment_bytes`` (Adam m, v: 8 in fp32, 4 in
    bf16 with the precision-aware optimizer) + 4 for a separate fp32 master copy
    (``master_weights``). Megatron (2, 4, 12): stage 0 18 B; stage 1 (distributed optimizer)
    2 + 4 + 12/n; stage 2 2 + 16/n; stage 3 18/n.
    Framework terms (TrainingSpec, from the framework profile): ``fp32_grad_partition`` adds
    an fp32 gradient partition 4/n to 16-bit gradients at stages 1-2 (DeepSpeed ZeRO-2:
    2 + 18/n, its estimator after PR #5099); ``pp_unsharded_params`` adds the stage's bf16
    parameters, 2 B, at stage 3 with pp > 1 (FSDP2 does not reshard after forward under PP),
    and the stage's unsharded gradients, grad_bytes (accumulated over the micro-batches before
    the last one's reduce-scatter under PyTorch pipelining).
    FP8 (``hw`` given): the ``linear`` part of ``params`` and all ``experts`` are linear-layer
    weights held as precision.weight_bytes (FP8 copies, transposes, scales) instead of
    param_bytes; gradients and optimizer states are unchanged (fp8_hardware.md 3.1).
    ``optimizer_offload_fraction`` of the optimizer states sits in host memory, not here.
    """
    w, g, o = zero_divisors(c)
    we, ge, oe = zero_divisors(c, "expert") if np.any(np.asarray(experts) > 0) else (1.0, 1.0, 1.0)
    stage = c.sharding_stage
    pb, master, moments = state_bytes(training)
    gb = float(training.grad_bytes)
    lb = pb if hw is None else precision.weight_bytes(hw, training, stage)
    weights = params * pb / w + experts * lb / we
    if precision.is_fp8(training) and hw is not None:
        weights = weights + linear * (lb - pb) / w
    grads = params * gb / g + experts * gb / ge
    if training.pp_unsharded_params:
        held = (stage >= 3) & (np.asarray(c.pp) > 1)
        weights = weights + np.where(held, (params + experts) * 2.0, 0.0)
        # micro-batches before the last skip the reduce-scatter and accumulate the unsharded
        # gradient in the reduce dtype (torch fsdp/_fully_shard/_fsdp_param.py
        # to_accumulated_grad_if_needed; pipelining/stage.py backward_maybe_with_nosync)
        grads = grads + np.where(held, (params + experts) * gb, 0.0)
    if training.fp32_grad_partition and training.grad_bytes < 4:
        grads = grads + np.where((stage == 1) | (stage == 2),
                                 params * 4.0 / o + experts * 4.0 / oe, 0.0)
    on_gpu = 1.0 - float(training.optimizer_offload_fraction)
    return {"weights": weights, "gradients": grads,
            "optimizer": (params / o + experts / oe) * (master + moments) * on_gpu}


def activation_per_layer(model: ModelSpec, training: TrainingSpec, c,
                         recompute_mode: np.ndarray | None = None, rank=None) -> np.ndarray:
    """Bytes saved by ONE layer for ONE micro-batch on one GPU, by recompute code (0 none, 1
    selective, 2 full, 3 selective with layernorm/moe_act/mla_up_proj). Broadcast array.

    tokens = s*b/cp (LayoutDegrees.tokens_per_microbatch) x the bytes per token of an attention
    block and an MLP block (block_activations.activation_bytes_per_token; for a dense MHA/GQA layer this is
    tokens*(R/sp + (S + scores)/t), Korthikanti's s*b*h*(34 + 5*a*s/h) for MHA + GeLU + dropout,
    formulas.md 3.2); a model of mixed layers (MoE, windows, MTP) takes the mean layer of
    pipeline rank ``rank`` (blocks.rank_blocks; default: of the whole model's layers).
    """
    return _activation_per_layer(model, training, c, recompute_mode, rank)


@cached_per_candidates(2)
def _activation_per_layer(model: ModelSpec, training: TrainingSpec, c, recompute_mode, rank) -> np.ndarray:
    """activation_per_layer, cached on the candidates (the search's memory pass and its least
    full-recompute solver ask for the same terms)."""
    rc = c.recompute if recompute_mode is None else recompute_mode
    per_token = activation_bytes_per_token(model, training, c, rc)
    tokens = c.tokens_per_microbatch(training.seq_length)
    if rank is None and set(per_token) == {blocks.ATTENTION, blocks.MLP}:
        return tokens * (per_token[blocks.ATTENTION] + per_token[blocks.MLP])
    if rank is None:
        mix = {k: float(v) for k, v in zip(("attention", "attention_window", "mlp", "moe"),
                                           _model_mix(model))}
        layers = float(model.num_layers)
    else:
        mix = blocks.rank_blocks(model, c, rank)
        layers = np.maximum(c.rank_layers(model.num_layers, rank), 1)
    return tokens * sum(mix[k] * per_token[k] for k in per_token) / layers


def deferred_w_fraction(model: ModelSpec, training: TrainingSpec, c) -> np.ndarray:
    """gamma: the share of a chunk's saved activations still held between its input-gradient
    backward (I) and its weight-gradient backward (W), for the zero-bubble schedules that defer
    W (reference/pipeline_schedules.md §0.4): the bytes the weight-gradient GEMMs need, each
    linear layer's input X and output gradient G at 2 B (blocks.linear_io_per_token; the ZB
    authors' 32h of a GPT layer's 34h + 5as), over the bytes the layer saves for the backward
    (block_activations.activation_bytes_per_token at the layout's recompute mode), on the model's mean
    layer; at most 1 (where recomputation saves less than W needs, W holds what the recompute
    rebuilt). Broadcast array in [0, 1]."""
    io = blocks.linear_io_per_token(model, c, training)
    saved = activation_bytes_per_token(model, training, c, c.recompute)
    mix = dict(zip((blocks.ATTENTION, blocks.WINDOW, blocks.MLP, blocks.MOE), _model_mix(model)))
    need = sum(float(mix[k]) * 2.0 * io[k] for k in io)
    held = sum(float(mix[k]) * saved[k] for k in saved)
    return np.clip(need / np.maximum(held, 1e-30), 0.0, 1.0)


def _model_mix(model: ModelSpec) -> tuple[int, int, int, int]:
    """(full-attention, windowed, dense-MLP, MoE) blocks among the model's decoder layers."""
    windowed = int(mc.window_layer_mask(model).sum())
    dense, moe = mc.layer_kind_counts(model)
    return model.num_layers - windowed, windowed, dense, moe


def activation_bytes_by_stage(model: ModelSpec, training: TrainingSpec, c,
                              kinds: tuple[str, ...] = ("first", "last"),
                              ranks: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Peak activation bytes on the ``first``, ``middle`` and ``last`` pipeline ranks. {kind: array}
    (``ranks``: {label: pipeline rank index array} instead of ``kinds``, e.g. every rank of one
    layout: {"rank": np.arange(pp)}, broadcast against ``c``.)

    in-flight layers (pipeline.inflight_layers, the rank's own chunk sizes) x the rank's mean
    per-layer bytes (activation_per_layer); with full recompute add the working set of one layer
    recomputed in backward (formulas.md 3.3); full recompute of N layers per chunk mixes the
    recomputed and stored layers (block_recompute_layer). Edge buffers (3.6): rank 0, per micro-batch in
    flight on its first chunk, 8 B/token of ids (+ 1 B/token*h embedding dropout mask, /sp); the
    last rank, for the micro-batch in backward: final-norm and output-layer inputs 2*2*h per
    token (/sp), and the loss's bytes per logit x V_p/t per token: the framework's
    loss_bytes_per_logit (6 = bf16 logits 2*V_p/t and fp32 softmax 4*V_p/t in Megatron; 12 in
    torchtitan's fp32 loss), or 2 (the bf16 logits alone) with training.cross_entropy_in_place
    (once per output head: the MTP modules add theirs), for a chunk of the tokens where the loss
    is chunked (loss_edge_bytes). Per-layer terms shared by the ranks are computed once.
    """
    h = model.hidden_size
    tokens = c.tokens_per_microbatch(training.seq_length)
    m = c.num_microbatches(training.global_batch_size)
    uniform = block_kinds(model) == ("attention", "mlp")
    per_layer = activation_per_layer(model, training, c) if uniform else None
    sp_div = c.sp_divisor
    last_edge = loss_edge_bytes(model, training, c)
    out = {}
    targets = ranks if ranks is not None else {kind: rank_index(c, kind) for kind in kinds}
    scheduled = np.any(pipeline.simulated(c))  # peaks from the op order (pipeline.scheduled_inflight)
    gamma = deferred_w_fraction(model, training, c) if scheduled else 0.0
    block = np.any(np.asarray(c.recompute_num_layers) > 0)
    offload = np.any(np.asarray(c.offload_layers) > 0)
    for kind, rank in targets.items():
        layer = per_layer if uniform else activation_per_layer(model, training, c, rank=rank)
        stored = activation_per_layer(model, training, c, np.zeros_like(c.recompute),
                                      None if uniform else rank)
        per_op = training.selective_recompute == "per_op"
        working = np.where((c.recompute == 2) | ((c.recompute == 1) & per_op), stored, 0.0)
        if block:  # full recompute of the first N layers of each chunk: the rest store theirs
            layer, full_working = block_recompute_layer(c, model.num_layers, rank, layer, stored)
            working = np.where(c.recompute == 2, full_working, working)
        held = pipeline.inflight_layers(c, model.num_layers, m, rank)
        if scheduled:
            held = pipeline.scheduled_inflight(c, model.num_layers, m, rank, gamma, held)
        total = held * layer + working
        if offload:
            total = total + offloaded_bytes(c, held, layer)
        held_first = pipeline.inflight_first_chunk(c, m, rank)
        if scheduled:  # GPipe, looped BFS: every micro-batch's ids and loss until the backward
            held_first, last_edge = pipeline.edge_microbatches(c, m, held_first, last_edge)
        first_edge = held_first * tokens * (8.0 + (h / sp_div if model.dropout > 0 else 0.0))
        is_first = pipeline.holds_embedding(c, rank)
        is_last = pipeline.holds_head(c, rank)
        out[kind] = total + np.where(is_first, first_edge, 0.0) + np.where(is_last, last_edge, 0.0)
    return out


def loss_edge_bytes(model: ModelSpec, training: TrainingSpec, c) -> np.ndarray:
    """Bytes the last pipeline rank holds for the output layer and the loss of the micro-batch
    in its backward (formulas.md 3.6), per head (1 + MTP layers): tokens x (the final norm's
    and the output layer's inputs 4h/sp + p x V_p/t / N), p the framework's bytes per logit
    (2 with training.cross_entropy_in_place), N = training.loss_chunks: torchtitan's
    ChunkedLossWrapper (components/loss.py L501-720 @b5bcd76c66d0) makes one chunk's logits at a
    time and runs its backward at once, and keeps an fp32 gradient accumulator of the hidden
    states beside (GradAccumulator, dtype float32: + 4h per token where N > 1). MTP's loss is
    not chunked there (models/deepseek_v3/MTP.md TODO 3: N = 1 with MTP layers). Broadcast
    array, bytes."""
    h = model.hidden_size
    per_logit = 2.0 if training.cross_entropy_in_place else training.loss_bytes_per_logit
    chunks = 1 if model.mtp_layers else training.loss_chunks
    accumulator = 4.0 * h if chunks > 1 else 0.0
    per_token = 4.0 * h / c.sp_divisor + per_logit * vocab_per_rank(model, c.tp) / chunks + accumulator
    return c.tokens_per_microbatch(training.seq_length) * per_token * (1 + model.mtp_layers)


def block_recompute_layer(c, num_layers: int, rank, layer, stored) -> tuple[np.ndarray, np.ndarray]:
    """(mean bytes per in-flight layer, recompute working set) on pipeline rank ``rank`` when
    full recompute covers the first N layers of each model chunk (Megatron's block method,
    Layout.recompute_num_layers; formulas.md 3.3). ``layer``: a layer's bytes at the layout's
    recompute mode (a fully recomputed layer keeps its input), ``stored``: without recompute.
    With the share q = min(N, c)/c of the chunk's c layers (LayoutDegrees.recompute_share)
    the in-flight layer holds q*layer + (1 - q)*stored; the working set of one recomputed
    layer (``stored``) is added only where every layer is recomputed (q = 1): with N < c the
    backward reaches the recomputed layers after the chunk's c - N stored layers of that
    micro-batch have freed theirs, at least one layer's worth. Broadcast arrays, bytes."""
    q = c.recompute_share(num_layers, rank)
    return q * layer + (1.0 - q) * stored, np.where((c.recompute == 2) & (q >= 1.0), stored, 0.0)


def offloaded_bytes(c, held, layer) -> np.ndarray:
    """Change of a rank's activation bytes when the activations of N = ``offload_layers`` of
    its ``held`` in-flight layers (``layer`` bytes each) live in host memory (formulas.md
    3.3.2): -min(N, held) x layer, + one layer being copied (the staging of the layer in
    transfer while the next one computes). 0 where N = 0. Broadcast array, bytes."""
    n = np.asarray(c.offload_layers, dtype=np.float64)
    return np.where(n > 0, (1.0 - np.minimum(n, held)) * layer, 0.0)


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
    An MoE model adds the token dispatch buffers of one MoE block (moe.md 5.2, transient): the
    permuted copy and the all-to-all send and receive buffers, 3 x 2*T*k*h bytes on the SP shard
    T (x moe_imbalance on the receive side, counted once).
    """
    h = model.hidden_size
    tokens = c.tokens_per_microbatch(training.seq_length)
    gather = np.where(c.sequence_parallel, 2.0 * tokens * h, 0.0)
    per_block = blocks.block_params(model, c)
    attention = per_block[blocks.ATTENTION][0] + per_block[blocks.ATTENTION][1]
    unit = attention + np.maximum.reduce([sum(per_block[k]) for k in per_block
                                          if k in (blocks.MLP, blocks.MOE)])
    if model.moe is not None:
        rows = blocks.moe_rows(model, c, training)
        gather = gather + 2.0 * h * (2.0 * rows["sent"] + rows["received"] / np.asarray(c.etp, dtype=np.float64))
    if training.zero3_gather_unit == "module":
        # largest GEMM weight per GPU: fused QKV h*d_h*(a/t + 2*max(g, t)/t) (one KV head per
        # rank when g < t, blocks.kv_heads_per_rank), or fc1 h*f/t (GeLU) / fused gate+up
        # 2*h*f/t (SwiGLU)
        d, a = model.kv_channels, model.num_attention_heads
        tp = np.asarray(c.tp, dtype=np.float64)
        qkv = h * d * (a / tp + 2.0 * blocks.kv_heads_per_rank(model, tp))
        unit = np.maximum(qkv, mc.fc1_outputs(model) * h * model.ffn / tp)
    fsdp = np.where(c.sharding_stage >= 3, unit * (2 * 2.0 + training.grad_bytes), 0.0)
    return gather + fsdp
