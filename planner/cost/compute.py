"""Compute time of one layer and of the pipeline's edge work, per micro-batch per GPU (formulas.md 4.4, 7.1).

GEMMs: T = F / (F_peak * eta(F)), with eta falling for small GEMMs as
eta(F) = eta_max * F / (F + F_half) (hardware profile: ``matmul``, ``matmul_half_flops``).
Attention with flash attention: causal FLOPs at the ``attention`` efficiency, backward 2.5x forward
(5 vs 2 score-sized GEMMs, formulas.md 7.1). Without flash attention: full s^2 batched GEMMs plus
the memory-bound softmax/dropout on the score matrix. Memory-bound elementwise work (norms,
bias-dropout-add, activation function) at the achieved HBM bandwidth; backward 2x forward.
Arrays have shape (N,), seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import blocks, precision
from .per_op_checkpoint import per_op_recomputed_gemm_share
from . import model_counts as mc
from . import model_flops as mf

SOFTMAX_BYTES_PER_SCORE = 9.0  # fused scale-mask-softmax read 2 + write 2, dropout read 2 + write 2 + mask 1
CROSS_ENTROPY_BYTES_PER_LOGIT = 20.0  # bf16 logits read, fp32 cast write/read, exp write/read, grad write


@dataclass(frozen=True)
class LayerTimes:
    """Seconds for one layer and one micro-batch on one GPU, each (N,)."""

    gemm_forward: np.ndarray
    attention_forward: np.ndarray
    attention_backward: np.ndarray
    memory_forward: np.ndarray
    column_parallel_share: object  # share of the GEMM time in QKV / fc1 (whose backward hides TP comm)
    light_recompute: object = 0.0  # forward seconds selective+ runs again (norms, activations, MLA up-projections)
    selective_recompute: object = None  # forward seconds selective (code 1) runs again; None: the attention core

    @cached_property
    def forward(self) -> np.ndarray:
        return self.gemm_forward + self.attention_forward + self.memory_forward

    @cached_property
    def backward(self) -> np.ndarray:
        return 2 * self.gemm_forward + self.attention_backward + 2 * self.memory_forward


def achieved_hbm(hw: HardwareProfile) -> float:
    """Bytes/s that memory-bound kernels reach: HBM bandwidth x the profile's ``hbm`` efficiency."""
    return hw.gpu.hbm_bandwidth * hw.efficiency.hbm


def block_times(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile, c) -> dict[str, LayerTimes]:
    """Compute and memory-bound seconds of one block of each kind (blocks.block_kinds: attention,
    windowed attention, dense MLP, MoE) for one micro-batch on one GPU. {kind: LayerTimes}

    A GPU of a stage processes tokens = s*b/cp (LayoutDegrees.tokens_per_microbatch) through its
    1/tp share of the GEMMs (blocks.gemm_flops_per_token), at the efficiency of the block's mean
    GEMM size (two GEMMs per block: QKV and out-proj, fc1 and fc2; an MoE block's routed experts
    at the size of one local expert's GEMM, blocks.moe_rows' per_expert rows, moe.md 6), and
    1/(tp*cp) of the micro-batch's attention core (Megatron's CP cuts every sequence into 2*cp
    chunks so causal attention is balanced, formulas.md 5.7). The linear layers' GEMMs run at
    precision.linear_peak and linear_efficiency (FP8 where the training is); the attention
    core and an MoE block's router GEMM at the 16-bit peak; FP8 quantization is memory-bound
    work (_quantize_bytes_per_token). Broadcast arrays, seconds."""
    peak, hbm = precision.linear_peak(hw, training), achieved_hbm(hw)
    tokens = c.tokens_per_microbatch(training.seq_length)
    gemms = blocks.gemm_flops_per_token(model, c)
    elementwise = blocks.elementwise_bytes_per_token(model, c, training)
    quantize = _quantize_bytes_per_token(model, training, hw, c)
    zero = np.zeros(np.shape(tokens))
    out = {}
    for kind in blocks.block_kinds(model):
        flops_per_token, share = gemms[kind]
        t_mem = tokens * (elementwise[kind] + quantize.get(kind, 0.0)) / hbm
        if kind == blocks.MOE:
            routed = tokens * share  # gemm_flops_per_token gives the routed experts' FLOPs here
            router = tokens * mf.router_flops_per_token(model) / np.asarray(c.tp, dtype=np.float64)
            shared = tokens * flops_per_token - router
            t_router = router / (precision.dtype_peak(hw, training) * precision.gemm_efficiency(router, hw))
            t_shared = shared / (peak * precision.linear_efficiency(np.maximum(shared / 2, 1.0), hw, training))
            t_routed = blocks.routed_factor(training) * routed / (peak * precision.linear_efficiency(
                _expert_gemm_flops(model, c, training), hw, training))
            t_gemm = t_router + t_shared + t_routed
            selective = None if training.selective_recompute != "per_op" else \
                t_router + t_routed + t_shared * per_op_recomputed_gemm_share(model, kind, c.tp) + t_mem
            out[kind] = LayerTimes(t_gemm, zero, zero, t_mem, _shared_fc1_share(model, t_shared, t_gemm),
                                   t_mem, selective)
            continue
        gemm = tokens * flops_per_token
        t_gemm = gemm / (peak * precision.linear_efficiency(gemm / 2, hw, training))
        t_f = t_b = zero
        light = t_mem
        if kind in (blocks.ATTENTION, blocks.WINDOW):
            t_f, t_b = _attention_core_times(model, training, hw, c, kind == blocks.WINDOW)
            light = t_mem + t_gemm * blocks.mla_up_share(model)
        selective = None
        if training.selective_recompute == "per_op":
            selective = t_gemm * per_op_recomputed_gemm_share(model, kind, c.tp) + t_mem
        out[kind] = LayerTimes(t_gemm, t_f, t_b, t_mem, share, light, selective)
    return out


