"""Rank placement (planner.placement) against hand-enumerated groups and the cost model."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from planner import __version__, catalog
from planner.cli import app
from planner.export import write_plan
from planner.placement import place, rank_grid, summary
from planner.specs import Layout, Plan, TrainingSpec


def make(tp, pp, dp, model="175b", hw="dgx-h100", gbs=1536) -> Plan:
    m = catalog.resolve_model(model)
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware(hw),
                gpus=tp * pp * dp, training=TrainingSpec(seq_length=2048, global_batch_size=gbs),
                layout=Layout(tp=tp, pp=pp, dp=dp, zero_stage=1, micro_batch_size=1))


def test_megatron_order_small_grid():
    # tp=2 dp=2 pp=2, rank = i_tp + 2*(i_dp + 2*i_pp) (formulas.md 5.3); the validator's torchrun
    # mesh (pp, dp, tp) gave rank 3 -> tp [2,3], dp [1,3], pp [3,7] (validator_notes.md section 1)
    g = rank_grid(2, 1, 2, 2, "megatron")
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
    assert "128 groups of 4" in res.stdout
    res = runner.invoke(app, ["placement", str(f), "--json", "--order", "torchtitan"])
    import json
    data = json.loads(res.stdout)
    assert len(data["groups"]["tp"]) == 128 and len(data["groups"]["dp"]) == 32
    assert len(data["node_of_rank"]) == 512 and data["node_of_rank"][511] == 63
    res = runner.invoke(app, ["placement", str(f), "--order", "jax"])
    assert res.exit_code == 2 and "unknown rank order" in res.stderr
