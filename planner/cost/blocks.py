"""A decoder layer as blocks, per GPU: attention (full or sliding window), dense MLP, MoE MLP.

A layer is an attention block followed by an MLP block, dense or mixture-of-experts; a pipeline
rank holds counts of each (``rank_blocks``). For each block kind this module gives, on one GPU
of a stage: parameters (sharded over TP, replicated, or expert parameters sharded over ETP x EP),
forward GEMM FLOPs per token, attention-core FLOPs, elementwise bytes and saved activation bytes
per token. Tokens are those of one micro-batch on a GPU, s*b/cp (LayoutDegrees.
tokens_per_microbatch); TP shards weights, SP the replicated activations, and an MoE block sees
the SP shard of tokens, s*b/(cp*tp) (Megatron-Core requires SP with MoE and tp > 1).

Sources: Korthikanti et al. 2022 Sec. 4 (saved activations, formulas.md 3.1-3.2); moe.md 1.1
(parameters), 5.2 (what an MoE block saves), 5.4 (MLA), 6 (grouped GEMM rows per expert), from
Megatron-LM @ d98e8a64ddf3 (moe/experts.py, moe/token_dispatcher.py, transformer/
multi_latent_attention.py). All values are float arrays broadcast over candidates.
"""

from __future__ import annotations

import numpy as np

from ..layout.degrees import cached_per_candidates
from ..specs import ModelSpec, TrainingSpec
from . import model_counts as mc
from .model_counts import ATTENTION, MLP, MOE, WINDOW
from . import model_flops as mf

ROUTER_BYTES_PER_SCORE = 12.0  # fp32 logits, scores, probs + routing map per (token, expert): moe.md 5.2 estimate
PERMUTE_BYTES_PER_ROW_H = 8.0  # permute write + read, unpermute read + scatter-add, bf16: 4 passes x 2 B x h


def block_kinds(model: ModelSpec) -> tuple[str, ...]:
    """The block kinds the model has: attention (and windowed attention), MLP and/or MoE."""
    kinds = [ATTENTION]
    if model.sliding_window is not None:
        kinds.append(WINDOW)
    if mc.has_dense_mlp(model):
        kinds.append(MLP)
    if model.moe is not None:
        kinds.append(MOE)
    return tuple(kinds)


def kv_heads_per_rank(model: ModelSpec, tp) -> np.ndarray:
    """KV heads (query groups) one TP rank holds: max(g, t)/t, float array of the shape of
    ``tp``. g/t when t divides g; one replicated KV head per rank when g < t (Megatron-Core
    replicates a group's K/V on every rank of its query heads; formulas.md 1.3). The one owner
    of this rule: attention weights, FLOPs, FP8 inputs, saved activations and the CP ring's
    K/V block all read it."""
    tp = np.asarray(tp, dtype=np.float64)
    return np.maximum(model.kv_heads, tp) / tp


# ----------------------------------------------------------------------------- layer counts


@cached_per_candidates(1)
def rank_blocks(model: ModelSpec, c, rank) -> dict[str, np.ndarray]:
    """Blocks held by pipeline rank ``rank``: {kind: count}, float arrays. Rank r holds layers
    [start, start + rank_layers) (the uneven split's edges and middles, LayoutDegrees); each
    layer is one attention block (windowed or not, model_counts.window_layer_mask) and one MLP
    block (dense or MoE, model_counts.moe_layer_mask). The last rank also holds the MTP
    modules' layers (of the last layer's kind: Megatron places MTP on the last stage)."""
    layers = c.rank_layers(model.num_layers, rank)
    kinds = block_kinds(model)
    if kinds == (ATTENTION, MLP):  # a plain dense model: every layer the same
        return {ATTENTION: layers, MLP: layers}
    first, middle, _ = c.stage_layers(model.num_layers)
    rank = np.asarray(rank)
    last = rank == np.asarray(c.pp) - 1
    start = np.where(rank == 0, 0.0, np.where(last, model.num_layers - layers, first + (rank - 1) * middle))
    start, stop = np.rint(start).astype(np.int64), np.rint(start + layers).astype(np.int64)
    counts = mc.layer_counts_in_range(model, np.clip(start, 0, model.num_layers),
                                      np.clip(stop, 0, model.num_layers))
    mtp_moe, mtp_window = mc.mtp_layer_kind(model)
    mtp = np.where(last, float(model.mtp_layers), 0.0)
    out = {ATTENTION: counts["layers"] - counts["window"] + mtp * (not mtp_window),
           MLP: counts["dense"] + mtp * (not mtp_moe)}
    if WINDOW in kinds:
        out[WINDOW] = counts["window"] + mtp * mtp_window
    if MOE in kinds:
        out[MOE] = counts["moe"] + mtp * mtp_moe
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items() if k in kinds}


# ----------------------------------------------------------------------------- parameters


