"""Rank placement (planner.placement) against hand-enumerated groups and the cost model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner import __version__, catalog
from planner.cli import app
from planner.errors import UsageError
from planner.export import write_plan
from planner.layout.groups import all_groups
from planner.placement import place, summary
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec


def make(tp, pp, dp, model="175b", hw="dgx-h100", gbs=1536) -> Plan:
    m = catalog.resolve_model(model)
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware(hw),
                gpus=tp * pp * dp, training=TrainingSpec(seq_length=2048, global_batch_size=gbs),
                layout=Layout(tp=tp, pp=pp, dp=dp, zero_stage=1, micro_batch_size=1))


def test_megatron_order_small_grid():
    # tp=2 dp=2 pp=2, rank = i_tp + 2*(i_dp + 2*i_pp) (formulas.md 5.3); the validator's torchrun
    # mesh (pp, dp, tp) gave rank 3 -> tp [2,3], dp [1,3], pp [3,7] (validator_notes.md section 1)
    g = all_groups(make(tp=2, pp=2, dp=2).layout, "megatron")
    assert g["tp"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert g["dp"].tolist() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert g["pp"].tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_gpt3_512_groups_nodes_and_cost_model():
    plan = make(tp=4, pp=8, dp=16)
    s = summary(plan)
    tp, dp, pp = s["dims"]["tp"], s["dims"]["dp"], s["dims"]["pp"]
    # 512/4 = 128 TP groups [0..3], [4..7], ...: 4 ranks on one node of 8, none crosses
    assert (tp["groups"], tp["stride"], tp["ranks_per_node"], tp["nodes_per_group"]) == (128, 1, 4, 1)
    assert tp["examples"][0] == [0, 1, 2, 3] and s["tp_crosses_node"] is False
    # DP stride tp = 4: [0, 4, ..., 60] -> 2 per node over 8 nodes; 512/16 = 32 groups
    assert dp["examples"][0] == list(range(0, 64, 4))
    assert (dp["groups"], dp["ranks_per_node"], dp["nodes_per_group"]) == (32, 2, 8)
    # PP stride tp*dp = 64: [0, 64, ..., 448], one rank per node, 8 nodes
    assert pp["examples"][0] == list(range(0, 512, 64)) and pp["nodes_per_group"] == 8
    cm = s["cost_model"]
    assert cm["tp"]["assumed_nodes"] == 1 and cm["dp"]["assumed_ranks_per_node"] == 2
    assert all(v["agrees"] for v in cm.values())
    assert "cp" not in s["dims"]  # plan3d layouts have no context parallelism


def test_torchtitan_mesh_gives_megatron_groups():
    # torchtitan's mesh [pp, dp_replicate, dp_shard, cp, tp] with cp=1 is Megatron's tp-dp-pp
    plan = make(tp=4, pp=8, dp=16)
    a, b = place(plan, "megatron"), place(plan, "torchtitan")
    for dim in ("tp", "dp", "pp"):
        assert np.array_equal(a.groups[dim], b.groups[dim])


def test_tp_pp_dp_mapping_disagrees_with_cost_model():
    # --use-tp-pp-dp-mapping: DP stride tp*pp = 32 -> one rank per node, 16 nodes, where the cost
    # model assumed 2 per node on 8 nodes: the check must say so
    s = summary(make(tp=4, pp=8, dp=16), "megatron-tp-pp-dp")
    assert s["dims"]["dp"]["examples"][0] == list(range(0, 512, 32))
    assert s["cost_model"]["dp"]["agrees"] is False
    assert s["cost_model"]["tp"]["agrees"] is True
    # PP stride 4: groups of 8 on 4 nodes, boundaries 1-2, 3-4, 5-6 cross: 3 of 7 per group
    assert s["cost_model"]["pp"]["crossing_boundaries"] == 64 * 3


def test_tp_across_nodes_is_reported():
    # tp=16 on 8-GPU nodes (search forbids it; a hand-written plan can have it)
    s = summary(make(tp=16, pp=1, dp=1, model="megatron-1t"))
    assert s["tp_crosses_node"] is True
    assert (s["dims"]["tp"]["ranks_per_node"], s["dims"]["tp"]["nodes_per_group"]) == (8, 2)
    assert s["cost_model"]["tp"] == {"assumed_ranks_per_node": 8, "assumed_nodes": 2,
                                     "ranks_per_node": [8], "nodes": [2], "agrees": True}
    # single node: p2p never crosses, and the cost model agrees
    s = summary(make(tp=2, pp=4, dp=1, model="llama3-8b", gbs=512))
    assert s["cost_model"]["pp"]["p2p_crosses_nodes"] is False and s["cost_model"]["pp"]["agrees"]


def test_cli_placement(tmp_path):
    f = tmp_path / "plan.yaml"
    write_plan(make(tp=4, pp=8, dp=16), f)
    runner = CliRunner()
    res = runner.invoke(app, ["placement", str(f)])
    assert res.exit_code == 0, res.stderr
    assert "TP groups cross a node: no" in res.stdout and "agrees" in res.stdout
    # the TP row: size 4, 128 groups, stride 1, 4 ranks/node, 1 node, 1 domain, none leaves
    rows = {ln.split()[0]: ln.split()[1:] for ln in res.stdout.splitlines() if ln[:1].isupper() and ln.split()[1].isdigit()}
    assert rows["TP"] == ["4", "128", "1", "4", "1", "1", "0", "0"]
    assert rows["DP"] == ["16", "32", "4", "2", "8", "8", "32", "32"]
    assert max(len(ln) for ln in res.stdout.splitlines()) <= 80
    res = runner.invoke(app, ["placement", str(f), "--json", "--order", "torchtitan"])
    import json
    data = json.loads(res.stdout)
    assert len(data["groups"]["tp"]) == 128 and len(data["groups"]["dp"]) == 32
    assert len(data["node_of_rank"]) == 512 and data["node_of_rank"][511] == 63
    res = runner.invoke(app, ["placement", str(f), "--order", "jax"])
    assert res.exit_code == 2 and "unknown rank order" in res.stderr


# ----------------------------------------------------------------------------- expert groups

def moe_plan(model, gpus, hw="dgx-h100", dispatcher="alltoall", **layout) -> Plan:
    m = catalog.resolve_model(model)
    tr = TrainingSpec(seq_length=4096, global_batch_size=m.training.global_batch_size)
    layout = {"zero_stage": 1, "micro_batch_size": 1, "sequence_parallel": layout.get("tp", 1) > 1,
              "moe_dispatcher": dispatcher, **layout}
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware(hw),
                gpus=gpus, training=tr, layout=Layout(**layout))


def test_deepseek_v3_expert_groups_on_1024_h100():
    # tp=2 pp=16 dp=32 ep=8 etp=1: a stage holds tp*dp = 64 GPUs, edp = 64/(1*8) = 8.
    # Megatron-Core's expert order etp-ep-edp-pp: rank = i_ep + 8*(i_edp + 8*i_pp), so
    # EP = 8 consecutive ranks [0..7], [8..15], ... (1024/8 = 128 groups, one node each);
    # EDP = 8 ranks 8 apart [0,8,...,56] (128 groups, each over 8 nodes); ETP: single ranks.
    pl = place(moe_plan("deepseek-v3", 1024, tp=2, pp=16, dp=32, ep=8))
    assert pl.groups["ep"].shape == (128, 8) and pl.groups["ep"][0].tolist() == list(range(8))
    assert pl.groups["ep"][1].tolist() == list(range(8, 16))
    assert pl.groups["ep"][-1].tolist() == list(range(1016, 1024))
    assert pl.groups["edp"].shape == (128, 8)
    assert pl.groups["edp"][0].tolist() == list(range(0, 64, 8))
    assert pl.groups["edp"][1].tolist() == list(range(1, 64, 8))
    # the second pipeline stage starts at rank 64: its first EDP group [64, 72, ..., 120]
    assert pl.groups["edp"][8].tolist() == list(range(64, 128, 8))
    assert pl.groups["etp"].shape == (1024, 1)
    s = summary(moe_plan("deepseek-v3", 1024, tp=2, pp=16, dp=32, ep=8))
    ep, edp = s["dims"]["ep"], s["dims"]["edp"]
    assert (ep["groups"], ep["stride"], ep["nodes_per_group"], ep["groups_crossing_domains"]) == \
        (128, 1, 1, 0)
    assert (edp["stride"], edp["domains_per_group"], edp["groups_crossing_domains"]) == (8, 8, 128)
    assert "etp" not in s["dims"] and s["ep_leaves_nvlink_domain"] is False
    assert all(v["agrees"] for v in s["cost_model"].values())
    assert s["cost_model"]["ep"]["assumed_nodes"] == 1  # all-to-all on NVLink


def test_deepseek_v3_ep64_leaves_the_nvlink_domain():
    # Megatron-Bridge's H100 layout tp=2 pp=8 ep=64: stage 2*64 = 128 GPUs, edp = 2;
    # EP [0..63] spans nodes 0-7 with 8 ranks each; EDP [0, 64]: two nodes
    s = summary(moe_plan("deepseek-v3", 1024, tp=2, pp=8, dp=64, ep=64))
    assert s["dims"]["ep"]["examples"][0] == list(range(64))
    assert s["dims"]["edp"]["examples"][0] == [0, 64]
    assert (s["dims"]["ep"]["ranks_per_domain"], s["dims"]["ep"]["domains_per_group"]) == (8, 8)
    assert s["ep_leaves_nvlink_domain"] is True
    assert s["cost_model"]["ep"]["assumed_ranks_per_node"] == 8
    assert s["cost_model"]["ep"]["assumed_nodes"] == 8 and s["cost_model"]["ep"]["agrees"]


def test_qwen3_30b_on_one_node():
    # tp=1 dp=8 ep=8 on 8 GPUs: one EP group [0..7]; edp = 8/8 = 1, eight EDP groups of one
    s = summary(moe_plan("qwen3-30b-a3b", 8, tp=1, pp=1, dp=8, ep=8))
    assert s["dims"]["ep"]["examples"] == [list(range(8))]
    assert (s["dims"]["edp"]["size"], s["dims"]["edp"]["groups"]) == (1, 8)
    assert s["dims"]["edp"]["examples"] == [[0], [1], [7]]
    assert s["ep_leaves_nvlink_domain"] is False and s["nvlink_domain"] == 8


def test_expert_tensor_parallel_groups():
    # tp=4 dp=4 ep=4 etp=2 on 16 GPUs: edp = 16/(2*4) = 2; rank = i_etp + 2*(i_ep + 4*i_edp)
    plan = moe_plan("qwen3-30b-a3b", 16, tp=4, pp=1, dp=4, ep=4, etp=2)
    pl = place(plan)
    assert pl.groups["etp"].tolist() == [[2 * i, 2 * i + 1] for i in range(8)]
    assert pl.groups["ep"].tolist() == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert pl.groups["edp"].tolist() == [[i, i + 8] for i in range(8)]
    assert pl.groups["ep_etp"].tolist() == [list(range(8)), list(range(8, 16))]
    s = summary(plan)
    assert s["dims"]["etp"]["stride"] == 1 and s["dims"]["ep"]["stride"] == 2
    # EDP [0, 8]: one rank on each of two nodes, as the cost model assumes (1, 2)
    assert s["cost_model"]["edp"]["assumed_nodes"] == 2 and s["cost_model"]["edp"]["agrees"]
    assert s["cost_model"]["etp"]["assumed_nodes"] == 1 and s["cost_model"]["ep"]["agrees"]
    # the allgather dispatcher runs on the etp*ep block of 8 consecutive ranks
    s = summary(moe_plan("qwen3-30b-a3b", 16, dispatcher="allgather", tp=4, pp=1, dp=4, ep=4, etp=2))
    assert s["cost_model"]["ep"]["assumed_ranks_per_node"] == 8 and s["cost_model"]["ep"]["agrees"]
    # torchtitan 0.3 has no expert tensor parallelism
    with pytest.raises(UsageError, match="no expert tensor parallelism"):
        place(plan, "torchtitan")


def test_expert_groups_under_tp_pp_dp_mapping_and_torchtitan():
    # tp=2 pp=2 dp=4 ep=2 etp=1 on 16: edp = 4 = dp, which --use-tp-pp-dp-mapping needs;
    # expert order etp-ep-pp-edp: rank = i_ep + 2*(i_pp + 2*i_edp): EP [0,1], EDP [0,4,8,12]
    plan = moe_plan("qwen3-30b-a3b", 16, tp=2, pp=2, dp=4, ep=2)
    pl = place(plan, "megatron-tp-pp-dp")
    assert pl.groups["ep"][:2].tolist() == [[0, 1], [2, 3]]
    assert pl.groups["edp"][0].tolist() == [0, 4, 8, 12]
    assert pl.groups["pp"][0].tolist() == [0, 2]  # dense PP stride tp*cp = 2, the same groups
    # ep=8: edp = 2*4/8 = 1 != dp = 4: Megatron-Core refuses that mapping
    with pytest.raises(UsageError, match="edp=1 dp=4"):
        place(moe_plan("qwen3-30b-a3b", 32, tp=2, pp=4, dp=4, ep=8), "megatron-tp-pp-dp")
    # torchtitan 0.3's sparse mesh [pp, dp_replicate, efsdp, ep] gives Megatron's groups at etp 1
    a, b = place(plan, "megatron"), place(plan, "torchtitan")
    for dim in ("ep", "edp", "etp"):
        assert np.array_equal(a.groups[dim], b.groups[dim])


def test_nvl72_ep64_spans_nodes_inside_one_domain():
    # GB200 NVL72: 4-GPU trays, NVLink domain of 64 (collectives.nvlink_domain); EP 64 of
    # consecutive ranks spans 16 trays but one domain: the all-to-all stays on NVLink
    s = summary(moe_plan("qwen3-235b-a22b", 128, hw="gb200-nvl72", tp=1, pp=1, dp=128, ep=64))
    ep = s["dims"]["ep"]
    assert (ep["nodes_per_group"], ep["groups_crossing_nodes"]) == (16, 2)
    assert (ep["domains_per_group"], ep["groups_crossing_domains"]) == (1, 0)
    assert s["nvlink_domain"] == 64 and s["ep_leaves_nvlink_domain"] is False
    assert s["cost_model"]["ep"]["assumed_nodes"] == 1 and s["cost_model"]["ep"]["agrees"]


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8, 16, 32]),
       pp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
       etp=st.sampled_from([1, 2, 4]), hw=st.sampled_from(["dgx-h100", "gb200-nvl72"]),
       dispatcher=st.sampled_from(["alltoall", "allgather", "deepep", "hybridep"]))
def test_ep_span_is_what_the_cost_model_times(tp, dp, pp, ep, etp, hw, dispatcher):
    # The all-to-all is timed on group_span(ep_group) (cost.comm): its domain count decides
    # NVLink vs network. The enumerated EP groups must span that many domains, and one of them
    # leaves a domain iff the cost model puts the dispatch on the network.
    from hypothesis import assume
    from planner.cost.collectives import Links, span
    from planner.cost.moe import ep_group
    assume((tp * dp) % (etp * ep) == 0)
    plan = moe_plan("deepseek-v3", tp * dp * pp, hw=hw, dispatcher=dispatcher, tp=tp, pp=pp, dp=dp,
                    ep=ep, etp=etp)
    s = summary(plan)
    links = Links.of(plan.hardware)
    n_local, n_nodes = (int(x) for x in span(plan.layout, ep_group(plan.layout), links.domain))
    check = s["cost_model"]["ep"]
    assert check["agrees"]
    assert check["assumed_nodes"] == n_nodes
    if dispatcher != "allgather" or etp == 1:
        assert s["ep_leaves_nvlink_domain"] == (n_nodes > 1)
        if n_local > 1 or n_nodes == 1:  # a regular split: every group spans exactly n_nodes
            assert s["dims"]["ep"]["domains_per_group"] == n_nodes


def test_cli_placement_of_a_moe_plan(tmp_path):
    import json
    f = tmp_path / "plan.yaml"
    write_plan(moe_plan("deepseek-v3", 1024, tp=2, pp=8, dp=64, ep=64, first_stage_layers=7,
                        last_stage_layers=6), f)
    runner = CliRunner()
    res = runner.invoke(app, ["placement", str(f)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    rows = {ln.split()[0]: ln.split()[1:] for ln in lines if ln[:1].isupper() and ln.split()[1].isdigit()}
    # EP: 64 ranks, 1024/64 = 16 groups, stride 1, 8 per node over 8 nodes / 8 domains, all leave
    assert rows["EP"] == ["64", "16", "1", "8", "8", "8", "16", "16"]
    assert rows["EDP"] == ["2", "512", "64", "1", "2", "2", "512", "512"]
    assert "EP groups leave the NVLink domain of 8 GPUs: YES" in res.stdout
    assert "expert ranks: Megatron-Core etp-ep-edp-pp" in res.stdout
    res = runner.invoke(app, ["placement", str(f), "--json"])
    data = json.loads(res.stdout)
    assert data["groups"]["ep"][1] == list(range(64, 128)) and len(data["groups"]["edp"]) == 512
    assert data["nvlink_domain_of_rank"][1023] == 127 and data["ep_leaves_nvlink_domain"] is True
    res = runner.invoke(app, ["placement", str(f), "--order", "megatron-tp-pp-dp"])
    assert res.exit_code == 2 and "edp=2 dp=64" in res.stderr and len(res.stderr.splitlines()) == 1
