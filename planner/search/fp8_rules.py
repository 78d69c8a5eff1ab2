"""The GEMM shapes an FP8 recipe runs, as named masks of the search space: each FP8 library
refuses (or crashes on) operands whose token count or widths are not multiples of its tile,
so a layout whose FP8 GEMMs do not fit them is refused by search, estimate, ``--plan`` and every
export alike (framework_rules.framework_masks calls fp8_masks).

Transformer Engine (the Megatron-Core profile's runtime.fp8_library): every FP8 linear asserts
on its input and its weight that the product of the leading dimensions is a multiple of 8 and
the last a multiple of 16 (transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec, called
in the forward of Linear, LayerNormLinear and LayerNormMLP; "FP8 execution requires ...":
NVIDIA/TransformerEngine#1422, #232, #688): tokens x 8, weight (out, in) out x 8, in x 16, for
per-tensor and blockwise recipes. MXFP8 scales blocks of 32 along both dimensions of every
quantized tensor (tensor/mxfp8_tensor.py MXFP8Quantizer.make_empty asserts both divisible by
MXFP8_BLOCK_SCALING_SIZE = 32). The tokens of one GEMM on a GPU are seq/cp x mbs, quantized on
the sequence-parallel shard before the SP all-gather (fp8_hardware.md 2.4): seq/cp/tp x mbs
with SP. Read from stored copies of TransformerEngine's files (no commit is pinned by the
profile).

torchao (torchtitan's): Float8Linear's rowwise recipe runs torch._scaled_mm for the weight
gradient too, whose contraction runs over the tokens, and _scaled_mm requires mat1's trailing
dimension and both of mat2's to be multiples of 16 (ATen Blas.cpp _scaled_mm checks; torchao
0.18.0 float8/config.py: pad_inner_dim False in the rowwise recipe): tokens seq/cp x mbs (the
GEMM runs on the all-gathered sequence) x 16. MX: MXTensor.to_mx asserts the last dimension a
multiple of the block, 32 (torchao 0.18.0 prototype/mx_formats/mx_tensor.py L230), for the
tokens of the weight gradient and for each converted layer's widths. torchtitan leaves a linear
whose global widths are not multiples of 16 in BF16 (components/quantization/utils.py
module_filter_fn @b5bcd76c66d0): no rule, the cost model's FP8 time is then optimistic there.
"""

from __future__ import annotations

import numpy as np

from ..cost.linear_shapes import fp8_linear_shapes
from ..cost.precision import is_fp8
from ..framework_spec import FrameworkProfile
from ..specs import ModelSpec, TrainingSpec

# (tokens, weight out, weight in) multiples of Transformer Engine's FP8 GEMMs by recipe (module
# docstring: assert_dim_for_fp8_exec 8 / 8 / 16; MXFP8 blocks of 32 on both dimensions)
TE_MULTIPLES = {"fp8": (8, 8, 16), "fp8-blockwise": (8, 8, 16), "mxfp8": (32, 32, 32)}
# tokens multiple of torchao's FP8 GEMMs (torch._scaled_mm 16; MX block 32); torchtitan converts
# a linear only if its global widths are multiples of TORCHAO_CONVERTED (module_filter_fn)
TORCHAO_TOKENS = {"fp8": 16, "mxfp8": 32}
TORCHAO_CONVERTED = 16
# what every FP8 shape rule's name says (check_layout adds the numbers: fp8_hint)
FP8_SHAPE_TAG = "FP8 GEMM"


def gemm_tokens(training: TrainingSpec, c) -> np.ndarray:
    """Tokens of one FP8 GEMM operand on one GPU, as the library quantizes it: seq/cp x mbs,
    divided by tp with SP for Transformer Engine (it quantizes the SP shard before the
    all-gather); torchao runs on the gathered sequence. Float array."""
    tokens = c.tokens_per_microbatch(training.seq_length)
    return tokens / c.sp_divisor if training.fp8_library == "transformer-engine" else tokens


def fp8_masks(profile: FrameworkProfile, model: ModelSpec, training: TrainingSpec,
              c) -> dict[str, np.ndarray]:
    """{rule name: bool mask (True = allowed)} of the FP8 GEMM shapes (module docstring); {}
    outside FP8. Transformer Engine: the tokens and every FP8 linear's per-GPU weight
    (cost.linear_shapes) against TE_MULTIPLES; torchao: the tokens against TORCHAO_TOKENS and,
    for MXFP8, the per-GPU widths of the layers torchtitan converts against 32."""
    if not is_fp8(training) or training.fp8_library == "none":
        return {}
    d, p = profile.display, training.precision
    tokens = gemm_tokens(training, c)
    if training.fp8_library == "transformer-engine":
        k, k_out, k_in = TE_MULTIPLES[p]
        where = "seq/cp/(tp with SP) x mbs"
        shapes = fp8_linear_shapes(model, c.tp, c.etp).values()
        widths = np.logical_and.reduce([(np.mod(o, k_out) == 0) & (np.mod(i, k_in) == 0)
                                        for o, i in shapes])
        width_rule = (f"{d} (Transformer Engine, {p}): every FP8 GEMM's weight per GPU (out, in) "
                      f"a multiple of ({k_out}, {k_in})")
    else:
        k, where, width_rule, widths = TORCHAO_TOKENS[p], "seq/cp x mbs", None, None
        if p == "mxfp8":
            widths = _torchao_mx_widths(model, c)
            width_rule = f"{d} (torchao, mxfp8): every FP8 GEMM's widths per GPU a multiple of 32"
    library = "Transformer Engine" if training.fp8_library == "transformer-engine" else "torchao"
    out = {f"{d} ({library}, {p}): the tokens of each FP8 GEMM, {where}, a multiple of {k}":
           np.mod(tokens, k) == 0}
    if width_rule is not None:
        out[width_rule] = np.asarray(widths)
    return out


def _torchao_mx_widths(model: ModelSpec, c) -> np.ndarray:
    """Whether every linear torchtitan converts to MXFP8 (global widths multiples of
    TORCHAO_CONVERTED, module_filter_fn) has per-GPU widths that are multiples of 32."""
    ok = np.asarray(True)
    full = fp8_linear_shapes(model, 1, 1)
    for name, (o, i) in fp8_linear_shapes(model, c.tp, c.etp).items():
        if float(full[name][0]) % TORCHAO_CONVERTED == 0 and float(full[name][1]) % TORCHAO_CONVERTED == 0:
            ok = ok & (np.mod(o, 32) == 0) & (np.mod(i, 32) == 0)
    return ok


def fp8_hint(model: ModelSpec, training: TrainingSpec, c) -> str:
    """The numbers behind a broken FP8 shape rule for one layout ``c`` (one candidate): its
    tokens per GEMM and the first FP8 linear whose widths miss the library's multiples."""
    tokens = float(np.ravel(gemm_tokens(training, c))[0])
    lay = c.layout(0)
    parts = [f"{training.seq_length}/{lay.cp}"
             + (f"/{lay.tp}" if training.fp8_library == "transformer-engine" and lay.sequence_parallel else "")
             + f" x {lay.micro_batch_size} = {tokens:g} tokens"]
    if training.fp8_library == "transformer-engine":
        _, k_out, k_in = TE_MULTIPLES[training.precision]
        for name, (o, i) in fp8_linear_shapes(model, c.tp, c.etp).items():
            o, i = float(np.ravel(o)[0]), float(np.ravel(i)[0])
            if o % k_out or i % k_in:
                parts.append(f"{name} weight ({o:g}, {i:g}) per GPU")
                break
    return "; ".join(parts)
