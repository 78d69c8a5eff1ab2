"""Exports of the job settings a plan's TrainingSpec holds (optimizer CPU offload, MoE activation
offload, the in-place cross entropy) beside the layout's MoE token dispatcher and EP
communication overlap (Megatron-LM flags and Megatron-Bridge fields; each flag in the parser's
option list, each field in the Bridge field list, and the arguments through the ported
validation of NVIDIA/Megatron-LM @ d98e8a64, tests/megatron_rules.py)."""

from __future__ import annotations

import pytest
import yaml

from planner import __version__, catalog
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from tests import megatron_rules as rules
from tests.test_frameworks import BRIDGE, MEGATRON, flatten
from tests.test_frameworks_moe import DSV3, DSV3_PP1

ALL_ON = dict(optimizer_offload_fraction=0.5, moe_activation_offload=True,
              cross_entropy_in_place=True, optimizer_moment_bytes=2)
# the layout's software: DeepEP with the EP overlap
SOFTWARE_ON = dict(moe_dispatcher="deepep", moe_a2a_overlap=True)


def plan_with(training: dict, hw: str = "dgx-h100", gpus: int = 128, **layout) -> Plan:
    m = catalog.resolve_model("deepseek-v3")
    tr = TrainingSpec(seq_length=4096, global_batch_size=m.training.global_batch_size, **training)
    software = {k: layout.pop(k) for k in list(layout) if k in SOFTWARE_ON}
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware(hw),
                gpus=gpus, training=tr, layout=Layout(**(layout or DSV3_PP1), **software))


def test_megatron_writes_the_job_settings():
    # DeepSeek-V3 tp=2 dp=64 ep=64 pp=1 on 128 GPUs: EP overlap allowed (ep > 1, no full
    # recompute, pp = 1), flex with DeepEP (DGX H100: an NVLink domain is one host)
    exp = export_plan(plan_with(ALL_ON, **SOFTWARE_ON), "megatron")
    args = rules.parse(exp.text)
    assert {"--" + k.replace("_", "-") for k in args} <= MEGATRON
    rules.validate(args, world=128)
    assert args["moe_token_dispatcher_type"] == "flex" and args["moe_flex_dispatcher_backend"] == "deepep"
    assert args["overlap_moe_expert_parallel_comm"] is True and args["delay_wgrad_compute"] is True
    assert (args["optimizer_cpu_offload"], args["optimizer_offload_fraction"],
            args["use_precision_aware_optimizer"]) == (True, "0.5", True)
    assert (args["exp_avg_dtype"], args["exp_avg_sq_dtype"]) == ("bf16", "bf16")
    assert exp.text.count("--use-precision-aware-optimizer") == 1
    assert args["fine_grained_activation_offloading"] is True
    assert args["offload_modules"] == ["expert_fc1", "moe_act"]
    # Megatron-LM refuses TE's cross entropy fusion: not written, said in a comment and a note
    assert "cross_entropy_loss_fusion" not in args and "cross_entropy_fusion_impl" not in args
    assert any("cross_entropy_in_place" in n for n in exp.notes)
    assert "# the plan assumed Transformer Engine's in-place cross entropy" in exp.text


def test_defaults_write_alltoall_and_nothing_else():
    args = rules.parse(export_plan(plan_with({}), "megatron").text)
    assert args["moe_token_dispatcher_type"] == "alltoall" and "moe_flex_dispatcher_backend" not in args
    for k in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "optimizer_cpu_offload",
              "fine_grained_activation_offloading", "offload_modules"):
        assert k not in args
    args = rules.parse(export_plan(plan_with({}, **DSV3_PP1, moe_dispatcher="allgather"),
                                   "megatron").text)
    assert args["moe_token_dispatcher_type"] == "allgather"


def test_gb200_hybridep():
    # HybridEP is the flex dispatcher's hybridep backend (transformer_config.py L891-902), the
    # one of the flex backends that handles GB200 NVL72's multi-node NVLink (L898-902)
    args = rules.parse(export_plan(plan_with({}, hw="gb200-nvl72", **DSV3_PP1,
                                             moe_dispatcher="hybridep"), "megatron").text)
    assert (args["moe_token_dispatcher_type"], args["moe_flex_dispatcher_backend"]) == \
        ("flex", "hybridep")


