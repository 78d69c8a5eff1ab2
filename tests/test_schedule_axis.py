"""The pipeline schedule as a layout axis: its values by framework (the profiles' Rules facts),
its rules against vpp, pp and the micro-batches, and the layouts it refuses per framework.
Expected values are the reference's constraints (reference/pipeline_schedules.md §1-§12),
worked by hand in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from planner import catalog
from planner.errors import UsageError
from planner.layout import BY_NAME, Candidates, Layout
from planner.layout.axes import IMPLIED
from planner.search.check import check_layout
from types import SimpleNamespace

from planner.search.grid import knob_values
from planner.search.options import SearchOptions
from planner.search.rules import schedule_microbatches_ok, schedule_ok
from planner.specs import TrainingSpec

CODE = {name: code for code, name in enumerate(BY_NAME["pipeline_schedule"].choices)}


def _values(framework: str) -> list[int]:
    model = catalog.resolve_model("llama3-70b")
    training = TrainingSpec(seq_length=8192, global_batch_size=2048, framework=framework)
    opts = SearchOptions(framework=catalog.resolve_framework(framework))
    ctx = SimpleNamespace(model=model, training=training, hardware=catalog.resolve_hardware("dgx-h100"),
                          framework=opts.framework, pps=np.array([1, 2, 4]))
    return knob_values(ctx, opts, "pipeline_schedule").tolist()


def test_values_come_from_the_framework_rules():
    # Megatron-Core and DeepSpeed run only what vpp implies: one grid value (IMPLIED), no growth
    assert _values("megatron-core") == [IMPLIED]
    assert _values("deepspeed") == [IMPLIED]
    # torchtitan: IMPLIED (1F1B / Interleaved1F1B) + GPipe, LoopedBFS, InterleavedZeroBubble,
    # ZBVZeroBubble, DualPipeV; no DualPipe
    assert _values("torchtitan") == [IMPLIED] + [CODE[n] for n in (
        "gpipe", "looped-bfs", "interleaved-zero-bubble", "zbv", "dualpipev")]


def test_implied_resolves_from_vpp():
    c = Candidates(tp=np.array([1, 1, 1]), pp=np.array([4, 4, 4]), dp=np.array([1, 1, 1]),
                   zero_stage=np.array([1, 1, 1]), micro_batch_size=np.array([1, 1, 1]),
                   vpp=np.array([1, 2, 2]), pipeline_schedule=np.array([IMPLIED, IMPLIED, CODE["zbv"]]))
    assert c.pipeline_schedule.tolist() == [CODE["1f1b"], CODE["interleaved-1f1b"], CODE["zbv"]]
    assert Layout(tp=1, pp=4, dp=1, zero_stage=1, micro_batch_size=1, vpp=3).pipeline_schedule \
        == "interleaved-1f1b"


@pytest.mark.parametrize("name,vpp,pp,ok", [
    ("1f1b", 1, 4, True), ("1f1b", 2, 4, False), ("gpipe", 1, 4, True), ("gpipe", 2, 4, False),
    ("gpipe", 1, 1, False),                           # no pipeline to schedule
    ("interleaved-1f1b", 2, 4, True), ("interleaved-1f1b", 1, 4, False),
    ("looped-bfs", 3, 4, True), ("interleaved-zero-bubble", 4, 4, True),
    ("interleaved-zero-bubble", 1, 4, False),
    ("zbv", 2, 4, True), ("zbv", 4, 4, False), ("dualpipev", 2, 4, True), ("dualpipev", 1, 4, False),
    ("dualpipe", 1, 4, True), ("dualpipe", 2, 4, False)])
def test_schedule_against_chunks_per_rank(name, vpp, pp, ok):
    c = Candidates(tp=np.array([1]), pp=np.array([pp]), dp=np.array([1]), zero_stage=np.array([1]),
                   micro_batch_size=np.array([1]), vpp=np.array([vpp]),
                   pipeline_schedule=np.array([CODE[name]]))
    assert bool(schedule_ok(c)[0]) is ok


@pytest.mark.parametrize("name,pp,m,ok", [
    ("dualpipe", 4, 8, True),     # p even, m even, m >= 2p = 8
    ("dualpipe", 4, 6, False),    # m < 2p
    ("dualpipe", 4, 9, False),    # m odd
    ("dualpipe", 3, 12, False),   # p odd
    ("dualpipev", 4, 7, False), ("dualpipev", 4, 8, True), ("dualpipev", 3, 6, True),
    # PyTorch's rounds = max(1, m // p): p=4, m=10: rounds 2, 10 mod 2 = 0; m=9: 9 mod 2 = 1;
    # m=3 < p
    ("interleaved-zero-bubble", 4, 10, True), ("interleaved-zero-bubble", 4, 9, False),
    ("interleaved-zero-bubble", 4, 3, False), ("zbv", 4, 3, True), ("gpipe", 4, 3, True)])
def test_schedule_against_microbatches(name, pp, m, ok):
    c = Candidates(tp=np.array([1]), pp=np.array([pp]), dp=np.array([1]), zero_stage=np.array([1]),
                   micro_batch_size=np.array([1]), vpp=np.array([1]),
                   pipeline_schedule=np.array([CODE[name]]))
    assert bool(schedule_microbatches_ok(c, np.array([m]))[0]) is ok


def _check(framework: str, **layout):
    model, hw = catalog.resolve_model("llama3-70b"), catalog.resolve_hardware("dgx-h100")
    profile = catalog.resolve_framework(framework)
    training = TrainingSpec(seq_length=8192, global_batch_size=512, framework=framework)
    base = dict(tp=8, pp=4, zero_stage=3 if framework == "torchtitan" else 1, micro_batch_size=1)
    return check_layout(model, hw, training, 64, {**base, **layout}, False, profile)


def test_megatron_and_deepspeed_refuse_what_they_do_not_run():
    # Megatron-LM (d98e8a64) has no zero-bubble, V-shape or DualPipe schedule
    with pytest.raises(UsageError, match="Megatron-Core runs the pipeline schedules 1f1b, "
                                         "interleaved-1f1b"):
        _check("megatron-core", vpp=2, pipeline_schedule="zbv")
    with pytest.raises(UsageError, match="DeepSpeed runs the pipeline schedules 1f1b"):
        _check("deepspeed", vpp=1, zero_stage=1, pipeline_schedule="gpipe")
    # torchtitan runs ZBVZeroBubble (2 stages per rank: 80 layers = 4 x 2 x 10)
    assert _check("torchtitan", vpp=2, pipeline_schedule="zbv").pipeline_schedule == "zbv"
    with pytest.raises(UsageError, match="torchtitan runs the pipeline schedules"):
        _check("torchtitan", vpp=1, pipeline_schedule="dualpipe")


def _plan(schedule: str, vpp: int):
    from planner import __version__
    from planner.plan import Plan
    model, hw = catalog.resolve_model("llama3-8b"), catalog.resolve_hardware("dgx-h100")
    return Plan(plan3d_version=__version__, model=model, hardware=hw, gpus=16,
                training=TrainingSpec(seq_length=2048, global_batch_size=64, framework="torchtitan"),
                layout=Layout(tp=1, pp=4, dp=4, zero_stage=3, micro_batch_size=1, vpp=vpp,
                              pipeline_schedule=schedule),
                framework=catalog.resolve_framework("torchtitan"))


@pytest.mark.parametrize("schedule,vpp,name", [("zbv", 2, "ZBVZeroBubble"),
                                               ("dualpipev", 2, "DualPipeV"),
                                               ("interleaved-zero-bubble", 2, "InterleavedZeroBubble"),
                                               ("gpipe", 1, "GPipe"), ("looped-bfs", 2, "LoopedBFS")])
def test_torchtitan_exports_the_schedule_by_its_name(schedule, vpp, name):
    # parallelism.pipeline_parallel_schedule, PyTorch's get_schedule_class names, in both formats
    from planner.frameworks import export_plan
    plan = _plan(schedule, vpp)
    overrides = export_plan(plan, "torchtitan", "overrides")
    toml = export_plan(plan, "torchtitan", "toml")
    assert f"--parallelism.pipeline_parallel_schedule {name} \\" in overrides.text
    assert f'pipeline_parallel_schedule = "{name}"' in toml.text
    assert ("split" in overrides.text) == (schedule in ("zbv", "dualpipev", "interleaved-zero-bubble"))
    # Llama 3 8B: 32 layers on 4 ranks x vpp stages each: 32 / (4 vpp) per stage
    assert f"--parallelism.pipeline_parallel_layers_per_stage {32 // (4 * vpp)} \\" in overrides.text


def test_megatron_export_refuses_a_schedule_it_lacks():
    from planner.frameworks import export_plan
    with pytest.raises(UsageError, match="Megatron-Core runs the pipeline schedules 1f1b, "
                                         "interleaved-1f1b"):
        export_plan(_plan("zbv", 2), "megatron")


@pytest.mark.parametrize("schedule,vpp", [("zbv", 2), ("dualpipev", 2), ("interleaved-zero-bubble", 2)])
def test_torchtitan_async_tp_not_beside_a_schedule_that_refuses_compile(schedule, vpp):
    # torchtitan's async TP needs torch.compile of the model (configs.py L291-312); PyTorch's
    # InterleavedZeroBubble, ZBVZeroBubble and DualPipeV raise on a compiled stage
    # (_check_torch_compile_compatibility): the pair is one rule for the search, estimate and
    # the export, which would otherwise write --compile.enable beside the schedule
    from planner.frameworks import export_plan
    ovl = dict(tp=8, dp=2, sequence_parallel=True, tp_comm_overlap=True)  # 8 x 4 x 2 = 64 GPUs
    with pytest.raises(UsageError, match="TP communication overlap .async TP compiles the model. "
                                         f"not with the .*{schedule}"):
        _check("torchtitan", vpp=vpp, pipeline_schedule=schedule, **ovl)
    # 1F1B and interleaved 1F1B compile: the same overlap runs there
    assert _check("torchtitan", vpp=2, pipeline_schedule="interleaved-1f1b", **ovl).tp_comm_overlap
    plan = _plan(schedule, vpp)  # 16 GPUs: tp 2 x pp 4 x dp 2
    plan = plan.model_copy(update={"layout": plan.layout.model_copy(update={**ovl, "tp": 2})})
    with pytest.raises(UsageError, match="async TP compiles the model"):
        export_plan(plan, "torchtitan", "overrides")
