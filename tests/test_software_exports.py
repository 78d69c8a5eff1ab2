"""Every exporter writes the layout's software switches (TP communication overlap, the MoE token
dispatcher, the EP overlap, CUDA graphs) and the TrainingSpec's token dropping, or refuses what
its framework lacks with one line.

The expected flags and fields are written here from the frameworks' own names (not from plan3d's
output):
  MLM  NVIDIA/Megatron-LM @d98e8a64ddf3 megatron/training/arguments.py and megatron/core/
       transformer/transformer_config.py = TC: --tp-comm-overlap; --moe-token-dispatcher-type
       alltoall | allgather | flex with --moe-flex-dispatcher-backend deepep | hybridep (TC
       L891-902); --overlap-moe-expert-parallel-comm --delay-wgrad-compute (TC L3002-3082);
       --cuda-graph-impl transformer_engine | full_iteration, --cuda-graph-modules attn mlp moe
       moe_router moe_preprocess (TC L1075-1106), --no-check-for-nan-in-loss-and-grad with
       full_iteration (arguments.py L1235-1237), --te-rng-tracker (L1954-1960);
       --moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity, --moe-token-drop-policy
       probs (TC L917-938). The same option strings and choices are in Megatron-LM's release
       core_v0.19.0 (its parser, built from that tag).
  MB   NVIDIA-NeMo/Megatron-Bridge @067f987df03b: comm_overlap.tp_comm_overlap,
       overlap_moe_expert_parallel_comm, delay_wgrad_compute (training/comm_overlap.py
       L384-398); model.* = TransformerConfig fields; utils/cuda_graph.py set_cuda_graph_modules
       (cuda_graph_modules set, cuda_graph_scope None); rng.te_rng_tracker and
       rerun_state_machine.check_for_nan_in_loss (training/config.py L1415-1416, L1508-1513).
  TT   torchtitan 0.3.0 configs.py L66-77 (training.disable_cuda_graphs), L291-312 (compile.enable,
       compile.components, compile.enable_async_tensor_parallel); torchtitan 0.2.2
       job_config.py L357 (parallelism.enable_async_tensor_parallel), L474-483
       (parallelism.expert_parallel_comm_backend "standard" | "deepep"), L721-727 (compile).
"""

from __future__ import annotations

import tomllib

import pytest
import yaml

from planner import __version__, catalog
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.frameworks.deepspeed import export_deepspeed
from planner.frameworks.torchtitan import export_torchtitan
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from tests import megatron_rules as rules
from tests.test_frameworks import BRIDGE, MEGATRON, TITAN_02, TITAN_03, flatten, titan_overrides


def make(model: str, gpus: int, training: dict | None = None, hw: str = "dgx-h100",
         **layout) -> Plan:
    m = catalog.resolve_model(model)
    tr = TrainingSpec(seq_length=4096, global_batch_size=m.training.global_batch_size,
                      **(training or {}))
    layout = {"pp": 1, "zero_stage": 1, "micro_batch_size": 1, **layout}
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware(hw),
                gpus=gpus, training=tr, layout=Layout(**layout))


def megatron(plan: Plan) -> dict:
    """The Megatron-LM export's arguments, checked against the parser's option list and the
    ported validation (tests/megatron_rules.py)."""
    args = rules.parse(export_plan(plan, "megatron").text)
    assert {"--" + k.replace("_", "-") for k in args} <= MEGATRON
    rules.validate(args, world=plan.gpus)
    return args


def bridge(plan: Plan) -> dict:
    """The Megatron-Bridge export's fields (section.field), checked against the field list."""
    fields = flatten(yaml.safe_load(export_plan(plan, "nemo").text))
    assert set(fields) <= BRIDGE, set(fields) - BRIDGE
    return fields


