"""plan3d validate: real 8-rank gloo runs of plan miniatures (skipped without torch).

Each run forks 8 ranks (tp=2 x pp=2 x dp=2) and asserts, against the cost model:
- the loss of every step equals the single-process reference within 1e-12 relative (float64);
- every rank's collective calls and payload bytes per (group, kind) equal
  planner.cost.volumes.step_volumes(impl="torch") exactly;
- parameter, gradient and optimizer-state bytes per rank are within 2% of planner.cost.memory.
About 20-40 s per run on 2 cores.
"""

from __future__ import annotations

import pytest

from planner import catalog
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec

torch = pytest.importorskip("torch")


def make_plan(model: str, **layout) -> Plan:
    m = catalog.resolve_model(model)
    hw = catalog.resolve_hardware("dgx-h100")
    lay = Layout(**layout)
    training = TrainingSpec(seq_length=2048, global_batch_size=lay.dp * lay.micro_batch_size * 64)
    return Plan(plan3d_version="0.1.0", model=m, hardware=hw, gpus=lay.gpus, training=training,
                layout=lay)


def _assert_all(result: dict) -> None:
    failed = [c for c in result["checks"] if not c["passed"]]
    assert not failed, failed
    names = [c["name"] for c in result["checks"]]
    assert sum(n.startswith("loss step") for n in names) == 2
    assert any(n.startswith("comm pp0 tp:") for n in names)
    assert any(n.startswith("comm pp1 dp:") for n in names)


def test_gpt3_zero1_sp_interleaved_tied():
    """The done-when plan's miniature: GPT-3 (LayerNorm, biases, learned positions, tied
    embeddings), ZeRO-1, SP, interleaved 1F1B (vpp 2), one micro-batch of one sequence."""
    from planner.validate import run_local
    plan = make_plan("175b", tp=4, pp=8, dp=16, zero_stage=1, micro_batch_size=1,
                     sequence_parallel=True, vpp=12)
    result, records = run_local(plan, world=8, steps=2, timeout_s=400)
    _assert_all(result)
    expected = dict(tp=2, pp=2, dp=2, zero_stage=1, micro_batch_size=1, recompute="none",
                    sequence_parallel=True, vpp=2, cp=1)
    assert {k: result["run"]["layout"][k] for k in expected} == expected
    checks = {c["name"]: c for c in result["checks"]}
    # Hand count, rank at pp 0 (stages 0 and 2: embedding + 2 layers), m = 4 micro-batches,
    # X = b*s*h*8 B = 1*32*64*8 = 16,384 B. TP all-gathers: 2 layers x 4 (2 fwd, 2 bwd) x 4 mb
    # = 32, + 4 embedding backward (Replicate -> Shard(1)) = 36 calls, 36 * 16,384 = 589,824 B.
    assert checks["comm pp0 tp:all_gather"]["measured"] == [36, 589_824]
    # Tied embeddings: one all-reduce of V*h/tp*8 = 256*64/2*8 = 65,536 B between the stages.
    assert checks["comm pp0 embd:all_reduce"]["measured"] == [1, 65_536]
    # p2p with SP: m*(2*vpp - 1) = 12 sends of b*s*h/tp*8 = 8,192 B.
    assert checks["comm pp0 pp:send"]["measured"] == [12, 98_304]
    # ZeRO-1 optimizer: fp64 master + Adam m, v of the 1/dp shard: 3 * 484,864 / 2 = 727,296 B.
    assert checks["optimizer_bytes pp0"]["measured"] == 727_296
    # DCP checkpoint, pp 0 (2 layers + embedding), h = 64, tp 2: TP-sharded per layer
    # (12h^2 + 7h)/2 = 24,800, embedding 256*64/2 = 8,192 -> 57,792; TP replicas (norms,
    # row biases 6h = 384 per layer, positions 32*64 = 2,048) 2,816, on TP rank 0 only.
    # 4 kinds (weights, fp64 master, m, v) x 8 B = 32 B each, over dp = 2 ranks:
    # tp0 (57,792 + 2,816)/2*32 = 969,728 B; tp1 57,792/2*32 = 924,672 B.
    assert checks["checkpoint_bytes pp0 tp0"]["measured"] == 969_728
    assert checks["checkpoint_bytes pp0 tp1"]["measured"] == 924_672
    assert all(c["rel_diff"] <= 1e-12 for c in result["checks"] if c["rel_diff"] is not None)


