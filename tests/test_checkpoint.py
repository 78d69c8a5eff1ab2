"""Checkpoint size per rank and in all (planner.cost.checkpoint, formulas.md 12.1-12.2): hand
counts, published checkpoint sizes, and the invariant that the ranks together write the
unsharded state exactly once."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import catalog
from planner.cost.checkpoint import (checkpoint_sizes, evaluate_checkpoint, megatron_format,
                                     rank_bytes, stage_bytes)
from planner.cost.model_flops import padded_vocab
from planner.cost.model_counts import mtp_params, total_params
from planner.cost.step import estimate_layout
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import ModelSpec, TrainingSpec

TB, TIB, GIB = 1e12, 2.0**40, 2.0**30
TRAINING = TrainingSpec(seq_length=2048, global_batch_size=1536)


def unique_state(model: ModelSpec, tp: int) -> float:
    """14 B x the model's parameters counted once (model_counts, not the per-rank split), with
    Megatron's vocabulary padded to a multiple of 128*tp (embedding, and output layer if untied)."""
    pad = int(padded_vocab(model.vocab_size, tp)) - model.vocab_size
    return 14.0 * (total_params(model) + pad * model.hidden_size * (1 if model.tie_embeddings else 2))


def test_gpt3_175b_distributed_optimizer_total_and_per_rank():
    """GPT-3 175B, tp=8 pp=8 dp=8, distributed optimizer. h = 12288, 96 layers, V = 50257 padded
    to 51,200 (a multiple of 128*8), learned positions 2048, LayerNorm, biases, tied.
    Layer: 12h^2 + 13h = 1,811,939,328 + 159,744 = 1,812,099,072; 96 layers 173,961,510,912;
    embedding 51,200*12,288 = 629,145,600; positions 2048*12,288 = 25,165,824; final norm 2h =
    24,576. P = 174,615,846,912; 14 B x P = 2,444,621,856,768 B, to the byte.
    Per rank: TP-sharded per layer per GPU (12h^2 + 7h)/8 = 226,503,168, TP replicas 6h =
    73,728 per layer. Pipeline rank 0 (12 layers + embedding): sharded 12 x 226,503,168 +
    629,145,600/8 = 2,796,681,216, replicas 12 x 73,728 + 25,165,824 = 26,050,560; over the
    dp*cp = 8 GPUs that share it: TP rank 0 14 x 2,822,731,776/8 = 4,939,780,608 B, the others
    14 x 2,796,681,216/8 = 4,894,192,128 B. The last rank holds no output layer (tied: a replica
    of the embedding): 14 x (12 x (226,503,168 + 73,728) + 24,576)/8 = 4,758,157,824 B."""
    m = catalog.resolve_model("gpt3-175b")
    lay = Layout(tp=8, pp=8, dp=8, zero_stage=0, distributed_optimizer=True, micro_batch_size=1)
    c = Candidates.from_layouts([lay])
    sizes = checkpoint_sizes(m, TRAINING, c)
    assert sizes["total_bytes"][0] == 2_444_621_856_768 == unique_state(m, 8)
    assert megatron_format(TRAINING).bytes_per_param == 14  # 2 bf16 + 4 fp32 main + 4 + 4 Adam
    assert rank_bytes(m, c, 0, 0, training=TRAINING)[0] == 4_939_780_608
    assert rank_bytes(m, c, 0, 3, training=TRAINING)[0] == 4_894_192_128
    assert rank_bytes(m, c, 7, 0, training=TRAINING)[0] == 4_758_157_824
    assert sizes["largest_rank_bytes"][0] == 4_939_780_608 and sizes["largest_stage"][0] == 0
    # per-rank bytes = the pipeline rank's state over its sharding group (8 TP x 8 dp*cp GPUs)
    stage0 = stage_bytes(m, c, 0, training=TRAINING)[0]
    assert stage0 == 14 * (8 * 2_796_681_216 + 26_050_560)


def test_every_zero_stage_writes_the_same_bytes():
    """The checkpoint holds the same tensors whatever shards them in memory (frameworks_
    checkpoints.md 3.1): ZeRO 0-3 and the distributed optimizer write the same per rank."""
    m = catalog.resolve_model("llama3-8b")
    layouts = [Layout(tp=2, pp=2, dp=4, zero_stage=z, micro_batch_size=1) for z in range(4)]
    layouts.append(Layout(tp=2, pp=2, dp=4, zero_stage=0, distributed_optimizer=True,
                          micro_batch_size=1))
    c = Candidates.from_layouts(layouts)
    sizes = checkpoint_sizes(m, TRAINING, c)
    assert len(set(sizes["total_bytes"].tolist())) == 1
    assert len(set(sizes["largest_rank_bytes"].tolist())) == 1


