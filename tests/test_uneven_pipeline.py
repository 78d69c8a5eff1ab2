"""Uneven pipeline splits (Megatron's --decoder-first/last-pipeline-num-layers), issue 4."""

from __future__ import annotations

import numpy as np
import pytest

from planner import __version__, catalog
from planner.cost.memory import rank_params, stage_params
from planner.cost.step import TIME_TERMS, estimate_layout
from planner.errors import UsageError
from planner.search.options import SearchOptions
from planner.search.check import check_layout
from planner.search.run import search
from planner.layout import Candidates
from planner.layout.split import default_uneven_split, uneven_splits
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec


def _flag_forms():
    """Megatron-Core's profile with only its two flag forms of an interleaved uneven split
    (--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split):
    a release before --pipeline-model-parallel-layout, or a user who does not write it."""
    p = catalog.resolve_framework("megatron-core")
    return p.model_copy(update={"rules": p.rules.model_copy(update={"uneven_split": "megatron"})})


FLAGS = _flag_forms()


def test_uneven_split_by_hand():
    # 126 layers (Llama-3 405B): middle stages ceil(126/pp), the rest halved between the edges
    # pp=16: 8 each, 126 - 14*8 = 14 -> 7 + 7 (Llama 3 paper §3.3.2: one layer fewer on each edge)
    # pp=8: 16 each, 126 - 96 = 30 -> 15 + 15; pp=4: 32, 62 -> 31 + 31; pp=64: 2, 2 -> 1 + 1;
    # pp=128 > 126 layers: impossible; pp=2 divides 126: even (0, 0)
    got = [default_uneven_split(126, pp) for pp in (16, 8, 4, 64, 128, 2)]
    assert got == [(7, 7), (15, 15), (31, 31), (1, 1), (-1, -1), (0, 0)]
    # odd layers on two stages: 81 -> 40 + 41; 96 layers on 64 stages: 62 * 2 > 96, impossible
    assert default_uneven_split(81, 2) == (40, 41)
    assert default_uneven_split(96, 64) == (-1, -1)


def test_the_search_tries_every_nearby_split_both_ways():
    # 61 layers on pp 8: 6 middle stages of 8 leave 13 for the edges, each 4..8: both directions
    assert uneven_splits(61, 8) == [(5, 8), (6, 7), (7, 6), (8, 5)]
    # 80 layers on pp 8 (even split 10 each): 6 middle stages of 11 leave 14 = 7 + 7; of 12, 8
    # would need an edge of 4 or less below 12: out of range (MAX_EDGE_SHORTFALL = 4)
    assert uneven_splits(80, 8) == [(7, 7)]
    # two stages: no middle, edges within 4 layers of each other
    assert uneven_splits(81, 2) == [(39, 42), (40, 41), (41, 40), (42, 39)]


def test_stage_parameters_by_hand():
    m = catalog.resolve_model("llama3-405b")
    c = Candidates.from_layouts([Layout(tp=8, pp=16, dp=1, zero_stage=1, micro_batch_size=1,
                                        first_stage_layers=7, last_stage_layers=7)])
    layer = float(rank_params(m, c, 1)["layer"][0])  # a middle rank's mean layer
    # (2*16384*128*128 + 2*16384*128*8 + 3*16384*53248)/8 + 2*16384 norms = 398,491,648 per layer
    assert layer == 398_491_648
    # word embedding: V_p = ceil(128256/1024)*1024 = 129,024; 129024 * 16384 / 8 = 264,241,152
    assert stage_params(m, c, "first")[0] == 7 * layer + 264_241_152
    assert stage_params(m, c, "middle")[0] == 8 * layer  # 3,187,933,184: the most per GPU
    assert stage_params(m, c, "last")[0] == 7 * layer + 16_384 + 264_241_152  # final norm, output layer


