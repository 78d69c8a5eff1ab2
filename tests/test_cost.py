"""Cost-model unit tests against hand-computed values and the test vectors of formulas.md §9."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import memory, pipeline
from planner.cost.model_flops import model_flops_per_step
from planner.cost.collectives import Links, collective_time, group_span
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec

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
    layers = pipeline.inflight_layers(cands(pp=p, vpp=v), L, m, 0)
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
    c = cands(tp=8, pp=p)
    per_gpu = float(memory.rank_params(model, c, memory.rank_index(c, "middle"))["dense"][0])
    assert per_gpu == pytest.approx(L / p * ((12 * h * h + 7 * h) / 8 + 6 * h), rel=1e-15)
    training = TrainingSpec(seq_length=2048, global_batch_size=8)
    states = memory.model_state_bytes(np.array([per_gpu]), cands(), training)
    total = sum(states.values())[0] / GIB
    # Replicated norms and row-parallel biases (6h, not 6h/t) add 0.03-0.08 %: 22B 45.596 GiB.
    assert total == pytest.approx(published_gib, rel=1e-3)


def test_bytes_per_parameter_by_zero_stage():
    # bf16 weights 2 B, fp32 main grads 4 B, Adam 12 B; n = dp = 8 (formulas.md 2.1):
    # ZeRO-0 18, ZeRO-1 2+4+12/8 = 7.5, ZeRO-2 2+(4+12)/8 = 4, ZeRO-3 18/8 = 2.25 B/param.
    training = TrainingSpec(seq_length=2048, global_batch_size=8)
    params = np.full(4, 1e9)
    c = Candidates.from_layouts([Layout(tp=1, pp=1, dp=8, zero_stage=z, micro_batch_size=1)
                                 for z in range(4)])
    states = memory.model_state_bytes(params, c, training)
    total = states["weights"] + states["gradients"] + states["optimizer"]
    np.testing.assert_allclose(total / 1e9, [18, 7.5, 4, 2.25])
    bf16_grads = TrainingSpec(seq_length=2048, global_batch_size=8, grad_bytes=2)
    states = memory.model_state_bytes(params[:1], c.take(np.array([0])), bf16_grads)
    # ZeRO-2 over dp = 4 x cp = 2: the gradient group is dp*cp = 8 ranks, as with dp = 8
    cp2 = Candidates.from_layouts([Layout(tp=1, pp=1, dp=4, cp=2, zero_stage=2, micro_batch_size=1)])
    assert sum(memory.model_state_bytes(params[:1], cp2, training).values())[0] / 1e9 == 4
    assert sum(states.values())[0] / 1e9 == 16  # the ZeRO paper's 2 + 2 + 12


def test_inflight_layers_1f1b_and_interleaved():
    # 1F1B: rank r holds min(p - r, m) micro-batches of L/p layers; L = 96, p = 8.
    c = cands(pp=8)
    for m, rank, want in ((64, 0, 96), (64, 7, 12), (3, 0, 36)):  # 8*12, 1*12, min(8, 3)*12
        assert float(pipeline.inflight_layers(c, 96, m, rank)[0]) == want
    # Interleaved, v = 3: rank 0 holds L*(1 + (p-1)/(p*v)) = 96*(1 + 7/24) = 124 layers;
    # the last rank ((v-1)*p + 1) chunks of L/(p*v) = 4 layers = 17*4 = 68.
    c = cands(pp=8, vpp=3)
    assert [float(pipeline.inflight_layers(c, 96, 64, r)[0]) for r in (0, 7)] == [124, 68]


def test_inflight_layers_of_the_embedding_and_loss_split():
    # 14 layers on pp 4, vpp 2, 3 + 4 + 4 + 3: (14 + 2)/8 = 2 layers' worth per chunk, the
    # embedding in rank 0's chunk 0 and the loss in rank 3's chunk 1: rank 0 holds [1, 2]
    # layers, rank 3 [2, 1]. Forward k runs chunk (k // 4) % 2. m = 8 micro-batches.
    c = cands(pp=4, vpp=2, first_stage_layers=3, last_stage_layers=3)
    # rank 3: 2*0 + 4 + 1 = 5 forwards held: 4 of chunk 0 (2 layers) + 1 of chunk 1 (1) = 9
    assert float(pipeline.inflight_layers(c, 14, 8, 3)[0]) == 9
    # rank 0: 2*3 + 4 + 1 = 11 forwards: chunks 0,0,0,0,1,1,1,1,0,0,0 = 7 x 1 + 4 x 2 = 15
    assert float(pipeline.inflight_layers(c, 14, 8, 0)[0]) == 15
    # a middle rank: 2*2 + 5 = 9 forwards of 2 layers
    assert float(pipeline.inflight_layers(c, 14, 8, 1)[0]) == 18
    # the chunk-0 forwards held on rank 0 (the embedding's inputs): 4 + 3 = 7
    assert float(pipeline.inflight_first_chunk(c, 8, 0)[0]) == 7


def test_inflight_layers_with_the_embedding_alone_in_a_chunk():
    # Meta's Llama 3 405B split (arXiv 2407.21783 §3.3.2): 126 layers on pp 16, vpp 8, 7 + 14 x 8
    # + 7, (126 + 2)/128 = 1 layer's worth per chunk: rank 0's chunk 0 holds the embedding alone.
    c = cands(pp=16, vpp=8, first_stage_layers=7, last_stage_layers=7)
    # m = 16 = p: warm-up 2*15 + 7*16 = 142 >= m*v = 128, so all 128 forwards are held; the 16
    # of chunk 0 hold no transformer layer: 112 layers on rank 0, 128 on rank 1 (8 chunks of 1)
    assert float(pipeline.inflight_layers(c, 126, 16, 0)[0]) == 112
    assert float(pipeline.inflight_layers(c, 126, 16, 1)[0]) == 128
    # m = 64: rank 1 holds 2*14 + 7*16 + 1 = 141 forwards of one layer each
    assert float(pipeline.inflight_layers(c, 126, 64, 1)[0]) == 141


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
        per_token = model_flops_per_step(m, 8192, 1, np.array([1]))[0] / 8192
        assert per_token / 1e9 == pytest.approx(gflops, abs=0.005)


def test_korthikanti_mfu_from_table5():
    # formulas.md §9 item 3: 175B, B=64 on 64 A100 (312 TFLOP/s), 13.75 s per iteration gives
    # MFU 51.39 % with 72*B*s*L*h^2*(1 + s/(6h) + V/(12*L*h)) (non-causal attention).
    model = gpt("175B", 96, 12288, 96)
    f = model_flops_per_step(model, 2048, 64, np.array([8]), causal=False)[0]
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
    n_local, n_nodes = group_span(np.array([64]), np.array([8]), 8)
    assert (n_local[0], n_nodes[0]) == (1, 64)
    t = collective_time("reduce_scatter", np.array([1e9]), n_local, n_nodes, links)[0]
    assert t == pytest.approx(63 / 64 * 1e9 / ib + 20e-6)
    # 16 ranks at stride 2: 4 per node on 4 nodes: 3/4*S/B_nvl + 3/4*(S/4)/B_ib + both latencies.
    n_local, n_nodes = group_span(np.array([16]), np.array([2]), 8)
    assert (n_local[0], n_nodes[0]) == (4, 4)
    t = collective_time("all_gather", np.array([1e9]), n_local, n_nodes, links)[0]
    assert t == pytest.approx(0.75 * 1e9 / nvl + 0.75 * 0.25e9 / ib + 30e-6)


def test_group_span_where_groups_sit():
    # tp = 4 on 6-GPU nodes: group [4..7] sits 2 + 2 on two nodes, so the ring is a flat ring on
    # the network (1 rank per node, 4 "nodes"); tp = 2 or 3 divide 6: inside a node.
    assert [tuple(int(v[0]) for v in group_span(np.array([n]), np.array([1]), 6))
            for n in (2, 3, 4, 6, 12)] == [(2, 1), (3, 1), (1, 4), (6, 1), (6, 2)]
    # dp = 8 at stride tp = 2 on 8-GPU nodes: blocks of 16 ranks, 4 per node on 2 nodes
    assert tuple(int(v[0]) for v in group_span(np.array([8]), np.array([2]), 8)) == (4, 2)
    # a group of one rank moves nothing: (1, 1)
    assert tuple(int(v[0]) for v in group_span(np.array([1]), np.array([4]), 8)) == (1, 1)
    # NVL72-style domain of 72 GPUs: tp = 8 inside; 64 ranks at stride 1 straddle 72: flat
    assert tuple(int(v[0]) for v in group_span(np.array([8]), np.array([1]), 72)) == (8, 1)
    assert tuple(int(v[0]) for v in group_span(np.array([64]), np.array([1]), 72)) == (1, 64)


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
    # bytes a GPU receives over that rate. One layout of 8 GPUs (dp = 8, one node); a ZeRO-3
    # all-gather of 2e9 bytes (P = 1e9 per GPU) receives 7/8 * 2e9 = 1.75e9 B, at 21e9 B/s =
    # 83.33 ms (NVLink alone: 1.75e9 / (300e9 x 0.627) = 9.3 ms); the gradient reduce-scatter
    # of 2P (grad_bytes 2) the same. Without the rate: link-bound.
    from planner import catalog
    from planner.cost.comm import _dp_times
    from planner.cost.traffic import Collective
    hw = catalog.resolve_hardware("dgx-a100-80g")
    c = Candidates.from_layouts([Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1)])
    colls = [Collective("dp", "all_gather", "microbatch", "forward", "forward", 1.0, 2e9, "ZeRO-3 x"),
             Collective("dp", "all_gather", "microbatch", "backward", "backward", 1.0, 2e9, "ZeRO-3 x"),
             Collective("dp", "reduce_scatter", "microbatch", "backward", "backward", 1.0, 2e9, "ZeRO-3 x")]
    slow = TrainingSpec(seq_length=2048, global_batch_size=8, grad_bytes=2, zero3_throughput=21e9)
    t = _dp_times(slow, c, Links.of(hw), colls)
    assert t["microbatch", "forward"][0] == pytest.approx(1.75e9 / 21e9)       # one gather
    assert t["microbatch", "backward"][0] == pytest.approx(2 * 1.75e9 / 21e9)  # gather + reduce-scatter
    fast = slow.model_copy(update={"zero3_throughput": None})
    t = _dp_times(fast, c, Links.of(hw), colls)
    assert t["microbatch", "forward"][0] == pytest.approx(1.75e9 / (300e9 * hw.efficiency.nvlink), rel=0.01)


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
