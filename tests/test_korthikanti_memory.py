"""Korthikanti et al. 2022 Figure 1 memory, per GPU of the first pipeline stage (formulas.md Sec. 9 items 1-2).

Published values (GiB) from Korthikanti 2022 Fig. 1 as embedded in calculon's validation data:
activations with tensor parallelism only ("none") and with SP + selective recompute, and
parameters + optimizer states. s = 2048, t = 8, dropout on, no flash attention (2022 Megatron).
"""

import numpy as np
import pytest

from planner.cost import flops, memory, pipeline
from planner.space import Candidates
from planner.specs import Layout, ModelSpec, TrainingDefaults, TrainingSpec

GIB = 2.0**30
# name: (h, a, L, p, v, micro-batch, global batch, activations none, SP+selective, params+optimizer)
FIG1 = {
    "22B": (6144, 64, 48, 1, 1, 4, 4, 59.25, 9.5625, 45.5625),
    "175B": (12288, 96, 96, 8, 3, 1, 64, 66.84375, 12.3516, 45.5625),
    "530B": (20480, 128, 105, 35, 3, 1, 280, 114.0234, 23.0762, 31.6406),
    "1T": (25600, 160, 128, 64, 1, 1, 512, 131.25, 26.5625, 32.9590),
}


def _setup(name, recompute, sp):
    h, a, L, p, v, b, B, *_ = FIG1[name]
    model = ModelSpec(name=name, source="Korthikanti 2022 Table 3", num_layers=L, hidden_size=h,
                      num_attention_heads=a, vocab_size=51200, dropout=0.1, bias=False,
                      training=TrainingDefaults(seq_length=2048, global_batch_size=B))
    training = TrainingSpec(seq_length=2048, global_batch_size=B, flash_attention=False)
    layout = Layout(tp=8, pp=p, dp=1, zero_stage=0, micro_batch_size=b, recompute=recompute,
                    sequence_parallel=sp, vpp=v)
    return model, training, Candidates.from_layouts([layout])


@pytest.mark.parametrize("name", list(FIG1))
def test_activations_match_figure_1(name):
    # per-layer bytes (Korthikanti Table 2) x layers in flight on stage 0, L*(1 + (p-1)/(p*v)).
    # e.g. 22B none: 2048*4*6144*(10 + 24/8 + 5*64*2048/(6144*8)) * 48 = 63,619,203,072 B = 59.25 GiB
    none_pub, sel_pub = FIG1[name][7], FIG1[name][8]
    for recompute, sp, published in (("none", False, none_pub), ("selective", True, sel_pub)):
        model, training, c = _setup(name, recompute, sp)
        m = c.num_microbatches(training.global_batch_size)
        layers = pipeline.inflight_layers(model.num_layers, c.pp, c.vpp, m, np.zeros_like(c.pp))
        per_layer = memory.activation_per_layer(model, training, c)
        assert round(float(layers[0] * per_layer[0]) / GIB, 4) == pytest.approx(published, abs=1e-4)


@pytest.mark.parametrize("name", list(FIG1))
def test_params_and_optimizer_match_figure_1(name):
    # 18 B/param (bf16 weight 2 + fp32 main grad 4 + fp32 master, Adam m, v 12) x the 12h^2 GEMM
    # weights of L/p layers / t. 22B: 18 * 12*6144^2 * 48/8 = 48,922,361,856 B = 45.5625 GiB.
    model, training, c = _setup(name, "none", False)
    sharded, _ = flops.layer_params_per_gpu(model, c.tp)
    params = sharded * model.num_layers / c.pp
    terms = memory.model_state_bytes(params, c.zero_stage, c.dp, training)
    total = sum(float(terms[k][0]) for k in ("weights", "gradients", "optimizer"))
    assert round(total / GIB, 4) == pytest.approx(FIG1[name][9], abs=1e-4)