def test_llama_zero3_sp_full_recompute():
    """Llama-3 style (RMSNorm, SwiGLU, RoPE, GQA, no biases, untied), FSDP2 ZeRO-3, SP, full
    recompute, 1F1B."""
    from planner.validate import run_local
    plan = make_plan("llama3-70b", tp=8, pp=4, dp=8, zero_stage=3, micro_batch_size=1,
                     sequence_parallel=True, recompute="full")
    result, _ = run_local(plan, world=8, steps=2, timeout_s=400)
    _assert_all(result)
    checks = {c["name"]: c for c in result["checks"]}
    # FSDP2 ZeRO-3 under pipelining: each unit is gathered m+1 = 5 times per step; the rank at
    # pp 0 has 2 unit types: 1 layer unit and the embedding root unit -> 2 x 5 = 10 calls.
    assert checks["comm pp0 dp:all_gather"]["measured"][0] == 10
    assert checks["comm pp0 dp:reduce_scatter"]["measured"][0] == 2
    # Full recompute with SP adds 2 all-gathers + 1 reduce-scatter per layer per micro-batch:
    # (4 + 2) * 1 layer * 4 mb = 24, + 4 for the embedding backward = 28 all-gathers.
    assert checks["comm pp0 tp:all_gather"]["measured"][0] == 28
    assert checks["comm pp0 tp:reduce_scatter"]["measured"][0] == 20
    # DCP checkpoint: h = 64, 4 heads, 2 KV heads, d 16, SwiGLU f = 128, tp 2. TP-sharded per
    # layer: QKV 64*16*(4+4)/2 = 4,096 + O 2,048 + MLP 3*64*128/2 = 12,288 = 18,432; pp 0 adds
    # the embedding 256*64/2 = 8,192; TP replicas: 2 RMSNorms 128 (+ the final norm 64 on the
    # last rank). FSDP2 keeps no master copy: 3 kinds x 8 B = 24 B, over dp = 2 ranks.
    # pp0: tp0 (26,624 + 128)/2*24 = 321,024, tp1 26,624/2*24 = 319,488; pp1 (output layer
    # 8,192 untied): tp0 (26,624 + 192)/2*24 = 321,792, tp1 319,488.
    assert [checks[f"checkpoint_bytes pp{p} tp{t}"]["measured"] for p in (0, 1) for t in (0, 1)] \
        == [321_024, 319_488, 321_792, 319_488]


def test_validate_cli_world_too_small(tmp_path):
    """Bad input through the CLI: --world too small is one line, exit 2, before any fork."""
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.export import write_plan
    path = tmp_path / "plan.yaml"
    write_plan(make_plan("175b", tp=4, pp=8, dp=16, zero_stage=1, micro_batch_size=1), path)
    res = CliRunner().invoke(app, ["validate", str(path), "--local", "--world", "4"])
    assert res.exit_code == 2
    assert "needs 8 ranks" in res.output


