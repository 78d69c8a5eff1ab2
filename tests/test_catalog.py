import pytest

from planner import catalog
from planner.cost.model_counts import total_params
from planner.errors import UsageError

# Published parameter counts: GPT-3 175B from Brown et al. 2020 (174.6B per formulas.md 1.2 with
# V=50257 and 2048 learned positions); the Llama counts are the Hugging Face model cards' exact
# figures, verified in formulas.md 1.2; Megatron sizes from Narayanan et al. 2021 Table 1.
EXACT = {
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "llama2-70b": 68_976_648_192,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
    "gpt-neox-20b": 20_554_567_680,  # EleutherAI GPT-NeoX-20B model card
}
ROUNDED_B = {  # published in billions, to the digits given
    "gpt3-175b": 174.6, "megatron-18b": 18.4, "megatron-39b": 39.1, "megatron-76b": 76.1,
    "megatron-145b": 145.6, "megatron-310b": 310.1, "mt-nlg-530b": 529.6, "megatron-1t": 1008.0,
}


@pytest.mark.parametrize("name, count", EXACT.items())
def test_exact_parameter_counts(name, count):
    assert total_params(catalog.resolve_model(name)) == count


@pytest.mark.parametrize("name, billions", ROUNDED_B.items())
def test_rounded_parameter_counts(name, billions):
    assert round(total_params(catalog.resolve_model(name)) / 1e9, 1) == billions


def test_catalog_has_the_required_models_and_unique_aliases():
    names = set(catalog.models())
    required = {"gpt3-175b", "megatron-1t", "mt-nlg-530b", "megatron-22b", "opt-175b", "bloom-176b",
                "gpt-neox-20b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
                "llama3-405b", "mpt-7b", "mpt-30b", "mpt-70b", "megatron-1.7b", "megatron-3.6b",
                "megatron-7.5b", "megatron-18b", "megatron-39b", "megatron-76b", "megatron-145b",
                "megatron-310b"}
    assert required <= names
    seen: dict[str, str] = {}
    for m in catalog.models().values():
        for key in (m.name, *m.aliases):
            assert key.lower() not in seen, f"{key} used by {seen.get(key.lower())} and {m.name}"
            seen[key.lower()] = m.name


def test_aliases_resolve():
    assert catalog.resolve_model("175b").name == "gpt3-175b"
    assert catalog.resolve_model("GPT3-175B").name == "gpt3-175b"
    assert catalog.resolve_hardware("h100").name == "dgx-h100"


def test_unknown_model_lists_close_names():
    with pytest.raises(UsageError, match=r"unknown model 'llama3-7b'; did you mean: .*llama3-70b"):
        catalog.resolve_model("llama3-7b")


def test_hardware_profiles_have_sourced_numbers():
    profiles = catalog.hardware_profiles()
    assert {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200"} <= set(profiles)
    h100 = profiles["dgx-h100"]
    assert h100.gpu.hbm_capacity == 81_559 * 2**20               # nvidia-smi: 81,559 MiB
    assert h100.intra_node.bandwidth_per_gpu == 450e9          # 900 GB/s bidirectional / 2
    assert h100.network_bandwidth_per_gpu == 50e9              # 8 NICs x 400 Gb/s / 8 GPUs = 50 GB/s
    for p in profiles.values():
        assert p.gpu.source and p.intra_node.source and p.inter_node.source and p.efficiency.source


def test_model_file_errors_name_the_field(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("name: x\nsource: s\nnum_layers: 0\nhidden_size: 64\nnum_attention_heads: 4\n"
                   "vocab_size: 100\ntraining: {seq_length: 8, global_batch_size: 8}\n")
    with pytest.raises(UsageError, match="num_layers: Input should be greater than 0"):
        catalog.resolve_model(str(bad))
    bad.write_text("name: [unclosed\n")
    with pytest.raises(UsageError, match=r"line \d+"):
        catalog.resolve_model(str(bad))
    bad.write_text("name: x\nsource: s\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\n"
                   "vocab_size: 100\nactivation: swiglu\ntraining: {seq_length: 8, global_batch_size: 8}\n")
    with pytest.raises(UsageError, match="ffn_hidden_size is required"):
        catalog.resolve_model(str(bad))
    with pytest.raises(UsageError, match="file not found"):
        catalog.resolve_model(str(tmp_path / "missing.yaml"))


def test_hardware_quantity_needs_a_unit(tmp_path):
    import yaml
    data = catalog.resolve_hardware("dgx-h100").model_dump(mode="json")
    data["gpu"]["hbm_capacity"] = 80
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UsageError, match="needs a unit"):
        catalog.resolve_hardware(str(path))
