"""--moe-dispatcher and --moe-a2a-overlap on search, estimate and sweep: one-line errors for bad
values, recorded in the plan YAML, and read by the cost model."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
QWEN = ["--model", "qwen3-30b-a3b", "--gpus", "16"]


@pytest.mark.parametrize("command", ["search", "estimate", "sweep"])
@pytest.mark.parametrize("flags, message", [
    (["--moe-dispatcher", "deepep"], "--moe-dispatcher must be alltoall, allgather or flex, got 'deepep'"),
    (["--moe-dispatcher", "allgather", "--moe-a2a-overlap"], "--moe-a2a-overlap needs --moe-dispatcher alltoall or flex"),
    # the combined-1F1B EP overlap is Megatron-Core's (--overlap-moe-expert-parallel-comm)
    (["--moe-a2a-overlap", "--framework", "torchtitan"], "has no Megatron-Core EP communication overlap"),
    (["--moe-a2a-overlap", "--framework", "deepspeed"], "has no Megatron-Core EP communication overlap"),
    # flex (DeepEP / HybridEP) and allgather are Megatron-Core's token dispatchers
    (["--moe-dispatcher", "flex", "--framework", "torchtitan"],
     "dispatches tokens with all-to-all, not Megatron-Core's flex dispatcher"),
    (["--moe-dispatcher", "allgather", "--framework", "deepspeed"],
     "dispatches tokens with all-to-all, not Megatron-Core's allgather dispatcher"),
])
def test_bad_values_are_one_line_errors(command, flags, message):
    res = runner.invoke(app, [command, *QWEN, *flags])
    assert res.exit_code == 2 and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_a_flex_plan_is_refused_by_torchtitan_and_deepspeed(tmp_path):
    plan = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["search", *QWEN, "--moe-dispatcher", "flex", "--ep", "4",
                              "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    for target in ("torchtitan", "deepspeed"):
        res = runner.invoke(app, ["export", str(plan), "--to", target])
        assert res.exit_code == 2 and "not Megatron-Core's flex dispatcher" in res.stderr


def test_dense_models_refuse_the_moe_flags():
    res = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--moe-dispatcher", "flex"])
    assert res.exit_code == 2 and "applies to mixture-of-experts models; llama3-8b has no experts" in res.stderr


def test_recorded_in_the_plan_and_read_by_the_estimate(tmp_path):
    plan = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["search", *QWEN, "--ep", "8", "--moe-dispatcher", "flex",
                              "--moe-a2a-overlap", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    training = yaml.safe_load(plan.read_text())["training"]
    assert training["moe_dispatcher"] == "flex" and training["moe_a2a_overlap"] is True
    # the same layout with the default dispatcher: its EP links carry the plain all-to-all, the
    # flex dispatcher's deduplicated shares (moe.flex_shares) make them smaller or equal
    flags = ["estimate", *QWEN, "--ep", "8", "--tp", "1", "--pp", "1", "--distributed-optimizer",
             "--zero-stage", "0", "--recompute", "full", "--json"]
    plain = json.loads(runner.invoke(app, flags).stdout)
    flex = json.loads(runner.invoke(app, [*flags, "--moe-dispatcher", "flex"]).stdout)
    assert flex["time"]["link"]["ep"] < plain["time"]["link"]["ep"]
    assert "--no-moe-a2a-overlap" in runner.invoke(app, ["estimate", "--help"]).stdout
    # the title names a dispatcher or overlap that is not the default
    shown = runner.invoke(app, [*flags[:-1], "--moe-dispatcher", "flex", "--moe-a2a-overlap"]).stdout
    assert "MoE: flex token dispatcher, EP communication overlapped" in shown
    assert "MoE:" not in runner.invoke(app, flags[:-1]).stdout


@pytest.mark.parametrize("flags, message", [
    # gpt3-175b is dense: an expert pin would silently do nothing
    (["--model", "175b", "--gpus", "64", "--ep", "8"],
     "--ep applies to mixture-of-experts models; gpt3-175b has no experts"),
    (["--model", "175b", "--gpus", "64", "--etp", "2", "--max-ep", "4"],
     "--etp, --max-ep apply to mixture-of-experts models; gpt3-175b has no experts"),
    # deepseek-v3 routes over 256 experts; 256 % 7 = 4, so ep=7 cannot split them evenly
    (["--model", "deepseek-v3", "--gpus", "1024", "--ep", "7"],
     "--ep 7 does not divide the 256 experts of deepseek-v3"),
    # the same pins in --why-not; before: 'ep=8' on the dense gpt3-175b was dropped and the winner reported as its completion
    (["--model", "175b", "--gpus", "64", "--why-not", "ep=8"],
     "--why-not: ep applies to mixture-of-experts models; gpt3-175b has no experts"),
    # 256 experts % 7 = 4
    (["--model", "deepseek-v3", "--gpus", "1024", "--why-not", "ep=7,tp=2"],
     "--why-not: ep 7 does not divide the 256 experts of deepseek-v3"),
])
def test_expert_pins_are_one_line_errors(flags, message):
    res = runner.invoke(app, ["search", *flags])
    assert res.exit_code == 2 and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
