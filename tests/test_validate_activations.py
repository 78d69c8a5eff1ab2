"""The activation check: plan formula + named torch deltas against the saved-activation peak.

Torch-free: the prediction of the brief's llama2-7b cases by hand, the interleaved schedule's
first-chunk count, the tolerance and the CPU-only rule. With torch (fast, one process): what
instrument.SavedBytes counts.
"""

from __future__ import annotations

import dataclasses

import pytest

from planner import catalog
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from planner.validate.activations import (ACT_RTOL, DELTAS, activation_check,
                                          first_chunk_microbatches, predict_saved)
from planner.validate.miniature import miniature


def llama2_plan(cp: int) -> Plan:
    """llama2-7b, tp 1, cp 1 or 2, dp 2, ZeRO-3, full recompute, micro-batch 2: on --world 4
    the miniature is tp=1 cp=cp pp=1 dp=2 (dp stays 2: 1*2*1*2 = 4 ranks)."""
    lay = Layout(tp=1, cp=cp, pp=1, dp=2, zero_stage=3, micro_batch_size=2, recompute="full")
    return Plan(plan3d_version="0.1.0", model=catalog.resolve_model("llama2-7b"),
                hardware=catalog.resolve_hardware("dgx-h100"), gpus=lay.gpus,
                training=TrainingSpec(seq_length=4096, global_batch_size=256), layout=lay)


# Hand derivation. Miniature: h 64, a = g = 4 heads of d 16, SwiGLU f 128, vocabulary 128,
# s 32, b 2, one layer, m = 2 micro-batches (one in flight, pp 1), float64 (e = 8).
# Plan formula (formulas.md 3.2-3.6, bf16 bytes, T = b*s/cp tokens): full recompute stores the
# layer input 2h*T, plus the working set of one layer T*(R + S + 4a) with R = 8h = 512,
# S = 2d(a+2g) + 2ad + 6f = 384 + 128 + 768 = 1280, flash LSE 4a = 16 -> 1808 per token;
# ids 8*T; last stage T*(4h + 6V) = T*(256 + 768). cp 1 (T = 64): 8,192 + 115,712 + 512 +
# 65,536 = 189,952, x e/2 = 759,808. cp 2 (T = 32): half, 379,904.
# What torch saves at the peak (the layer recomputed in backward after the loss and output
# layer were freed), cp 1, T = 64: ids 2*32*8 = 512; stored input T*h*e = 32,768; recomputed:
# rstd T*e 512 + normalized 32,768 (first norm), QKV input 32,768, RoPE cos/sin 4*s*d*e =
# 16,384, q, k, v 3*T*a*d*e = 98,304, LSE T*a*e = 2,048, attention output 32,768, second norm
# input + rstd + normalized 66,048, fc1 input 32,768, fc1 output 2*T*f*e = 131,072, silu
# T*f*e = 65,536, fc2 input 65,536: 576,512. Total 512 + 32,768 + 576,512 = 609,792.
# cp 2, T = 32: ids 256; input 16,384; recomputed: first norm 256 + 16,384, QKV input 16,384,
# cos/sin 4*(s/2)*d*e = 8,192, float mask (s/2)*s*e = 4,096, q T*a*d*e = 16,384, K and V of
# the whole sequence 2*b*s*a*d*e = 65,536, LSE 1,024, output 16,384, second norm 33,024, fc1
# input 16,384, fc1 output 65,536, silu 32,768, fc2 input 32,768: 325,120. Total 341,760.
CP1_FORMULA, CP2_FORMULA = 759_808, 379_904
CP1_SAVED, CP2_SAVED = 609_792, 341_760


def test_prediction_of_the_llama2_cp_cases_by_hand():
    for cp, formula, saved in ((1, CP1_FORMULA, CP1_SAVED), (2, CP2_FORMULA, CP2_SAVED)):
        pred = predict_saved(miniature(llama2_plan(cp), world=4), 0)
        assert pred["formula"] == formula
        assert pred["predicted"] == saved
        assert all(d["name"] in DELTAS for d in pred["deltas"])
    # The K, V of the whole sequence do not shrink with cp: 2*b*(s - s/2)*g*d*e = 32,768.
    pred = predict_saved(miniature(llama2_plan(2), world=4), 0)
    deltas = {d["name"]: d["bytes"] for d in pred["deltas"]}
    assert deltas["cp gathered kv"] == 2 * 2 * 16 * 4 * 16 * 8
    # Last stage: the loss tensors (82,440 B at cp 2) are gone before the recomputation.
    assert deltas["recompute after loss"] == -(16_384 + 16_384 + 256 + 16_384 + 32_768 + 256 + 8)


