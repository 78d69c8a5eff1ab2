"""The model schema's MoE, MLA, MTP and window fields: validation (one-line errors), the
catalog entries, `plan3d models` / `models --show`, and the refusal of cost commands."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.errors import UsageError
from planner.specs import ModelSpec

NEW = ("mistral-7b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "deepseek-v2-lite",
       "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "gpt-oss-20b", "olmoe-1b-7b",
       "llama4-scout", "llama4-maverick")


def base() -> dict:
    """A small MoE model as a user would write it (the brief's keys)."""
    return {"name": "tiny-moe", "source": "test", "num_layers": 8, "hidden_size": 512,
            "num_attention_heads": 8, "num_kv_heads": 2, "ffn_hidden_size": 1024,
            "vocab_size": 1000, "activation": "swiglu", "norm": "rmsnorm",
            "moe": {"num_experts": 16, "router_topk": 2, "ffn_hidden_size": 256,
                    "shared_experts": 1, "shared_ffn_hidden_size": 512, "first_dense_layers": 1,
                    "layer_freq": 1},
            "training": {"seq_length": 1024, "global_batch_size": 8}}


def load(data: dict) -> ModelSpec:
    return catalog.validate(ModelSpec, data, "tiny.yaml")


def with_(**changes) -> dict:
    d = base()
    for key, value in changes.items():
        if "." in key:
            outer, inner = key.split(".")
            d[outer] = {**d[outer], inner: value}
        elif value is None:
            d.pop(key, None)
        else:
            d[key] = value
    return d


def test_brief_keys_load():
    m = load({**base(), "attention_type": "mla", "num_kv_heads": None,
              "mla": {"q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
                      "qk_rope_head_dim": 16, "v_head_dim": 32},
              "mtp_layers": 1, "sliding_window": 128, "window_layers": [0, 3]})
    assert m.moe.shared_ffn == 512 and m.attention_kind == "mla" and m.mtp_layers == 1
    assert load(with_(**{"moe.shared_ffn_hidden_size": None})).moe.shared_ffn == 256


MLA = {"q_lora_rank": None, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
       "v_head_dim": 32}


@pytest.mark.parametrize("data, message", [
    (with_(mla=MLA), "an mla block needs attention_type: mla"),
    (with_(attention_type="mla", num_kv_heads=None), "attention_type mla needs the mla block"),
    (with_(attention_type="mla", mla=MLA), "num_kv_heads does not apply to MLA"),
    (with_(attention_type="mla", mla=MLA, num_kv_heads=None, head_dim=64), "head_dim is not supported"),
    (with_(attention_type="mla", mla={k: v for k, v in MLA.items() if k != "q_lora_rank"},
           num_kv_heads=None), "mla.q_lora_rank: missing required field"),
    (with_(attention_type="mha"), "attention_type mha needs num_kv_heads"),
    (with_(attention_type="gqa", num_kv_heads=None), "attention_type gqa needs fewer KV heads"),
    (with_(**{"moe.router_topk": 17}), "router_topk (17) is larger than num_experts (16)"),
    (with_(**{"moe.layer_freq": 0}), "moe.layer_freq: Input should be greater than or equal to 1"),
    (with_(**{"moe.first_dense_layers": 8}), "first_dense_layers (8) must be smaller than num_layers (8)"),
    (with_(**{"moe.layer_freq": 9, "moe.first_dense_layers": 0}), "leaves no MoE layer"),
    (with_(**{"moe.shared_experts": 0}), "shared_ffn_hidden_size is set but shared_experts is 0"),
    (with_(ffn_hidden_size=None), "ffn_hidden_size is required for the dense layers"),
    (with_(window_layers="all"), "window_layers is set but sliding_window is not"),
    (with_(sliding_window=64, window_layers=[8]), "window_layers index 8 is outside 0..7"),
    (with_(sliding_window=64, window_layers=[1, 1]), "window_layers lists a layer twice"),
    (with_(sliding_window=64, window_layers="alternate"), "window_layers"),
    (with_(qk_norm="yes"), "qk_norm"),
    (with_(mtp_layers=-1), "mtp_layers"),
    (with_(**{"moe.num_experts": "16"}), "moe.num_experts: Input should be a valid integer"),
])
def test_invalid_models_are_one_line_errors(data, message):
    with pytest.raises(UsageError) as err:
        load(data)
    text = str(err.value)
    assert message in text and "\n" not in text and text.startswith("tiny.yaml: ")


def test_all_moe_layers_need_no_dense_ffn():
    # every layer MoE (Mixtral): ffn_hidden_size is not needed
    m = load(with_(ffn_hidden_size=None, **{"moe.first_dense_layers": 0}))
    assert m.ffn_hidden_size is None


def test_new_catalog_entries_have_sources_and_training_defaults():
    for name in NEW:
        m = catalog.resolve_model(name)
        assert m.source and m.notes and m.training.seq_length > 0, name
        assert "RoPE base" in m.source and m.rope_theta, name
    assert catalog.resolve_model("mistral-7b").sliding_window == 4096
    assert catalog.resolve_model("deepseek-v3").training.tokens == 14.8e12


def test_models_lists_total_and_active():
    res = CliRunner().invoke(app, ["models"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "name" in line and "params" in line)
    assert "active" in lines[at + 1]  # the header stacks total over active
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("deepseek-v3 "))
    row, below = lines[at], lines[at + 1]  # total over active, activation over top-k/experts
    assert "671.0B" in row and "128 MLA" in row and "swiglu" in row
    assert "37.6B" in below and "top-8/256 +1sh" in below


@pytest.mark.parametrize("name", NEW)
def test_show_round_trips(name, tmp_path):
    res = CliRunner().invoke(app, ["models", "--show", name])
    assert res.exit_code == 0, res.stderr
    f = tmp_path / "m.yaml"
    f.write_text(res.stdout)
    assert catalog.resolve_model(str(f)) == catalog.resolve_model(name)
    data = yaml.safe_load(res.stdout)
    m = catalog.resolve_model(name)
    assert ("moe" in data) == (m.moe is not None) and ("mla" in data) == (m.mla is not None)
    if name == "deepseek-v2-lite":
        assert data["mla"]["q_lora_rank"] is None      # null is kept, not dropped
    if name == "gpt-oss-120b":
        assert data["window_layers"] == "even" and data["attention_sinks"] is True