def test_context_parallel_miniature():
    """The plan `plan3d search --model 175b --gpus 512` exports (tp=2 cp=2 pp=16 dp=8, ZeRO-1,
    SP, vpp 6) on 8 ranks: tp'=cp'=pp'=2, dp' = 1 (reported as not exercised), K/V all-gathered
    over the cp group, the sequence in 2*cp load-balanced chunks. About 16 s on 2 cores."""
    from planner.validate import run_local
    plan = make_plan("175b", tp=2, cp=2, pp=16, dp=8, zero_stage=1, micro_batch_size=1,
                     sequence_parallel=True, vpp=6)
    result, _ = run_local(plan, world=8, steps=2, timeout_s=400)
    failed = [c for c in result["checks"] if not c["passed"]]
    assert not failed, failed
    expected = dict(tp=2, cp=2, pp=2, dp=1, zero_stage=1, sequence_parallel=True, vpp=2)
    assert {k: result["run"]["layout"][k] for k in expected} == expected
    assert [d["feature"] for d in result["not_exercised"]] == ["dp", "dropout"]  # GPT-3: 0.1
    checks = {c["name"]: c for c in result["checks"]}
    assert all(checks[f"loss step {i}"]["rel_diff"] <= 1e-12 for i in range(2))
    # Per layer per micro-batch one all-gather of K and V of the whole sequence, 2 local heads:
    # 2 * b1 * s32 * 2 * d16 * 8 B = 16,384 B; 2 layers (vpp 2) x 4 micro-batches = 8 calls.
    for pp in (0, 1):
        assert checks[f"comm pp{pp} cp:all_gather"]["measured"] == [8, 131_072]
        assert checks[f"comm pp{pp} cp:reduce_scatter"]["measured"] == [8, 131_072]
    # p2p with SP and CP: 12 sends of b * s/cp * h / tp * 8 = 1*16*64/2*8 = 4,096 B.
    assert checks["comm pp0 pp:send"]["measured"] == [12, 49_152]
    # Dense gradients reduce-scattered over dp*cp = 2 ranks: 60,608 params x 8 B.
    assert checks["comm pp0 dp:reduce_scatter"]["measured"] == [1, 484_864]
    # Activations checked per pipeline rank. K and V of the whole sequence (the all-gather
    # form) are saved: 2*b*(s - s/cp)*(g/tp)*d*e = 2*1*16*2*16*8 = 8,192 B more than the ring
    # per layer per micro-batch, times the layers in flight: rank 0 holds 2*(pp-1) + (vpp-1)*pp
    # + 1 = 5 chunks of 1 layer, rank 1 holds 3.
    for pp, layers in ((0, 5), (1, 3)):
        act = checks[f"activations pp{pp}"]
        assert act["passed"] and act["tolerance"] == 0.01
        kv = next(d for d in act["deltas"] if d["name"] == "cp gathered kv")
        assert (kv["count"], kv["each"], kv["bytes"]) == (layers, 8_192, layers * 8_192)


def test_activations_follow_cp_1_to_2_and_fail_on_a_wrong_formula(monkeypatch):
    """The activation check on the llama2-7b plan with cp 1 and cp 2 (tp 1, dp 2, ZeRO-3, full
    recompute, micro-batch 2) on 4 ranks: it passes for both, the measured bytes are the hand
    derivation of test_validate_activations.py, and the measured change from cp 1 to cp 2
    matches the predicted change. With the formula halved the same records fail it."""
    import numpy as np

    from planner.cost import memory
    from planner.validate import run_local
    from planner.validate.activations import ACT_RTOL
    from planner.validate.compare import compare
    from planner.validate.miniature import miniature

    from .test_validate_activations import (CP1_FORMULA, CP1_SAVED, CP2_FORMULA, CP2_SAVED,
                                            llama2_plan)
    runs = {}
    for cp in (1, 2):
        result, records = run_local(llama2_plan(cp), world=4, steps=2, timeout_s=400)
        failed = [c for c in result["checks"] if not c["passed"]]
        assert not failed, failed
        assert result["run"]["layout"]["cp"] == cp and result["run"]["layout"]["dp"] == 2
        runs[cp] = (result, records)
    act = {cp: next(c for c in runs[cp][0]["checks"] if c["name"] == "activations pp0")
           for cp in (1, 2)}
    assert (act[1]["measured"], act[2]["measured"]) == (CP1_SAVED, CP2_SAVED)
    assert (act[1]["formula"], act[2]["formula"]) == (CP1_FORMULA, CP2_FORMULA)
    measured = act[2]["measured"] / act[1]["measured"] - 1   # -44.0 %
    predicted = act[2]["predicted"] / act[1]["predicted"] - 1
    assert abs(measured - predicted) <= ACT_RTOL
    assert act[2]["formula"] / act[1]["formula"] - 1 == -0.5  # the formula alone: -50 %
    assert any(n.startswith("activation delta 'cp gathered kv'") for n in runs[2][0]["notes"])

    real = memory.activation_bytes_by_stage
    monkeypatch.setattr(memory, "activation_bytes_by_stage",
                        lambda *a, **k: {r: np.asarray(v) / 2 for r, v in real(*a, **k).items()})
    result, records = runs[2]
    reference = [c["predicted"] for c in result["checks"] if c["name"].startswith("loss")]
    wrong = compare(miniature(llama2_plan(2), world=4, steps=2), records, reference)
    failed = [c["name"] for c in wrong["checks"] if not c["passed"]]
    assert failed == ["activations pp0"] and not wrong["passed"]
