"""The validator runs the plan's pipeline schedule with torch.distributed.pipelining's own class
and checks the op order each rank ran and its chunks in flight against the simulator's order
(validate.schedule_check); what the miniature cannot run (DualPipe; FSDP2 under a split
backward) it says it does not exercise. The torch runs fork 4 gloo ranks (pp' 2 x dp' 2, about
20 s each on 2 cores) and are skipped without torch; the rest needs none."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from planner.validate.miniature import miniature
from planner.validate.schedule_check import _first_difference, peak_in_flight, simulated_orders


def test_peak_in_flight_counts_forwards_until_their_input_gradient():
    # F F I W F B: 1, 2, 1 (I frees), 1 (W does not), 2, 1 -> peak 2
    assert peak_in_flight([["F", 0, 0], ["F", 0, 1], ["I", 0, 0], ["W", 0, 0], ["F", 0, 2],
                           ["B", 0, 1]]) == 2


@pytest.mark.parametrize("schedule,v,ops,peak", [
    ("zbv", 2, 24, 4),              # 2 chunks x 4 micro-batches x (F, I, W); 2p chunks (§8)
    ("interleaved-zero-bubble", 2, 24, None),
    ("gpipe", 1, 8, 4),             # m on every rank (§1)
    ("dualpipev", 2, None, 5)])     # 2p + 1 chunks (§11)
def test_simulated_orders_on_two_ranks(schedule, v, ops, peak):
    orders = simulated_orders(schedule, 2, 4, v)
    assert len(orders) == 2
    for rank in orders:
        assert ops is None or len(rank) == ops
        assert peak is None or peak_in_flight(rank) == peak
    # stages as torch numbers them: ZB-V's rank 0 holds stages 0 and 3
    if schedule == "zbv":
        assert {op[1] for op in orders[0]} == {0, 3}


def test_first_difference_names_the_op():
    assert _first_difference([["F", 0, 0], ["I", 1, 2]], [["F", 0, 0], ["W", 1, 0]]) == \
        "op 1: ran I s1 mb2, simulated W s1 mb0"


def _plan(schedule: str, vpp: int, zero: int) -> Plan:
    m, hw = catalog.resolve_model("llama3-8b"), catalog.resolve_hardware("dgx-h100")
    lay = Layout(tp=1, pp=4, dp=4, zero_stage=zero, micro_batch_size=1, vpp=vpp,
                 pipeline_schedule=schedule)
    training = TrainingSpec(seq_length=2048, global_batch_size=64, framework="torchtitan")
    return Plan(plan3d_version="0.1.0", model=m, hardware=hw, gpus=16, training=training,
                layout=lay, framework=catalog.resolve_framework("torchtitan"))


def test_miniature_keeps_the_schedule_or_says_why_not():
    run = miniature(_plan("zbv", 2, 3), world=4)
    assert run.layout.pipeline_schedule == "zbv" and run.layout.zero_stage == 1
    assert any("ZeRO-3 with zbv" in d["feature"] for d in run.not_exercised)
    dual = miniature(_plan("dualpipe", 1, 0), world=4)
    assert dual.layout.pipeline_schedule == "1f1b"
    assert any(d["feature"] == "pipeline schedule dualpipe" for d in dual.not_exercised)


@pytest.mark.parametrize("schedule,vpp,zero", [("zbv", 2, 3), ("gpipe", 1, 3)])
def test_the_schedule_that_ran_is_the_simulated_one(schedule, vpp, zero):
    pytest.importorskip("torch")
    from planner.validate import run_local
    result, _ = run_local(_plan(schedule, vpp, zero), world=4, steps=2, timeout_s=400)
    failed = [c for c in result["checks"] if not c["passed"]]
    assert not failed, failed
    names = [c["name"] for c in result["checks"]]
    assert {"schedule order pp0", "schedule order pp1", "schedule peak pp0",
            "schedule peak pp1"} <= set(names)
    assert sum(n.startswith("loss step") for n in names) == 2   # the loss on rank 0 for ZB-V
