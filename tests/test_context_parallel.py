"""Context parallelism and the distributed optimizer in the space and the cost model (issue 4)."""

from __future__ import annotations

import numpy as np
import pytest

from planner import catalog
from planner.cost.collectives import Links
from planner.cost.comm import ring_times
from planner.cost.compute import LayerTimes
from planner.cost.context_parallel import kv_chunk_bytes
from planner.cost.traffic import Elements
from planner.cost.volumes import block_collectives
from planner.cost.step import TIME_TERMS, estimate_layout
from planner.errors import UsageError
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec
from planner.search.whynot import why_not

GIB = 2.0**30


@pytest.fixture(scope="module")
def llama8b():
    return catalog.resolve_model("llama3-8b"), catalog.resolve_hardware("dgx-h100")


def _one(**kw) -> Candidates:
    base = dict(tp=2, pp=1, dp=1, zero_stage=1, micro_batch_size=1, recompute="none",
                sequence_parallel=True, vpp=1)
    return Candidates.from_layouts([Layout(**{**base, **kw})])


def test_kv_chunk_bytes_by_hand(llama8b):
    m, _ = llama8b
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    # Llama-3-8B: 8 KV heads of 128; tp=2 -> 4 KV heads per rank; cp=4 -> 2048 local tokens:
    # X_kv = 2 (K,V) * 2048 * 1 seq * 128 * 4 heads * 2 B = 4,194,304 B
    assert kv_chunk_bytes(m, tr, _one(cp=4))[0] == 4_194_304
    # tp=16 > g=8: one KV head per rank (replicated), 2 * 2048 * 128 * 1 * 2 = 1,048,576 B
    assert kv_chunk_bytes(m, tr, _one(cp=4, tp=16))[0] == 1_048_576


def test_ring_exposed_time_by_hand(llama8b):
    m, hw = llama8b
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    links = Links.of(hw)

    def ring(c, attention):
        zero = np.zeros(1)
        layer = LayerTimes(zero, np.array([attention]), np.array([attention]), zero, 0.5)
        exposed, link = ring_times(c, block_collectives(m, tr, c, Elements.of(tr))["attention"], links, layer)
        return float(exposed[0]), float(link[0])

    c = _one(cp=4)  # tp*cp = 8 <= 8 GPUs per node: the ring stays on NVLink
    t = links.intra_latency + 4_194_304 / links.intra_bw
    # no attention to hide behind: forward 3 steps of one X_kv, backward 3 steps of two (K/V
    # and its gradient): 3t + 6t exposed, all of it on the link
    assert ring(c, 0.0) == pytest.approx((9 * t, 9 * t))
    # attention per step (attention/cp) longer than the transfers: nothing exposed
    assert ring(c, 4 * 2 * t) == pytest.approx((0.0, 9 * t))
    # tp=8, cp=4 spans 4 nodes: the ring runs on the NIC share
    c = _one(cp=4, tp=8)
    t_ib = links.inter_latency + kv_chunk_bytes(m, tr, c)[0] / links.inter_bw
    assert ring(c, 0.0)[0] == pytest.approx(9 * t_ib)


def test_cp_shrinks_tokens_like_a_smaller_micro_batch(llama8b):
    """cp=2 with mbs=2 on dp=d has the per-GPU tokens (s*2/2) and the micro-batch count
    (B/(d*2)) of cp=1, mbs=1 on dp=2d, and the same sharding group (d*cp = 2d): equal compute,
    activations and model states; CP adds only its ring and receive buffers."""
    m, hw = llama8b
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    with_cp = estimate_layout(m, hw, tr, Layout(tp=2, cp=2, pp=2, dp=2, zero_stage=1,
                                                micro_batch_size=2, sequence_parallel=True))
    without = estimate_layout(m, hw, tr, Layout(tp=2, pp=2, dp=4, zero_stage=1,
                                                micro_batch_size=1, sequence_parallel=True))
    for key in ("weights", "gradients", "optimizer", "activations"):
        assert with_cp.memory[key][0] == pytest.approx(without.memory[key][0], rel=1e-12), key
    for key in ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "optimizer"):
        assert with_cp.time[key][0] == pytest.approx(without.time[key][0], rel=1e-12), key
    assert without.time["cp_comm"][0] == 0
    ring = 2 * kv_chunk_bytes(m, tr, with_cp.candidates)[0]  # 2 * (2*4096*2*128*4*2) = 33.5 MB
    assert ring == 2 * 2 * 4096 * 2 * 128 * 4 * 2
    assert with_cp.memory["other"][0] - without.memory["other"][0] == pytest.approx(ring)
    assert sum(with_cp.time[t][0] for t in TIME_TERMS) == pytest.approx(with_cp.time["step"][0])
    assert with_cp.candidates.layout(0).gpus == 16 == 2 * 2 * 2 * 2


def test_long_context_needs_cp():
    """Llama 3 405B at 128K tokens per sequence, 128 sequences (16.8M tokens) per step on
    16,384 H100s. The Llama 3 paper (§3.3.2, Table 4) ran it with tp=8, cp=16, pp=16, dp=8 and
    126 layers split 7 + 14 x 8 + 7. Without CP, dp >= 16384 / (8 * 16) = 128 leaves one
    micro-batch per step and a pipeline that is mostly bubble; with CP the winner uses tp=8,
    cp=16; pinning the paper's tp and pp, the best completion is the paper's layout."""
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=131072, global_batch_size=128)
    no_cp = search(m, hw, tr, 16384, SearchOptions(max_cp=1)).ranked
    best = search(m, hw, tr, 16384).ranked
    assert (best.candidates.layout(0).tp, best.candidates.layout(0).cp) == (8, 16)
    # calibrated H100 profile: ~1.06M vs ~0.11M tokens/s; the bubble alone makes it several-fold
    assert best.throughput["tokens_per_s"][0] > 5 * no_cp.throughput["tokens_per_s"][0]
    paper = search(m, hw, tr, 16384, SearchOptions(tp=8, pp=16)).ranked.candidates.layout(0)
    assert (paper.cp, paper.dp) == (16, 8)
    assert (paper.first_stage_layers, paper.last_stage_layers) == (7, 7)