def test_an_uneven_split_equal_to_the_even_one_costs_the_same():
    """96 layers on pp=8 given as 12 + 6 x 12 + 12 is the even split: every number must match."""
    m, hw = catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=2048, global_batch_size=1536)
    base = dict(tp=8, pp=8, dp=8, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    even = estimate_layout(m, hw, tr, Layout(**base))
    given = estimate_layout(m, hw, tr, Layout(**base, first_stage_layers=12, last_stage_layers=12))
    for group in ("memory", "time", "throughput"):
        for key, v in getattr(even, group).items():
            assert getattr(given, group)[key][0] == pytest.approx(v[0], rel=1e-12), key


def test_uneven_step_and_memory():
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=2048)
    est = estimate_layout(m, hw, tr, Layout(tp=8, pp=16, dp=128, zero_stage=1, micro_batch_size=1,
                                            sequence_parallel=True, recompute="full",
                                            first_stage_layers=7, last_stage_layers=7))
    assert sum(est.time[t][0] for t in TIME_TERMS) == pytest.approx(est.time["step"][0], rel=1e-12)
    assert est.memory["peak_stage"][0] == 1  # the 8-layer middle rank, not an edge
    # the same on 14 even stages of 9 layers holds more per GPU and runs longer per micro-batch
    even = estimate_layout(m, hw, tr, Layout(tp=8, pp=14, dp=128, zero_stage=1, micro_batch_size=1,
                                             sequence_parallel=True, recompute="full"))
    assert est.memory["total"][0] < even.memory["total"][0]
    assert est.time["compute"][0] < even.time["compute"][0]


def test_rules_and_hints():
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=2048)
    with pytest.raises(UsageError, match="--first-stage-layers 7 --last-stage-layers 7"):
        check_layout(m, hw, tr, 16384, dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1), framework=FLAGS)
    for bad in (dict(first_stage_layers=5, last_stage_layers=7),  # 114 on 14 stages: not whole
                # interleaved: 7 is not divisible by 3, nor is (126 + 2) by 16*3
                dict(first_stage_layers=7, last_stage_layers=7, vpp=3)):
        with pytest.raises(UsageError, match="uneven pipeline split"):
            check_layout(m, hw, tr, 16384, dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, **bad), framework=FLAGS)
    # pp=64: 1 + 62*2 + 1 = (126 + 2)/64 = 2 layers' worth per rank: vpp 4 would need half a
    # layer per chunk; vpp 2 is the embedding-and-loss form with the embedding alone in rank 0's
    # first chunk (Megatron-Core builds a chunk of 0 transformer layers there:
    # get_num_layers_to_build asserts >= 0, transformer_block.py @d98e8a64)
    with pytest.raises(UsageError, match="uneven pipeline split"):
        check_layout(m, hw, tr, 16384, dict(tp=8, pp=64, zero_stage=1, micro_batch_size=1, vpp=4,
                                            first_stage_layers=1, last_stage_layers=1), framework=FLAGS)
    check_layout(m, hw, tr, 16384, dict(tp=8, pp=64, zero_stage=1, micro_batch_size=1, vpp=2,
                                        first_stage_layers=1, last_stage_layers=1), framework=FLAGS)
    # embedding and loss counted as layers: (126 + 2)/16 = 8 per rank, 8/vpp per chunk; vpp 8
    # leaves the embedding alone in the first chunk and the loss alone in the last: Meta's split
    # of Llama 3 405B (arXiv 2407.21783 §3.3.2)
    for vpp in (2, 4, 8):
        check_layout(m, hw, tr, 16384, dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, vpp=vpp,
                                            first_stage_layers=7, last_stage_layers=7), framework=FLAGS)
    with pytest.raises(UsageError, match="--first-stage-layers 7 --last-stage-layers 7"):
        check_layout(m, hw, tr, 16384, dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, vpp=4), framework=FLAGS)
    with pytest.raises(UsageError, match="--first-stage-layers 7 --last-stage-layers 7"):
        check_layout(m, hw, tr, 16384, dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, vpp=8), framework=FLAGS)
    for vpp in (3, 5):  # no split helps: (126 + 2) is not divisible by 16*3 or 16*5
        with pytest.raises(UsageError, match=r"layers divisible by pp\*vpp$"):
            check_layout(m, hw, tr, 16384, dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, vpp=vpp), framework=FLAGS)
    lay = search(m, hw, tr, 16384, SearchOptions(tp=8, pp=16, max_cp=1, framework=FLAGS)).ranked.candidates.layout(0)
    assert (lay.first_stage_layers, lay.last_stage_layers) == (7, 7)