def _quantize_bytes_per_token(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile,
                              c) -> dict[str, np.ndarray]:
    """FP8 quantization traffic per token of one block, as forward memory-bound bytes ({} in
    BF16): the inputs X and output gradients G of its linear layers (blocks.linear_io_per_token)
    at precision.quantize_bytes each, a third of it here (LayerTimes' backward moves twice the
    forward's: X is quantized in forward, G in backward, (X + G)/3 x 3 in all); with torchao
    also the block's linear weights cast at every forward and backward (2 x
    weight_quantize_bytes per parameter per micro-batch, two thirds here), spread over the
    micro-batch's tokens."""
    if not precision.is_fp8(training):
        return {}
    per_byte = precision.quantize_bytes(hw, training)
    io = blocks.linear_io_per_token(model, c, training)
    out = {k: v * per_byte / 3.0 for k, v in io.items()}
    if training.fp8_library == "torchao":
        tokens = c.tokens_per_microbatch(training.seq_length)
        cast = 2.0 * precision.weight_quantize_bytes(hw, training) / 3.0
        for kind, (sharded, replicated, experts) in blocks.block_params(model, c).items():
            if kind in out:
                out[kind] = out[kind] + cast * (sharded + replicated + experts) / tokens
    return out


def _expert_gemm_flops(model: ModelSpec, c, training: TrainingSpec) -> np.ndarray:
    """FLOPs of one GEMM of one local expert (the mean of fc1 and fc2): the per-expert rows x
    h x (glu*F/etp)/2 x 2 FLOPs (moe.md 6)."""
    rows = blocks.moe_rows(model, c, training)["per_expert"] / blocks.routed_factor(training)
    glu = mc.glu_factor(model)
    return rows * model.hidden_size * glu * model.moe.ffn_hidden_size / np.asarray(c.etp, dtype=np.float64)


def _shared_fc1_share(model: ModelSpec, t_shared, t_gemm):
    """The MoE block's TP window as a share of its GEMM time: its shared experts' fc1 (the
    shared experts are the block's only TP-sharded GEMMs; 0 without them)."""
    if not model.moe.shared_experts:
        return 0.0
    glu = mc.glu_factor(model)
    return (glu - 1) / glu * t_shared / np.maximum(t_gemm, 1e-300)


