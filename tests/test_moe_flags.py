"""The training software's switches as layout axes on search, estimate and sweep
(--moe-dispatcher, --moe-a2a-overlap, --tp-comm-overlap, --cuda-graphs) and token dropping as a
job input (--moe-capacity-factor): one-line errors where a framework or layout cannot run them,
recorded in the plan's layout, read by the cost model."""

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


@pytest.mark.parametrize("command", ["search", "estimate"])
@pytest.mark.parametrize("flags, message", [
    # transformer_config.py L3016-3019: EP overlap needs the alltoall or flex dispatcher
    (["--moe-dispatcher", "allgather", "--moe-a2a-overlap"],
     "EP overlap needs ep > 1, vpp > 1 with pp > 1, no full recompute, the alltoall or a fused dispatcher"),
    # the merged forward-backward EP overlap is Megatron-Core's (--overlap-moe-expert-parallel-comm)
    (["--moe-a2a-overlap", "--framework", "torchtitan"], "torchtitan has no EP communication overlap"),
    (["--moe-a2a-overlap", "--framework", "deepspeed"], "DeepSpeed has no EP communication overlap"),
    (["--moe-dispatcher", "allgather", "--framework", "deepspeed"], "DeepSpeed dispatches tokens with alltoall"),
    # arguments.py L1431-1442: --tp-comm-overlap asserts sequence parallelism, which needs tp > 1
    (["--tp-comm-overlap", "--tp", "1"], "TP communication overlap needs sequence parallelism (tp > 1)"),
    # transformer_config.py L1364-1381: a full-iteration graph needs static shapes
    (["--cuda-graphs", "full_iteration"], "a full-iteration CUDA graph of a dropless MoE needs a static capacity"),
])
def test_bad_values_are_one_line_errors(command, flags, message):
    res = runner.invoke(app, [command, *QWEN, *flags])
    assert res.exit_code == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command, flags, message", [
    # "flex" is Megatron-Core's dispatcher type; plan3d names its backend
    ("search", ["--moe-dispatcher", "flex"], "'flex' is not one of 'alltoall', 'allgather', 'deepep', 'hybridep'"),
    ("estimate", ["--moe-dispatcher", "flex"], "'flex' is not one of 'alltoall', 'allgather', 'deepep', 'hybridep'"),
    # sweep searches every layout and its software: it takes no pins, only the job's inputs
    ("sweep", ["--moe-dispatcher", "deepep"], "No such option: --moe-dispatcher"),
    ("sweep", ["--moe-capacity-factor", "0"], "--moe-capacity-factor is the rows an expert takes over its balanced share"),
    ("search", ["--moe-capacity-factor", "0"], "--moe-capacity-factor is the rows an expert takes over its balanced share"),
])
def test_bad_values_are_one_line_errors_of_the_real_entry_point(command, flags, message):
    res = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", command, *QWEN, *flags],
                         capture_output=True, text=True)
    assert res.returncode == 2 and message in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_torchtitan_refuses_token_dropping():
    res = runner.invoke(app, ["estimate", *QWEN, "--framework", "torchtitan", "--moe-capacity-factor", "1"])
    assert res.exit_code == 2 and "torchtitan has no token dropping with a capacity factor" in res.stderr


def test_dense_models_refuse_the_moe_flags():
    res = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--moe-dispatcher", "deepep"])
    assert res.exit_code == 2 and "a token dispatcher and EP overlap need an MoE model" in res.stderr
    res = runner.invoke(app, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--moe-capacity-factor", "1"])
    assert res.exit_code == 2 and "llama3-8b has no experts" in res.stderr


def test_recorded_in_the_plan_and_read_by_the_estimate(tmp_path):
    plan = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["search", *QWEN, "--ep", "8", "--moe-dispatcher", "hybridep",
                              "--moe-a2a-overlap", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    layout = yaml.safe_load(plan.read_text())["layout"]
    assert layout["moe_dispatcher"] == "hybridep" and layout["moe_a2a_overlap"] is True
    # the same layout with NCCL's all-to-all: the fused dispatcher's deduplicated shares
    # (moe.flex_shares) move fewer bytes over the EP links
    flags = ["estimate", *QWEN, "--ep", "8", "--tp", "1", "--pp", "1", "--distributed-optimizer",
             "--zero-stage", "0", "--recompute", "full", "--json"]
    plain = json.loads(runner.invoke(app, [*flags, "--moe-dispatcher", "alltoall"]).stdout)
    fused = json.loads(runner.invoke(app, [*flags, "--moe-dispatcher", "hybridep"]).stdout)
    assert fused["time"]["link"]["ep"] < plain["time"]["link"]["ep"]
    assert fused["layout"]["moe_dispatcher"] == "hybridep"
    assert "--no-moe-a2a-overlap" in runner.invoke(app, ["estimate", "--help"]).stdout
    # the layout line names a dispatcher wherever experts are spread (ep x etp > 1)
    shown = runner.invoke(app, [*flags[:-1], "--moe-dispatcher", "hybridep"]).stdout
    assert "dispatcher=hybridep" in shown


def test_a_capacity_factor_is_named_and_removes_the_host_sync():
    """Drop-and-pad has no device-to-host sync per MoE layer (token_dispatcher.py L517-538), so
    its host term never exceeds the dropless one's; the title names the capacity factor."""
    flags = ["estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--hardware", "dgx-b200",
             "--tp", "1", "--pp", "1", "--ep", "8", "--micro-batch-size", "1", "--recompute", "none",
             "--precision", "mxfp8", "--global-batch-size", "512", "--zero-stage", "1",
             "--moe-dispatcher", "alltoall", "--no-moe-a2a-overlap", "--cuda-graphs", "layers"]
    dropless = json.loads(runner.invoke(app, [*flags, "--json"]).stdout)
    dropped = json.loads(runner.invoke(app, [*flags, "--moe-capacity-factor", "1", "--json"]).stdout)
    assert dropped["time"]["host"] <= dropless["time"]["host"]
    assert dropless["time"]["host"] > 0
    text = runner.invoke(app, [*flags, "--moe-capacity-factor", "1.25"]).stdout
    assert "tokens dropped beyond capacity factor 1.25" in text


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