@cached_per_candidates(1)
def block_params(model: ModelSpec, c) -> dict[str, tuple]:
    """Per-GPU parameters of one block of each kind: {kind: (tp_sharded, replicated, expert)}.

    Attention (formulas.md 1.3, 11.1): MHA/GQA weights 2*h*d*(n + g')/t with g' = max(g, t) (one
    KV head per TP rank when g < t), column biases and sinks /t; replicated: the layer's input
    norm, the row-parallel bias, QK norms. MLA: the up-projections and o_proj /t; the down-
    projections h*(r_q + r_kv + d_r) and the latent norms replicated (Megatron-Core's MLA runs
    them duplicated across TP). Dense MLP: glu*h*f/t (+ column biases /t); replicated: norm and
    row bias. MoE: shared experts /t; router h*E (+ bias) and the norm replicated; the E routed
    experts E*P_e/(ep*etp) as expert parameters (moe.md 5.1)."""
    tp = np.asarray(c.tp, dtype=np.float64)
    h = model.hidden_size
    norm = mc._norm_width(model, h)
    out = {}
    out[ATTENTION] = _attention_params(model, tp, norm)
    if WINDOW in block_kinds(model):
        out[WINDOW] = out[ATTENTION]
    f, glu = model.ffn, mc.glu_factor(model)
    col_bias = (mc.fc1_outputs(model) * f) if model.bias else 0
    if MLP in block_kinds(model):
        out[MLP] = ((glu * h * f + col_bias) / tp, np.broadcast_to(norm + (h if model.bias else 0.0), tp.shape), 0.0)
    if model.moe is not None:
        experts = mc.routed_expert_params_per_layer(model) / (np.asarray(c.ep, dtype=np.float64) * c.etp)
        shared = mc.shared_expert_params(model) / tp
        out[MOE] = (shared, np.broadcast_to(float(norm + mc.router_params(model)), tp.shape), experts)
    return out


def _attention_params(model: ModelSpec, tp, norm) -> tuple:
    h, n = model.hidden_size, model.num_attention_heads
    if model.attention_kind == "mla":
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + mc._norm_width(model, m.kv_lora_rank)
        up = m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim) + n * m.v_head_dim * h
        if m.q_lora_rank is None:
            up += h * n * qk
        else:
            down += h * m.q_lora_rank + mc._norm_width(model, m.q_lora_rank)
            up += m.q_lora_rank * n * qk
        return up / tp, np.broadcast_to(float(down + norm), tp.shape), 0.0
    d, g = model.kv_channels, model.kv_heads
    kv = kv_heads_per_rank(model, tp)
    sharded = 2 * h * d * n / tp + 2 * h * d * kv
    replicated = float(norm)
    if model.bias or model.qkv_bias:  # column-parallel Q, K, V biases: sharded like their weights
        sharded = sharded + n * d / tp + 2 * d * kv
    if model.bias:  # the row-parallel output projection's bias: replicated
        replicated += h
    if model.attention_sinks:
        sharded = sharded + n / tp
    if model.qk_norm == "per_head":
        replicated += 2 * mc._norm_width(model, d)
    elif model.qk_norm == "full":
        replicated += mc._norm_width(model, n * d) + mc._norm_width(model, g * d)
    return sharded, np.broadcast_to(replicated, tp.shape), 0.0


# ----------------------------------------------------------------------------- compute


def tokens_on_gpu(c, training: TrainingSpec) -> np.ndarray:
    """Tokens of one micro-batch on one GPU: s*b/cp (TP ranks share them: GEMMs split weights)."""
    return c.tokens_per_microbatch(training.seq_length)


def routed_factor(training: TrainingSpec) -> float:
    """The busiest EP rank's routed rows over the balanced share: the capacity factor where
    tokens are dropped and padded to capacity (every rank then sends and computes exactly that
    many: Megatron-Core moe_utils.py L1073-1080 @d98e8a64), else training.moe_imbalance."""
    if training.moe_capacity_factor is not None:
        return float(training.moe_capacity_factor)
    return training.moe_imbalance


def moe_rows(model: ModelSpec, c, training: TrainingSpec) -> dict[str, np.ndarray]:
    """Routed rows of one MoE block per micro-batch on one GPU (moe.md 4.2, 6), balanced:
    T = s*b/(cp*tp) tokens (the SP shard), ``sent`` = T*k rows dispatched, ``received`` =
    T*k*etp rows its local experts compute (times routed_factor on the busiest rank),
    ``per_expert`` = T*k*etp*ep/E rows per local expert (the grouped GEMM's M)."""
    k, E = model.moe.router_topk, model.moe.num_experts
    T = tokens_on_gpu(c, training) / np.asarray(c.tp, dtype=np.float64)
    gamma = routed_factor(training)
    return {"tokens": T, "sent": T * k, "received": gamma * T * k * c.etp,
            "per_expert": gamma * T * k * c.etp * c.ep / E}


