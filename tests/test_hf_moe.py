"""Hugging Face import of MoE, MLA, MTP and sliding-window configs (planner.hf_moe), and of
missing fields: an error naming a field with no checkpoint-independent default, or the
transformers class default taken and named in the notes (planner.hf_fields).

Inputs: tests/data/hf/*.json (SOURCES.md). Each MoE config must give exactly the catalog
entry's architecture, whose counts test_moe_counts.py checks against the published figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.cost import model_counts as mc
from planner.errors import UsageError
from planner.hf_config import from_hf_dict, load_hf_config

HF = Path(__file__).parent / "data" / "hf"

SAME_AS_CATALOG = {"mixtral-8x7b.json": "mixtral-8x7b", "qwen3-30b-a3b.json": "qwen3-30b-a3b",
                   "deepseek-v3.json": "deepseek-v3", "deepseek-v2-lite.json": "deepseek-v2-lite",
                   "gpt-oss-120b.json": "gpt-oss-120b", "olmoe-1b-7b.json": "olmoe-1b-7b",
                   "llama4-maverick.json": "llama4-maverick", "mistral-7b-v0.1.json": "mistral-7b"}
ARCH = ("num_layers", "hidden_size", "num_attention_heads", "kv_heads", "vocab_size", "moe",
        "mla", "attention_kind", "mtp_layers", "sliding_window", "window_layers", "qk_norm",
        "attention_sinks", "bias", "tie_embeddings", "norm", "activation", "rope_theta")


def cfg(name: str) -> dict:
    return json.loads((HF / name).read_text())


@pytest.mark.parametrize("file, name", SAME_AS_CATALOG.items())
def test_configs_give_the_catalog_architecture(file, name):
    m, c = load_hf_config(HF / file), catalog.resolve_model(name)
    for field in ARCH:
        assert getattr(m, field) == getattr(c, field), (file, field)
    if c.moe and (c.moe.first_dense_layers or c.moe.layer_freq > 1):
        assert m.ffn == c.ffn                      # the dense layers' width
    assert mc.total_params(m) == mc.total_params(c) and mc.active_params(m) == mc.active_params(c)


def test_deepseek_fields():
    v3 = load_hf_config(HF / "deepseek-v3.json")
    # first_k_dense_replace 3, moe_layer_freq 1 -> 3 dense layers then every layer MoE
    assert (v3.moe.first_dense_layers, v3.moe.layer_freq, v3.moe.shared_experts) == (3, 1, 1)
    assert v3.mtp_layers == 1 and v3.ffn_hidden_size == 18432 and "rope_scaling" in v3.notes
    lite = load_hf_config(HF / "deepseek-v2-lite.json")
    assert lite.mla.q_lora_rank is None and lite.moe.shared_experts == 2 and lite.mtp_layers == 0
    # q_lora_rank is required: its DeepseekV2Config default 1536 is DeepSeek-V2's size
    c = cfg("deepseek-v2-lite.json")
    del c["q_lora_rank"]
    with pytest.raises(UsageError, match="q_lora_rank is missing"):
        from_hf_dict(c, "config.json", "x")
    # moe_layer_freq 2 after 3 dense layers: HF makes layers 4, 6, ... MoE (i >= 3, i % 2 == 0),
    # plan3d's pattern expresses it as every 2nd layer after 3 dense ones (4, 6, ...)
    c = {**cfg("deepseek-v2-lite.json"), "moe_layer_freq": 2, "first_k_dense_replace": 3}
    m = from_hf_dict(c, "config.json", "x")
    assert (m.moe.first_dense_layers, m.moe.layer_freq) == (3, 2)
    assert mc.moe_layer_mask(m).tolist() == [i >= 3 and i % 2 == 0 for i in range(27)]
    # ... but not from layer 0 (HF: 0, 2, 4, ...; plan3d's k-th-after-the-lead cannot start at 0
    # and skip 1)
    c["first_k_dense_replace"] = 0
    with pytest.raises(UsageError, match="first_k_dense_replace / moe_layer_freq give MoE layers"):
        from_hf_dict(c, "config.json", "x")


def test_qwen3_moe_dense_layers_and_pattern():
    c = {**cfg("qwen3-30b-a3b.json"), "mlp_only_layers": [0, 1]}
    m = from_hf_dict(c, "config.json", "x")
    assert (m.moe.first_dense_layers, m.ffn_hidden_size) == (2, 6144)
    c = {**cfg("qwen3-30b-a3b.json"), "mlp_only_layers": [5]}
    with pytest.raises(UsageError, match="cannot express") as err:
        from_hf_dict(c, "config.json", "x")
    assert "mlp_only_layers / decoder_sparse_step" in str(err.value)
    m = from_hf_dict({**cfg("qwen3-30b-a3b.json"), "decoder_sparse_step": 2}, "config.json", "x")
    assert mc.moe_layer_mask(m).tolist() == [(i + 1) % 2 == 0 for i in range(48)]


def test_gpt_oss_windows_and_biases():
    m = load_hf_config(HF / "gpt-oss-120b.json")
    assert (m.sliding_window, m.window_layers, m.attention_sinks, m.bias) == (128, "even", True, True)
    # without layer_types: GptOssConfig's alternation (sliding first), named in the notes
    c = cfg("gpt-oss-120b.json")
    del c["layer_types"]
    m2 = from_hf_dict(c, "config.json", "x")
    assert m2.window_layers == "even" and "layer_types = alternating, sliding first" in m2.notes
    c = {**cfg("gpt-oss-120b.json"), "layer_types": ["full_attention"] * 35 + ["sliding_attention"]}
    assert from_hf_dict(c, "config.json", "x").window_layers == [35]
    c = {**cfg("gpt-oss-120b.json"), "attention_bias": False}
    with pytest.raises(UsageError, match="attention_bias=false"):
        from_hf_dict(c, "config.json", "x")


def test_llama4_nested_and_text_configs():
    m = load_hf_config(HF / "llama4-maverick.json")
    assert "vision encoder is not counted" in m.notes and "chunked attention" in m.notes
    text = {**cfg("llama4-maverick.json")["text_config"], "interleave_moe_layer_step": 1}
    scout = from_hf_dict({**text, "num_local_experts": 16}, "config.json", "scout")
    assert mc.total_params(scout) == mc.total_params(catalog.resolve_model("llama4-scout"))
    with pytest.raises(UsageError, match="text_config"):
        from_hf_dict({"model_type": "llama4"}, "config.json", "x")


def test_mistral_window_default_and_qwen2_window_layers():
    # Mistral without sliding_window: MistralConfig's 4096 is taken and said so
    c = cfg("mistral-7b-v0.1.json")
    del c["sliding_window"]
    m = from_hf_dict(c, "config.json", "x")
    assert m.sliding_window == 4096 and "sliding_window 4096" in m.notes
    # an explicit null means no window (Mistral v0.2+)
    assert from_hf_dict({**c, "sliding_window": None}, "config.json", "x").sliding_window is None
    # Qwen2 with use_sliding_window: layers >= max_window_layers (Qwen2Config.layer_types)
    q = {**json.loads((HF / "qwen2-7b.json").read_text()), "use_sliding_window": True,
         "sliding_window": 4096, "max_window_layers": 20}
    m = from_hf_dict(q, "config.json", "x")
    assert m.window_layers == list(range(20, 28)) and m.sliding_window == 4096


@pytest.mark.parametrize("file, drop, message", [
    # widths and counts whose class default is one checkpoint's size: refused, named
    ("llama3-8b.json", "intermediate_size", "intermediate_size is missing (model_type llama; LlamaConfig"),
    ("mistral-7b-v0.1.json", "num_key_value_heads", "num_key_value_heads is missing"),
    ("mixtral-8x7b.json", "num_local_experts", "num_local_experts is missing"),
    ("qwen3-30b-a3b.json", "moe_intermediate_size", "moe_intermediate_size is missing"),
    ("deepseek-v3.json", "n_shared_experts", "n_shared_experts is missing"),
    ("deepseek-v3.json", "num_nextn_predict_layers", "num_nextn_predict_layers is missing"),
    ("gpt-oss-120b.json", "head_dim", "head_dim is missing"),
    ("olmoe-1b-7b.json", "num_experts_per_tok", "num_experts_per_tok is missing"),
    ("gpt2.json", "n_positions", "n_positions is missing"),
    ("opt-125m.json", "ffn_dim", "ffn_dim is missing"),
    ("gpt-neox-20b.json", "intermediate_size", "intermediate_size is missing"),
])
def test_missing_sized_fields_are_refused(file, drop, message):
    c = cfg(file)
    del c[drop]
    with pytest.raises(UsageError) as err:
        from_hf_dict(c, "config.json", "x")
    assert message in str(err.value) and "\n" not in str(err.value)
    c[drop] = None                         # null is no better than absent for a required width
    with pytest.raises(UsageError, match=f"{drop} is null"):
        from_hf_dict(c, "config.json", "x")


@pytest.mark.parametrize("file, drop, check, noted", [
    # switches and rules: the class default is taken and named in the notes
    ("llama3-8b.json", "num_key_value_heads", lambda m: m.kv_heads == 32,
     "num_key_value_heads = num_attention_heads"),
    ("llama3-8b.json", "tie_word_embeddings", lambda m: m.tie_embeddings is False,
     "tie_word_embeddings False"),
    ("gpt-neox-20b.json", "rotary_pct", lambda m: m.rotary_percent == 0.25, "rotary_pct 0.25"),
    ("gpt2.json", "resid_pdrop", lambda m: m.dropout == 0.1, "resid_pdrop 0.1"),
    ("opt-125m.json", "dropout", lambda m: m.dropout == 0.1, "dropout 0.1"),
    ("mixtral-8x7b.json", "rope_theta", lambda m: m.rope_theta == 1e6, "rope_theta not given: 1e+06"),
    ("gpt-oss-120b.json", "rope_theta", lambda m: m.rope_theta == 150000, "150000 assumed"),
    ("deepseek-v3.json", "moe_layer_freq", lambda m: m.moe.layer_freq == 1, "moe_layer_freq 1"),
    ("qwen3-30b-a3b.json", "decoder_sparse_step", lambda m: m.moe.layer_freq == 1,
     "decoder_sparse_step 1"),
    ("olmoe-1b-7b.json", "num_key_value_heads", lambda m: m.kv_heads == 16,
     "num_key_value_heads = num_attention_heads"),
])
def test_missing_switches_take_the_class_default_with_a_note(file, drop, check, noted):
    c = cfg(file)
    del c[drop]
    m = from_hf_dict(c, "config.json", "x")
    assert check(m) and noted in m.notes


def test_falcon_ffn_default_is_noted():
    m = load_hf_config(HF / "falcon-7b.json")   # no ffn_hidden_size: FalconConfig's 4 * hidden
    assert m.ffn == 4 * 4544 and "ffn_hidden_size = 4 * hidden" in m.notes


def test_cli_shows_and_plans_moe_configs(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["models", "--show", str(HF / "deepseek-v3.json")])
    assert res.exit_code == 0 and "mtp_layers: 1" in res.stdout and "q_lora_rank: 1536" in res.stdout
    f = tmp_path / "dsv3.yaml"
    f.write_text(res.stdout)
    assert mc.total_params(catalog.resolve_model(str(f))) == 671_026_404_352
    # an HF MoE config plans like a catalog model: Mixtral-8x7B's 46.7B parameters need 18 B
    # each with plain DDP, far more than 8 x 79.6 GiB, so the search must shard (ZeRO/EP) or
    # report no fit; either way one line on stderr at most, no traceback
    res = runner.invoke(app, ["search", "--model", str(HF / "mixtral-8x7b.json"), "--gpus", "64", "--json"])
    assert res.exit_code == 0, res.stderr
    import json
    best = json.loads(res.stdout)[0]
    lay = best["layout"]
    assert best["memory"]["fits"]
    # sharded somehow: ZeRO, experts over ep, or model parallelism
    assert lay["zero_stage"] > 0 or lay["distributed_optimizer"] or lay["ep"] > 1 \
        or lay["tp"] * lay["pp"] > 1
    states = sum(best["memory"][k] for k in ("weights", "gradients", "optimizer"))
    assert states < 79.65 * 2**30 < 18 * 46_702_792_704