def test_exports_of_an_uneven_split():
    from planner.frameworks import export_plan
    from planner.frameworks.megatron import megatron_args
    from planner.frameworks.torchtitan import torchtitan_settings
    m = catalog.resolve_model("llama3-405b")
    lay = Layout(tp=8, pp=16, dp=128, zero_stage=1, micro_batch_size=1, first_stage_layers=7,
                 last_stage_layers=7)
    plan = Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware("dgx-h100"),
                gpus=16384, training=TrainingSpec(seq_length=8192, global_batch_size=2048), layout=lay)
    args = dict(megatron_args(plan))
    assert args["--decoder-first-pipeline-num-layers"] == "7"
    assert args["--decoder-last-pipeline-num-layers"] == "7"
    par = torchtitan_settings(plan, "overrides")[0]["parallelism"]
    assert (par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (8, 1, 1)
    # Megatron-Bridge: the same TransformerConfig fields (translate_mlm_to_bridge.py maps
    # model.num_layers_in_first/last_pipeline_stage to those two flags)
    from planner.frameworks.nemo import nemo_fields
    model = nemo_fields(plan)["model"]
    assert (model["num_layers_in_first_pipeline_stage"], model["num_layers_in_last_pipeline_stage"]) == (7, 7)
    assert "account_for_embedding_in_pipeline_split" not in model
    # DeepSpeed's rules refuse it
    with pytest.raises(UsageError, match="DeepSpeed splits the pipeline evenly only"):
        export_plan(plan, "deepspeed", "overrides")


def test_bridge_writes_the_interleaved_split_forms():
    # 126 layers on pp 16, vpp 2 as 7 + 14 x 8 + 7: (126 + 2) / 16 = 8 = 7 + 1 and 8 divisible by
    # vpp 2, the embedding-and-loss form (Bridge's own Llama 3.1 405B recipe sets the two flags)
    from planner.frameworks.megatron import megatron_args
    from planner.frameworks.nemo import nemo_fields
    m = catalog.resolve_model("llama3-405b")
    lay = Layout(tp=8, pp=16, dp=64, zero_stage=1, micro_batch_size=1, vpp=2, first_stage_layers=7,
                 last_stage_layers=7)
    # 2048 / 64 = 32 micro-batches: pp 16 divides them, no micro-batch group
    plan = Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware("dgx-h100"),
                gpus=8192, training=TrainingSpec(seq_length=8192, global_batch_size=2048), layout=lay)
    model = nemo_fields(plan)["model"]
    assert model["account_for_embedding_in_pipeline_split"] and model["account_for_loss_in_pipeline_split"]
    assert model["virtual_pipeline_model_parallel_size"] == 2
    assert "num_layers_in_first_pipeline_stage" not in model and "microbatch_group_size_per_vp_stage" not in model
    args = dict(megatron_args(plan))
    assert "--account-for-embedding-in-pipeline-split" in args
    # 48 micro-batches (gbs 3072 / dp 64) on pp 16 divide evenly; gbs 2560 gives 40: 40 mod 16 = 8,
    # so the group is the least G >= 16 with 40 mod G = 0 or >= 16: 20 (40 mod 20 = 0)
    plan = plan.model_copy(update={"training": TrainingSpec(seq_length=8192, global_batch_size=2560)})
    assert nemo_fields(plan)["model"]["microbatch_group_size_per_vp_stage"] == 20
    assert dict(megatron_args(plan))["--microbatch-group-size-per-virtual-pipeline-stage"] == "20"
    # every field written is a Megatron-Bridge field (tests/data/megatron_bridge_fields.txt)
    from tests.test_frameworks import BRIDGE, flatten
    for lay in (plan.layout, plan.layout.model_copy(update={"vpp": 1})):
        fields = flatten(nemo_fields(plan.model_copy(update={"layout": lay})))
        assert set(fields) <= BRIDGE, set(fields) - BRIDGE


