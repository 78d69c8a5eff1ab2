"""The FLOP formulas the published sources used to turn a step time into TFLOP/s, MFU and HFU.

To compare like with like, plan3d's predicted step time is converted into each source's own
figure with the source's own formula (and the source's own peak), never with plan3d's FLOP count.
All functions return FLOPs of ONE optimizer step (global batch ``B`` sequences of ``s`` tokens).
Symbols: ``L`` layers, ``h`` hidden size, ``V`` vocabulary, ``N`` parameters.
"""

from __future__ import annotations

# Dense 16-bit peaks the sources divide by (SOURCES.md "Conventions"): A100 312 TFLOP/s
# (Narayanan 2021, Korthikanti 2022, llm-foundry), H100 SXM 989 TFLOP/s (llm-foundry).
SOURCE_PEAK_FLOPS = {"a100": 312e12, "h100": 989e12}


def narayanan_flops(B: int, s: int, L: int, h: int, V: int) -> float:
    """F = 96*B*s*L*h^2*(1 + s/(6h) + V/(16*L*h)): Narayanan et al. 2021 (arXiv:2104.04473) Sec. 5.1.

    Counts full activation recomputation (one extra forward of every layer: 96 = 4/3 * 72) and
    non-causal attention; the logits GEMM 3x only. Hardware FLOPs for a full-recompute run; also
    what Table 2's ZeRO-3 rows and the 2020 Megatron README table were counted with.
    """
    return 96.0 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def korthikanti_model_flops(B: int, s: int, L: int, h: int, V: int) -> float:
    """Model FLOPs 72*B*L*s*h^2*(1 + s/(6h) + V/(12*L*h)): Korthikanti et al. 2022 Eq. 7 (MFU).

    No recomputation, non-causal attention. Reproduces the paper's MFU 41.5/51.4/56.0/56.3 %
    from Table 5's times (formulas.md Sec. 9 item 3).
    """
    return 72.0 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * L * h))


def korthikanti_hardware_flops(B: int, s: int, L: int, h: int, V: int) -> float:
    """Hardware FLOPs 72*B*L*s*h^2*(1 + s/(3h) + V/(12*L*h)): Korthikanti et al. 2022 Eq. 8 (HFU).

    Adds the selective (core-attention) recomputation as the paper counted it (doubling the
    attention term); reproduces the published HFU 43.7/52.8/57.0/57.0 % (formulas.md Sec. 9).
    """
    return 72.0 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * L * h))


def mosaic_flops(B: int, s: int, L: int, h: int, N: float, recompute: bool = False) -> float:
    """llm-foundry benchmarking README: (k*2*N*s + k*L*2*2*h*s^2) per sequence, times B.

    k = 3 for MFU (forward + 2x backward); k = 4 for HFU when activation checkpointing is on.
    N = all parameters (Composer's ``n_params``, embeddings included); non-causal attention;
    norms, activations and residuals excluded.
    """
    k = 4.0 if recompute else 3.0
    return B * (k * 2.0 * N * s + k * L * 2.0 * 2.0 * h * s**2)
