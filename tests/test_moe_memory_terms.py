"""Memory terms of the measured MoE runs' settings, hand-derived: optimizer-state offload,
fine-grained activation offload of the experts' fc1 and activation inputs, and the in-place
(Transformer Engine) cross entropy."""

from __future__ import annotations

import numpy as np
import pytest

from planner.catalog import models
from planner.cost import blocks, memory
from planner.space import Candidates
from planner.specs import Layout, TrainingSpec


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
    kept = blocks.activation_bytes_per_token(m, t, c, np.array([3]))["moe"]
    off = t.model_copy(update={"moe_activation_offload": True})
    dropped = blocks.activation_bytes_per_token(m, off, c, np.array([3]))["moe"]
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