def _attention_core_times(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile, c,
                          windowed: bool) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of the attention core of one layer for one micro-batch on
    one GPU: with flash attention its causal FLOPs (over the window for windowed layers) at the
    ``attention`` efficiency, backward 2.5x forward (5 vs 2 score-sized GEMMs, formulas.md 7.1);
    without, the full s^2 batched GEMMs plus the memory-bound softmax and dropout on the score
    matrix (SOFTMAX_BYTES_PER_SCORE per score), backward 2x."""
    s, a = training.seq_length, model.num_attention_heads
    b = np.asarray(c.micro_batch_size, dtype=np.float64)
    tp = np.asarray(c.tp, dtype=np.float64)
    peak = precision.dtype_peak(hw, training)
    attn = b * blocks.attention_flops_per_sequence(model, training, windowed) / (tp * c.cp)
    if training.flash_attention:
        t_f = attn / (peak * hw.efficiency.attention)
        return t_f, 2.5 * t_f
    scores = b * a / tp * s * s  # without flash attention there is no CP (space rule)
    t_gemm = attn / (peak * precision.gemm_efficiency(attn / 2, hw))
    t_softmax = scores * SOFTMAX_BYTES_PER_SCORE / achieved_hbm(hw)
    return t_gemm + t_softmax, 2 * t_gemm + 2 * t_softmax


def output_gemm_time(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile, c) -> np.ndarray:
    """Seconds of ONE pass of the output layer's GEMM, 2*(s*b/cp)*h*V_p/t FLOPs, per micro-batch
    on one GPU of the last stage (forward, input gradient and weight gradient each take this).
    Broadcast array."""
    tokens = c.tokens_per_microbatch(training.seq_length)
    gemm = 2.0 * tokens * model.hidden_size * mf.vocab_per_rank(model, c.tp)
    return gemm / (precision.dtype_peak(hw, training) * precision.gemm_efficiency(gemm, hw))


def output_layer_time(model: ModelSpec, training: TrainingSpec, hw: HardwareProfile,
                      c) -> np.ndarray:
    """Forward + backward seconds of the output GEMM (3 x output_gemm_time) and the cross
    entropy (CROSS_ENTROPY_BYTES_PER_LOGIT per logit at the achieved HBM bandwidth), per
    micro-batch on one GPU of the last stage. Broadcast array."""
    tokens = c.tokens_per_microbatch(training.seq_length)
    t_loss = tokens * mf.vocab_per_rank(model, c.tp) * CROSS_ENTROPY_BYTES_PER_LOGIT / achieved_hbm(hw)
    return 3 * output_gemm_time(model, training, hw, c) + t_loss


def optimizer_bytes_per_param(training: TrainingSpec | None) -> float:
    """HBM bytes moved per updated parameter by one step of Megatron-LM's mixed-precision
    optimizer (megatron/core/optimizer: Float16OptimizerWithFloat16Params.step, also the
    DistributedOptimizer's shard), pass by pass:

    - fused Adam (apex / TE multi-tensor): read fp32 param, grad, m, v; write param, m, v: 28 B
      (12 + 4 x ``optimizer_moment_bytes``: 20 B with bf16 moments)
    - copy the fp32 main params to the 16-bit model params: read 4, write 2: 6 B
    - gradient norm for clipping (multi_tensor_l2norm): read the fp32 grad: 4 B
    - zero the gradient buffer for the next step: write it: ``grad_bytes`` (4 fp32, 2 16-bit)
    - 16-bit gradient buffer (grad_bytes 2): copy to fp32 main grads, read 2 + write 4: 6 B
    - fp16 with dynamic loss scaling: unscale in place + inf/nan check, read 4 + write 4: 8 B

    bf16 with fp32 grads (Megatron's default): 42 B; fp16 with fp32 grads: 50 B; fp16 with an
    fp16 buffer (pre-2022 Megatron default): 54 B. ``training`` None: bf16 with fp32 grads."""
    grad_bytes = 4.0 if training is None else float(training.grad_bytes)
    moment = 4.0 if training is None else float(training.optimizer_moment_bytes)
    total = 12.0 + 4.0 * moment + 6.0 + 4.0 + grad_bytes  # Adam: 28 B with fp32 moments
    if grad_bytes < 4:
        total += 2.0 + 4.0
    if training is not None and training.dtype == "fp16":
        total += 8.0
    return total


def optimizer_time(params_updated: np.ndarray, hw: HardwareProfile,
                   training: TrainingSpec | None = None,
                   grad_buffer_params: np.ndarray | None = None,
                   linear_params: np.ndarray | None = None) -> np.ndarray:
    """Optimizer step: optimizer_bytes_per_param(training) of HBM traffic per updated
    parameter at the achieved HBM bandwidth, plus zeroing the rest of the gradient buffer where
    it is larger than the updated shard (``grad_buffer_params``: ZeRO-1 / the distributed
    optimizer keep full gradients on each rank but update 1/dp of them), plus the profile's
    fixed per-step overhead T_misc (``efficiency.step_overhead``: data loading, logging, launch
    gaps; formulas.md 7.1). With Transformer Engine FP8, making the FP8 copies of the rank's
    ``linear_params`` once per step: precision.weight_quantize_bytes each (TE caches them across
    the step's micro-batches, fp8_hardware.md 3.1). (N,) seconds"""
    moved = optimizer_bytes_per_param(training) * params_updated
    if grad_buffer_params is not None:
        grad_bytes = 4.0 if training is None else float(training.grad_bytes)
        moved = moved + grad_bytes * np.maximum(grad_buffer_params - params_updated, 0.0)
    if linear_params is not None and training is not None and precision.is_fp8(training) \
            and training.fp8_library == "transformer-engine":
        moved = moved + precision.weight_quantize_bytes(hw, training) * linear_params
    return moved / achieved_hbm(hw) + hw.efficiency.step_overhead
