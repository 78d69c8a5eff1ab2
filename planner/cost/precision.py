"""FP8 and MXFP8 training: what a precision changes in time, memory and traffic (fp8_hardware.md).

``TrainingSpec.precision`` is bf16 or one of three FP8 recipes, each as Megatron-Bridge's
mixed-precision presets run it (NVIDIA-NeMo/Megatron-Bridge @ 05097809 training/mixed_precision.py):
  fp8            per-tensor current scaling (``bf16_with_fp8_current_scaling_mixed``: hybrid
                 E4M3/E5M2, recipe "tensorwise", FP8 parameter all-gather), Hopper and Blackwell;
  fp8-blockwise  1x128 / 128x128 block scales (DeepSeek-V3's recipe;
                 ``bf16_with_fp8_subchannel_scaling_mixed``: recipe "blockwise", no parameter
                 gather), native on Hopper, emulated through MXFP8 on Blackwell;
  mxfp8          1x32 E8M0 block scales (``bf16_with_mxfp8_mixed``: E4M3, parameter gather into
                 the reused gradient buffer), Blackwell only.
The framework's FP8 library (TrainingSpec.fp8_library, from its profile) decides what is kept:
Transformer Engine keeps FP8 weight copies and saves FP8 linear inputs for the backward;
torchao (torchtitan) casts weights and inputs at each use and saves the 16-bit inputs
(fp8_hardware.md 3.4).

What FP8 changes (fp8_hardware.md 2-5), each a function below:
  - time: the linear layers' GEMMs (attention projections, MLPs, experts; fprop, dgrad, wgrad)
    at the FP8 peak x the profile's ``matmul_fp8`` x the recipe's kernel factor
    (linear_peak, linear_efficiency); attention core, norms, softmax, router, embedding and
    output layer stay 16-bit; each linear layer quantizes its input and its output gradient:
    quantize_bytes of HBM traffic per element; weights are quantized once per step (TE) or at
    each use (torchao): weight_quantize_bytes;
  - memory: weight copies (weight_bytes), FP8 linear inputs saved for backward
    (linear_input_bytes);
  - traffic: SP all-gathers of linear inputs and output gradients in FP8 (gather_bytes), the
    DP parameter all-gather in FP8 for per-tensor scaling (param_gather_bytes); gradients are
    reduced in 16/32 bits as before.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..specs import HardwareProfile, TrainingSpec

FP8 = ("fp8", "fp8-blockwise", "mxfp8")
# Kernel-only GEMM throughput of a recipe relative to per-tensor FP8 (fp8_hardware.md 5.3): MXFP8
# on B300 pre-quantized 2677 vs 2815 TFLOP/s (TE GEMM benchmark, h 4096, f 16384); blockwise on
# H200, autocast 838 vs current scaling 945 TFLOP/s (no kernel-only figure is published; the
# autocast ratio also holds blockwise's extra quantization work). Both to be refitted.
RECIPE_GEMM_FACTOR = {"fp8": 1.0, "mxfp8": 2677 / 2815, "fp8-blockwise": 838 / 945}
# Scale bytes per element of one quantized copy (fp8_hardware.md 3.3): one FP32 scale per tensor
# (negligible), one E8M0 byte per 32 elements (MXFP8), one FP32 per 128 (blockwise 1x128).
SCALE_BYTES = {"fp8": 0.0, "mxfp8": 1.0 / 32, "fp8-blockwise": 4.0 / 128}


def is_fp8(training: TrainingSpec) -> bool:
    """Whether the linear layers run in FP8."""
    return training.precision in FP8


def blackwell(hw: HardwareProfile) -> bool:
    """A Blackwell GPU: the profile gives an MXFP8 peak (MXFP8 runs on Blackwell only:
    Transformer Engine MXFP8BlockScaling, "native hardware acceleration on Blackwell GPUs (SM
    10.0+)", fp8_hardware.md 2.1)."""
    return "mxfp8" in hw.gpu.peak_tflops


