"""Runs files of one's own measured runs (plan3d accuracy / calibrate): what a row and its facts
file must state, and what is refused (one line each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from tests.cli_errors import one_line_error

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.mark.parametrize("tokens_per_s, refused", [(300_000, True), (130_000, False), (126_000, True)])
def test_runs_file_step_time_and_token_rate_must_agree(tmp_path, monkeypatch, tokens_per_s, refused):
    # batch 64 x 2048 tokens = 131,072 tokens per step; a step of 1.0 s is 131,072 tokens/s:
    # 130,000 is 0.8 % away and 126,000 4.0 % (refused beyond 2 %), 300,000 a different run
    rows = yaml.safe_load((ROOT / "benchmarks" / "published_runs.yaml").read_text())
    row = next(r for r in rows if r["id"] == "korthikanti22-175b-selective-sp")
    assert (row["layout"]["global_batch"], row["model"]["seq_len"]) == (64, 2048)
    row = dict(row, id="mylab-175b", notes="[flops=korthikanti]",
               measured={"iteration_s": 1.0, "tokens_per_s": tokens_per_s})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([row]))
    if refused:
        line = one_line_error(["accuracy", "runs.yaml", "--no-loso"])
        assert "run mylab-175b: measured.iteration_s 1 s and measured.tokens_per_s" in line
        assert f"= {131072 / tokens_per_s:.4g} s" in line
    else:
        res = runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso", "--json"])
        assert res.exit_code == 0, res.stderr


def _own_run(tmp_path, monkeypatch, **model):
    row = {"id": "mylab-llama3-8b", "source": "my lab, 2026",
           "model": {"name": "llama3-8b", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                     "ffn_hidden": 14336, "vocab": 128256, "seq_len": 8192, **model},
           "hardware": {"gpu": "H100-SXM5-80GB", "gpus": 8, "profile": "dgx-h100"},
           "layout": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64, "zero_stage": 1},
           "measured": {"iteration_s": 9.5}}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([row]))
    return runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso", "--json"])


def test_own_run_names_its_catalog_model(tmp_path, monkeypatch):
    # without model.catalog the row is a Megatron GPT (GeLU, LayerNorm, biases, learned
    # positions) of Llama 3 8B's shape, and the assumption says model.name is a catalog model;
    # with it, the run is costed as the catalog's Llama 3 8B (SwiGLU, RMSNorm, RoPE, untied)
    plain = json.loads(_own_run(tmp_path, monkeypatch).stdout)["runs"][0]
    assert any("model.catalog: llama3-8b" in a for a in plain["assumptions"])
    res = _own_run(tmp_path, monkeypatch, catalog="llama3-8b")
    named = json.loads(res.stdout)["runs"][0]
    assert not any("architecture=" in a for a in named["assumptions"])
    from planner.catalog import resolve_model
    from planner.fidelity.runs import load_runs
    case = load_runs(tmp_path / "runs.yaml")[0]
    ref = resolve_model("llama3-8b")
    assert (case.model.activation, case.model.norm, case.model.tie_embeddings,
            case.model.position_embedding) == (ref.activation, ref.norm, ref.tie_embeddings,
                                               ref.position_embedding) == ("swiglu", "rmsnorm", False, "rope")
    # SwiGLU's three FFN matrices of 14,336 against GeLU's two: the catalog model costs more
    assert named["predicted_step_s"] > plain["predicted_step_s"]


def test_own_run_shape_that_contradicts_its_catalog_model_is_refused(tmp_path, monkeypatch):
    res = _own_run(tmp_path, monkeypatch, catalog="llama3-8b", kv_heads=4)
    assert res.exit_code == 2
    assert "model.kv_heads is 4 but catalog model llama3-8b has 8" in res.stderr


def _write_mixtral_run(tmp_path, monkeypatch, ep, tp=1, **top):
    """A runs.yaml of one Mixtral 8x7B run on 64 H100 (tp, the given ep) in tmp_path (cwd)."""
    row = {"id": "mylab-mixtral", "source": "my lab", **top,
           "model": {"name": "mixtral", "catalog": "mixtral-8x7b", "seq_len": 4096},
           "hardware": {"gpus": 64, "profile": "dgx-h100"},
           "layout": {"tp": tp, "pp": 1, "dp": 64 // tp, "ep": ep, "micro_batch": 1, "global_batch": 512},
           "measured": {"iteration_s": 9.5}}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([row]))


def test_own_run_layout_keeps_the_expert_rules(tmp_path, monkeypatch):
    # Mixtral 8x7B has 8 experts: ep 3 divides neither them nor the 64 GPUs of a stage; search,
    # estimate and regress refuse it, and so does a runs file (it used to be costed)
    _write_mixtral_run(tmp_path, monkeypatch, ep=3)
    line = one_line_error(["accuracy", "runs.yaml"])
    assert line.startswith("error: runs.yaml: run mylab-mixtral: layout tp=1 pp=1 dp=64 ep=3 zero=0")
    assert "experts divisible by ep" in line and "run mylab-mixtral: run" not in line
    _write_mixtral_run(tmp_path, monkeypatch, ep=8)
    assert runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso", "--json"]).exit_code == 0
    # tp 2 without a stated SP: Megatron-Core's MoE layer needs SP with tp > 1, so that is the
    # default (SP off would break the rule this check applies)
    _write_mixtral_run(tmp_path, monkeypatch, ep=8, tp=2)
    res = runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso", "--json"])
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["runs"][0]["layout"]["sequence_parallel"] is True


def test_own_run_precision_error_is_one_line(tmp_path, monkeypatch):
    _write_mixtral_run(tmp_path, monkeypatch, ep=8, precision="fp4")
    line = one_line_error(["accuracy", "runs.yaml"])
    assert "run mylab-mixtral: training: precision: Input should be 'bf16'" in line


def test_own_run_catalog_that_its_facts_contradict_is_refused(tmp_path, monkeypatch):
    # the row names llama3-8b, its facts file mixtral-8x7b: one model must be named, not one dropped
    _own_run(tmp_path, monkeypatch, catalog="llama3-8b")
    (tmp_path / "runs_facts.yaml").write_text(yaml.safe_dump(
        [{"runs": "mylab-*", "source": "my notes", "model": "mixtral-8x7b"}]))
    line = one_line_error(["accuracy", "runs.yaml"])
    assert "model.catalog is llama3-8b but the run's facts name mixtral-8x7b" in line


def test_calibrate_says_what_its_runs_assume(tmp_path, monkeypatch):
    # accuracy lists each run's defaults; calibrate fitted on the same runs without saying them
    _own_run(tmp_path, monkeypatch)
    res = runner.invoke(app, ["calibrate", "runs.yaml", "--hardware", "dgx-h100", "-o", str(tmp_path / "cal.yaml")])
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stderr.split())
    assert "note: the fitted runs assume" in flat and "recompute=none (1 run)" in flat


def test_accuracy_on_runs_no_profile_is_fitted_on_says_they_are_held_out(tmp_path, monkeypatch):
    # "Leave-one-source-out: 0 refits ... without the source predicted" read as a failure
    _own_run(tmp_path, monkeypatch)
    res = runner.invoke(app, ["accuracy", "runs.yaml"])
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "no shipped profile is fitted on these runs' sources" in flat and "0 refits" not in flat


def _llama_row(**changes):
    """Llama 3 8B on one DGX H100 (tp 1, pp 1, dp 8, batch 64 x 8,192), with ``changes``: a dict
    per section, merged into it."""
    row = {"id": "mylab-llama3-8b", "source": "my lab",
           "model": {"name": "llama3-8b", "catalog": "llama3-8b", "seq_len": 8192},
           "hardware": {"gpu": "H100-SXM5-80GB", "gpus": 8, "profile": "dgx-h100"},
           "layout": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 64},
           "measured": {"iteration_s": 9.5}}
    for section, values in changes.items():
        row[section] = {**row[section], **values} if isinstance(values, dict) else values
    return row


def _write(tmp_path, monkeypatch, row, facts=None):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([row]))
    if facts is not None:
        (tmp_path / "runs_facts.yaml").write_text(yaml.safe_dump(facts))


@pytest.mark.parametrize("changes, facts, words", [
    # degrees are whole numbers: 1.5, true and '2' were cast to 1, 1 and 2
    ({"layout": {"tp": 1.5}}, None, "layout.tp must be a whole number, got 1.5"),
    ({"layout": {"tp": True}}, None, "layout.tp must be a whole number, got True"),
    ({"layout": {"pp": "2"}}, None, "layout.pp must be a whole number, got '2'"),
    # tp missing with pp and dp given: what gpus / (dp*cp) leaves must split (was ZeroDivisionError)
    ({"layout": {"tp": None, "dp": 16}}, None, "layout.dp x cp = 16 does not divide the 8 GPUs"),
    ({"layout": {"tp": None, "pp": 3, "dp": 1}}, None, "layout.tp is not given and 3 does not divide the tp*pp = 8"),
    ({"layout": {"tp": None, "pp": None, "dp": 2}}, None, "tp*pp = 4 (gpus / (dp*cp)) is not 8 GPUs"),
    # hardware that contradicts the profile: an A100 name on an H100 profile, 4 GPUs per node on 8
    ({"hardware": {"gpu": "A100-SXM4-80GB"}}, None, "hardware.gpu A100-SXM4-80GB is not the GPU of profile dgx-h100"),
    ({"hardware": {"gpus_per_node": 4}}, None, "hardware.gpus_per_node 4 is not profile dgx-h100's 8"),
    ({"hardware": {"gpus_per_node": "8"}}, None, "hardware.gpus_per_node must be a whole number, got '8'"),
    # a facts file that contradicts the row, or names what does not exist
    ({}, [{"runs": "mylab-*", "source": "s", "layout": {"global_batch": 128}}],
     "layout.global_batch 64 but the run's facts give 128"),
    ({}, [{"runs": "mylab-*", "source": "s", "hardware": "dgx-h1000"}], "hardware: unknown hardware profile 'dgx-h1000'"),
    ({}, [{"runs": "other-*", "source": "s", "framework": "megatron-cor"}], "framework: unknown framework profile"),
    # a mistyped glob applied its facts to no run, silently
    ({}, [{"runs": "mylab-*", "source": "s", "group": "mine"}, {"runs": "mylb-*", "source": "s", "layout": {"vpp": 2}}],
     "entry 2: runs 'mylb-*' matches no run id of runs.yaml"),
    # no seq_len, and the two figures imply 8,192 (64 x 8,192 / 9.5 s = 55,188 tokens/s)
    ({"model": {"seq_len": None}, "measured": {"iteration_s": 9.5, "tokens_per_s": 55188}}, None,
     "model.seq_len is not given (1024 assumed) and measured.iteration_s x tokens_per_s / global batch = 8,192"),
])
def test_own_run_contradictions_are_refused(tmp_path, monkeypatch, changes, facts, words):
    _write(tmp_path, monkeypatch, _llama_row(**changes), facts)
    assert words in one_line_error(["accuracy", "runs.yaml"])


def test_own_run_derived_degrees_and_defaults_are_listed(tmp_path, monkeypatch):
    # pp missing: 8 GPUs / (dp 4) = 2 = tp 2 x pp 1; an MoE run without ep: ep 1, listed
    _write(tmp_path, monkeypatch, _llama_row(layout={"tp": 2, "pp": None, "dp": 4}))
    run = json.loads(runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso", "--json"]).stdout)["runs"][0]
    assert run["layout"]["pp"] == 1 and "pp=1 (tp*pp=2)" in run["assumptions"]
    _write(tmp_path, monkeypatch, _llama_row(model={"catalog": "mixtral-8x7b", "name": "mixtral", "seq_len": 4096},
                                             layout={"global_batch": 512}))
    res = runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso", "--json"])
    assert res.exit_code == 0, res.stderr
    run = json.loads(res.stdout)["runs"][0]
    assert run["layout"]["ep"] == 1 and "ep=1 (no expert parallelism)" in run["assumptions"]


def test_accuracy_layouts_tell_selective_from_selective_plus(tmp_path, monkeypatch):
    # the layout column printed 'sele' for both
    rows = [_llama_row(layout={"recompute": mode}) for mode in ("selective", "selective+")]
    rows[1]["id"] = "mylab-llama3-8b-b"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(rows))
    text = runner.invoke(app, ["accuracy", "runs.yaml", "--no-loso"]).stdout
    assert " b1 sel " in text.replace("\n", " ") and " b1 sel+ " in text.replace("\n", " ")


def test_accuracy_on_a_profile_calibrated_on_the_same_runs_says_in_sample(tmp_path, monkeypatch):
    # calibrate fitted my profile on these runs; accuracy called its errors "held out already"
    _own_run(tmp_path, monkeypatch)
    res = runner.invoke(app, ["calibrate", "runs.yaml", "--hardware", "dgx-h100", "-o", "mine.yaml"])
    assert res.exit_code == 0, res.stderr
    rows = yaml.safe_load((tmp_path / "runs.yaml").read_text())
    rows[0]["hardware"]["profile"] = "mine.yaml"
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump(rows))
    res = runner.invoke(app, ["accuracy", "runs.yaml"])
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "In-sample: 1 of these runs are on a profile plan3d calibrate fitted on them (mylab-llama3-8b)" in flat
    assert "held out already" not in flat


def test_resolve_search_does_not_offload_activations_a_run_did_not_state(tmp_path, monkeypatch):
    # Llama 3 8B at 8,192 tokens, micro-batch 2, no recomputation, on 8 H100 does not fit in
    # plan3d's memory model at any ZeRO stage; the search made it "fit" by offloading layers'
    # activations to the host (a slower step), hiding the false OOM the run is
    _write(tmp_path, monkeypatch, _llama_row(layout={"micro_batch": 2, "recompute": "none"}))
    res = runner.invoke(app, ["accuracy", "runs.yaml", "--resolve", "search", "--no-loso", "--json"])
    assert res.exit_code == 0, res.stderr
    run = json.loads(res.stdout)["runs"][0]
    assert run["layout"]["offload_layers"] == 0
    assert run["resolution"] == "false-oom"


def test_accuracy_with_a_runs_file_refuses_dataset(tmp_path, monkeypatch):
    # --dataset modern beside a runs file was ignored
    _own_run(tmp_path, monkeypatch)
    line = one_line_error(["accuracy", "runs.yaml", "--dataset", "modern"])
    assert "--dataset chooses a shipped dataset; with a runs file (runs.yaml) give one or the other" in line


def test_calibrate_exclude_that_matches_nothing_is_refused(tmp_path, monkeypatch):
    _own_run(tmp_path, monkeypatch)
    line = one_line_error(["calibrate", "runs.yaml", "--hardware", "dgx-h100", "-o", "x.yaml",
                           "--exclude", "nomatch*"])
    assert "--exclude 'nomatch*' matches no run id of runs.yaml" in line


def test_own_run_facts_state_the_software_and_token_dropping(tmp_path, monkeypatch):
    # the training software's switches are layout facts (layout axes), flex named by its backend;
    # a capacity factor is a training fact
    from planner.fidelity.runs import load_runs
    row = _llama_row(model={"catalog": "mixtral-8x7b", "name": "mixtral", "seq_len": 4096},
                     layout={"ep": 8, "global_batch": 512})
    _write(tmp_path, monkeypatch, row, [{"runs": "mylab-*", "source": "s", "layout": {"moe_dispatcher": "flex"}}])
    line = one_line_error(["accuracy", "runs.yaml"])
    assert "layout.moe_dispatcher: flex is Megatron-Core's fused dispatcher: name its backend, deepep or hybridep" in line
    _write(tmp_path, monkeypatch, row, [{"runs": "mylab-*", "source": "s", "training": {"moe_dispatcher": "alltoall"}}])
    assert "moe_dispatcher: unknown field" in one_line_error(["accuracy", "runs.yaml"])
    _write(tmp_path, monkeypatch, row, [{"runs": "mylab-*", "source": "my launch script",
                                         "layout": {"moe_dispatcher": "deepep", "cuda_graphs": "layers"},
                                         "training": {"moe_capacity_factor": 1.25}}])
    case = load_runs(tmp_path / "runs.yaml")[0]
    assert (case.layout.moe_dispatcher, case.layout.cuda_graphs) == ("deepep", "layers")
    assert case.training.moe_capacity_factor == 1.25
    # what the facts leave out is unknown, at the axis default, and listed
    assert "moe_a2a_overlap" in case.unknown and "moe_a2a_overlap=False" in case.assumptions
    assert "moe_dispatcher" not in case.unknown and "tp_comm_overlap" not in case.unknown  # tp 1