# Llama 3 70B, tp=4 with SP on 64 H100 (Bridge's H100 recipe runs userbuffers at tp 4)
DENSE = dict(tp=4, dp=16, sequence_parallel=True)
# Qwen3-30B-A3B (every layer MoE), ep=8 on 8 H100; DeepSeek-V2-Lite (one dense layer first)
QWEN = dict(tp=1, dp=8, ep=8)
GRAPH_KEYS = ("cuda_graph_impl", "cuda_graph_modules", "te_rng_tracker",
              "no_check_for_nan_in_loss_and_grad")


# --- Megatron-LM ---------------------------------------------------------------------------------

def test_megatron_tp_comm_overlap():
    on = megatron(make("llama3-70b", 64, **DENSE, tp_comm_overlap=True))
    assert on["tp_comm_overlap"] is True
    assert "tp_comm_overlap" not in megatron(make("llama3-70b", 64, **DENSE))
    # the ported rule catches the flag without SP (arguments.py L1441-1442)
    on.pop("sequence_parallel")
    with pytest.raises(rules.MegatronRejects, match="L1441-1442"):
        rules.validate(on, world=64)
    # TE userbuffers want CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell: the comment says so
    text = export_plan(make("llama3-70b", 64, **DENSE, tp_comm_overlap=True), "megatron").text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert "userbuffers" in text