def check_precision(hw: HardwareProfile, training: TrainingSpec) -> None:
    """UsageError (one line) when ``hw`` cannot run ``training.precision``: FP8 needs an FP8 peak
    and the profile's ``efficiency.matmul_fp8``; MXFP8 needs Blackwell. (What the framework
    offers is its profile's rule: search.framework_rules.model_problems.)"""
    precision = training.precision
    if not is_fp8(training):
        return
    gpu = f"{hw.gpu.name} ({hw.name})"
    if "fp8" not in hw.gpu.peak_tflops:
        raise UsageError(f"--precision {precision} needs FP8 tensor cores: {gpu} has no FP8 peak "
                         "(Hopper H100/H200/H800 and Blackwell B200/GB200 have)")
    if precision == "mxfp8" and not blackwell(hw):
        raise UsageError(f"--precision mxfp8 runs on Blackwell only (B200, GB200: Transformer "
                         f"Engine MXFP8BlockScaling), not on {gpu}: use fp8 or fp8-blockwise")
    if hw.efficiency.matmul_fp8 is None:
        raise UsageError(f"hardware profile {hw.name} gives no efficiency.matmul_fp8 (the fraction "
                         f"of the FP8 peak its GEMMs reach): add it to train with --precision {precision}")


def dtype_peak(hw: HardwareProfile, training: TrainingSpec) -> float:
    """Dense peak FLOP/s of the 16-bit training dtype (bf16, or fp16 where the profile gives
    it): the peak of every GEMM that FP8 leaves alone, and MFU's denominator in every precision."""
    peaks = hw.gpu.peak_tflops
    return peaks[training.dtype if training.dtype in peaks else "bf16"] * 1e12


def linear_peak(hw: HardwareProfile, training: TrainingSpec) -> float:
    """Peak FLOP/s of the linear layers' GEMMs: the FP8 peak for FP8 recipes (MXFP8 on the same
    tensor cores, fp8_hardware.md 1.1), else dtype_peak."""
    peaks = hw.gpu.peak_tflops
    if is_fp8(training):
        return peaks.get("mxfp8", peaks["fp8"]) * 1e12 if training.precision == "mxfp8" \
            else peaks["fp8"] * 1e12
    return dtype_peak(hw, training)


def gemm_efficiency(flops_per_gemm: np.ndarray, hw: HardwareProfile) -> np.ndarray:
    """eta(F) = matmul * F / (F + matmul_half_flops): achieved fraction of peak for one GEMM of F FLOPs."""
    eff = hw.efficiency
    f = np.asarray(flops_per_gemm, dtype=np.float64)
    return eff.matmul * f / (f + eff.matmul_half_flops)


def linear_efficiency(flops_per_gemm, hw: HardwareProfile, training: TrainingSpec) -> np.ndarray:
    """eta(F), the achieved fraction of linear_peak for one linear GEMM of F FLOPs. BF16:
    matmul * F / (F + matmul_half_flops) (gemm_efficiency). FP8: matmul_fp8 x the
    recipe's kernel factor, with the half-efficiency size scaled by the FP8/BF16 peak ratio (the
    same launch and tile time at twice the rate: FP8 reaches its plateau at larger GEMMs,
    fp8_hardware.md 5.4 item 5). Broadcast array."""
    if not is_fp8(training):
        return gemm_efficiency(flops_per_gemm, hw)
    eff = hw.efficiency
    f = np.asarray(flops_per_gemm, dtype=np.float64)
    half = eff.matmul_half_flops * linear_peak(hw, training) / (hw.gpu.peak_tflops["bf16"] * 1e12)
    return eff.matmul_fp8 * RECIPE_GEMM_FACTOR[training.precision] * f / (f + half)


def quantize_bytes(hw: HardwareProfile, training: TrainingSpec) -> float:
    """HBM bytes per element to quantize one linear input or output gradient (0 for BF16),
    fp8_hardware.md 2.4: per-tensor current scaling reads the tensor for its amax, reads it
    again and writes 1 B, and on Hopper writes the transposed copy too (2 + 2 + 1 + 1 = 6; 5 on
    Blackwell, which needs no transpose); MXFP8 and blockwise read once and write row- and
    column-wise copies with their scales (2 + 2 x (1 + scales)): the reads + fp8_copies_bytes."""
    if not is_fp8(training):
        return 0.0
    reads = 4.0 if training.precision == "fp8" else 2.0
    return reads + fp8_copies_bytes(hw, training)


def fp8_copies_bytes(hw: HardwareProfile, training: TrainingSpec) -> float:
    """Bytes per linear-layer parameter of the FP8 copies a step uses (fp8_hardware.md 3.1):
    per-tensor 1, plus its transpose on Hopper; MXFP8 and blockwise row and column copies with
    their scales. 0 for BF16."""
    if not is_fp8(training):
        return 0.0
    if training.precision == "fp8":
        return 1.0 if blackwell(hw) else 2.0
    return 2.0 * (1.0 + SCALE_BYTES[training.precision])