def test_first_chunk_microbatches_follows_the_interleaved_order():
    # pp 2, vpp 2, m 4, rank 0: 0F0 0F1 2F0 2F1 (warm-up (vpp-1)*pp + 2*(pp-1) = 4), 0F2 2B0
    # 0F3: five chunks in flight, four of them first chunks (the formula: ceil(5/2) = 3).
    assert first_chunk_microbatches(2, 2, 4) == 4
    # pp 4, vpp 2, m 8: warm-up 10 forwards (chunks 0,0,0,0,1,1,1,1,0,0), F10 (chunk 0) -> 11
    # chunks, B0, F11 (chunk 0) -> 11 again with all 8 first chunks.
    assert first_chunk_microbatches(4, 2, 8) == 8
    assert first_chunk_microbatches(2, 1, 4) == 2 and first_chunk_microbatches(4, 1, 2) == 2


def test_tolerance_and_cpu_only():
    run = miniature(llama2_plan(2), world=4)
    want = predict_saved(run, 0)["predicted"]
    for factor, ok in ((1 + ACT_RTOL / 2, True), (1 - ACT_RTOL / 2, True),
                       (1 + 2 * ACT_RTOL, False), (1 - 2 * ACT_RTOL, False)):
        check = activation_check(run, 0, [{"saved_peak": [0, want]},
                                          {"saved_peak": [0, round(want * factor)]}])
        assert check["passed"] is ok and check["tolerance"] == ACT_RTOL
    gpu = dataclasses.replace(run, device="cuda")  # deltas are derived for the CPU kernels only
    assert activation_check(gpu, 0, [{"saved_peak": [0, want]}])["passed"] is None
    blind = [{"saved_peak": [0, want], "recompute_tracked": False}]  # recomputation not counted
    assert activation_check(run, 0, blind)["passed"] is None


def test_saved_bytes_counts_saved_tensors_views_once_and_recomputation():
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    from planner.validate.instrument import SavedBytes, recompute_context
    lin = torch.nn.Linear(8, 16, bias=False).double()
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with SavedBytes() as saved:  # mm saves x (4*8*8 = 256 B; the weight is a parameter),
        y = torch.tanh(lin(x))  # tanh its output (4*16*8 = 512 B)
        assert saved.live == 768
        y.sum().backward()
    assert (saved.peak, saved.live) == (768, 0)
    with SavedBytes() as saved:  # two views of x saved by one product: x's 256 B, once
        (x[:, :4] * x[:, 4:]).sum().backward()
    assert saved.peak == 256
    with SavedBytes() as saved:  # checkpoint: the forward saves x only; the recomputation in
        y = checkpoint(lambda t: torch.tanh(lin(t)), x, use_reentrant=False,  # backward holds
                       context_fn=recompute_context)  # tanh's output again: 256 + 512
        assert saved.live == 256
        y.sum().backward()
    assert (saved.peak, saved.live) == (768, 0)


def test_saved_bytes_ignores_an_empty_view_of_a_held_storage():
    # an expert that receives no tokens saves a 0-row view of the dispatch buffer: it holds no
    # bytes, and counting it as a zero-width span made the buffer's key vanish while the span
    # was still held (KeyError in the finalizer, printed as "Exception ignored" tracebacks)
    torch = pytest.importorskip("torch")
    import gc
    import sys

    from planner.validate.instrument import SavedBytes
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    caught, hook = [], sys.unraisablehook
    sys.unraisablehook = caught.append  # a finalizer's exception is "ignored", not raised
    try:
        with SavedBytes() as saved:
            y = (x[:0] * x[:0]).sum() + (x * x).sum()  # x[:0]: empty views; x * x saves x (256 B)
            assert saved.live == 256
            y.backward()
            del y
            gc.collect()
    finally:
        sys.unraisablehook = hook
    assert not caught, caught[0].exc_value
    assert (saved.peak, saved.live) == (256, 0) and not saved._spans


def test_adapter_on_the_middle_ranks_of_a_deeper_pipeline():
    """torchrun runs the plan's own pp: a middle rank r holds min(pp - r, m) micro-batches of
    its layers and no embedding or loss. llama3-8b, one layer per stage, pp 4, s 2048, b 1:
    per token R = 8h = 32,768; S = 2*128*(32 + 2*8) + 2*32*128 + 6*14,336 = 106,496; flash
    LSE 4a = 128: 139,392 B x 2,048 tokens = 285,474,816 B per layer (bf16), x e/2 = 2 in
    float32."""
    from planner.validate.activations import predicted_activations
    from planner.validate.miniature import full_scale
    lay = Layout(tp=1, pp=4, dp=1, zero_stage=1, micro_batch_size=1)
    plan = Plan(plan3d_version="0.1.0", model=catalog.resolve_model("llama3-8b"),
                hardware=catalog.resolve_hardware("dgx-h100"), gpus=lay.gpus,
                training=TrainingSpec(seq_length=2048, global_batch_size=8), layout=lay)
    run = full_scale(plan, 1, "float32", 2, "cpu")
    for rank, layers in ((1, 3), (2, 2)):
        pred = predicted_activations(run, rank)
        assert pred["inflight_layers"] == layers
        assert pred["bytes"] == layers * 285_474_816 * 2
