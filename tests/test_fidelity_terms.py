"""The cost-model switches added for fidelity (issue 3), each checked against hand arithmetic."""

import numpy as np
import pytest

from planner.catalog import resolve_hardware
from planner.cost import memory
from planner.cost.collectives import Links, collective_time, p2p_time
from planner.cost.step import estimate_layout
from planner.layout import Layout
from planner.specs import TrainingSpec

from .conftest import gpt


def _hw(**eff):
    hw = resolve_hardware("dgx-a100-80g")
    data = hw.efficiency.model_dump(mode="json")
    data.update(eff)
    return hw.model_copy(update={"efficiency": type(hw.efficiency).model_validate(data)})


def test_synchronous_tp_backward_exposes_both_all_reduces():
    # 22B layer, t=8, b=4, no SP: X = 2*2048*4*6144 B. Without overlap the backward pays the two
    # input-gradient all-reduces of every layer in full, and the output layer's (hidden under its
    # weight-gradient GEMM when overlapped): the step grows by (L * 2 + 1) * m * t_AR(X) exactly.
    hw = _hw()
    model = gpt("22B", 48, 6144, 64, batch=4)
    layout = Layout(tp=8, pp=1, dp=1, zero_stage=0, micro_batch_size=4)
    on = TrainingSpec(seq_length=2048, global_batch_size=4, flash_attention=False)
    off = on.model_copy(update={"tp_backward_overlap": False})
    t_on = float(estimate_layout(model, hw, on, layout).time["tp_comm"][0])
    t_off = float(estimate_layout(model, hw, off, layout).time["tp_comm"][0])
    links = Links.of(hw)
    ar = collective_time("all_reduce", np.array([2.0 * 2048 * 4 * 6144]), np.array([8]), np.array([1]), links)[0]
    assert t_off - t_on == pytest.approx((48 * 2 + 1) * 1 * ar, rel=1e-9)  # fully hidden when overlapped


def test_blocking_interleaved_p2p_and_scatter_gather():
    # 175B, t=8, p=8, v=3, b=1, B=64 (m=64), no SP. Overlapped (Megatron-Core): only the fill,
    # 2*(p-1)*t_p2p. Blocking (2021-22): 2*v*t_p2p per micro-batch on the critical stage, and with
    # scatter/gather each TP rank sends s*b*h/t = 2048*12288*2/8 B across nodes.
    hw = _hw()
    model = gpt("175B", 96, 12288, 96, batch=64)
    layout = Layout(tp=8, pp=8, dp=1, zero_stage=0, micro_batch_size=1, vpp=3)
    base = TrainingSpec(seq_length=2048, global_batch_size=64, flash_attention=False)
    links = Links.of(hw)
    full = p2p_time(np.array([2.0 * 2048 * 12288]), np.array([True]), links)[0]
    split = p2p_time(np.array([2.0 * 2048 * 12288 / 8]), np.array([True]), links)[0]
    overlapped = float(estimate_layout(model, hw, base, layout).time["pp_comm"][0])
    assert overlapped == pytest.approx(2 * 7 * full, rel=1e-9)
    old = base.model_copy(update={"overlap_p2p_comm": False, "p2p_scatter_gather": True})
    blocking = float(estimate_layout(model, hw, old, layout).time["pp_comm"][0])
    assert blocking == pytest.approx(64 * 2 * 3 * split, rel=1e-9)


def test_step_overhead_adds_to_the_step():
    # T_misc = 25 ms is added once per step, to the optimizer term.
    model = gpt("22B", 48, 6144, 64, batch=4)
    training = TrainingSpec(seq_length=2048, global_batch_size=4, flash_attention=False)
    layout = Layout(tp=8, pp=1, dp=1, zero_stage=0, micro_batch_size=4)
    a = estimate_layout(model, _hw(step_overhead="0 s"), training, layout).time
    b = estimate_layout(model, _hw(step_overhead="25 ms"), training, layout).time
    assert float(b["step"][0] - a["step"][0]) == pytest.approx(0.025, rel=1e-9)
    assert float(b["optimizer"][0] - a["optimizer"][0]) == pytest.approx(0.025, rel=1e-9)


def test_zero3_gather_unit_layer_vs_module():
    # 175B, t=1, ZeRO-3, grads 2 B: FSDP keeps 2 layers' bf16 weights + 1 layer's grads:
    # (12h^2 + 13h) * (2*2 + 2) B; DeepSpeed per module: fc1 = h*4h -> 4h^2 * 6 B.
    from planner.layout import Candidates
    h = 12288
    model = gpt("175B", 96, h, 96)
    c = Candidates.from_layouts([Layout(tp=1, pp=1, dp=384, zero_stage=3, micro_batch_size=1)])
    fsdp = TrainingSpec(seq_length=2048, global_batch_size=384, grad_bytes=2)
    ds = fsdp.model_copy(update={"zero3_gather_unit": "module"})
    assert memory.transient_bytes(model, fsdp, c)[0] == pytest.approx((12 * h * h + 13 * h) * 6)
    assert memory.transient_bytes(model, ds, c)[0] == pytest.approx(4 * h * h * 6)
