"""The measured MoE runs' facts the cost model reads, and the in-place resolution of a run whose
pipeline layout the search cannot enumerate."""

from __future__ import annotations

from planner.cost.step import estimate_layout
from planner.fidelity.resolve import RECOMPUTE_CHOICES, _options, resolve
from planner.fidelity.runs import load_datasets

SWITCHES = ("moe_dispatcher", "moe_a2a_overlap", "tp_comm_overlap", "cuda_graphs")


def _cases(*ids):
    return {c.id: c for c in load_datasets(["modern"]) if c.id in ids}


def test_dispatcher_and_overlap_facts_follow_the_bridge_configs():
    cases = _cases("mbridge260401-b200-mxfp8-deepseekv3-256gpu", "mbridge2509-h100-fp8-deepseekv3-1024gpu",
                   "mbridge2511-b200-fp8mx-deepseekv3-256gpu", "mbridge2511-gb200-bf16-deepseekv3-256gpu")
    # the dispatcher and the EP overlap are layout axes (layout.axes): a run states them there.
    # Bridge 5acef9309 (26.04.01 B200 MXFP8) and run_script.py @fa0315ae (25.09 H100): the flex
    # dispatcher's DeepEP backend + 1F1B overlap
    for rid in ("mbridge260401-b200-mxfp8-deepseekv3-256gpu", "mbridge2509-h100-fp8-deepseekv3-1024gpu"):
        lay = cases[rid].layout
        assert (lay.moe_dispatcher, lay.moe_a2a_overlap) == ("deepep", True)
    # @5776a6d9: B200 has no flex backend, GB200 hybridep; neither overlaps
    assert cases["mbridge2511-b200-fp8mx-deepseekv3-256gpu"].layout.moe_dispatcher == "alltoall"
    assert cases["mbridge2511-gb200-bf16-deepseekv3-256gpu"].layout.moe_dispatcher == "hybridep"
    assert not cases["mbridge2511-gb200-bf16-deepseekv3-256gpu"].layout.moe_a2a_overlap
    # the switches are layout axes the run states: not left to a search
    assert not {"moe_dispatcher", "moe_a2a_overlap"} & set(cases["mbridge2511-gb200-bf16-deepseekv3-256gpu"].unknown)
    # every Bridge performance run computes the loss with Transformer Engine's cross entropy
    assert all(c.training.cross_entropy_in_place for c in cases.values())


def test_a_pipeline_layout_string_run_is_inside_the_search_space():
    # Yan et al. 2026's GB200 BF16 DeepSeek-V3 (pp 8, vp 4 with a Megatron pipeline layout
    # string; 61 layers divide by neither) states no recomputation: Megatron-Core's layout form
    # (layout.split.uneven_layout_ok) puts it inside the search space, so the search resolves
    # what it leaves unknown on its stated degrees, and the layout kept fits
    case = _cases("mcoremoe26-gb200-bf16-deepseekv3-256gpu")["mcoremoe26-gb200-bf16-deepseekv3-256gpu"]
    stated = case.layout
    result = resolve(case)
    assert result.status == "resolved"
    assert case.layout.recompute in RECOMPUTE_CHOICES
    assert (case.layout.pp, case.layout.vpp, case.layout.ep) == (stated.pp, stated.vpp, stated.ep)
    assert bool(estimate_layout(case.model, case.hardware, case.training, case.layout).fits[0])


def test_a_run_that_states_full_recompute_keeps_every_layer_recomputed():
    # Korthikanti et al. 2022 Table 5's full-recompute 175B row recomputes every layer
    # (megatron-lm-2022 offers --recompute-num-layers, but the row states full recomputation of
    # the model): --resolve search leaves recompute_num_layers at 0 (all layers), it does not
    # pick the least N that fits, which would make the prediction faster than the run
    case = next(c for c in load_datasets(["published"]) if c.id == "korthikanti22-175b-fullrecompute")
    assert "recompute" not in case.unknown and case.layout.recompute == "full"
    resolve(case)
    assert case.layout.recompute == "full" and case.layout.recompute_num_layers == 0


def test_gpt_oss_recompute_and_expert_parallelism_follow_each_release():
    # Megatron-Bridge @5776a6d9 (25.11): recompute_modules [layernorm, moe_act] without a
    # granularity (no recomputation); @c0b9a000 (26.02) and @74695a06 (26.04) set granularity
    # "selective" with them: selective+ (layernorm, moe_act; MLA's module does not apply)
    ids = ("mbridge2511-gb200-bf16-gptoss120b-64gpu", "mbridge2511-b200-bf16-gptoss120b-64gpu",
           "mbridge2602-gb200-bf16-gptoss120b-64gpu", "mbridge260401-gb200-bf16-gptoss120b-64gpu")
    cases = _cases(*ids)
    assert [cases[i].layout.recompute for i in ids] == ["none", "none", "selective+", "selective+"]
    # the 25.11 DGX-B200 row prints EP 8; its config (and its throughput) is EP 64's, and the
    # override is listed among the run's assumptions
    b200 = cases["mbridge2511-b200-bf16-gptoss120b-64gpu"]
    assert b200.layout.ep == 64 and "ep=64 (facts) for the row's 8" in b200.assumptions
    # at EP 64 each GPU holds 2 of the 128 experts: it fits the 179 GiB of a B200 (it ran)
    assert bool(estimate_layout(b200.model, b200.hardware, b200.training, b200.layout).fits[0])


