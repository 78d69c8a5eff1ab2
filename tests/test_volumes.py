"""planner.cost.volumes: per-rank per-step collective volumes, checked by hand (no torch)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from planner import catalog
from planner.cost import memory
from planner.cost.memory import rank_params
from planner.validate.torch_volumes import step_volumes
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec

GPT3 = catalog.resolve_model("175b")
TRAIN = TrainingSpec(seq_length=2048, global_batch_size=1536)
# The plan `plan3d search --model 175b --gpus 512` picks (dgx-h100).
PLAN = Layout(tp=4, pp=8, dp=16, zero_stage=1, micro_batch_size=2, sequence_parallel=True, vpp=12)
# m = 1536 / (16 * 2) = 48 micro-batches; 96 / 8 = 12 layers per rank;
# X = b*s*h*2 B = 2*2048*12288*2 = 100,663,296 B.
X = 100_663_296
# One layer on one of 4 TP ranks: GEMMs (2*h*d*a + 2*h*d*g + 2*h*f)/4 = 1,811,939,328/4 =
# 452,984,832; column biases (a*d + 2*d*g + f)/4 = 86,016/4 = 21,504; replicated 2 norms x 2h +
# 2 row biases of h = 73,728 -> 453,080,064 parameters.
LAYER = 453_080_064


def test_layer_params_match_hand_count():
    params = rank_params(GPT3, Candidates.from_layouts([PLAN]), 3)
    assert (params["layer"][0], params["layers"][0]) == (LAYER, 12)


def test_megatron_middle_rank():
    v = step_volumes(GPT3, TRAIN, PLAN, pp_rank=3)
    # SP: 2 AG fwd + 2 AG (conjugate) + 2 re-gathers bwd = 6 per layer per micro-batch:
    # 48 * 12 * 6 = 3,456 calls; RS 4 per layer: 2,304 calls.
    assert v[("tp", "all_gather")] == (3456, 3456 * X)
    assert v[("tp", "reduce_scatter")] == (2304, 2304 * X)
    # SP norm + row-bias grads, coalesced: (2*12 norms * 2h + 2*12 biases * h) * 4 B
    # = (48 + 24) * 12288 * 4 = 3,538,944 B in 1 call.
    assert v[("tp", "all_reduce")] == (1, 3_538_944)
    # p2p: m * 2 * vpp = 48 * 24 = 1,152 sends of b*s*h/tp * 2 B = 25,165,824 B.
    assert v[("pp", "send")] == (1152, 1152 * 25_165_824)
    assert v[("pp", "recv")] == v[("pp", "send")]
    # Distributed optimizer: RS of 12 layers of fp32 grads, AG of bf16 params, once per step.
    assert v[("dp", "reduce_scatter")] == (1, 12 * LAYER * 4)
    assert v[("dp", "all_gather")] == (1, 12 * LAYER * 2)
    assert ("embd", "all_reduce") not in v


def test_megatron_first_rank_edges_and_consistency_with_memory():
    v = step_volumes(GPT3, TRAIN, PLAN, pp_rank=0)
    # + embedding reduce-scatter (SP) per micro-batch: 2,304 + 48 = 2,352.
    assert v[("tp", "reduce_scatter")][0] == 2352
    # p2p: stage 0 receives nothing forward and sends nothing backward: 48 * 23 = 1,104.
    assert v[("pp", "send")][0] == 1104
    # Tied embeddings, pp > 1: all-reduce V_p*h/tp*4 B = 50,688*12,288/4*4 = 622,854,144 B.
    assert v[("embd", "all_reduce")] == (1, 622_854_144)
    # DP gradient bytes of rank 0, by hand: 4 B x (12 layers x 453,080,064 parameters per GPU
    # + the word embedding 50,688*12,288/4 + positions 2,048*12,288) = 22,471,360,512 B
    assert v[("dp", "reduce_scatter")][1] == 22_471_360_512
    # and the same parameters the memory model holds on that rank (what step.py times)
    first = memory.stage_params(GPT3, Candidates.from_layouts([PLAN]), "first")[0]
    assert 4 * first == 22_471_360_512


def test_torch_differences_on_a_middle_rank():
    v = step_volumes(GPT3, TRAIN, PLAN, pp_rank=3, impl="torch")
    # No re-gathers: 4 all-gathers per layer per micro-batch = 2,304.
    assert v[("tp", "all_gather")] == (2304, 2304 * X)
    # One all-reduce per LayerNorm tensor: 24 norms * 2 tensors = 48 calls of h * 4 B.
    assert v[("tp", "all_reduce")] == (48, 48 * 12288 * 4)
    # ZeRO-1 flat buffer padded to a multiple of dp: 12 * LAYER = 5,436,960,768 (divisible by 16).
    assert v[("dp", "reduce_scatter")] == (1, 12 * LAYER * 4)


def test_torch_zero3_gathers_each_unit_m_plus_1_times():
    lay = Layout(tp=2, pp=2, dp=2, zero_stage=3, micro_batch_size=1, vpp=1)
    train = TrainingSpec(seq_length=32, global_batch_size=8)  # m = 8 / 2 = 4
    small = GPT3.model_copy(update=dict(num_layers=4, hidden_size=64, num_attention_heads=4,
                                        ffn_hidden_size=256, vocab_size=256,
                                        max_position_embeddings=32))
    v = step_volumes(small, train, lay, pp_rank=0, impl="torch", act_bytes=8, weight_bytes=8,
                     grad_bytes=8)
    # 2 layer units + the embedding unit, each gathered m + 1 = 5 times: 15 calls. Bytes: 5 x
    # (2 layers x 25,184 + embedding 256*64/2 + positions 32*64 = 10,240) x 8 B = 2,424,320 B,
    # the count measured on 8 gloo ranks (validator_notes.md section 5 method).
    assert v[("dp", "all_gather")] == (15, 2_424_320)
    assert v[("dp", "reduce_scatter")] == (3, 484_864)
    # The tied-embedding all-reduce moves the dp-sharded gradient: 256*64/2/2 * 8 = 32,768 B.
    assert v[("embd", "all_reduce")] == (1, 32_768)


def test_single_gpu_moves_nothing_and_bad_rank():
    one = Layout(tp=1, pp=1, dp=1, zero_stage=0, micro_batch_size=1)
    assert step_volumes(GPT3, TRAIN, one) == {}
    with pytest.raises(ValueError):
        step_volumes(GPT3, TRAIN, PLAN, pp_rank=8)


def test_cli_does_not_import_torch():
    import subprocess
    code = "import planner.cli, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_validate_without_torch_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    from typer.testing import CliRunner

    from planner.cli import app
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "plan.yaml"), "--local"])
    assert res.exit_code == 2
    from planner.errors import VALIDATE_EXTRA
    assert VALIDATE_EXTRA in " ".join(res.output.split())
    assert "Traceback" not in res.output


def test_volumes_are_numpy_free_ints():
    v = step_volumes(GPT3, TRAIN, PLAN, pp_rank=7, impl="torch")
    assert all(isinstance(c, int) and isinstance(b, int) for c, b in v.values())
    # last rank: logits all-gather per micro-batch, b*s*V_p*2 = 2*2048*50688*2 B.
    assert np.isclose(v[("tp", "all_gather")][1], (2304 + 48) * X + 48 * 2 * 2048 * 50688 * 2)
