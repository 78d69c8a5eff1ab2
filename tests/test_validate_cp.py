"""The validator's handling of context parallel, the distributed optimizer and uneven pipeline
splits, without torch: the miniature, the predicted volumes and the not-exercised notes."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.cost.memory import rank_params
from planner.validate.torch_volumes import step_volumes
from planner.layout import Candidates
from planner.errors import UsageError
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from planner.render.validate import render
from planner.validate.activations import predict_saved
from planner.validate.compare import compare
from planner.validate.miniature import full_scale, miniature, predict


def _plan(model="175b", **layout) -> Plan:
    lay = Layout(**layout)
    return Plan(plan3d_version="0.1.0", model=catalog.resolve_model(model),
                hardware=catalog.resolve_hardware("dgx-h100"), gpus=lay.gpus,
                training=TrainingSpec(seq_length=2048, global_batch_size=1536), layout=lay)


# What `plan3d search --model 175b --gpus 512 --export` writes (checked 2026-11-29).
CP_PLAN = _plan(tp=2, cp=2, pp=16, dp=8, zero_stage=1, micro_batch_size=1,
                sequence_parallel=True, vpp=6)


def test_cp_miniature_on_8_ranks_drops_dp_and_says_so():
    run = miniature(CP_PLAN, world=8)
    assert run.layout == Layout(tp=2, cp=2, pp=2, dp=1, zero_stage=1, micro_batch_size=1,
                                sequence_parallel=True, vpp=2)
    assert [d["feature"] for d in run.not_exercised] == ["dp", "dropout"]
    assert "--world 16 keeps dp = 2" in run.not_exercised[0]["reason"]
    assert run.notes == ()
    # m' = 2*pp' = 4 micro-batches of 1 sequence on dp' = 1.
    assert run.training.global_batch_size == 4
    assert run.worker_config("x")["cp"] == 2


def test_cp_miniature_on_16_ranks_keeps_all_four():
    run = miniature(CP_PLAN, world=16)
    assert (run.layout.tp, run.layout.cp, run.layout.pp, run.layout.dp) == (2, 2, 2, 2)
    assert [d["feature"] for d in run.not_exercised] == ["dropout"]
    # ZeRO-1 shards over dp*cp = 4: fp64 master + Adam m, v = 3 * 8 * 60,608 / 4 bytes.
    assert predict(run, 0)["memory"]["optimizer_bytes"] == 3 * 8 * 60_608 / 4


def test_cp_miniature_needs_8_ranks():
    with pytest.raises(UsageError, match=r"tp=2 cp=2 pp=2 dp=1\) needs 8 ranks"):
        miniature(CP_PLAN, world=4)


def test_cp_volumes_of_the_miniature():
    comm = predict(miniature(CP_PLAN, world=8), 0)["comm"]
    # K and V of the whole sequence for 4/2 = 2 local KV heads: 2 * b1 * s32 * 2 * d16 * 8 B =
    # 16,384 B per all-gather; one per layer per micro-batch: 2 layers (vpp 2) x 4 mb = 8 calls.
    assert comm["cp:all_gather"] == [8, 131_072]
    assert comm["cp:reduce_scatter"] == [8, 131_072]
    # TP and PP messages carry s/cp = 16 tokens: SP p2p b*16*64/2*8 = 4,096 B x 12 sends.
    assert comm["pp:send"] == [12, 49_152]
    assert comm["tp:all_gather"] == [36, 36 * 1 * 16 * 64 * 8]
    # Dense gradients over dp*cp = 2 ranks: 60,608 params x 8 B, one reduce-scatter.
    assert comm["dp:reduce_scatter"] == [1, 484_864]


def test_cp_recompute_repeats_the_gather_and_megatron_is_a_ring():
    run = miniature(_plan(tp=2, cp=2, pp=16, dp=8, zero_stage=1, micro_batch_size=1,
                          recompute="selective", vpp=6), world=8)
    assert predict(run, 0)["comm"]["cp:all_gather"] == [16, 16 * 16_384]
    mega = step_volumes(run.model, run.training, run.layout, 0, impl="megatron",
                        act_bytes=8, weight_bytes=8, grad_bytes=8)
    # Ring (formulas.md 5.7): 3(cp-1) = 3 p2p of X_kv = 2 * 16 * 1 * 2 * 16 * 8 = 8,192 B per
    # layer per micro-batch: 3 x 2 layers x 4 mb = 24 sends, 196,608 B.
    assert mega[("cp", "send")] == (24, 196_608)
    assert ("cp", "all_gather") not in mega


def test_distributed_optimizer_runs_as_zero1_with_a_note():
    plan = _plan(tp=4, pp=8, dp=16, zero_stage=0, distributed_optimizer=True, micro_batch_size=1)
    run = miniature(plan, world=8)
    assert run.layout.zero_stage == 1 and not run.layout.distributed_optimizer
    assert run.notes[0].startswith("distributed_optimizer: run as ZeRO-1")
    comm = predict(run, 0)["comm"]
    assert "dp:all_reduce" not in comm and comm["dp:reduce_scatter"][0] == 1
    full = full_scale(plan, 1, "float64", 2, "cpu")
    assert full.layout.zero_stage == 1 and full.notes == run.notes


def test_uneven_split_is_kept_uneven():
    plan = _plan(tp=4, pp=8, dp=4, zero_stage=2, micro_batch_size=2,
                 first_stage_layers=14, last_stage_layers=10)  # middle (96-24)/6 = 12
    run = miniature(plan, world=8)
    # The plan's first stage is the larger: K+1 = 2 and K = 1 layers.
    assert (run.layout.first_stage_layers, run.layout.last_stage_layers) == (2, 1)
    assert run.model.num_layers == 3 and run.stage_layers() == [2, 1]
    assert run.notes == ("uneven pipeline split 14+..+10 layers: run as 2+1 on pp' = 2",)
    assert [d["feature"] for d in run.not_exercised] == ["dropout"]
    c = Candidates.from_layouts([run.layout])
    assert rank_params(run.model, c, 0)["layers"][0] == 2
    assert rank_params(run.model, c, 1)["layers"][0] == 1
    # No SP: 4 all-reduces of X = 2*32*64*8 = 32,768 B per layer per micro-batch (m = 4), plus
    # the embedding's (pp 0) or the output layer's input-gradient all-reduce (pp 1) per mb.
    assert predict(run, 0)["comm"]["tp:all_reduce"] == [2 * 4 * 4 + 4, 36 * 32_768]
    assert predict(run, 1)["comm"]["tp:all_reduce"] == [1 * 4 * 4 + 4, 20 * 32_768]


def test_uneven_split_with_interleaving_is_reported_not_exercised():
    plan = _plan(tp=4, pp=8, dp=4, zero_stage=1, micro_batch_size=1, vpp=2,
                 first_stage_layers=14, last_stage_layers=10)
    run = miniature(plan, world=8)
    assert run.layout.first_stage_layers == 0 and run.stage_layers() is None
    assert [d["feature"] for d in run.not_exercised] == ["uneven pipeline split", "dropout"]


def test_notes_reach_the_json_result_and_the_table(capsys):
    run = miniature(CP_PLAN, world=8)
    records = []
    for rank in range(8):  # tp fastest, then cp, then pp (dp' = 1)
        tp, cp, pp = rank % 2, (rank // 2) % 2, rank // 4
        pred = predict(run, pp)
        records.append({"coord": {"pp": pp, "dp": 0, "cp": cp, "tp": tp}, "losses": [2.5, 2.0],
                        "step_s": [3.0, 1.0], "comm": [{}, dict(pred["comm"])],
                        "live_peak": [0, 10 ** 7], **pred["memory"],
                        "saved_peak": [0, predict_saved(run, pp)["predicted"]]})
    result = compare(run.__class__(**{**run.__dict__, "steps": 2}), records, [2.5, 2.0])
    assert result["passed"]
    assert result["not_exercised"][0]["feature"] == "dp"
    # CP 2 runs have deltas the plan's formula leaves out (the gathered K/V, the CP mask):
    # notes must exist, or all() over none would pass on a run that dropped them
    assert result["notes"] and all(n.startswith("activation delta '") for n in result["notes"])
    render(result, None)
    out = capsys.readouterr().out
    assert "tp=2 cp=2 pp=2 dp=1" in out and "not exercised: dp: dp' = 1" in out


def test_dropout_is_reported_not_exercised_never_dropped_silently():
    # gpt3-175b has dropout 0.1 (catalog); both runs set it to 0 and must say so.
    run = miniature(CP_PLAN, world=8)
    assert run.model.dropout == 0.0
    entry = run.not_exercised[-1]
    assert entry["feature"] == "dropout" and entry["reason"].startswith("dropout 0.1 run as 0")
    full = full_scale(CP_PLAN, 1, "float64", 2, "cpu")
    assert full.model.dropout == 0.0 and full.not_exercised[-1] == entry
    # A model without dropout (llama3-8b: 0.0) gets no entry.
    llama = miniature(_plan("llama3-8b", tp=2, pp=2, dp=2, zero_stage=1, micro_batch_size=1),
                     world=8)
    assert llama.not_exercised == ()