def test_every_moe_run_of_the_bridge_tables_states_its_software():
    # the dispatcher, EP overlap, TP overlap and CUDA graphs of each Megatron-Bridge MoE row come
    # from its release tag's performance config; the one left unknown is the 26.02 H100
    # Qwen3-30B row, whose config names DeepEP in a container the release notes say lacks it
    # (Bridge docs/releases/known-issues.md)
    runs = [c for c in load_datasets(["modern"]) if c.id.startswith("mbridge") and not c.skipped
            and c.model.moe is not None]
    assert runs and all(c.group.startswith("Megatron-Bridge") for c in runs)
    unknown = {c.id: [k for k in SWITCHES if k in c.unknown] for c in runs}
    assert {rid: keys for rid, keys in unknown.items() if keys} == \
        {"mbridge2602-h100-fp8-qwen3-30b-16gpu": ["moe_dispatcher"]}
    left = next(c for c in runs if c.id == "mbridge2602-h100-fp8-qwen3-30b-16gpu")
    assert any("DeepEP is not supported" in s for s in left.sources)
    # the fused dispatchers the tags name: DeepEP on the 25.09 H100 and 26.04.01 B200 DeepSeek-V3,
    # HybridEP on every GB200 Qwen3 and DeepSeek-V3 config
    fused = {c.id: c.layout.moe_dispatcher for c in runs if c.layout.moe_dispatcher in ("deepep", "hybridep")}
    assert fused["mbridge2509-h100-fp8-deepseekv3-1024gpu"] == fused["mbridge260401-b200-mxfp8-deepseekv3-256gpu"] == "deepep"
    assert all(d == "hybridep" for rid, d in fused.items() if "-gb200-" in rid)
    assert all(c.layout.moe_dispatcher == "alltoall" for c in runs if "gptoss" in c.id)


def test_the_26_02_01_qwen3_30b_row_runs_its_release_config():
    # Bridge v0.3.1's only H100 FP8 Qwen3-30B config is EP16 with no pipeline and HybridEP; the
    # table reprints 26.02's PP2 VP12 EP8 (reference/moe_performance.md 3.1): the facts correct
    # the layout, and the run lists each degree it overrides
    rid = "mbridge260201-h100-fp8-qwen3-30b-16gpu"
    case = _cases(rid)[rid]
    lay = case.layout
    assert (lay.tp, lay.pp, lay.dp, lay.ep, lay.vpp) == (1, 1, 16, 16, 1)
    assert (lay.moe_dispatcher, lay.moe_a2a_overlap, lay.cuda_graphs) == ("hybridep", False, "none")
    for note in ("pp=1 (facts) for the row's 2", "dp=16 (facts) for the row's 8",
                 "ep=16 (facts) for the row's 8", "vpp=1 (facts) for the row's 12"):
        assert note in case.assumptions
    assert not set(SWITCHES) & set(case.unknown)


def test_the_26_04_01_gb200_gpt_oss_row_is_all_to_all_with_ep_overlap():
    # at v0.4.2 the GB200 V2 config has moe_a2a_overlap and no flex backend (HybridEP, still at
    # main 74695a06, was removed on the release branch): NCCL's all-to-all with the EP overlap
    rid = "mbridge260401-gb200-bf16-gptoss120b-64gpu"
    lay = _cases(rid)[rid].layout
    assert (lay.moe_dispatcher, lay.moe_a2a_overlap) == ("alltoall", True)


def test_resolve_search_chooses_an_unknown_switch_and_pins_the_stated_ones():
    rid = "mbridge2602-h100-fp8-qwen3-30b-16gpu"
    case = _cases(rid)[rid]
    opts = _options(case)
    # stated: EP overlap on, no CUDA graphs, no TP overlap (tp 1); unknown: the dispatcher
    assert (opts.moe_a2a_overlap, opts.cuda_graphs, opts.tp_comm_overlap) == (True, "none", False)
    assert opts.moe_dispatcher is None
    assert resolve(case).status == "resolved"
    assert case.layout.moe_a2a_overlap and case.layout.cuda_graphs == "none"
    note = next(a for a in case.assumptions if a.startswith("resolved by search:"))
    assert f"moe_dispatcher={case.layout.moe_dispatcher}" in note
    assert "moe_dispatcher=alltoall" not in [a for a in case.assumptions if a != note]
