"""The command line end to end: tables, JSON, export/estimate round trip, one-line errors."""

import json
import subprocess
import sys

import pytest
import yaml



def run(*args, cwd=None):
    """Run the real entry point in a subprocess: (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


def test_search_table_and_summary():
    code, out, err = run("search", "--model", "175b", "--gpus", "512", "--top", "3")
    assert code == 0, err
    assert "gpt3-175b (174.6B parameters) on 512 x H100-SXM5-80GB" in out
    assert "MFU" in out and "tokens/s" in out and "Winner:" in out and "Pruned:" in out
    assert sum(1 for line in out.splitlines() if line.lstrip()[:2] in {"1 ", "2 ", "3 "}) == 3


def test_search_json_and_export_round_trip(tmp_path):
    plan = tmp_path / "plan.yaml"
    code, out, err = run("search", "--model", "175b", "--gpus", "512", "--top", "2", "--json",
                         "--export", str(plan))
    assert code == 0, err
    ranked = json.loads(out)
    assert len(ranked) == 2
    best = ranked[0]
    assert set(best) == {"layout", "memory", "time", "throughput"}
    assert {"weights", "gradients", "optimizer", "activations", "other", "total", "capacity",
            "fits"} <= set(best["memory"])
    assert {"tokens_per_s", "model_tflops_per_gpu", "mfu", "hfu"} == set(best["throughput"])
    lay = best["layout"]
    assert lay["tp"] * lay["pp"] * lay["dp"] == 512 and best["memory"]["fits"]
    saved = yaml.safe_load(plan.read_text())
    assert saved["layout"] == lay and saved["gpus"] == 512 and saved["model"]["name"] == "gpt3-175b"
    assert saved["hardware"]["gpu"]["hbm_capacity"] == "80 GiB"
    code, out, err = run("estimate", "--plan", str(plan), "--json")
    assert code == 0, err
    assert json.loads(out) == best  # the plan reproduces exactly the numbers it was exported with


def test_export_does_not_overwrite_without_force(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("mine\n")
    code, _, err = run("search", "--model", "175b", "--gpus", "512", "--export", str(plan))
    assert code == 2 and "exists; pass --force" in err
    assert plan.read_text() == "mine\n"
    code, _, err = run("search", "--model", "175b", "--gpus", "512", "--export", str(plan), "--force")
    assert code == 0, err
    assert "layout:" in plan.read_text()


def test_estimate_from_flags_matches_hand_checks():
    code, out, err = run("estimate", "-m", "llama2-7b", "-g", "8", "--tp", "1", "--pp", "1",
                         "--zero-stage", "0", "--json", "--hardware", "dgx-a100-80g",
                         "--global-batch-size", "64", "--seq-length", "4096")
    assert code == 0, err
    est = json.loads(out)
    # Llama-2-7B with tp=1, pp=1, V = 32000 (already a multiple of 128): all 6,738,415,616
    # parameters on each GPU; ZeRO-0: 2 B weights, 4 B fp32 grads, 12 B optimizer.
    assert est["memory"]["weights"] == 2 * 6_738_415_616
    assert est["memory"]["gradients"] == 4 * 6_738_415_616
    assert est["memory"]["optimizer"] == 12 * 6_738_415_616
    assert est["layout"]["dp"] == 8 and not est["memory"]["fits"]  # 18 B x 6.7e9 = 121 GB > 80 GiB


@pytest.mark.parametrize("args, code, message", [
    (["search", "--model", "nosuch", "--gpus", "8"], 2, "unknown model 'nosuch'"),
    (["search", "--model", "175b", "--gpus", "8", "--hardware", "tpu"], 2, "unknown hardware profile"),
    (["search", "--model", "175b", "--gpus", "12"], 2, "not a whole number of 8-GPU nodes"),
    (["search", "--model", "175b", "--gpus", "-8"], 2, "must be positive"),
    (["search", "--model", "175b", "--gpus", "abc"], 2, "Invalid value for '--gpus'"),
    (["search", "--model", "175b", "--gpus", "512", "--global-batch-size", "7"], 2,
     "not divisible by any data-parallel degree"),
    (["search", "--model", "175b", "--gpus", "512", "--seq-length", "0"], 2, "must be positive"),
    (["search", "--model", "175b", "--gpus", "8"], 1, "no layout of gpt3-175b fits"),
    (["search", "--model", "175b"], 2, "missing option --gpus"),
    (["search", "--model", "175b", "--gpus", "512", "--zero-stage", "5"], 2, "--zero-stage must be"),
    (["estimate", "-m", "175b", "-g", "512", "--tp", "3"], 2, "does not divide"),
    (["estimate", "-m", "175b", "-g", "512", "--tp", "16", "--pp", "2"], 2, "tp within a node"),
    (["estimate", "--plan", "nosuch.yaml"], 2, "cannot read nosuch.yaml"),
    (["frobnicate"], 2, "No such command"),
])
def test_bad_input_is_one_line(args, code, message, tmp_path):
    got, out, err = run(*args, cwd=tmp_path)
    assert got == code
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], err
    assert "Traceback" not in err + out


def test_malformed_plan_and_model_files(tmp_path):
    bad = tmp_path / "plan.yaml"
    bad.write_text("layout: [1, 2\n")
    code, _, err = run("estimate", "--plan", str(bad))
    assert code == 2 and "line" in err and "Traceback" not in err
    bad.write_text("plan3d_version: x\n")
    code, _, err = run("estimate", "--plan", str(bad))
    assert code == 2 and "missing required field" in err
    model = tmp_path / "m.yaml"
    model.write_text("name: tiny\nsource: test\nnum_layers: 4\nhidden_size: 256\n"
                     "num_attention_heads: 4\nvocab_size: 1000\n"
                     "training: {seq_length: 512, global_batch_size: 32}\n")
    code, out, err = run("search", "--model", str(model), "--gpus", "8", "--top", "1")
    assert code == 0 and "tiny" in out, err


def test_catalog_listings():
    code, out, _ = run("models")
    assert code == 0 and "gpt3-175b" in out and "llama3-405b" in out
    code, out, _ = run("hardware", "--json")
    names = {h["name"] for h in json.loads(out)}
    assert {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200"} <= names
