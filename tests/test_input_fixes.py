"""One-line usage errors (exit 2) for bad inputs found by a new-user test: Hugging Face config
fields of the wrong type, a plan passed as --model/--hardware, a model folder, impossible
measured runs for `plan3d accuracy`, malformed regress cases, negative --max-rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.cost.flops import total_params

HF = Path(__file__).parent / "data" / "hf"
runner = CliRunner()


def one_line_error(args: list[str]) -> str:
    """Run the CLI; assert exit 2 with exactly one stderr line, and return it."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2, (res.exit_code, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.parametrize("field, value, shown", [
    ("hidden_size", "big", "'big'"),
    ("hidden_size", 4096.5, "4096.5"),
    ("hidden_size", True, "True"),
    ("max_position_embeddings", "x", "'x'"),
    ("num_key_value_heads", "8", "'8'"),
    ("intermediate_size", 14336.5, "14336.5"),
])
def test_hf_integer_fields_must_be_integers(tmp_path, monkeypatch, field, value, shown):
    cfg = json.loads((HF / "llama3-8b.json").read_text())
    cfg[field] = value
    (tmp_path / "typ.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    line = one_line_error(["estimate", "--model", "typ.json", "--gpus", "8"])
    assert line == f"error: typ.json: {field} must be an integer, got {shown}"


def test_hf_float_fields_and_integral_floats(tmp_path, monkeypatch):
    cfg = json.loads((HF / "gpt2.json").read_text())
    cfg["n_embd"] = 768.0  # an integral float is the integer 768
    cfg["resid_pdrop"] = "high"
    (tmp_path / "typ.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    line = one_line_error(["estimate", "--model", "typ.json", "--gpus", "8"])
    assert line == "error: typ.json: resid_pdrop must be a number, got 'high'"
    cfg["resid_pdrop"] = 0.1
    (tmp_path / "typ.json").write_text(json.dumps(cfg))
    m = catalog.resolve_model("typ.json")
    assert m.hidden_size == 768 and m.dropout == 0.1
    assert total_params(m) == 124_439_808  # the published GPT-2 small count (test_hf_config.py)


def test_model_folder_with_config_json(tmp_path):
    folder = tmp_path / "Meta-Llama-3-8B"
    folder.mkdir()
    (folder / "config.json").write_text((HF / "llama3-8b.json").read_text())
    m = catalog.resolve_model(str(folder))
    assert total_params(m) == 8_030_261_248  # published Meta-Llama-3-8B count
    empty = tmp_path / "empty"
    empty.mkdir()
    line = one_line_error(["estimate", "--model", str(empty), "--gpus", "8"])
    assert line == f"error: {empty} is a directory, not a model file"


def test_plan_file_as_model_or_hardware(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["search", "--model", "megatron-1.7b", "--gpus", "8", "--export",
                              "plan.yaml"])
    assert res.exit_code == 0, res.stderr
    line = one_line_error(["estimate", "--model", "plan.yaml", "--gpus", "8"])
    assert line == "error: plan.yaml is a plan3d plan; use `plan3d estimate --plan plan.yaml`"
    line = one_line_error(["estimate", "--model", "megatron-1.7b", "--hardware", "plan.yaml",
                           "--gpus", "8"])
    assert line == "error: plan.yaml is a plan3d plan; use `plan3d estimate --plan plan.yaml`"
