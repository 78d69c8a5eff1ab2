"""One input-checking path (planner.inputs): a value one command refuses, every command that
takes it refuses, with the same words; and every JSON row of a command has the same keys."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import UsageError
from planner.fidelity.runs import load_runs
from planner.regress import Case, evaluate_case

runner = CliRunner()


def cli(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


# GPT-3 175B has learned positions: 2048 of them (Brown et al. 2020, Table 2.1 context 2048)
LONG = "4096 exceeds the 2048 learned position embeddings of gpt3-175b"


@pytest.mark.parametrize("args", [
    ["search", "--model", "175b", "--gpus", 512, "--seq-length", 4096],
    ["search", "--model", "175b", "--gpus", 512, "--seq-length", 4096, "--why-not", "tp=8"],
    ["estimate", "--model", "175b", "--gpus", 512, "--tp", 8, "--pp", 8, "--seq-length", 4096],
    ["sweep", "--model", "175b", "--gpus", "256:512", "--seq-length", 4096],
])
def test_learned_positions_refused_by_every_command_with_flags(args):
    code, out, err = cli(*args)
    assert (code, out) == (2, "") and err == f"error: --seq-length {LONG}\n"


@pytest.mark.parametrize("kind,fields", [
    ("layout", {"tp": 8, "pp": 8, "zero_stage": 1, "micro_batch_size": 1}),
    ("search", {"top": 1}),
])
def test_regress_refuses_what_search_and_estimate_refuse(kind, fields):
    out = evaluate_case(Case(name="long", model="gpt3-175b", gpus=512,
                             training={"seq_length": 4096}, **{kind: fields}))
    assert out == {"status": "error", "message": f"training.seq_length {LONG}"}


def test_plans_with_a_sequence_beyond_learned_positions_are_refused(tmp_path):
    plan = tmp_path / "plan.yaml"
    assert cli("search", "--model", "175b", "--gpus", 512, "--export", plan)[0] == 0
    data = yaml.safe_load(plan.read_text())
    data["training"]["seq_length"] = 4096  # edited by hand
    plan.write_text(yaml.safe_dump(data))
    for args in (["estimate", "--plan", plan], ["export", plan, "--to", "megatron"],
                 ["placement", plan]):
        code, out, err = cli(*args)
        assert code == 2 and err == f"error: {plan}: training.seq_length {LONG}\n", (args, err)


@pytest.mark.parametrize("batch,message", [
    (0, "layout.global_batch must be positive, got 0"),
    ("64", "layout.global_batch must be a whole number, got '64'"),
    (10**9, "layout.global_batch 1,000,000,000 is beyond what plan3d models (at most 100,000,000)"),
])
def test_runs_files_check_the_batch_like_every_command(tmp_path, batch, message):
    # (the loader sets max_position_embeddings = seq_len, so positions cannot be exceeded; the
    # batch is checked as --global-batch-size is, in one line)
    runs = tmp_path / "runs.yaml"
    runs.write_text(yaml.safe_dump([{
        "id": "mylab-1", "source": "mylab", "hardware": {"gpu": "A100 80GB", "gpus": 8, "profile": "dgx-a100-80g"},
        "model": {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 51200},
        "layout": {"tp": 8, "pp": 1, "dp": 1, "global_batch": batch},
        "measured": {"iteration_s": 1.0}}]))
    with pytest.raises(UsageError) as info:
        load_runs(runs)
    assert str(info.value) == f"{runs}: run mylab-1: {message}"


@pytest.mark.parametrize("batch,message", [
    ("0", "--global-batch-size must be positive, got 0"),
    ("100000001", "--global-batch-size 100,000,001 is beyond what plan3d models (at most 100,000,000)"),
])
def test_sweep_checks_each_batch_as_search_does(batch, message):
    for args in (["sweep", "--gpus", 512, "--global-batch-size", f"1536,{batch}"],
                 ["search", "--gpus", 512, "--global-batch-size", batch]):
        code, out, err = cli(args[0], "--model", "175b", *args[1:])
        assert (code, out) == (2, "") and err == f"error: {message}\n", (args, err)


@pytest.mark.parametrize("search_fields,message", [
    ({"zero_stage": 7}, "search.zero_stage must be 0, 1, 2 or 3, got 7"),
    ({"tp": 0}, "search.tp must be positive, got 0"),
    ({"tp": "8"}, "search.tp must be a whole number, got '8'"),
    ({"recompute": "most"}, "search.recompute must be none, selective, selective+ or full, got 'most'"),
    ({"tp": 8, "max_tp": 4}, "--tp 8 contradicts --max-tp 4"),
    ({"objective": "speed"}, "search.objective must be one of throughput, time-to-train, cost"),
    # 0.99 of 79.65 GiB leaves 0.8 GiB, below the 3 GiB framework allowance (as --min-memory-headroom 99%)
    ({"headroom_fraction": 0.99}, "search.headroom_fraction 0.99 leaves 0.8 GiB of the 79.6 GiB"),
    ({"headroom_fraction": 1.5}, "search.headroom_fraction must be a number from 0 up to"),
])
def test_regress_search_options_are_checked_as_the_flags_are(search_fields, message):
    out = evaluate_case(Case(name="c", model="175b", gpus=512, search={"top": 1, **search_fields}))
    assert out["status"] == "error" and message in out["message"], out


def test_regress_gpu_counts_are_checked_as_the_flag_is():
    out = evaluate_case(Case(name="c", model="175b", gpus=12, search={"top": 1}))
    assert out["status"] == "error"
    assert "--gpus 12 is not a whole number of 8-GPU nodes of dgx-h100" in out["message"]


def test_models_and_accuracy_json_rows_share_keys():
    code, out, _ = cli("models", "--json")
    rows = json.loads(out)
    assert code == 0 and len({tuple(r) for r in rows}) == 1
    assert any(r["moe"] is None for r in rows) and any(r["moe"] is not None for r in rows)
    code, out, _ = cli("accuracy", "--json")
    d = json.loads(out)
    for key in ("measured", "predicted", "error"):
        assert len({tuple(r[key]) for r in d["runs"]}) == 1
    assert len({tuple(r) for r in d["runs"]}) == 1
    assert len({tuple(v) for v in d["summary"].values()}) == 1


def test_sweep_json_error_rows_have_every_key():
    # 8 GPUs cannot hold 175B on H100s (about 184 GiB of model states per GPU); 512 can
    code, out, err = cli("sweep", "--model", "175b", "--gpus", "8,512", "--json")
    rows = json.loads(out)
    assert code == 0 and rows[0]["error"] and rows[1]["error"] is None
    assert list(rows[0]) == list(rows[1])
    assert all(rows[0][k] is None for k in ("layout", "layout_short", "tokens_per_s", "mfu",
                                            "step_s", "memory_bytes", "scaling_efficiency"))


@pytest.mark.parametrize("given, bound, value", [
    ({"cp": 32}, "max_cp", 32), ({"vpp": 24}, "max_vpp", 24),
    ({"micro_batch_size": 128}, "max_micro_batch_size", 128), ({"cp": 8}, "max_cp", 16)])
def test_a_pin_above_a_default_bound_raises_the_bound(given, bound, value):
    # `--cp 32` said "--cp 32 contradicts --max-cp 16", a bound the user never gave (default 16)
    from planner.catalog import resolve_hardware
    from planner.search.options import search_options
    from planner.specs import TrainingSpec
    opts = search_options(resolve_hardware("dgx-h100"), TrainingSpec(seq_length=8192, global_batch_size=64), given)
    assert getattr(opts, bound) == value


def test_a_pin_above_a_bound_the_user_gave_is_refused():
    code, out, err = cli("search", "--model", "llama3-8b", "--gpus", 64, "--cp", 32, "--max-cp", 16)
    assert code == 2 and err == "error: --cp 32 contradicts --max-cp 16\n"