def _model(layers):
    return catalog.resolve_model("llama3-8b").model_copy(update={"num_layers": layers})


def test_interleaved_uneven_split_each_stage_divisible_by_vpp():
    # Megatron-Core's --decoder-first/last-pipeline-num-layers with vpp: every stage's layer count
    # divisible by vpp. 28 layers on pp=4 as 4 + 10 + 10 + 4: with vpp=2 each stage splits in
    # two chunks (2, 5, 5, 2 layers); 5 + 9 + 9 + 5 does not (5 and 9 are odd, and 5 + 1 != 9)
    m, hw = _model(28), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=4096, global_batch_size=64)
    base = dict(tp=1, pp=4, zero_stage=1, micro_batch_size=1, vpp=2)
    check_layout(m, hw, tr, 8, dict(base, first_stage_layers=4, last_stage_layers=4), framework=FLAGS)
    with pytest.raises(UsageError, match="uneven pipeline split"):
        check_layout(m, hw, tr, 8, dict(base, first_stage_layers=5, last_stage_layers=5), framework=FLAGS)


def test_interleaved_uneven_bubble_follows_the_general_schedule():
    # pipeline.pipeline_time: T = m*t_max + (sum_r t_r - t_max)/vpp over the ranks' per-micro-
    # batch totals (7, 8 x 14, 7 layers here). Those totals are the same with vpp = 4 as with
    # vpp = 1 except the blocking p2p of 1F1B, 2*t_p2p per micro-batch on every rank, which
    # interleaving overlaps (overlap_p2p_comm); so 4 * bubble(vpp 4) = bubble(vpp 1) - 15 * 2 t_p2p,
    # with 2 t_p2p = pp_comm(vpp 1) / m and m = 2048 / 64 = 32.
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=2048)
    base = dict(tp=8, pp=16, dp=64, distributed_optimizer=True, zero_stage=0, micro_batch_size=1,
                sequence_parallel=True, first_stage_layers=7, last_stage_layers=7)
    one = estimate_layout(m, hw, tr, Layout(**base))
    four = estimate_layout(m, hw, tr, Layout(**base, vpp=4))
    expected = one.time["bubble"][0] - 15 * one.time["pp_comm"][0] / 32
    assert 4 * four.time["bubble"][0] == pytest.approx(expected, rel=1e-9)
    assert sum(four.time[t][0] for t in TIME_TERMS) == pytest.approx(four.time["step"][0], rel=1e-12)


def test_exports_of_an_interleaved_uneven_split():
    from planner.frameworks.megatron import megatron_args
    from planner.frameworks.torchtitan import torchtitan_settings

    def plan(model, gpus, **layout):
        return Plan(plan3d_version=__version__, model=model, hardware=catalog.resolve_hardware("dgx-h100"),
                    gpus=gpus, training=TrainingSpec(seq_length=8192, global_batch_size=2048),
                    layout=Layout(zero_stage=1, micro_batch_size=1, **layout))

    # embedding and loss as layers: 126 + 2 = 128 = 16 ranks x 4 chunks x 2
    llama = plan(catalog.resolve_model("llama3-405b"), 16384, tp=8, pp=16, dp=128, vpp=4,
                 first_stage_layers=7, last_stage_layers=7)
    args = dict(megatron_args(llama))
    assert args["--num-virtual-stages-per-pipeline-rank"] == "4"
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    assert not {"--decoder-first-pipeline-num-layers", "--num-layers-per-virtual-pipeline-stage"} & set(args)
    par = torchtitan_settings(llama, "overrides")[0]["parallelism"]
    assert (par["pipeline_parallel_layers_per_stage"], par["pipeline_parallel_first_stage_less_layers"],
            par["pipeline_parallel_last_stage_less_layers"]) == (2, 1, 1)  # 16*4*2 - 2 = 126
    # each stage divisible by vpp: 4 + 10 + 10 + 4 on pp=4, vpp=2
    small = plan(_model(28), 8, tp=1, pp=4, dp=2, vpp=2, first_stage_layers=4, last_stage_layers=4)
    args = dict(megatron_args(small))
    assert (args["--decoder-first-pipeline-num-layers"], args["--decoder-last-pipeline-num-layers"],
            args["--num-virtual-stages-per-pipeline-rank"]) == ("4", "4", "2")
    assert "--account-for-embedding-in-pipeline-split" not in args
    # torchtitan shortens only the first and last virtual stage: its rules refuse this split
    from planner.frameworks import export_plan
    with pytest.raises(UsageError, match="only as one layer less on the first and last stage"):
        export_plan(small, "torchtitan")