def gemm_flops_per_token(model: ModelSpec, c) -> dict[str, np.ndarray]:
    """Forward GEMM FLOPs per token (of the s*b/cp on the GPU) of one block of each kind, and the
    share of them in the column-parallel GEMMs whose backward hides TP collectives:
    {kind: (flops, column_share)}. Attention: 2 x its weights (MLA: replicated down-projections
    in full, the rest /t); dense MLP 2*glu*h*f/t; MoE: the shared experts 2*glu*h*F_sh/t, the
    router 2*h*E/t (on the SP shard) and the routed experts 2*glu*h*F*k*gamma/t (each GPU
    computes its etp share of the rows its ep experts receive: etp and ep cancel)."""
    tp = np.asarray(c.tp, dtype=np.float64)
    h = model.hidden_size
    out = {}
    if model.attention_kind == "mla":
        sharded, replicated, _ = _attention_params(model, tp, 0.0)
        attn = 2.0 * (sharded + replicated)
        share = 0.5
    else:
        d, n = model.kv_channels, model.num_attention_heads
        qkv = 2 * h * d * (n + kv_heads_per_rank(model, tp) * tp) - n * d * h
        attn = 2.0 * (qkv + n * d * h) / tp
        share = qkv / (qkv + n * d * h)
    out[ATTENTION] = (attn, share)
    if WINDOW in block_kinds(model):
        out[WINDOW] = out[ATTENTION]
    glu = mc.glu_factor(model)
    if MLP in block_kinds(model):
        out[MLP] = (2.0 * glu * h * model.ffn / tp, mc.fc1_outputs(model) / glu)
    if model.moe is not None:
        shared = mf.shared_expert_flops_per_token(model) / tp
        routed = model.moe.router_topk * mf.expert_flops_per_token(model) / tp
        out[MOE] = (shared + mf.router_flops_per_token(model) / tp, routed)
    return out