def test_overlap_refused_where_the_layout_cannot_overlap():
    # pp = 8 without interleaving: Megatron-Core needs vpp for the overlap (transformer_config.py
    # L3007-3011); the layout axis is refused by the software rules the search applies
    with pytest.raises(UsageError, match="EP overlap needs ep > 1, vpp > 1 with pp > 1"):
        export_plan(plan_with({}, gpus=1024, **DSV3, moe_a2a_overlap=True), "megatron")


@pytest.mark.parametrize("training, layout, match", [
    ({}, {**DSV3_PP1, "moe_a2a_overlap": True, "moe_dispatcher": "allgather"},
     "the alltoall or a fused dispatcher"),
    ({"moe_activation_offload": True}, {**DSV3_PP1, "offload_layers": 2}, "whole-layer offloading"),
])
def test_refused_as_megatron_refuses(training, layout, match):
    with pytest.raises(UsageError, match=match):
        export_plan(plan_with(training, **layout), "megatron")


@pytest.mark.parametrize("change, rule", [
    ({"cross_entropy_loss_fusion": True, "cross_entropy_fusion_impl": "te"}, "L1697-1702"),
    # FP8 parameters gathered beside the optimizer offload, which plan3d's export leaves out
    ({"fp8_param_gather": True, "fp8_recipe": "tensorwise"}, "L1888-1891"),
    ({"use_precision_aware_optimizer": None}, "arguments.py L1885"),
    ({"optimizer_cpu_offload": None, "optimizer_offload_fraction": None,
      "use_precision_aware_optimizer": None}, "L476-477"),
    ({"moe_token_dispatcher_type": "allgather"}, "L3016-3019"),
    ({"offload_modules": ["expert_fc2"]}, "L2131-2147"),
    ({"cpu_offloading_num_layers": "2"}, "L2128-2130"),
    ({"pipeline_model_parallel_size": "2"}, "L3007-3011"),
])
def test_the_ported_job_rules_find_errors(change, rule):
    args = rules.parse(export_plan(plan_with(ALL_ON, **SOFTWARE_ON), "megatron").text)
    for k, v in change.items():
        if v is None:
            args.pop(k)
        else:
            args[k] = v
    with pytest.raises(rules.MegatronRejects, match=rule):
        rules.validate(args, world=128)


def test_bridge_fields_of_the_job_settings():
    exp = export_plan(plan_with(ALL_ON, **SOFTWARE_ON), "nemo")
    body = yaml.safe_load(exp.text)
    fields = flatten(body)
    assert set(fields) <= BRIDGE, set(fields) - BRIDGE
    assert (fields["model.moe_token_dispatcher_type"], fields["model.moe_flex_dispatcher_backend"]) == \
        ("flex", "deepep")
    assert fields["comm_overlap.overlap_moe_expert_parallel_comm"] is True
    assert fields["comm_overlap.delay_wgrad_compute"] is True
    assert (fields["optimizer.optimizer_cpu_offload"], fields["optimizer.optimizer_offload_fraction"],
            fields["optimizer.use_precision_aware_optimizer"]) == (True, 0.5, True)
    assert fields["model.offload_modules"] == ["expert_fc1", "moe_act"]
    assert (fields["optimizer.exp_avg_dtype"], fields["optimizer.exp_avg_sq_dtype"]) == \
        ("torch.bfloat16", "torch.bfloat16")
    assert fields["model.fine_grained_activation_offloading"] is True
    # Bridge sets TE's fusion as its DeepSeek-V3 bridge does (Megatron-Core only warns)
    assert (fields["model.cross_entropy_loss_fusion"], fields["model.cross_entropy_fusion_impl"]) == \
        (True, "te")
    assert "comm_overlap.overlap_moe_expert_parallel_comm=true" in exp.text  # the Hydra overrides
    plain = flatten(yaml.safe_load(export_plan(plan_with({}), "nemo").text))
    assert plain["model.moe_token_dispatcher_type"] == "alltoall"
    # the switches are written off, over whatever the recipe sets
    assert plain["comm_overlap.overlap_moe_expert_parallel_comm"] is False
    assert plain["comm_overlap.delay_wgrad_compute"] is False
    assert "optimizer.optimizer_cpu_offload" not in plain and "model.offload_modules" not in plain
