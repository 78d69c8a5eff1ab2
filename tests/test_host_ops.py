"""Host (CPU) operations per block (planner.cost.host): the counts of its docstring, derived by
hand for GPT-OSS-120B (128 routed experts with biases, no shared expert), and what CUDA graphs,
the dispatcher and the framework's unfused bias path change."""

from __future__ import annotations

import numpy as np
import pytest

from planner import catalog
from planner.cost.host import ROUTER_OPS, block_ops
from planner.cost.model_counts import MOE
from planner.inputs import training_spec
from planner.layout import Candidates, Layout


@pytest.fixture(scope="module")
def gpt_oss():
    model = catalog.resolve_model("gpt-oss-120b")
    assert model.moe.num_experts == 128 and model.bias and not model.moe.shared_experts
    return model


def _ops(model, training, **axes):
    lay = Layout(tp=1, pp=1, dp=8, ep=8, zero_stage=1, micro_batch_size=1, **axes)
    pre, post, back = block_ops(model, training, Candidates.from_layouts([lay]), MOE)
    return float(np.ravel(pre)[0]), float(np.ravel(post)[0]), float(np.ravel(back)[0])


def test_moe_block_counts_with_the_per_expert_bias_loop(gpt_oss):
    # ep 8: E_loc = 128 / 8 = 16; bf16: no quantize ops. Forward 25 + 2 x 16 + bias 3 x 16 = 105,
    # of which the router's 10 before the sync and 95 after; backward 20 + 4 x 16 + 48 = 132
    tr = training_spec(gpt_oss, {"precision": "bf16"})
    assert tr.moe_unfused_bias_glu
    assert _ops(gpt_oss, tr) == (ROUTER_OPS, 95.0, 132.0)


def test_a_framework_without_the_unfused_bias_path_launches_no_bias_loop(gpt_oss):
    # the same block without 3 x 16 = 48 each way: forward 57 (10 + 47), backward 84
    tr = training_spec(gpt_oss, {"precision": "bf16", "moe_unfused_bias_glu": False})
    assert _ops(gpt_oss, tr) == (ROUTER_OPS, 47.0, 84.0)


def test_fused_dispatchers_and_graphs(gpt_oss):
    tr = training_spec(gpt_oss, {"precision": "bf16"})
    # HybridEP: 8 fewer each way -> 10 + 87, 124; DeepEP: 3 fewer -> 10 + 92, 129
    assert _ops(gpt_oss, tr, moe_dispatcher="hybridep") == (ROUTER_OPS, 87.0, 124.0)
    assert _ops(gpt_oss, tr, moe_dispatcher="deepep") == (ROUTER_OPS, 92.0, 129.0)
    # layer graphs capture a dropless block's router and preprocessing as one replay; its experts
    # run eagerly after the sync (95 and 132 stay)
    assert _ops(gpt_oss, tr, cuda_graphs="layers") == (1.0, 95.0, 132.0)
    # a full-iteration graph leaves no per-layer operation
    assert _ops(gpt_oss, tr, cuda_graphs="full_iteration") == (0.0, 0.0, 0.0)
