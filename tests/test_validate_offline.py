"""The validator's torch-free parts: the miniature, the prediction and the checks."""

from __future__ import annotations

import copy

import pytest

from planner import catalog
from planner.errors import UsageError
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from planner.validate.activations import predict_saved
from planner.validate.compare import compare
from planner.validate.miniature import miniature, predict


def _plan(model="175b", **layout) -> Plan:
    lay = Layout(**layout)
    return Plan(plan3d_version="0.1.0", model=catalog.resolve_model(model),
                hardware=catalog.resolve_hardware("dgx-h100"), gpus=lay.gpus,
                training=TrainingSpec(seq_length=2048, global_batch_size=1536), layout=lay)


PLAN = _plan(tp=4, pp=8, dp=16, zero_stage=1, micro_batch_size=2, sequence_parallel=True, vpp=12)


def test_miniature_keeps_every_kind_of_parallelism():
    run = miniature(PLAN, world=8)
    assert run.layout == Layout(tp=2, pp=2, dp=2, zero_stage=1, micro_batch_size=2,
                                sequence_parallel=True, vpp=2)
    m = run.model
    # 2 pp x 2 vpp x 1 layer; 4 heads of 16; vocabulary 128 * tp = 256; GPT-3's kind kept.
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.vocab_size) == (4, 64, 4, 256)
    assert (m.tie_embeddings, m.position_embedding, m.bias, m.norm) == (True, "learned", True, "layernorm")
    # m' = 2 * pp' = 4 micro-batches of 2 on each of 2 DP ranks: 16 sequences of 32.
    assert (run.training.global_batch_size, run.training.seq_length) == (16, 32)
    with pytest.raises(UsageError, match="needs 8 ranks"):
        miniature(PLAN, world=4)


def test_gqa_miniature_keeps_grouped_heads():
    run = miniature(_plan("llama3-70b", tp=8, pp=4, dp=4, zero_stage=3, micro_batch_size=1), 8)
    assert (run.model.num_attention_heads, run.model.kv_heads) == (4, 2)
    assert run.model.activation == "swiglu" and run.model.ffn == 128


def test_predicted_model_states_of_the_miniature():
    run = miniature(PLAN, world=8)
    pred = predict(run, 0)["memory"]
    # Stage 0 holds 2 layers of 25,184 parameters per TP rank (see test_validate.py) plus the
    # embedding 256*64/2 = 8,192 and learned positions 32*64 = 2,048: 60,608 params x 8 B.
    assert pred["params_bytes"] == 60_608 * 8
    assert pred["grads_bytes"] == 60_608 * 8
    # ZeRO-1, float64: master copy + Adam m, v of a 1/2 shard = 3 * 8 * 60,608 / 2.
    assert pred["optimizer_bytes"] == 3 * 8 * 60_608 / 2


@pytest.mark.parametrize("update", [{"optimizer_moment_bytes": 2}, {"optimizer_offload_fraction": 0.5}])
def test_optimizer_bytes_are_what_the_torch_adam_keeps(update):
    # The validator's torch Adam keeps a flat master copy and m, v in the run's element size,
    # whatever the plan's framework does (bf16 moments, optimizer offload): Llama 3 8B, tp 2,
    # dp 2, ZeRO-1, seq 512, float32 (e = 4): 3 x 4 B x the 1/2 shard of stage 0's parameters,
    # the same bytes as with fp32 moments and nothing offloaded (the prediction used to divide
    # 8 B of bf16 moments by 12: 2/3 of what the run holds).
    from dataclasses import replace
    from planner.validate.miniature import Run
    m = catalog.resolve_model("llama3-8b")
    tr = TrainingSpec(seq_length=512, global_batch_size=8)
    lay = Layout(tp=2, pp=1, dp=2, zero_stage=1, micro_batch_size=1)
    base = Run(m, tr, lay, dtype="float32")
    other = replace(base, training=tr.model_copy(update=update))
    expected = predict(base, 0)["memory"]["optimizer_bytes"]
    assert predict(other, 0)["memory"]["optimizer_bytes"] == expected
    params = predict(base, 0)["memory"]["params_bytes"] / 4  # e = 4 B per weight
    assert expected == pytest.approx(3 * 4 * params / 2)


def _records(run):
    """Fake per-rank records that are exactly the prediction (8 ranks, tp fastest)."""
    records = []
    for rank in range(run.world):
        tp, dp, pp = rank % 2, (rank // 2) % 2, rank // 4
        pred = predict(run, pp)
        records.append({"coord": {"pp": pp, "dp": dp, "tp": tp}, "losses": [2.5, 2.0, 1.5],
                        "step_s": [3.0, 1.0, 1.0], "comm": [{}, {}, dict(pred["comm"])],
                        "live_peak": [0, 0, 10 ** 7], **pred["memory"],
                        "saved_peak": [0, 0, predict_saved(run, pp)["predicted"]]})
    return records


def test_checks_pass_on_the_prediction_and_fail_on_one_byte():
    run = miniature(PLAN, world=8)
    records = _records(run)
    result = compare(run, records, [2.5, 2.0, 1.5])
    assert result["passed"] and all(c["passed"] for c in result["checks"])
    bad = copy.deepcopy(records)
    calls, size = bad[5]["comm"][-1]["tp:all_gather"]
    bad[5]["comm"][-1]["tp:all_gather"] = [calls, size + 1]  # one rank of stage 1, one byte
    result = compare(run, bad, [2.5, 2.0, 1.5])
    failed = [c["name"] for c in result["checks"] if not c["passed"]]
    assert failed == ["comm pp1 tp:all_gather"] and not result["passed"]


def test_loss_and_memory_tolerances():
    run = miniature(PLAN, world=8)
    records = _records(run)
    # float64: 1e-12 relative. 2.5 * (1 + 2e-12) fails, 2.5 * (1 + 5e-13) passes.
    assert not compare(run, records, [2.5 * (1 - 2e-12), 2.0, 1.5])["passed"]
    assert compare(run, records, [2.5 * (1 - 5e-13), 2.0, 1.5])["passed"]
    # Memory within 2%: +1.5% passes, +2.5% fails.
    for factor, ok in ((1.015, True), (1.025, False)):
        rec = copy.deepcopy(records)
        rec[0]["params_bytes"] *= factor
        assert compare(run, rec, [2.5, 2.0, 1.5])["passed"] is ok
    # No reference: losses are reported, not checked.
    result = compare(run, records, None)
    assert not any(c["name"].startswith("loss") for c in result["checks"])
    assert any(r["name"] == "loss step 0" for r in result["reported"])


def test_a_torchtitan_plan_is_predicted_with_the_miniatures_megatron_loss():
    # torchtitan's fp32 loss holds 12 B per logit, Megatron's 6; the miniature runs Megatron's
    # loss, so a torchtitan plan's activation check failed by 6 B x T x V/t on its last stage
    from planner.validate.activations import predicted_activations
    layout = dict(tp=2, pp=4, dp=8, zero_stage=1, micro_batch_size=1, vpp=2)
    mega = _plan("llama3-70b", **layout)
    titan = mega.model_copy(update={"training": mega.training.model_copy(
        update={"loss_bytes_per_logit": 12.0})})
    last = miniature(mega, world=8).layout.pp - 1
    a = predicted_activations(miniature(mega, world=8), last)["bytes"]
    b = predicted_activations(miniature(titan, world=8), last)["bytes"]
    assert a == b