@pytest.mark.parametrize("dispatcher, flags", [
    ("alltoall", {"moe_token_dispatcher_type": "alltoall"}),
    ("allgather", {"moe_token_dispatcher_type": "allgather"}),
    ("deepep", {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep"}),
    ("hybridep", {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep"}),
])
def test_megatron_dispatchers(dispatcher, flags):
    args = megatron(make("qwen3-30b-a3b", 8, **QWEN, moe_dispatcher=dispatcher))
    got = {k: args[k] for k in ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend") if k in args}
    assert got == flags


def test_megatron_ep_overlap():
    on = megatron(make("qwen3-30b-a3b", 8, **QWEN, moe_a2a_overlap=True))
    assert on["overlap_moe_expert_parallel_comm"] is True and on["delay_wgrad_compute"] is True
    off = megatron(make("qwen3-30b-a3b", 8, **QWEN))
    assert "overlap_moe_expert_parallel_comm" not in off and "delay_wgrad_compute" not in off


@pytest.mark.parametrize("model, gpus, layout, training, impl, modules", [
    # a dense model: attention and MLP of each layer
    ("llama3-70b", 64, DENSE, {}, "transformer_engine", ["attn", "mlp"]),
    # every layer MoE, dropless: the static part only (router and preprocessing)
    ("qwen3-30b-a3b", 8, QWEN, {}, "transformer_engine", ["attn", "moe_router", "moe_preprocess"]),
    # a dense first layer: its MLP too
    ("deepseek-v2-lite", 8, QWEN, {}, "transformer_engine",
     ["attn", "mlp", "moe_router", "moe_preprocess"]),
    # drop-and-pad: the whole MoE layer (TC L2838-2844)
    ("qwen3-30b-a3b", 8, QWEN, {"moe_capacity_factor": 1.0}, "transformer_engine", ["attn", "moe"]),
    # with the EP overlap neither moe nor mlp (TC L3063-3071)
    ("qwen3-30b-a3b", 8, {**QWEN, "moe_a2a_overlap": True}, {"moe_capacity_factor": 1.0},
     "transformer_engine", ["attn", "moe_router", "moe_preprocess"]),
    ("deepseek-v2-lite", 8, {**QWEN, "moe_a2a_overlap": True}, {}, "transformer_engine",
     ["attn", "moe_router", "moe_preprocess"]),
])
def test_megatron_layer_graphs(model, gpus, layout, training, impl, modules):
    plan = make(model, gpus, training, **layout, cuda_graphs="layers")
    args = megatron(plan)
    assert (args["cuda_graph_impl"], args["cuda_graph_modules"]) == (impl, modules)
    assert args["te_rng_tracker"] is True and "no_check_for_nan_in_loss_and_grad" not in args


def test_megatron_full_iteration_graph_and_no_graphs():
    args = megatron(make("llama3-70b", 64, **DENSE, cuda_graphs="full_iteration"))
    assert args["cuda_graph_impl"] == "full_iteration" and "cuda_graph_modules" not in args
    assert args["no_check_for_nan_in_loss_and_grad"] is True and args["te_rng_tracker"] is True
    # the ported rule: full_iteration without it is refused (arguments.py L1235-1237)
    args.pop("no_check_for_nan_in_loss_and_grad")
    with pytest.raises(rules.MegatronRejects, match="L1235-1237"):
        rules.validate(args, world=64)
    none = megatron(make("llama3-70b", 64, **DENSE))
    assert not set(GRAPH_KEYS) & set(none)


def test_the_ported_graph_rules_find_errors():
    args = megatron(make("qwen3-30b-a3b", 8, **QWEN, cuda_graphs="layers"))
    for modules, rule in ((["attn", "moe"], "L2838-2844"), (["attn", "mlp"], "L2831-2836"),
                          (["attn", "moe_preprocess"], "L2821-2824")):
        with pytest.raises(rules.MegatronRejects, match=rule):
            rules.validate({**args, "cuda_graph_modules": modules}, world=8)


def test_megatron_token_dropping():
    args = megatron(make("qwen3-30b-a3b", 8, {"moe_capacity_factor": 1.25}, **QWEN))
    assert (args["moe_expert_capacity_factor"], args["moe_pad_expert_input_to_capacity"],
            args["moe_token_drop_policy"]) == ("1.25", True, "probs")
    hybrid = megatron(make("qwen3-30b-a3b", 8, {"moe_capacity_factor": 1.0}, **QWEN,
                           moe_dispatcher="hybridep"))
    assert hybrid["moe_pad_expert_input_to_capacity"] is True
    dropless = megatron(make("qwen3-30b-a3b", 8, **QWEN))
    assert "moe_expert_capacity_factor" not in dropless
    assert "moe_pad_expert_input_to_capacity" not in dropless
    # DeepEP refuses padding to capacity (TC L1754-1761): the export refuses, in one line
    with pytest.raises(UsageError, match="the DeepEP dispatcher does not pad to a capacity") as err:
        export_plan(make("qwen3-30b-a3b", 8, {"moe_capacity_factor": 1.0}, **QWEN,
                         moe_dispatcher="deepep"), "megatron")
    assert "\n" not in str(err.value)
    with pytest.raises(rules.MegatronRejects, match="L1754-1761"):
        rules.validate({**hybrid, "moe_flex_dispatcher_backend": "deepep"}, world=8)


@pytest.mark.parametrize("model, gpus, layout, match", [
    # megatron-1.7b trains with dropout 0.1: graphed attention beside core-attention
    # recomputation is refused (TC L2878-2885)
    ("megatron-1.7b", 8, dict(tp=1, dp=8, recompute="selective", cuda_graphs="layers"),
     "layer CUDA graphs with attention dropout not beside selective recompute"),
    # EP overlap with layer graphs under Megatron-FSDP (mcore_fsdp_adapter.py L182-187)
    ("qwen3-30b-a3b", 8, dict(QWEN, zero_stage=3, moe_a2a_overlap=True, cuda_graphs="layers"),
     "EP overlap with layer CUDA graphs not under Megatron-FSDP"),
    # EP overlap with graphed attention that has biases (arguments.py L1924-1927)
    ("gpt-oss-20b", 8, dict(QWEN, moe_a2a_overlap=True, cuda_graphs="layers"),
     "EP overlap with layer CUDA graphs needs attention without biases"),
])
def test_megatron_refusals_beyond_the_rules(model, gpus, layout, match):
    for target in ("megatron", "nemo"):
        with pytest.raises(UsageError, match=match) as err:
            export_plan(make(model, gpus, **layout), target)
        assert "\n" not in str(err.value)


# --- Megatron-Bridge -----------------------------------------------------------------------------

def test_bridge_writes_every_switch_on_and_off():
    off = bridge(make("qwen3-30b-a3b", 8, **QWEN))
    assert off["comm_overlap.tp_comm_overlap"] is False
    assert off["comm_overlap.overlap_moe_expert_parallel_comm"] is False
    assert off["comm_overlap.delay_wgrad_compute"] is False
    assert off["model.moe_token_dispatcher_type"] == "alltoall"
    assert off["model.cuda_graph_impl"] == "none"
    assert (off["model.moe_expert_capacity_factor"], off["model.moe_pad_expert_input_to_capacity"]) == \
        (None, False)
    on = bridge(make("qwen3-30b-a3b", 8, {"moe_capacity_factor": 1.0}, **QWEN,
                     moe_dispatcher="hybridep", moe_a2a_overlap=True, cuda_graphs="layers"))
    assert (on["model.moe_token_dispatcher_type"], on["model.moe_flex_dispatcher_backend"]) == \
        ("flex", "hybridep")
    assert on["comm_overlap.overlap_moe_expert_parallel_comm"] is True
    assert on["comm_overlap.delay_wgrad_compute"] is True
    assert on["model.moe_shared_expert_overlap"] is False
    assert (on["model.moe_expert_capacity_factor"], on["model.moe_pad_expert_input_to_capacity"],
            on["model.moe_token_drop_policy"]) == (1.0, True, "probs")
    assert (on["model.cuda_graph_impl"], on["model.cuda_graph_modules"], on["model.cuda_graph_scope"]) == \
        ("transformer_engine", ["attn", "moe_router", "moe_preprocess"], None)
    assert on["rng.te_rng_tracker"] is True


def test_bridge_tp_overlap_and_full_iteration():
    fields = bridge(make("llama3-70b", 64, **DENSE, tp_comm_overlap=True, cuda_graphs="full_iteration"))
    assert fields["comm_overlap.tp_comm_overlap"] is True
    assert (fields["model.cuda_graph_impl"], fields["model.cuda_graph_modules"]) == ("full_iteration", [])
    assert fields["rerun_state_machine.check_for_nan_in_loss"] is False
    assert fields["rng.te_rng_tracker"] is True
    # dense: no MoE fields
    assert not any(k.startswith("model.moe_") for k in fields)


# --- torchtitan ----------------------------------------------------------------------------------

TITAN = dict(tp=2, dp=8, zero_stage=3, sequence_parallel=True)


def test_torchtitan_async_tp_in_both_releases():
    plan = make("llama3-8b", 16, **TITAN, tp_comm_overlap=True)
    new = titan_overrides(export_plan(plan, "torchtitan").text)
    assert set(new) <= TITAN_03, set(new) - TITAN_03
    assert (new["compile.enable"], new["compile.components"],
            new["compile.enable_async_tensor_parallel"]) == ("true", "model,loss", "true")
    old = flatten(tomllib.loads(export_plan(plan, "torchtitan", "toml").text))
    assert set(old) <= TITAN_02, set(old) - TITAN_02
    assert (old["parallelism.enable_async_tensor_parallel"], old["compile.enable"],
            old["compile.components"]) == (True, True, ["model", "loss"])
    off = titan_overrides(export_plan(make("llama3-8b", 16, **TITAN), "torchtitan").text)
    assert not any(k.startswith("compile.") for k in off)


def test_torchtitan_cuda_graphs():
    # 0.3.0 graphs each micro-batch unless disabled: a plan costed without graphs disables them
    plan = make("llama3-8b", 16, **TITAN)
    assert titan_overrides(export_plan(plan, "torchtitan").text)["training.disable_cuda_graphs"] == "true"
    assert "disable_cuda_graphs" not in export_plan(plan, "torchtitan", "toml").text  # 0.2.2: none
    # the profile offers no graphs (rules refuse them first); the exporter's own mapping
    graphed = make("llama3-8b", 16, **TITAN, cuda_graphs="full_iteration")
    with pytest.raises(UsageError, match="captures no CUDA graphs"):
        export_plan(graphed, "torchtitan")
    assert titan_overrides(export_torchtitan(graphed).text)["training.disable_cuda_graphs"] == "false"
    for plan, fmt, match in ((graphed, "toml", "0.2.2 has no CUDA graphs"),
                             (make("llama3-8b", 16, **{**TITAN, "pp": 2, "dp": 4},
                                   cuda_graphs="full_iteration"), "overrides", "pipeline"),
                             (make("llama3-8b", 16, **TITAN, cuda_graphs="layers"), "overrides",
                              "does not graph single layers")):
        with pytest.raises(UsageError, match=match):
            export_torchtitan(plan, fmt)


MOE_TITAN = dict(tp=1, dp=8, ep=8, zero_stage=3)


def test_torchtitan_dispatchers():
    plan = make("qwen3-30b-a3b", 8, **MOE_TITAN)
    old = flatten(tomllib.loads(export_plan(plan, "torchtitan", "toml").text))
    assert old["parallelism.expert_parallel_comm_backend"] == "standard"
    # the torchtitan profile runs the all-to-all, DeepEP and HybridEP (torchtitan
    # models/common/config_utils.py L362-425 @b5bcd76c); the exporter maps what each release has
    deepep = make("qwen3-30b-a3b", 8, **MOE_TITAN, moe_dispatcher="deepep")
    assert 'moe_comm_backend="deepep"' in export_plan(deepep, "torchtitan").text.replace("\n#   ", " ")
    with pytest.raises(UsageError, match="torchtitan dispatches tokens with alltoall / deepep / hybridep"):
        export_plan(make("qwen3-30b-a3b", 8, **MOE_TITAN, moe_dispatcher="allgather"), "torchtitan")
    text = export_torchtitan(deepep, "toml").text
    assert flatten(tomllib.loads(text))["parallelism.expert_parallel_comm_backend"] == "deepep"
    assert 'moe_comm_backend="deepep"' in export_torchtitan(deepep).text.replace("\n#   ", " ")
    hybrid = make("qwen3-30b-a3b", 8, **MOE_TITAN, moe_dispatcher="hybridep")
    with pytest.raises(UsageError, match="0.2.2 has no HybridEP"):
        export_torchtitan(hybrid, "toml")
    for plan, match in ((make("qwen3-30b-a3b", 8, **MOE_TITAN, moe_dispatcher="allgather"),
                         "no allgather token dispatcher"),
                        (make("qwen3-30b-a3b", 8, **MOE_TITAN, moe_a2a_overlap=True),
                         "no EP communication overlap")):
        for fmt in ("overrides", "toml"):
            with pytest.raises(UsageError, match=match):
                export_torchtitan(plan, fmt)


# --- DeepSpeed -----------------------------------------------------------------------------------

@pytest.mark.parametrize("model, layout, rule", [
    ("llama3-8b", dict(tp=2, dp=4, tp_comm_overlap=True), "DeepSpeed has no TP communication overlap"),
    ("qwen3-30b-a3b", dict(QWEN, moe_dispatcher="deepep"), "DeepSpeed dispatches tokens with alltoall"),
    ("qwen3-30b-a3b", dict(QWEN, moe_dispatcher="allgather"), "DeepSpeed dispatches tokens with alltoall"),
    ("qwen3-30b-a3b", dict(QWEN, moe_a2a_overlap=True), "DeepSpeed has no EP communication overlap"),
    ("llama3-8b", dict(tp=1, dp=8, cuda_graphs="layers"), "DeepSpeed captures no CUDA graphs"),
])
def test_deepspeed_refuses_what_it_lacks(model, layout, rule):
    with pytest.raises(UsageError, match=rule) as err:
        export_plan(make(model, 8, **layout), "deepspeed")
    assert "\n" not in str(err.value)


def test_deepspeed_own_check():
    with pytest.raises(UsageError, match="DeepSpeed has no CUDA graphs"):
        export_deepspeed(make("llama3-8b", 8, tp=1, dp=8, cuda_graphs="full_iteration"))