def test_why_not_names_the_interleaving_that_works():
    from planner.search.whynot import why_not
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=2048)
    verdict = why_not(m, hw, tr, 16384, SearchOptions(framework=FLAGS), "tp=8 pp=16 vpp=16 cp=1")
    # 8 layers' worth per rank (126 + 2 = 128 on 16 ranks): chunks of 8/vpp, at least 1 each
    # (vpp 8: the embedding alone in the first chunk); vpp 16 would need half a layer per chunk
    assert verdict.status == "invalid"
    assert verdict.reasons[0].endswith("(126 layers on pp=16 split 7+..+7; vpp 1, 2, 4, 8 would do)")


def test_uneven_split_messages_and_the_even_one():
    m, hw = catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=2048, global_batch_size=1536)
    base = dict(tp=8, pp=32, zero_stage=1, micro_batch_size=1)
    with pytest.raises(UsageError, match="needs both first_stage_layers and last_stage_layers"):
        check_layout(m, hw, tr, 512, dict(base, first_stage_layers=1), framework=FLAGS)
    # 96 - 1 - 3 = 92 layers on 30 middle stages: 92 / 30 is not whole
    with pytest.raises(UsageError, match="the 92 layers left do not divide over the 30 middle stages"):
        check_layout(m, hw, tr, 512, dict(base, first_stage_layers=1, last_stage_layers=3), framework=FLAGS)
    # 90 + 10 = 100 > 96 layers: nothing left for the 30 middle stages (was "the -4 layers left")
    with pytest.raises(UsageError, match=r"first \+ last stage layers 90 \+ 10 leave 0 of the 96 "
                                         r"layers for the 30 middle stages\)$"):
        check_layout(m, hw, tr, 512, dict(base, first_stage_layers=90, last_stage_layers=10), framework=FLAGS)
    # 96 - 6 = 90 on 30: 3 each, less than the first stage's 4
    with pytest.raises(UsageError, match="an edge stage holds more than a middle stage's 3 layers"):
        check_layout(m, hw, tr, 512, dict(base, first_stage_layers=4, last_stage_layers=2), framework=FLAGS)
    # 3 + 30 x 3 + 3 is the even split of 96 layers on 32 stages: taken as even
    lay = check_layout(m, hw, tr, 512, dict(base, first_stage_layers=3, last_stage_layers=3), framework=FLAGS)
    assert (lay.first_stage_layers, lay.last_stage_layers) == (0, 0) and "+..+" not in lay.short()
    llama = catalog.resolve_model("llama3-405b")
    # (126 + 2)/16 = 8 layers' worth per rank: vpp 5 divides neither 7 nor 8
    with pytest.raises(UsageError, match="with vpp 5 neither .* vpp 2, 4, 8 would do"):
        check_layout(llama, hw, TrainingSpec(seq_length=8192, global_batch_size=2048), 8192,
                     dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, vpp=5,
                          first_stage_layers=7, last_stage_layers=7), framework=FLAGS)


