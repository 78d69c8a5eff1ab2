"""Memory terms of the measured MoE runs' settings, hand-derived: optimizer-state offload,
fine-grained activation offload of the experts' fc1 and activation inputs, and the in-place
(Transformer Engine) cross entropy."""

from __future__ import annotations

import numpy as np
import pytest

from planner.catalog import models
from planner.cost import block_activations, blocks, memory
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec


def _cands(**kw) -> Candidates:
    base = dict(tp=1, pp=1, dp=8, zero_stage=0, micro_batch_size=1, distributed_optimizer=True)
    base.update(kw)
    return Candidates.from_layouts([Layout(**base)])


def test_optimizer_offload_moves_the_optimizer_states_to_the_host():
    c = _cands()
    on = TrainingSpec(seq_length=4096, global_batch_size=64)
    half = on.model_copy(update={"optimizer_offload_fraction": 0.5})
    # 1e9 parameters, distributed optimizer over dp 8: (4 master + 8 moments) / 8 = 1.5 GB;
    # half of it offloaded: 0.75 GB; weights (2 B) and gradients stay
    a = memory.model_state_bytes(np.array([1e9]), c, on)
    b = memory.model_state_bytes(np.array([1e9]), c, half)
    assert float(a["optimizer"][0]) == pytest.approx(1.5e9)
    assert float(b["optimizer"][0]) == pytest.approx(0.75e9)
    assert float(b["weights"][0]) == float(a["weights"][0])


def test_activation_offload_drops_the_experts_fc1_and_activation_inputs():
    m = models()["qwen3-30b-a3b"]  # h 2048, moe F 768, top-8, SwiGLU
    c = _cands(ep=8)
    t = TrainingSpec(seq_length=4096, global_batch_size=64)
    kept = block_activations.activation_bytes_per_token(m, t, c, np.array([3]))["moe"]
    off = t.model_copy(update={"moe_activation_offload": True})
    dropped = block_activations.activation_bytes_per_token(m, off, c, np.array([3]))["moe"]
    # per routed row (etp 1, bf16): dispatched tokens 2 x 2048 = 4096 B and fc1 output
    # 2 x 2 x 768 = 3072 B leave the GPU; 8 rows per token: 8 x 7168 = 57,344 B
    assert float(kept[0] - dropped[0]) == pytest.approx(8 * (2 * 2048 + 2 * 2 * 768))


def test_in_place_cross_entropy_keeps_two_bytes_per_logit():
    m = models()["llama3-8b"]  # vocab 128,256 (a multiple of 128: no padding)
    c = _cands()
    t = TrainingSpec(seq_length=4096, global_batch_size=64)
    te = t.model_copy(update={"cross_entropy_in_place": True})
    a = memory.activation_bytes_by_stage(m, t, c)
    b = memory.activation_bytes_by_stage(m, te, c)
    # the last (here the only) rank: 4096 tokens x 128,256 logits x (6 - 2) B = 2.101e9 B
    last = list(a)[-1]
    assert float(np.asarray(a[last]).ravel()[0] - np.asarray(b[last]).ravel()[0]) == \
        pytest.approx(4096 * 128256 * 4.0)


@pytest.mark.parametrize("tp, recompute", [(1, 0), (1, 3), (2, 0), (8, 0)])
def test_qk_norm_inputs_are_saved_for_the_backward(tp, recompute):
    # Qwen3-30B-A3B: 32 query heads, 4 KV heads, head dim 128, a norm per head on q and k.
    # Each norm saves its bf16 input: 2 x 128 x (32 + g') B per token over the TP group, where
    # g' = max(4, t) (one replicated KV head per rank at t = 8), split by t:
    # t 1: 2 x 128 x 36 = 9,216 B; t 2: 9,216 / 2 = 4,608; t 8: 2 x 128 x 40 / 8 = 1,280.
    # moe.md 5.5 (s 4096, t 1): 4096 x 9,216 = 37.7 MB "q/k-norm inputs". The layernorm
    # recompute module (code 3) keeps them: it drops the input and pre-MLP norms only.
    m = models()["qwen3-30b-a3b"]
    plain = m.model_copy(update={"qk_norm": "none"})
    c = _cands(tp=tp, dp=8, sequence_parallel=tp > 1)
    t = TrainingSpec(seq_length=4096, global_batch_size=64)
    rc = np.array([recompute])
    with_norm = block_activations.activation_bytes_per_token(m, t, c, rc)["attention"]
    without = block_activations.activation_bytes_per_token(plain, t, c, rc)["attention"]
    expected = {1: 9216.0, 2: 4608.0, 8: 1280.0}[tp]
    assert float(with_norm[0] - without[0]) == pytest.approx(expected)
    # and the norms' memory-bound traffic, read 2 + write 2 per element: twice the saved bytes
    e_norm = blocks.elementwise_bytes_per_token(m, c, t)["attention"]
    e_plain = blocks.elementwise_bytes_per_token(plain, c, t)["attention"]
    assert float(np.asarray(e_norm - e_plain).ravel()[0]) == pytest.approx(2 * expected)


@pytest.mark.parametrize("etp, expected", [(1, 25_600.0), (2, 41_984.0)])
def test_fp8_quantized_elements_of_routed_rows_grow_with_expert_tp(etp, expected):
    # Qwen3-30B-A3B (h 2048, F 768, top-8, SwiGLU glu 3) at tp 2 with SP, ep 4: k/t = 4 routed
    # rows per token of the sequence shard. etp 1: 4 x (2 x 2048 + 3 x 768) = 4 x 6,400 = 25,600;
    # etp 2: each GPU quantizes the rows gathered over its ETP pair, h wide at fc1's input and
    # fc2's output gradient, F/2 inside: 4 x (2 x 2048 x 2 + 3 x 768) = 4 x 10,496 = 41,984
    m = models()["qwen3-30b-a3b"]
    c = _cands(tp=2, dp=4, ep=4, etp=etp, sequence_parallel=True)
    t = TrainingSpec(seq_length=4096, global_batch_size=64)
    assert float(np.asarray(blocks.linear_io_per_token(m, c, t)["moe"]).ravel()[0]) == pytest.approx(expected)