def weight_bytes(hw: HardwareProfile, training: TrainingSpec, stage=None):
    """Model-side bytes per linear-layer parameter held between steps (fp8_hardware.md 3.1),
    in place of ``training.param_bytes``. BF16 and torchao: param_bytes (torchao keeps no FP8
    copy). Transformer Engine: per-tensor FP8 with parameter gather stores the FP8 parameter (1)
    and, on Hopper, its transpose (1): 2, 1 on Blackwell; MXFP8 with parameter gather into the
    reused gradient buffer keeps row and column copies (2 + scales); blockwise (no parameter
    gather) keeps the 16-bit parameter and both FP8 copies (2 + 2 + scales). Parameter gather
    needs a sharded optimizer (Megatron: the distributed optimizer or FSDP): with ``stage``
    (LayoutDegrees.sharding_stage, an array) a layout at stage 0 keeps the 16-bit parameter and
    the copies. Float, or an array broadcast with ``stage``."""
    if not is_fp8(training) or training.fp8_library == "torchao":
        return float(training.param_bytes)
    copies = fp8_copies_bytes(hw, training)
    kept = float(training.param_bytes) + copies
    if not fp8_param_gather(training):
        return kept
    return copies if stage is None else np.where(np.asarray(stage) >= 1, copies, kept)


# the recipes whose Transformer Engine presets gather FP8 parameters (fp8_param_gather)
FP8_PARAM_GATHER = ("fp8", "mxfp8")


def fp8_param_gather(training: TrainingSpec) -> bool:
    """The recipe keeps parameters in FP8 and gathers them so (Megatron --fp8-param-gather;
    MXFP8 gathers the 16-bit master into the reused gradient buffer): Megatron-Bridge's
    per-tensor and MXFP8 presets set fp8_param_gather, its blockwise preset does not. Not with
    optimizer CPU offload (``optimizer_offload_fraction`` > 0): Megatron-LM allows the two
    together only under --fp8-recipe delayed (arguments.py L1888-1891 @d98e8a64), which none of
    plan3d's precisions is (tensorwise, mxfp8), so such a job gathers 16-bit parameters, as the
    Megatron-Core MoE report's GB200 MXFP8 DeepSeek-V3 run with optimizer offload (Yan et al.
    2026, App. B.2) did."""
    return training.fp8_library == "transformer-engine" and training.precision in FP8_PARAM_GATHER \
        and training.optimizer_offload_fraction == 0


def weight_quantize_bytes(hw: HardwareProfile, training: TrainingSpec) -> float:
    """HBM bytes per linear-layer parameter to make its FP8 copies once: read the 16-bit weight
    (2) and write the copies (fp8_copies_bytes). Transformer Engine does it once per step (it
    caches the copies across micro-batches: fp8_hardware.md 3.1); torchao at every forward and
    again for the backward (it saves the 16-bit weight, 3.4). 0 for BF16."""
    return 2.0 + fp8_copies_bytes(hw, training) if is_fp8(training) else 0.0


def linear_input_bytes(training: TrainingSpec) -> float:
    """Bytes per element of a linear layer's input as saved for backward (fp8_hardware.md 3.2):
    2 in BF16 and with torchao (it saves the 16-bit input); with Transformer Engine FP8, 1 +
    the recipe's scales (the column-wise copy for MXFP8 and blockwise)."""
    if is_fp8(training) and training.fp8_library == "transformer-engine":
        return 1.0 + SCALE_BYTES[training.precision]
    return 2.0


def gather_bytes(training: TrainingSpec) -> float:
    """Bytes per element of the SP all-gathers of linear inputs and output gradients
    (fp8_hardware.md 4): FP8 (1 + scales) with Transformer Engine, which quantizes before the
    gather; 2 otherwise (torchtitan's current float8 recipes communicate in high precision)."""
    return linear_input_bytes(training)


def param_gather_bytes(training: TrainingSpec) -> float:
    """Bytes per parameter of the DP / ZeRO parameter all-gather: FP8 (1) for per-tensor scaling
    with parameter gather; 2 otherwise, MXFP8 included (it gathers the 16-bit master into the
    gradient buffer, Megatron _post_param_sync; fp8_hardware.md 4)."""
    return 1.0 if fp8_param_gather(training) and training.precision == "fp8" else 2.0
