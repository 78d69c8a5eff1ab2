"""--moe-dispatcher and --moe-a2a-overlap (layout axes) on search and estimate: one-line errors
for bad values and for what a framework lacks, recorded in the plan's layout, read by the cost
model and refused by the exports of frameworks that lack them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
QWEN = ["--model", "qwen3-30b-a3b", "--gpus", "16"]


def test_flex_is_not_a_dispatcher():
    # the dispatchers are MOE_DISPATCHERS' names (planner.framework_spec): "flex" is
    # Megatron-Core's dispatcher type (with a backend), not a choice of the axis; the real
    # entry point prints click's usage error as one line
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()",
                           "estimate", *QWEN, "--moe-dispatcher", "flex"],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--moe-dispatcher" in lines[0]
    assert all(name in lines[0] for name in ("alltoall", "allgather", "deepep", "hybridep"))


@pytest.mark.parametrize("command", ["search", "estimate"])
@pytest.mark.parametrize("flags, message", [
    # transformer_config.py L3016-3019: the EP overlap with the alltoall or flex dispatcher only
    (["--moe-dispatcher", "allgather", "--moe-a2a-overlap"], "the alltoall or a fused dispatcher"),
    # the combined-1F1B EP overlap is Megatron-Core's (--overlap-moe-expert-parallel-comm)
    (["--moe-a2a-overlap", "--framework", "torchtitan"], "torchtitan has no EP communication overlap"),
    (["--moe-a2a-overlap", "--framework", "deepspeed"], "DeepSpeed has no EP communication overlap"),
    # DeepEP / HybridEP and allgather are Megatron-Core's token dispatchers (the profiles of
    # torchtitan and DeepSpeed list the all-to-all only)
    (["--moe-dispatcher", "deepep", "--ep", "8", "--framework", "torchtitan"],
     "torchtitan dispatches tokens with alltoall"),
    (["--moe-dispatcher", "allgather", "--framework", "deepspeed"],
     "DeepSpeed dispatches tokens with alltoall"),
])
def test_bad_values_are_one_line_errors(command, flags, message):
    res = runner.invoke(app, [command, *QWEN, *flags])
    assert res.exit_code == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_a_deepep_plan_is_refused_by_torchtitan_and_deepspeed(tmp_path):
    plan = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["search", *QWEN, "--moe-dispatcher", "deepep", "--ep", "4",
                              "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    for target, name in (("torchtitan", "torchtitan"), ("deepspeed", "DeepSpeed")):
        res = runner.invoke(app, ["export", str(plan), "--to", target])
        assert res.exit_code == 2 and f"{name} dispatches tokens with alltoall" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1


def test_dense_models_refuse_the_moe_flags():
    for flag in (["--moe-dispatcher", "hybridep"], ["--moe-a2a-overlap"]):
        res = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--gpus", "8", *flag])
        assert res.exit_code == 2 and "a token dispatcher and EP overlap need an MoE model" in res.stderr


def test_recorded_in_the_plan_and_read_by_the_estimate(tmp_path):
    plan = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["search", *QWEN, "--ep", "8", "--moe-dispatcher", "deepep",
                              "--moe-a2a-overlap", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    layout = yaml.safe_load(plan.read_text())["layout"]
    assert layout["moe_dispatcher"] == "deepep" and layout["moe_a2a_overlap"] is True
    # the same layout with the default dispatcher: its EP links carry the plain all-to-all, the
    # fused dispatcher's deduplicated shares (moe.flex_shares) make them smaller or equal
    flags = ["estimate", *QWEN, "--ep", "8", "--tp", "1", "--pp", "1", "--distributed-optimizer",
             "--zero-stage", "0", "--recompute", "full", "--json"]
    plain = json.loads(runner.invoke(app, flags).stdout)
    fused = json.loads(runner.invoke(app, [*flags, "--moe-dispatcher", "deepep"]).stdout)
    assert fused["time"]["link"]["ep"] < plain["time"]["link"]["ep"]
    assert "--no-moe-a2a-overlap" in runner.invoke(app, ["estimate", "--help"]).stdout
    # the layout line names a dispatcher that is not the default
    shown = runner.invoke(app, [*flags[:-1], "--moe-dispatcher", "deepep"]).stdout
    assert "dispatcher=deepep" in shown


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
