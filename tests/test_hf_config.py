"""Hugging Face config.json import (planner.hf_config) and `plan3d models --show`.

Inputs are the architecture fields of public Hub configs (tests/data/hf/SOURCES.md). Parameter
counts are recomputed by hand below with planner.cost.model_counts.total_params' formula
P = L*(attention + MLP + biases + 2 norms) + final norm + embeddings (+ learned positions).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.cost.model_counts import total_params
from planner.errors import UsageError
from planner.hf_config import from_hf_dict, load_hf_config

HF = Path(__file__).parent / "data" / "hf"


def load(name: str):
    return load_hf_config(HF / name)


def test_llama3_8b_parameter_count_and_fields():
    m = load("llama3-8b.json")
    # attention 2*4096*128*(32+8) = 41,943,040; SwiGLU 3*4096*14336 = 176,160,768; 2 RMSNorms 8,192
    # layer 218,112,000 * 32 = 6,979,584,000; + final norm 4,096 + untied 2*128256*4096 =
    # 1,050,673,152 -> 8,030,261,248 (the published Meta-Llama-3-8B count)
    assert total_params(m) == 8_030_261_248
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.kv_heads, m.ffn) == \
        (32, 4096, 32, 8, 14336)
    assert (m.activation, m.norm, m.position_embedding, m.tie_embeddings, m.bias) == \
        ("swiglu", "rmsnorm", "rope", False, False)
    # training defaults: seq = min(8192, 8192); batch 2^22 / 8192 = 512 sequences
    assert (m.training.seq_length, m.training.global_batch_size) == (8192, 512)
    assert "llama3-8b.json" in m.source
    # the catalog's llama3-8b is the same architecture
    assert total_params(catalog.resolve_model("llama3-8b")) == total_params(m)


def test_gpt2_tied_learned_positions():
    m = load("gpt2.json")
    # layer: attention 2*768*64*24 = 2,359,296 + MLP 2*768*3072 = 4,718,592 + biases
    # (2304 + 768 + 3072 + 768 = 6,912) + 2 LayerNorms 3,072 = 7,087,872; * 12 = 85,054,464
    # + final norm 1,536 + tied embedding 50257*768 = 38,597,376 + positions 1024*768 = 786,432
    # = 124,439,808 (published GPT-2 small)
    assert total_params(m) == 124_439_808
    assert (m.tie_embeddings, m.position_embedding, m.max_position_embeddings, m.ffn) == \
        (True, "learned", 1024, 3072)
    assert m.dropout == 0.1
    assert (m.training.seq_length, m.training.global_batch_size) == (1024, 4096)  # 2^22/1024


def test_mistral_and_gpt_neox_counts():
    # Mistral 7B: as Llama 3 8B per layer (218,112,000 * 32) + 4,096 + 2*32000*4096 = 262,144,000
    # = 7,241,732,096 (published); the 4096-token sliding window on every layer is kept
    mistral = load("mistral-7b-v0.1.json")
    assert total_params(mistral) == 7_241_732_096
    assert (mistral.sliding_window, mistral.window_layers) == (4096, "all")
    # GPT-NeoX-20B: attention 2*6144*96*128 = 150,994,944; MLP 2*6144*24576 = 301,989,888; biases
    # 18,432 + 6,144 + 24,576 + 6,144 = 55,296; norms 24,576 -> 453,064,704 * 44 = 19,934,846,976
    # + 12,288 + 2*50432*6144 = 619,708,416 -> 20,554,567,680 (published)
    neox = load("gpt-neox-20b.json")
    assert total_params(neox) == 20_554_567_680 == total_params(catalog.resolve_model("gpt-neox-20b"))


def test_counts_with_noted_differences():
    # Qwen2-7B: 233,053,184 * 28 + 3,584 + 2*152064*3584 = 7,615,487,488, plus the Q/K/V biases
    # (qkv_bias) (28 + 2*4) * 128 * 28 = 129,024: 7,615,616,512 (published)
    qwen = load("qwen2-7b.json")
    assert qwen.qkv_bias and not qwen.bias
    assert total_params(qwen) == 7_615_616_512
    assert qwen.kv_heads == 4 and qwen.training.seq_length == 8192  # min(131072, 8192)
    # OPT-125m: GPT-2's layer (ReLU counted as GeLU) * 12 + 1,536 + 50272*768 + 2048*768
    # = 125,237,760; the 2 offset rows 2*768 = 1,536 are noted: 125,239,296 (published)
    opt = load("opt-125m.json")
    assert total_params(opt) == 125_237_760 and "1,536" in opt.notes and "ReLU" in opt.notes
    # Falcon-7B: MQA (1 KV head), no biases, tied: attention 2*4544*64*72 = 41,877,504;
    # MLP 2*4544*18176 = 165,183,488; 2 norms 18,176 -> 207,079,168 * 32 + 9,088 + 65024*4544
    # = 6,922,011,520; one LayerNorm per layer counted twice: 2*4544*32 = 290,816 too many
    # (published 6,921,720,704)
    falcon = load("falcon-7b.json")
    assert falcon.kv_heads == 1 and total_params(falcon) == 6_922_011_520
    assert "290,816" in falcon.notes
    # BLOOM-560m: ALiBi; 12,596,224 * 24 + 2,048 + 250880*1024 = 559,212,544, embedding
    # LayerNorm 2,048 noted (published 559,214,592)
    bloom = load("bloom-560m.json")
    assert bloom.position_embedding == "alibi" and total_params(bloom) == 559_212_544
    assert bloom.training.seq_length == 2048  # no position limit in the config: 2048


def base_llama() -> dict:
    return json.loads((HF / "llama3-8b.json").read_text())


@pytest.mark.parametrize("change, field", [
    ({"model_type": "mixtral", "num_local_experts": 8}, "num_experts_per_tok is missing"),
    ({"num_local_experts": 8}, "num_local_experts=8: model_type llama is dense"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"hidden_size": None}, "hidden_size / n_embd / d_model"),
])
def test_unmappable_fields_are_named(change, field):
    cfg = {**base_llama(), **change}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(UsageError) as err:
        from_hf_dict(cfg, "config.json", "x")
    assert field in str(err.value)


def test_opt_projection_is_refused():
    cfg = json.loads((HF / "opt-125m.json").read_text())
    cfg["word_embed_proj_dim"] = 512  # as OPT-350m
    with pytest.raises(UsageError, match="word_embed_proj_dim=512"):
        from_hf_dict(cfg, "config.json", "opt-350m")


def test_cli_model_json_and_errors(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["estimate", "--model", str(HF / "llama3-8b.json"), "--gpus", "8",
                              "--tp", "1", "--zero-stage", "3", "--json"])
    assert res.exit_code == 0, res.stderr
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "t5", "d_model": 512}')
    res = runner.invoke(app, ["search", "--model", str(bad), "--gpus", "8"])
    assert res.exit_code == 2 and "model_type 't5' is not supported" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    bad.write_text("{not json")
    res = runner.invoke(app, ["estimate", "--model", str(bad), "--gpus", "8"])
    assert res.exit_code == 2 and "invalid JSON" in res.stderr


def test_models_show_round_trips(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["models", "--show", "175b"])
    assert res.exit_code == 0, res.stderr
    data = yaml.safe_load(res.stdout)
    assert data["name"] == "gpt3-175b" and data["num_layers"] == 96
    f = tmp_path / "mine.yaml"
    f.write_text(res.stdout)
    assert catalog.resolve_model(str(f)) == catalog.resolve_model("gpt3-175b")
    # an HF config shown as YAML is valid input too
    res = runner.invoke(app, ["models", "--show", str(HF / "gpt2.json")])
    f.write_text(res.stdout)
    assert total_params(catalog.resolve_model(str(f))) == 124_439_808
    res = runner.invoke(app, ["models", "--show", "nosuchmodel"])
    assert res.exit_code == 2 and "unknown model" in res.stderr
