"""Cost-model unit tests against hand-computed values and the test vectors of formulas.md §9."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import flops, memory, pipeline
from planner.cost.collectives import Links, collective_time, placement
from planner.space import Candidates
from planner.specs import Layout, TrainingSpec

from .conftest import gpt

GIB = 2**30


def cands(**kw) -> Candidates:
    base = dict(tp=1, pp=1, dp=1, zero_stage=0, micro_batch_size=1, recompute="none",
                sequence_parallel=False, vpp=1)
    base.update(kw)
    return Candidates.from_layouts([Layout(**base)])


# Korthikanti et al. 2022 Fig. 1 / formulas.md §9 item 1: first-stage activations, s=2048, t=8,
# no flash attention, dropout on; "none" = TP without SP, no recompute; "sp+sel" = SP + selective.
KORTHIKANTI = [
    # name, L, h, a, p, v, b, micro-batches, GiB none, GiB sp+selective
    ("22B", 48, 6144, 64, 1, 1, 4, 1, 59.25, 9.5625),
    ("175B", 96, 12288, 96, 8, 3, 1, 64, 66.84375, 12.3516),
    ("530B", 105, 20480, 128, 35, 3, 1, 280, 114.0234, 23.0762),
    ("1T", 128, 25600, 160, 64, 1, 1, 512, 131.25, 26.5625),
]


@pytest.mark.parametrize("name, L, h, a, p, v, b, m, none_gib, sel_gib", KORTHIKANTI)
def test_korthikanti_activation_memory(name, L, h, a, p, v, b, m, none_gib, sel_gib):
    model = gpt(name, L, h, a)
    training = TrainingSpec(seq_length=2048, global_batch_size=m * b, flash_attention=False)
    layers = pipeline.inflight_layers(L, np.array([p]), np.array([v]), np.array([m]), np.array([0]))
    for rc, sp, expected in (("none", False, none_gib), ("selective", True, sel_gib)):
        c = cands(tp=8, pp=p, vpp=v, micro_batch_size=b, recompute=rc, sequence_parallel=sp)
        per_layer = memory.activation_per_layer(model, training, c)
        assert float(layers[0] * per_layer[0]) / GIB == pytest.approx(expected, abs=5e-5)


def test_korthikanti_layer_formula_by_hand():
    # 22B, t=8, no SP: s*b*h*(10 + 24/t + 5*a*s/(h*t)) = 2048*4*6144*(10 + 3 + 5*64*2048/(6144*8))
    model = gpt("22B", 48, 6144, 64)
    training = TrainingSpec(seq_length=2048, global_batch_size=4, flash_attention=False)
    expected = 2048 * 4 * 6144 * (10 + 3 + 5 * 64 * 2048 / (6144 * 8))
    got = memory.activation_per_layer(model, training, cands(tp=8, micro_batch_size=4))[0]
    assert got == pytest.approx(expected, rel=1e-12)
    # Full recompute keeps only the layer input: 2*s*b*h, /t with SP.
    full = memory.activation_per_layer(model, training, cands(tp=8, micro_batch_size=4,
                                                              recompute="full", sequence_parallel=True))[0]
    assert full == 2 * 2048 * 4 * 6144 / 8


@pytest.mark.parametrize("name, L, h, a, p, published_gib", [
    ("22B", 48, 6144, 64, 1, 45.5625), ("175B", 96, 12288, 96, 8, 45.5625),
    ("530B", 105, 20480, 128, 35, 31.6406), ("1T", 128, 25600, 160, 64, 32.9590)])
def test_korthikanti_params_plus_optimizer(name, L, h, a, p, published_gib):
    # formulas.md §9 item 2: Megatron DDP, 18 B/param x layer params per stage / t (t = 8).
    # Exactly: column-parallel weights+biases (12h^2 + 7h)/t, replicated norms and row-parallel
    # biases 6h, so per GPU (L/p)*((12h^2 + 7h)/8 + 6h) parameters.
    model = gpt(name, L, h, a)
    sharded, replicated = flops.layer_params_per_gpu(model, np.array([8]))
    per_gpu = L / p * (sharded[0] + replicated[0])
    assert per_gpu == pytest.approx(L / p * ((12 * h * h + 7 * h) / 8 + 6 * h), rel=1e-15)
    training = TrainingSpec(seq_length=2048, global_batch_size=8)
    states = memory.model_state_bytes(np.array([per_gpu]), np.array([0]), np.array([1]), training)
    total = sum(states.values())[0] / GIB
    # Replicated norms and row-parallel biases (6h, not 6h/t) add 0.03-0.08 %: 22B 45.596 GiB.
    assert total == pytest.approx(published_gib, rel=1e-3)


def test_bytes_per_parameter_by_zero_stage():
    # bf16 weights 2 B, fp32 main grads 4 B, Adam 12 B; n = dp = 8 (formulas.md 2.1):
    # ZeRO-0 18, ZeRO-1 2+4+12/8 = 7.5, ZeRO-2 2+(4+12)/8 = 4, ZeRO-3 18/8 = 2.25 B/param.
    training = TrainingSpec(seq_length=2048, global_batch_size=8)
    params = np.full(4, 1e9)
    states = memory.model_state_bytes(params, np.array([0, 1, 2, 3]), np.full(4, 8), training)
    total = states["weights"] + states["gradients"] + states["optimizer"]
    np.testing.assert_allclose(total / 1e9, [18, 7.5, 4, 2.25])
    bf16_grads = TrainingSpec(seq_length=2048, global_batch_size=8, grad_bytes=2)
    states = memory.model_state_bytes(params[:1], np.array([0]), np.array([8]), bf16_grads)
    assert sum(states.values())[0] / 1e9 == 16  # the ZeRO paper's 2 + 2 + 12


def test_inflight_layers_1f1b_and_interleaved():
    # 1F1B: rank r holds min(p - r, m) micro-batches of L/p layers; L = 96, p = 8.
    got = pipeline.inflight_layers(96, np.array([8, 8, 8]), np.array([1, 1, 1]),
                                   np.array([64, 64, 3]), np.array([0, 7, 0]))
    np.testing.assert_array_equal(got, [96, 12, 36])  # 8*12, 1*12, min(8, 3)*12
    # Interleaved, v = 3: rank 0 holds L*(1 + (p-1)/(p*v)) = 96*(1 + 7/24) = 124 layers;
    # the last rank ((v-1)*p + 1) chunks of L/(p*v) = 4 layers = 17*4 = 68.
    got = pipeline.inflight_layers(96, np.array([8, 8]), np.array([3, 3]), np.array([64, 64]),
                                   np.array([0, 7]))
    np.testing.assert_array_equal(got, [124, 68])


def test_bubble_fraction_equal_stages():
    # Equal stages of t = 1 s: makespan = m*t + (p-1)*t/v; bubble fraction (p-1)/(v*m).
    t = np.ones(3)
    pp, vpp, m = np.array([8, 8, 1]), np.array([1, 4, 1]), np.array([32.0, 32.0, 16.0])
    makespan, bubble = pipeline.pipeline_time(t, t, t, pp, vpp, m)
    np.testing.assert_allclose(makespan, [32 + 7, 32 + 7 / 4, 16])
    np.testing.assert_allclose(bubble / m, pipeline.bubble_fraction(pp, vpp, m))
    np.testing.assert_allclose(pipeline.bubble_fraction(pp, vpp, m), [7 / 32, 7 / 128, 0])


def test_unequal_stages_makespan():
    # first 2 s, middle 1 s, last 3 s, p = 4, m = 10: T = m*t_max + (sum - t_max)/v
    # = 10*3 + (2 + 3 + 2*1 - 3) = 34 s.
    makespan, bubble = pipeline.pipeline_time(np.array([2.0]), np.array([1.0]), np.array([3.0]),
                                              np.array([4]), np.array([1]), np.array([10.0]))
    assert makespan[0] == 34 and bubble[0] == 4


def test_even_pipeline_time_hand_computed():
    # middle 1 s, first = 1 + 0.5, last = 1 + 2 s, p = 4, v = 2, m = 10:
    # t_max = 3; sum_r t_r - t_max = 1.5 + 3 + 2*1 - 3 = 3.5 = (p-1)*1 + min(0.5, 2);
    # bubble 3.5 / 2 = 1.75; makespan 10*3 + 1.75 = 31.75 s. With p = 1: 10 * 1.5 s, no bubble.
    makespan, bubble = pipeline.even_pipeline_time(
        np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([2.0, 2.0]), np.array([4, 1]),
        np.array([2, 1]), np.array([10.0, 10.0]))
    np.testing.assert_allclose(makespan, [31.75, 15.0])
    np.testing.assert_allclose(bubble, [1.75, 0.0])


@settings(max_examples=60, deadline=None)
@given(mid=st.floats(1e-4, 10), ef=st.floats(0, 5), el=st.floats(0, 5),
       pp=st.integers(1, 64), vpp=st.integers(1, 8), m=st.integers(1, 512))
def test_even_pipeline_time_equals_the_general_schedule(mid, ef, el, pp, vpp, m):
    # The even-split shortcut must agree with pipeline_time on stages (mid+ef, mid, mid+el).
    args = [np.array([x], dtype=np.float64) for x in (pp, vpp, m)]
    fast = pipeline.even_pipeline_time(np.array([mid]), np.array([ef]), np.array([el]), *args)
    general = pipeline.pipeline_time(np.array([mid + ef]), np.array([mid]), np.array([mid + el]),
                                     *args)
    for a, b in zip(fast, general):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_flops_test_vectors():
    # formulas.md §9 item 4 (Megatron FLOPs per token at s=8192, causal, unpadded V).
    from planner import catalog
    for name, gflops in (("llama3-8b", 51.47), ("llama3-70b", 449.22), ("llama3-405b", 2523.96)):
        m = catalog.resolve_model(name)
        per_token = flops.model_flops_per_step(m, 8192, 1, np.array([1]))[0] / 8192
        assert per_token / 1e9 == pytest.approx(gflops, abs=0.005)


def test_korthikanti_mfu_from_table5():
    # formulas.md §9 item 3: 175B, B=64 on 64 A100 (312 TFLOP/s), 13.75 s per iteration gives
    # MFU 51.39 % with 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) (non-causal attention).
    model = gpt("175B", 96, 12288, 96)
    f = flops.model_flops_per_step(model, 2048, 64, np.array([8]), causal=False)[0]
    B, s, L, h, V = 64, 2048, 96, 12288, 51200
    closed_form = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert f == pytest.approx(closed_form, rel=1e-12)
    assert f / (13.75 * 64 * 312e12) == pytest.approx(0.5139, abs=5e-5)


def test_collective_costs_by_hand(h100):
    links = Links.of(h100)
    # busbw = link rate x the profile's (calibrated) efficiency: NVLink 450 GB/s, NIC 50 GB/s.
    nvl, ib = 450e9 * h100.efficiency.nvlink, 50e9 * h100.efficiency.network
    # TP all-reduce of 100 MB among 8 GPUs of one node: 2*(7/8)*S/B_nvl + 10 us.
    t = collective_time("all_reduce", np.array([1e8]), np.array([8]), np.array([1]), links)[0]
    assert t == pytest.approx(2 * 7 / 8 * 1e8 / nvl + 10e-6)
    # DP reduce-scatter over 64 ranks, tp=8 so one rank per node on 64 nodes:
    # (63/64)*S/B_ib + 20 us (the inter-node phase alone).
    n_local, n_nodes = placement(np.array([64]), np.array([8]), 8)
    assert (n_local[0], n_nodes[0]) == (1, 64)
    t = collective_time("reduce_scatter", np.array([1e9]), n_local, n_nodes, links)[0]
    assert t == pytest.approx(63 / 64 * 1e9 / ib + 20e-6)
    # 16 ranks at stride 2: 4 per node on 4 nodes: 3/4*S/B_nvl + 3/4*(S/4)/B_ib + both latencies.
    n_local, n_nodes = placement(np.array([16]), np.array([2]), 8)
    assert (n_local[0], n_nodes[0]) == (4, 4)
    t = collective_time("all_gather", np.array([1e9]), n_local, n_nodes, links)[0]
    assert t == pytest.approx(0.75 * 1e9 / nvl + 0.75 * 0.25e9 / ib + 30e-6)


def test_optimizer_bytes_per_param_pass_by_pass():
    from planner.cost.compute import optimizer_bytes_per_param
    # Adam 28 + fp32->16-bit param copy 6 + grad-norm read 4 + zeroing the grad buffer:
    # bf16 with fp32 grads: 28 + 6 + 4 + 4 = 42 B (also the default with no training spec).
    assert optimizer_bytes_per_param(TrainingSpec(seq_length=2048, global_batch_size=8)) == 42
    assert optimizer_bytes_per_param(None) == 42
    # fp16 adds unscale + inf check (read 4, write 4): 42 + 8 = 50 B.
    assert optimizer_bytes_per_param(TrainingSpec(seq_length=2048, global_batch_size=8,
                                                  dtype="fp16")) == 50
    # fp16 with an fp16 grad buffer: zeroing 2 B, copy to fp32 main grads 2 + 4:
    # 28 + 6 + 4 + 2 + 6 + 8 = 54 B; bf16 with 2-byte grads: 28 + 6 + 4 + 2 + 6 = 46 B.
    assert optimizer_bytes_per_param(TrainingSpec(seq_length=2048, global_batch_size=8,
                                                  dtype="fp16", grad_bytes=2)) == 54
    assert optimizer_bytes_per_param(TrainingSpec(seq_length=2048, global_batch_size=8,
                                                  grad_bytes=2)) == 46


def test_implementation_bound_zero3_collectives():
    # DeepSpeed <= 0.4 ZeRO-3 (TrainingSpec.zero3_throughput): each collective takes at least the
    # bytes a GPU receives over that rate. One layout of 8 GPUs (dp = 8, one node) of a model whose
    # per-GPU parameters are P = 1e9: the all-gather of 2P bytes receives 7/8 * 2e9 = 1.75e9 B,
    # at 21e9 B/s = 83.33 ms (NVLink alone: 1.75e9 / (300e9 x 0.627) = 9.3 ms); the
    # gradient reduce-scatter of 2P (grad_bytes 2) the same. Without the rate: link-bound.
    from planner import catalog
    from planner.cost.collectives import Links
    from planner.cost.step import _dp_times
    hw = catalog.resolve_hardware("dgx-a100-80g")
    c = Candidates.from_layouts([Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1)])
    slow = TrainingSpec(seq_length=2048, global_batch_size=8, grad_bytes=2, zero3_throughput=21e9)
    _, _, fwd, bwd = _dp_times(np.array([1e9]), slow, c, Links.of(hw))
    assert fwd[0] == pytest.approx(1.75e9 / 21e9)            # one gather
    assert bwd[0] == pytest.approx(2 * 1.75e9 / 21e9)        # gather + reduce-scatter
    fast = slow.model_copy(update={"zero3_throughput": None})
    _, _, fwd_link, _ = _dp_times(np.array([1e9]), fast, c, Links.of(hw))
    assert fwd_link[0] == pytest.approx(1.75e9 / (300e9 * hw.efficiency.nvlink), rel=0.01)


def test_zero1_zeroes_its_whole_gradient_buffer():
    # ZeRO-1 / distributed optimizer: 1/dp of the parameters updated (42 B each in bf16, zeroing
    # their 4 B grads included) but the full fp32 gradient buffer zeroed on every rank: with
    # P = 8e9 per GPU and dp = 8, 42 * 1e9 + 4 * (8e9 - 1e9) = 70e9 B moved.
    from planner import catalog
    from planner.cost.compute import optimizer_time
    hw = catalog.resolve_hardware("dgx-a100-80g")
    bw = hw.gpu.hbm_bandwidth * hw.efficiency.hbm
    t = optimizer_time(np.array([1e9]), hw, None, np.array([8e9]))
    assert t[0] == pytest.approx(70e9 / bw + hw.efficiency.step_overhead)
    assert optimizer_time(np.array([1e9]), hw)[0] == pytest.approx(42e9 / bw + hw.efficiency.step_overhead)