@st.composite
def model_and_layout(draw):
    """A dense model and a layout of it: heads and KV heads divisible by tp (space.HEADS_RULE),
    an even or uneven pipeline split, cp, dp, any ZeRO stage or the distributed optimizer."""
    tp = draw(st.sampled_from([1, 2, 4]))
    g = tp * draw(st.sampled_from([1, 2]))
    a = g * draw(st.sampled_from([1, 2, 4]))
    d = draw(st.sampled_from([8, 16]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    uneven = pp > 2 and draw(st.booleans())
    per = draw(st.integers(1, 3))
    first = last = 0
    layers = pp * per
    if uneven:
        first, last = draw(st.integers(1, per)), draw(st.integers(1, per))
        layers = first + last + (pp - 2) * per
    swiglu = draw(st.booleans())
    model = ModelSpec(
        name="m", source="test", num_layers=layers, hidden_size=a * d, num_attention_heads=a,
        num_kv_heads=g, ffn_hidden_size=draw(st.integers(1, 8)) * 16,
        vocab_size=draw(st.integers(100, 5000)), activation="swiglu" if swiglu else "gelu",
        norm="rmsnorm" if swiglu else "layernorm", bias=draw(st.booleans()),
        tie_embeddings=draw(st.booleans()),
        position_embedding=draw(st.sampled_from(["learned", "rope"])),
        max_position_embeddings=128, training={"seq_length": 128, "global_batch_size": 8})
    zero = draw(st.integers(0, 3))
    lay = Layout(tp=tp, pp=pp, dp=draw(st.sampled_from([1, 2, 3])),
                 cp=draw(st.sampled_from([1, 2])), zero_stage=zero, micro_batch_size=1,
                 distributed_optimizer=zero == 0 and draw(st.booleans()),
                 first_stage_layers=first, last_stage_layers=last)
    return model, lay


@settings(max_examples=60, deadline=None)
@given(model_and_layout())
def test_ranks_write_the_unsharded_state_exactly_once(case):
    """Summed over every GPU (each pipeline rank, each TP rank, each of the dp*cp GPUs sharing
    its writes), the bytes equal 14 B x the model's parameters counted once: no replica (TP
    replicas, the tied output-layer copy, DP/CP replicas) twice, nothing missing. The sum of the
    pipeline ranks' totals and checkpoint_sizes' total agree, and the largest GPU is TP rank 0
    of some pipeline rank."""
    model, lay = case
    c = Candidates.from_layouts([lay])
    share = lay.dp * lay.cp  # GPUs of one (pp, tp) coordinate, each writing 1/share
    every_gpu = sum(float(rank_bytes(model, c, r, t, training=TRAINING)[0]) * share
                    for r in range(lay.pp) for t in range(lay.tp))
    want = unique_state(model, lay.tp)
    assert every_gpu == pytest.approx(want, rel=1e-12)
    stages = sum(float(stage_bytes(model, c, r, training=TRAINING)[0]) for r in range(lay.pp))
    assert stages == pytest.approx(want, rel=1e-12)
    sizes = checkpoint_sizes(model, TRAINING, c)
    assert sizes["total_bytes"][0] == pytest.approx(want, rel=1e-12)
    per_gpu = [float(rank_bytes(model, c, r, t, training=TRAINING)[0])
               for r in range(lay.pp) for t in range(lay.tp)]
    assert sizes["largest_rank_bytes"][0] == pytest.approx(max(per_gpu), rel=1e-12)


def test_bloom_176b_published_checkpoint_size():
    """BLOOM-176B (TP 4, PP 12 as 5 + 6 x 10 + 5 layers, DP 8): "each checkpoint with fp32 optim
    states and bf16+fp32 weights is 2.3TB - just the bf16 weights are 329GB" (bigscience
    train/tr11-176B-ml/README.md). 14 B x 176.25e9 = 2.4675e12 B = 2.244 TiB, which `du -h`
    (binary units, rounded up) prints as 2.3T; 2 B x 176.25e9 = 352.5e9 B = 328.3 GiB -> 329G."""
    m = catalog.resolve_model("bloom-176b")
    lay = Layout(tp=4, pp=12, dp=8, zero_stage=1, micro_batch_size=2, first_stage_layers=5,
                 last_stage_layers=5)
    c = Candidates.from_layouts([lay])
    total = float(checkpoint_sizes(m, TRAINING, c)["total_bytes"][0])
    assert math.ceil(total / TIB * 10) / 10 == 2.3
    assert math.ceil(total / 14 * 2 / GIB) == 329


def test_megatron_1t_published_checkpoint_size_and_save_time():
    """Narayanan et al. 2021 Sec. 5.10: the 1T model (t = 8, p = 64 on 3,072 A100) "has a
    checkpoint of size 13.8 terabytes", written at 273 GB/s (40% of the file system's peak),
    about 50.5 s. 14 B x 1.0081e12 (V = 51,200, no padding at t = 8) = 14.11 TB, 2.3% above (13.7 B
    per parameter measured); a synchronous save bound by 273 GB/s aggregate takes 51.7 s."""
    m = catalog.resolve_model("megatron-1t")
    hw = catalog.resolve_hardware("dgx-a100-80g")  # storage.aggregate write: 273 GB/s
    tr = TrainingSpec(seq_length=2048, global_batch_size=3072)
    tr = tr.model_copy(update={"checkpoint": tr.checkpoint.model_copy(update={"async_save": False})})
    lay = Layout(tp=8, pp=64, dp=6, zero_stage=1, micro_batch_size=1)
    est = estimate_layout(m, hw, tr, lay)
    ck = evaluate_checkpoint(m, hw, tr, est.candidates, est.time["step"]).to_dict(0)
    assert ck["total_bytes"] == pytest.approx(13.8e12, rel=0.03)
    assert ck["write_s"] == pytest.approx(13.8e12 / 273e9, rel=0.03)
    assert ck["blocking_s"] == ck["write_s"]  # synchronous: the whole write stalls training


@pytest.mark.parametrize("name, lay", [
    ("qwen3-30b-a3b", dict(tp=2, pp=2, dp=8, ep=8, etp=1, sequence_parallel=True)),
    ("mixtral-8x7b", dict(tp=2, pp=1, dp=4, ep=4, etp=2, sequence_parallel=True)),
    ("deepseek-v3", dict(tp=2, pp=8, dp=64, ep=64, etp=1, sequence_parallel=True,
                         first_stage_layers=5, last_stage_layers=8)),  # dense layers and MTP
    ("gpt-oss-20b", dict(tp=1, pp=1, cp=2, dp=4, ep=8, etp=1)),
])
def test_moe_checkpoints_hold_every_expert_once(name, lay):
    """Experts are written too: each GPU writes its E*P_e/(ep*etp) expert parameters' share over
    the expert-data-parallel group (edp = tp*cp*dp/(ep*etp)); summed over every GPU the bytes are
    14 B x the model's parameters counted once, experts, dense layers and MTP included."""
    model = catalog.resolve_model(name)
    layout = Layout(**{"zero_stage": 1, "micro_batch_size": 1, **lay})
    c = Candidates.from_layouts([layout])
    share = layout.dp * layout.cp
    every_gpu = sum(float(rank_bytes(model, c, r, t, training=TRAINING)[0]) * share
                    for r in range(layout.pp) for t in range(layout.tp))
    # + the MTP modules' own weights (DeepSeek-V3: 11.61B; their embedding and output layer are
    # the main model's, Megatron-Core shares them)
    want = unique_state(model, layout.tp) + 14.0 * mtp_params(model)
    assert every_gpu == pytest.approx(want, rel=1e-12)
    assert checkpoint_sizes(model, TRAINING, c)["total_bytes"][0] == pytest.approx(every_gpu, rel=1e-12)


def test_torchtitan_checkpoint_holds_12_bytes_per_parameter():
    """torchtitan trains fp32 parameters that are their own master (framework profile
    memory.param_bytes 4, master_weights false): its DCP holds 4 + Adam's 4 + 4 = 12 B per
    parameter, the state the memory model holds, not Megatron's 2 + 4 + 8 = 14."""
    from planner.frameworks.profile import resolve_training
    model = catalog.resolve_model("llama3-8b")
    training = resolve_training(TRAINING, catalog.resolve_framework("torchtitan"))
    fmt = megatron_format(training)
    assert (fmt.name, fmt.bytes_per_param) == ("torchtitan DCP", 12.0)
    c = Candidates.from_layouts([Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1)])
    want = 12.0 * (total_params(model) + (int(padded_vocab(model.vocab_size, 1)) - model.vocab_size)
                   * model.hidden_size * 2)
    assert checkpoint_sizes(model, training, c)["total_bytes"][0] == pytest.approx(want, rel=1e-12)