def test_search_reaches_the_vpp_an_uneven_split_allows():
    # divisors(126) = 1, 2, 3, 6, 7, 9, 14, 18, 21, ...: vpp 4 comes only from the 7+..+7 split on
    # pp=16 ((126 + 2)/16 = 8 per rank); with full recomputation pinned it halves the bubble of
    # vpp 2 and wins the pinned search
    from planner.layout import BY_NAME
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    from types import SimpleNamespace
    vpp_values = BY_NAME["vpp"].values
    ctx = SimpleNamespace(model=m, framework=FLAGS, bound=16)
    assert 4 in vpp_values(SimpleNamespace(**vars(ctx), pps=np.array([16]))).tolist()
    # 126 = 14 x 9: the even split only
    assert 4 not in vpp_values(SimpleNamespace(**vars(ctx), pps=np.array([14]))).tolist()
    # in the layout form the search tries the vpp that cut the middle stages' 8 layers evenly and
    # fit the edges' 7: 1, 2, 4, and 8 in the embedding-and-loss form (the embedding and the loss
    # each alone in an edge chunk)
    layout = SimpleNamespace(**{**vars(ctx), "framework": catalog.resolve_framework("megatron-core")},
                             pps=np.array([16]))
    values = vpp_values(layout).tolist()
    assert {1, 2, 4, 8} <= set(values) and 16 not in values
    tr = TrainingSpec(seq_length=8192, global_batch_size=2048)
    lay = search(m, hw, tr, 8192, SearchOptions(tp=8, pp=16, max_cp=1, recompute="full",
                                                framework=FLAGS)).ranked.candidates.layout(0)
    assert (lay.vpp, lay.first_stage_layers, lay.last_stage_layers) == (4, 7, 7)


def test_interleaved_uneven_split_on_two_stages():
    # pp=2 has no middle stage: Megatron-Core's interleaved uneven offset divides by the middle
    # stages' count, so only the embedding-and-loss form interleaves there (30 = 2 x 16 - 2)
    m, hw = _model(30), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=4096, global_batch_size=64)
    base = dict(tp=1, pp=2, zero_stage=1, micro_batch_size=1, vpp=2)
    with pytest.raises(UsageError, match="interleaving an uneven split on pp=2 needs"):
        check_layout(m, hw, tr, 8, dict(base, first_stage_layers=14, last_stage_layers=16), framework=FLAGS)
    check_layout(m, hw, tr, 8, dict(base, first_stage_layers=15, last_stage_layers=15), framework=FLAGS)


def test_the_layout_form_interleaves_what_the_flag_forms_cannot():
    """Megatron-Core's profile writes --pipeline-model-parallel-layout: Llama 3 405B's 7+..+7 on
    pp 16 interleaves with vpp 3 (7 and 8 are not divisible by 3, nor is 128 by 48: neither flag
    form), every one of its 48 chunks holding 2 or 3 layers; vpp 16 would leave an edge stage's
    7 layers short of a chunk, and vpp 8 is the embedding-and-loss form's (its flags)."""
    from planner.frameworks.megatron import megatron_args
    m, hw = catalog.resolve_model("llama3-405b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=2048)
    base = dict(tp=8, pp=16, zero_stage=1, micro_batch_size=1, first_stage_layers=7, last_stage_layers=7)
    lay = check_layout(m, hw, tr, 16384, dict(base, vpp=3))
    with pytest.raises(UsageError, match="with vpp 16 a stage of 7 layers leaves a model chunk without a "
                                         "layer; vpp 2, 3, 4, 5, 6, 7, 8 would do"):
        check_layout(m, hw, tr, 16384, dict(base, vpp=16))
    eight = Plan(plan3d_version=__version__, model=m, hardware=hw, gpus=16384, training=tr,
                 layout=check_layout(m, hw, tr, 16384, dict(base, vpp=8)))
    args8 = dict(megatron_args(eight))
    assert "--account-for-embedding-in-pipeline-split" in args8 and \
        "--pipeline-model-parallel-layout" not in args8
    plan = Plan(plan3d_version=__version__, model=m, hardware=hw, gpus=16384, training=tr, layout=lay)
    args = dict(megatron_args(plan))
    text = args["--pipeline-model-parallel-layout"].strip("'")
    assert len(text.split("|")) == 48 and "--num-virtual-stages-per-pipeline-rank" not in args