def linear_io_per_token(model: ModelSpec, c, training: TrainingSpec) -> dict[str, np.ndarray]:
    """Elements per token (of s*b/cp on the GPU) that one block's linear layers quantize under
    FP8: each layer's input (forward) and output gradient (backward), on this GPU's share
    (fp8_hardware.md 2.4: Transformer Engine quantizes a column-parallel input on the SP shard
    before its all-gather, h/sp; row-parallel inputs are TP shards). {kind: array}
    Attention: QKV in h/sp, out (n + 2g')d/t; out-projection in n*d/t, out h/sp. MLA: the two
    down-projections in h/sp each, out r_q and r_kv + d_r; the up-projections in r_q and r_kv,
    out n(d_n + d_r)/t and n(d_n + d_v)/t; out-projection n*d_v/t and h/sp. MLP: fc1 h/sp and
    (glu - 1)*f/t, fc2 f/t and h/sp (glu = mc.glu_factor, 3 for SwiGLU). MoE: per routed row
    (k*g/t per token, elementwise_bytes_per_token's convention) fc1 h and (glu - 1)*F, fc2 F and
    h; with expert TP each GPU holds etp times the rows (gathered over the ETP group in 16 bits
    before the grouped GEMM quantizes them), each h wide at fc1's input and fc2's output
    gradient and 1/etp of F inside: k*g/t * (2h*etp + glu*F); shared experts as an MLP of F_sh."""
    tp, sp, h = np.asarray(c.tp, dtype=np.float64), c.sp_divisor, model.hidden_size
    glu = mc.glu_factor(model)
    n = model.num_attention_heads
    if model.attention_kind == "mla":
        m = model.mla
        r_q = m.q_lora_rank or 0
        up = (r_q + m.kv_lora_rank) + n * (2 * m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / tp
        attn = 3.0 * h / sp + r_q + m.kv_lora_rank + m.qk_rope_head_dim + up + n * m.v_head_dim / tp
    else:
        d, g = model.kv_channels, kv_heads_per_rank(model, tp)
        attn = 2.0 * h / sp + (n / tp + 2 * g) * d + n * d / tp
    out = {ATTENTION: attn}
    if WINDOW in block_kinds(model):
        out[WINDOW] = attn
    if MLP in block_kinds(model):
        out[MLP] = 2.0 * h / sp + glu * model.ffn / tp
    if model.moe is not None:
        mo = model.moe
        rows = routed_factor(training) * mo.router_topk / tp
        shared = (2.0 * h / sp + glu * mo.shared_ffn / tp) * mo.shared_experts
        out[MOE] = rows * (2.0 * h * c.etp + glu * mo.ffn_hidden_size) + shared
    return out


def attention_flops_per_sequence(model: ModelSpec, training: TrainingSpec, windowed: bool) -> float:
    """Forward attention-core FLOPs of one layer for one sequence as the kernels run them:
    causal (half the square) with flash attention, the full square without; over the window
    for windowed layers (model_flops.attention_core_flops_per_sequence)."""
    return mf.attention_core_flops_per_sequence(model, training.seq_length, windowed,
                                                causal=training.flash_attention)


def elementwise_bytes_per_token(model: ModelSpec, c, training: TrainingSpec) -> dict[str, np.ndarray]:
    """HBM bytes per token (of s*b/cp) of the memory-bound kernels of one block, forward (backward
    moves twice as much): a norm (read 2h, write 2h) and a bias-dropout-add (read 4h, write 2h,
    mask h) = 11h per block, split by SP; QK norms read and write their inputs, 4*d*(n + g')/t
    (qk_norm_elements); the activation function 4f (GeLU) or 6f (SwiGLU: read
    gate and up, write the product) /t; MoE: the router's softmax and top-k on E scores per
    token, the permutation of the routed rows (PERMUTE_BYTES_PER_ROW_H x h each), the
    activation on them and their unfused bias and clamp passes (unfused_expert_bytes), on the
    SP shard."""
    tp = np.asarray(c.tp, dtype=np.float64)
    h = model.hidden_size
    sp = c.sp_divisor
    act = 2.0 * (mc.fc1_outputs(model) + 1)  # bf16: read the fc1 outputs, write the product
    qk = 4.0 * qk_norm_elements(model, kv_heads_per_rank(model, tp) * tp) / tp  # read 2 + write 2
    out = {ATTENTION: 11.0 * h / sp + qk}
    if WINDOW in block_kinds(model):
        out[WINDOW] = out[ATTENTION]
    if MLP in block_kinds(model):
        out[MLP] = 11.0 * h / sp + act * model.ffn / tp
    if model.moe is not None:
        m = model.moe
        rows = routed_factor(training) * m.router_topk / tp
        out[MOE] = (11.0 * h / sp + ROUTER_BYTES_PER_SCORE * m.num_experts / tp
                    + rows * (PERMUTE_BYTES_PER_ROW_H * h + act * m.ffn_hidden_size
                              + unfused_expert_bytes(model, training))
                    + act * m.shared_experts * m.shared_ffn / tp)
    return out


def unfused_expert_bytes(model: ModelSpec, training: TrainingSpec) -> float:
    """Forward-equivalent HBM bytes per routed row of the separate expert-bias and clamped-GLU
    passes where the framework runs them unfused (training.moe_unfused_bias_glu; reference/
    moe_performance.md 2.3, bf16): the clamp of each GLU half and their concatenation, 16F
    forward and 20F backward; fc2's bias times the routing probability, added and
    concatenated per local expert, 12h forward and 12h backward. As the other elementwise
    terms count the backward as twice the forward, (36F + 24h) / 3 here; 0 without them."""
    if not training.moe_unfused_bias_glu or model.moe is None:
        return 0.0
    clamp = 36.0 * model.moe.ffn_hidden_size if model.swiglu_limit is not None else 0.0
    bias = 24.0 * model.hidden_size if model.bias else 0.0
    return (clamp + bias) / 3.0


# ----------------------------------------------------------------------------- activations


def qk_norm_elements(model: ModelSpec, g) -> object:
    """Elements per token of the query and key norms' inputs over the TP group, d*(n + g)
    (``g`` the KV heads there: g' = max(g, t)); 0 without QK norms and for MLA, whose latent
    norms are counted with the latents. Qwen3 (per head) and OLMoE (full width) normalise q and
    k after the QKV GEMM and before RoPE; each norm saves its 16-bit input for the backward
    (moe.md 5.5: "q/k-norm inputs"), and Megatron-Core's ``layernorm`` recompute module drops
    only the input and pre-MLP norms (transformer_layer.py, recompute_input_layernorm /
    recompute_pre_mlp_layernorm @d98e8a64), so no recompute but full drops them."""
    if model.qk_norm == "none" or model.attention_kind == "mla":
        return 0.0
    return model.kv_channels * (model.num_attention_heads + g)


def mla_up_share(model: ModelSpec) -> float:
    """Share of an MLA attention block's GEMM FLOPs in its q and kv up-projections, which
    mla_up_proj recomputation runs again (0 for MHA/GQA): (r_q*n*(d_n + d_r) + r_kv*n*(d_n +
    d_v)) over the block's projections (model_counts.mla_attention_params)."""
    if model.attention_kind != "mla":
        return 0.0
    m, n = model.mla, model.num_attention_heads
    up = (m.q_lora_rank or 0) * n * (m.qk_nope_head_dim + m.qk_rope_head_dim) + \
        m.kv_lora_rank * n * (m.qk_nope_head_dim + m.v_head_dim)
    return up / mc.mla_attention_params(model)