def test_cp_rules(llama8b):
    m, hw = llama8b
    # 3004 = 4 * 751: divisible by 2*cp for cp = 2 only
    tr = TrainingSpec(seq_length=3004, global_batch_size=64)
    v = why_not(m, hw, tr, 64, SearchOptions(), "cp=4,sp=0")
    assert v.status == "invalid" and v.reasons == ["seq_length divisible by 2*cp"]
    assert why_not(m, hw, tr, 64, SearchOptions(), "cp=2,sp=0").status in ("winner", "slower")
    no_flash = TrainingSpec(seq_length=4096, global_batch_size=64, flash_attention=False)
    v = why_not(m, hw, no_flash, 64, SearchOptions(), "cp=2")
    assert v.reasons == ["context parallel needs flash attention"]


def test_distributed_optimizer_costs_like_zero1(llama8b):
    m, hw = llama8b
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    dist = estimate_layout(m, hw, tr, Layout(tp=2, pp=2, dp=16, zero_stage=0, micro_batch_size=1,
                                             distributed_optimizer=True))
    zero1 = estimate_layout(m, hw, tr, Layout(tp=2, pp=2, dp=16, zero_stage=1, micro_batch_size=1))
    ddp = estimate_layout(m, hw, tr, Layout(tp=2, pp=2, dp=16, zero_stage=0, micro_batch_size=1))
    for group in ("memory", "time"):
        for key, v in getattr(zero1, group).items():
            assert getattr(dist, group)[key][0] == v[0], key
    # 18 B/param without sharding vs 2 + 4 + 12/16 = 6.75 B/param: the optimizer states shrink 16x
    assert ddp.memory["optimizer"][0] / dist.memory["optimizer"][0] == pytest.approx(16)
    assert dist.candidates.layout(0).distributed_optimizer
    v = why_not(m, hw, tr, 64, SearchOptions(), "distopt=1,zero=2")
    assert v.reasons == ["distributed optimizer replaces ZeRO (zero_stage 0 only)"]
    res = search(m, hw, tr, 64, SearchOptions(distributed_optimizer=True))
    lay = res.ranked.candidates.layout(0)
    assert lay.distributed_optimizer and lay.zero_stage == 0


def test_layout_defaults_keep_old_plans_valid():
    lay = Layout(tp=4, pp=2, dp=8, zero_stage=1, micro_batch_size=1)
    assert (lay.cp, lay.distributed_optimizer, lay.gpus) == (1, False, 64)
    assert "cp=" not in lay.short() and "distopt" not in lay.short()
    assert Layout(tp=4, cp=2, pp=2, dp=8, zero_stage=1, micro_batch_size=1).gpus == 128


def _plan(**layout):
    from planner import __version__
    from planner.plan import Plan
    m = catalog.resolve_model("llama3-8b")
    lay = Layout(**{**dict(tp=2, pp=2, dp=2, zero_stage=0, micro_batch_size=1), **layout})
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware("dgx-h100"),
                gpus=lay.gpus, training=TrainingSpec(seq_length=8192, global_batch_size=64),
                layout=lay)


def test_exports_carry_cp_and_the_distributed_optimizer():
    from planner.frameworks import export_plan
    from planner.frameworks.megatron import megatron_args
    from planner.frameworks.nemo import nemo_fields
    from planner.frameworks.torchtitan import torchtitan_settings
    plan = _plan(cp=4, distributed_optimizer=True)  # 2 * 4 * 2 * 2 = 32 GPUs
    args = dict(megatron_args(plan))
    assert args["--context-parallel-size"] == "4" and "--use-distributed-optimizer" in args
    nemo = nemo_fields(plan)
    assert nemo["model"]["context_parallel_size"] == 4 and nemo["ddp"]["use_distributed_optimizer"]
    par = torchtitan_settings(plan, "overrides")[0]["parallelism"]
    assert par["context_parallel_degree"] == 4 and par["data_parallel_shard_degree"] == 2
    with pytest.raises(UsageError, match="DeepSpeed has no Megatron-style context parallelism"):
        export_plan(plan, "deepspeed", "overrides")
    # the distributed optimizer is Megatron's: DeepSpeed's rules refuse it, its ZeRO-1 exports
    with pytest.raises(UsageError, match="DeepSpeed has no distributed optimizer"):
        export_plan(_plan(distributed_optimizer=True), "deepspeed", "overrides")
    assert '"stage": 1' in export_plan(_plan(zero_stage=1), "deepspeed", "overrides").text


def test_placement_with_cp():
    from planner.placement import summary
    s = summary(_plan(cp=4))  # tp=2, cp=4, dp=2, pp=2 on 32 GPUs: rank = i_tp + 2*(i_cp + 4*(i_dp + 2*i_pp))
    assert s["dims"]["cp"]["examples"][0] == [0, 2, 4, 6]  # stride tp = 2, inside node 0
    assert s["dims"]["dp"]["examples"][0] == [0, 8]  # stride tp*cp = 8: two nodes
    assert s["dims"]["pp"]["examples"][0] == [0, 16]  # stride tp*cp*dp = 16
    assert all(v["agrees"] for v in s["cost_model"].values())
