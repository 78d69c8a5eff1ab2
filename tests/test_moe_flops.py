"""Model FLOPs of MoE, MLA, MTP and sliding-window models (planner.cost.model_flops) against the
test vectors of formulas.md 11.2 (Megatron-Bridge's counting, s = 4096, tp = 1) and hand
arithmetic; invariants of the window count; dense results unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import catalog
from planner.cost import model_flops as mf

G = 1e9


def no_mtp(name: str):
    return catalog.resolve_model(name).model_copy(update={"mtp_layers": 0})


# GFLOP per token at s = 4096, tp = 1: Megatron-Bridge flop_utils.transformer_flops @ 067f987d
# (active experts, MLA with its "+1" norm terms, SWA over the window, MTP layers); published
# implied values in the comments (Megatron-Bridge performance tables: TFLOP/s / tokens/s)
VECTORS = [
    ("deepseek-v3", 259.99),       # 26.08 tables: 1635/6288 = 260.0, 1276/4912 = 259.8
    ("qwen3-235b-a22b", 148.03),   # 25.11-26.08 tables: 147.7-148.3
    ("qwen3-30b-a3b", 23.01),      # 22.8-23.1
    ("gpt-oss-120b", 32.63),       # 26.06+ tables: 32.6 (GLU counted as 3 matrices, 18 SWA layers)
    ("gpt-oss-20b", 22.91),        # the four below: derived by hand in BY_HAND
    ("mixtral-8x7b", 79.71),
    ("mixtral-8x22b", 242.20),
    ("olmoe-1b-7b", 7.87),
]


@pytest.mark.parametrize("name, gflop", VECTORS)
def test_flops_per_token_vectors(name, gflop):
    m = catalog.resolve_model(name)
    assert mf.model_flops_per_token(m, 4096) / G == pytest.approx(gflop, abs=0.01)


# By hand from the architectures (models/*.yaml), s = 4096, tp = 1: 3 x forward per token of
#   attention projections 2*(h*(n*d + 2*g*d) + n*d*h) and k routed experts k*2*3*h*F per layer,
#   logits 2*h*V_p (V_p = V: each vocabulary below is a multiple of 128), and the causal core
#   2*n*(2d)*c per layer, c = s/2 = 2048 (a window w: c = w - w*(w - 1)/(2s)).
# Mixtral-8x7B (h 4096, n 32, g 8, d 128, L 32, F 14336, k 2, V 32000):
#   attention 2*(4096*6144 + 4096*4096) = 83,886,080; experts 2*6*4096*14336 = 704,643,072;
#   32 layers x 788,529,152 = 25,232,932,864; logits 2*4096*32000 = 262,144,000;
#   core 32 x 2*32*256*2048 = 1,073,741,824; 3 x 26,568,818,688 = 79,706,456,064
# Mixtral-8x22B (h 6144, n 48, g 8, d 128, L 56, F 16384, k 2, V 32768):
#   attention 2*(6144*8192 + 6144*6144) = 176,160,768; experts 2*6*6144*16384 = 1,207,959,552;
#   56 x 1,384,120,320 = 77,510,737,920; logits 2*6144*32768 = 402,653,184;
#   core 56 x 2*48*256*2048 = 2,818,572,288; 3 x 80,731,963,392 = 242,195,890,176
# OLMoE-1B-7B (h 2048, n = g = 16, d 128, L 16, F 1024, k 8, V 50304; QK norms are no GEMM):
#   attention 2*(2048*6144 + 2048*2048) = 33,554,432; experts 8*6*2048*1024 = 100,663,296;
#   16 x 134,217,728 = 2,147,483,648; logits 2*2048*50304 = 206,045,184;
#   core 16 x 2*16*256*2048 = 268,435,456; 3 x 2,621,964,288 = 7,865,892,864
# GPT-OSS-20B (h 2880, n 64, g 8, d 64, L 24, F 2880, k 4, V 201088 = 1571*128; window 128 on
#   the 12 even layers): attention 2*(2880*5120 + 4096*2880) = 53,084,160; experts
#   4*6*2880*2880 = 199,065,600; 24 x 252,149,760 = 6,051,594,240; logits 2*2880*201088 =
#   1,158,266,880; core: 12 full x 2*64*128*2048 = 402,653,184 + 12 windowed x 16384 *
#   (128 - 128*127/8192 = 126.015625) = 24,775,680; 3 x 7,637,289,984 = 22,911,869,952
BY_HAND = [("mixtral-8x7b", 79_706_456_064), ("mixtral-8x22b", 242_195_890_176),
           ("olmoe-1b-7b", 7_865_892_864), ("gpt-oss-20b", 22_911_869_952)]


@pytest.mark.parametrize("name, flops", BY_HAND)
def test_flops_per_token_by_hand(name, flops):
    assert mf.model_flops_per_token(catalog.resolve_model(name), 4096) == pytest.approx(flops, rel=1e-12)


def test_deepseek_v3_terms_by_hand():
    m = no_mtp("deepseek-v3")
    # no MTP: 249.81 (25.11 tables "w/o MTP": 961/3848 = 249.7, 1088/4357 = 249.7)
    assert mf.model_flops_per_token(m, 4096) / G == pytest.approx(249.81, abs=0.01)
    # MLP: 6*7168*(3 dense * 3*18432 + 58 MoE * (8*3*2048 + 3*2048)) = 6*7168*61*55,296
    mlp = 3 * (3 * mf.dense_mlp_flops_per_token(m) + 58 * mf.moe_mlp_flops_per_token(m))
    assert mlp == 6 * 7168 * 61 * 55_296 == pytest.approx(145.07e9, abs=0.01e9)
    # attention: 61 * 6 * (MLA projections 187,107,328 + core 4096*128*(192 + 128)/2)
    assert 3 * 61 * mf.attention_proj_flops_per_token(m) == 6 * 61 * 187_107_328
    core = mf.attention_core_flops_per_sequence_model(m, 4096) / 4096
    assert 3 * core == 6 * 61 * 83_886_080
    assert 6 * 61 * (187_107_328 + 83_886_080) == pytest.approx(99.18e9, abs=0.01e9)
    # logits: 6*7168*129280 (already a multiple of 128)
    assert 3 * mf.logits_flops_per_token(m) == 6 * 7168 * 129_280
    # MTP adds one MoE layer, one more logits pass and 6*(3h + 2h^2): +10.18
    delta = mf.model_flops_per_token(catalog.resolve_model("deepseek-v3"), 4096) - \
        mf.model_flops_per_token(m, 4096)
    layer = 3 * mf.layer_gemm_flops_per_token(m, moe=True) + 3 * core / 61
    assert delta == pytest.approx(layer + 6 * 7168 * 129_280 + 6 * (3 * 7168 + 2 * 7168**2))
    assert delta / G == pytest.approx(10.18, abs=0.01)
    # per-layer GEMMs of an MoE layer: 2*(187,107,328 + 9 * 3*7168*2048)
    assert mf.layer_gemm_flops_per_token(m, moe=True) == 2 * (187_107_328 + 9 * 44_040_192)
    # the router GEMM is not model FLOPs: 6*h*E*58 = 0.64 GFLOP/token (formulas.md 11.2)
    assert 3 * 58 * mf.router_flops_per_token(m) / G == pytest.approx(0.639, abs=0.001)


def test_mistral_sliding_window():
    m = catalog.resolve_model("mistral-7b")
    # GEMMs: 6*(32*(2*4096*128*40 + 3*4096*14336) + 4096*32000) = 42.66e9
    gemm = 6 * (32 * (41_943_040 + 176_160_768) + 4096 * 32000)
    # window 4096 at s = 8192: mean of min(i, 4096) over i = 1..8192 = 4096 - 4096*4095/16384
    c = 4096 - 4096 * 4095 / 16384
    assert c == 3072.25 == mf.keys_per_query(8192, 4096)
    core = 3 * 32 * 4 * 32 * 128 * c          # 3 passes, 32 layers, 4*n*d*c forward per token
    assert mf.model_flops_per_token(m, 8192) == pytest.approx(gemm + core, rel=1e-12)
    assert mf.model_flops_per_token(m, 8192) / G == pytest.approx(47.49, abs=0.005)
    # the full causal triangle would be 49.10: 6*8192*4096*32 more than the GEMMs
    full = m.model_copy(update={"sliding_window": None, "window_layers": None})
    assert mf.model_flops_per_token(full, 8192) / G == pytest.approx(49.10, abs=0.005)
    # the step total (MFU's numerator) counts the window too, for every tp
    tp = np.array([1, 2, 8])
    step = mf.model_flops_per_step(m, 8192, 64, tp)
    assert step[0] == pytest.approx(64 * 8192 * mf.model_flops_per_token(m, 8192), rel=1e-12)
    assert step.shape == (3,) and np.all(step < mf.model_flops_per_step(full, 8192, 64, tp))
    # at s <= window the window changes nothing
    assert mf.model_flops_per_token(m, 4096) == pytest.approx(mf.model_flops_per_token(full, 4096))


def test_recompute_flops_moe():
    m = catalog.resolve_model("deepseek-v3")
    s, B = 4096, 8
    f_model = mf.model_flops_per_step(m, s, B, np.array([1]))[0]
    extra = mf.recompute_flops_per_step(m, s, B, np.array([0, 1, 2]))
    logits = 3 * B * s * mf.logits_flops_per_token(m)
    # full: one more forward of every layer = (model FLOPs - logits) / 3
    assert extra[2] == pytest.approx((f_model - logits) / 3, rel=1e-12)
    # selective recomputes the attention core of every attention layer (61 + 1 MTP), by hand:
    # 8 sequences x 62 layers x 2 * 128 heads * (192 + 128) * 4096 * 2048 (causal: s^2/2 scores
    # of QK^T (d_qk 192) and PV (d_v 128), 2 FLOPs each) = 340,848,604,610,560
    assert extra[1] == pytest.approx(340_848_604_610_560, rel=1e-12)
    # full, by hand: 32,768 tokens x (62 layers x (attention 374,214,656 + MoE/dense mean
    # 792,723,456 FLOPs per token... as the layer GEMMs) + MTP projection 2*(2*7168^2 + 3*7168))
    # + the selective value = 2,718,354,661,965,824
    assert extra[2] == pytest.approx(2_718_354_661_965_824, rel=1e-9)
    assert extra[0] == 0


def test_dense_models_unchanged():
    # every dense catalog model: the layer sums equal section 4.1's formula written out,
    # F = 6*B*s*[L*(2*h*d*(a + g) + glu*h*f) + h*V_p] + 3*B*L*(4*s^2*a*d)/2 (causal half),
    # glu = 3 (SwiGLU) or 2, V_p = ceil(V/(128*tp))*128*tp
    B, s = 16, 2048
    for m in catalog.models().values():
        if m.moe is None and m.sliding_window is None and m.mtp_layers == 0:
            h, d, a, g, f = (m.hidden_size, m.kv_channels, m.num_attention_heads, m.kv_heads, m.ffn)
            glu = 3 if m.activation == "swiglu" else 2
            for tp in (1, 8):
                vp = -(-m.vocab_size // (128 * tp)) * 128 * tp
                by_hand = 6.0 * B * s * (m.num_layers * (2 * h * d * (a + g) + glu * h * f) + h * vp) \
                    + 3.0 * B * m.num_layers * 4.0 * s * s * a * d / 2
                plain = mf.model_flops_per_step(m, s, B, np.array([tp]))[0]
                general = B * s * mf.model_flops_per_token(m, s, tp)
                assert plain == pytest.approx(by_hand, rel=1e-12), m.name
                assert general == pytest.approx(by_hand, rel=1e-12), m.name
            assert mf.attention_core_flops_per_sequence(m, s) == 2.0 * s * s * a * d


@settings(max_examples=200, deadline=None)
@given(s=st.integers(1, 600), w=st.integers(1, 700))
def test_keys_per_query_is_the_causal_window(s, w):
    c = mf.keys_per_query(s, w)
    exact = sum(min(i, w) for i in range(1, s + 1)) / s   # query i sees min(i, w) keys
    if w >= s:
        assert c == s / 2                                   # Megatron's causal convention
    else:
        assert c == pytest.approx(min(exact, s / 2), rel=1e-12)
    assert c <= s / 2 and c <= mf.keys_per_query(s, w + 1)  # never above none, monotone in w
    assert mf.keys_per_query(s, w, causal=False) == s


def test_gpt_oss_window_core():
    m = catalog.resolve_model("gpt-oss-120b")
    # 18 full layers of 2*64*128*4096*2048 and 18 SWA layers over 128 - 128*127/8192 keys
    c = 128 - 128 * 127 / 8192
    expected = 18 * 2 * 64 * 128 * 4096 * (2048 + c)
    assert mf.attention_core_flops_per_sequence_model(m, 4096) == pytest.approx(expected)
    assert mf.attention_core_flops_per_sequence(m, 4096, windowed=True) == \
        pytest.approx(2 * 64 * 128 * 4096 * c)
