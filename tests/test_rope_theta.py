"""The RoPE base (ModelSpec.rope_theta): catalog values, HF import, exports, plan round trip.

Published values: Llama 3 / 3.1 use theta 500,000 (Llama 3 paper, arXiv:2407.21783, Table 3;
meta-llama/Meta-Llama-3-8B config.json "rope_theta": 500000.0, tests/data/hf/llama3-8b.json);
Llama 2 uses 10,000 (Meta's reference precompute_freqs_cis default, never overridden); GPT-NeoX-20B
rotary_emb_base 10000; Qwen2-7B rope_theta 1000000.0 and Mistral-7B-v0.1 10000.0 (their
config.json files in tests/data/hf). Megatron-LM's own default --rotary-base is 10000, so a
Llama 3 export without the flag would train a different model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.errors import UsageError
from planner.export import plan_to_yaml, read_plan, write_plan
from planner.frameworks import export_plan
from planner.hf_config import from_hf_dict
from planner.specs import ModelSpec
from planner.plan import Plan
from tests.test_frameworks import MEGATRON, make, megatron_flags, unwrapped

HF_DIR = Path(__file__).parent / "data" / "hf"


def with_theta(plan: Plan, theta: float | None) -> Plan:
    """``plan`` with its model's rope_theta replaced (validated, as a YAML edit would be)."""
    data = plan.model_dump(mode="json")
    return Plan.model_validate({**data, "model": {**data["model"], "rope_theta": theta}})


def test_catalog_rope_bases():
    for name in ("llama3-8b", "llama3-70b", "llama3-405b"):
        assert catalog.resolve_model(name).rope_theta == 500_000.0
    for name in ("llama2-7b", "llama2-13b", "llama2-70b", "gpt-neox-20b"):
        assert catalog.resolve_model(name).rope_theta == 10_000.0
    # every RoPE model in the catalog has a sourced base; no other model has one
    for m in catalog.models().values():
        assert (m.rope_theta is not None) == (m.position_embedding == "rope"), m.name
        if m.rope_theta is not None:
            assert "RoPE base" in m.source, m.name


def test_megatron_llama3_8b_rotary_base():
    # tp 1, pp 1, dp 8 on one DGX: global batch 2048 = 8 * 1 * 256 micro-batches
    plan = make("llama3-8b", 8, tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    ex = export_plan(plan, "megatron")
    flags = megatron_flags(ex.text)
    assert flags["--position-embedding-type"] == "rope"
    assert flags["--rotary-base"] == "500000"
    assert "--rotary-base" in MEGATRON and set(flags) <= MEGATRON
    llama2 = make("llama2-7b", 8, tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    assert megatron_flags(export_plan(llama2, "megatron").text)["--rotary-base"] == "10000"


def test_megatron_unknown_base_is_a_comment_and_fractional_base_an_error():
    plan = with_theta(make("llama3-8b", 8, tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1), None)
    text = export_plan(plan, "megatron").text
    assert "--rotary-base" not in megatron_flags(text)
    assert "# RoPE base: not set for llama3-8b" in text and "default --rotary-base 10000" in text
    # Megatron-LM parses --rotary-base with type=int: 10000.5 cannot be passed (megatron-core's
    # rule integer_rope_base, framework_profiles/megatron-core.yaml)
    with pytest.raises(UsageError, match=r"takes an integer RoPE base.*10000\.5"):
        export_plan(with_theta(plan, 10000.5), "megatron")
    # a learned-position model gets neither the flag nor the comment
    gpt3 = export_plan(make("gpt3-175b", 8, tp=8, pp=1, dp=1, zero_stage=0, micro_batch_size=1,
                            gbs=8), "megatron").text
    assert "--rotary-base" not in gpt3 and "RoPE" not in gpt3


def test_other_targets_name_the_base():
    plan = make("llama3-8b", 8, tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1)
    nemo = export_plan(plan, "nemo")
    assert "  rotary_base: 500000\n" in nemo.text  # a provider field (Megatron-Core rotary_base)
    titan = export_plan(plan, "torchtitan")
    assert "# RoPE base: this plan's model uses rope_theta 500000; set it in the model flavour" \
        in unwrapped(titan.text)
    ds = export_plan(plan, "deepspeed")
    assert any("rope_theta 500000" in n for n in ds.notes)
    unknown = with_theta(plan, None)
    for target in ("nemo", "torchtitan"):
        assert "RoPE base: not set for llama3-8b" in unwrapped(export_plan(unknown, target).text)
    assert any("not set for llama3-8b" in n for n in export_plan(unknown, "deepspeed").notes)


def test_hf_import_reads_the_base():
    llama3 = json.loads((HF_DIR / "llama3-8b.json").read_text())
    assert from_hf_dict(llama3, "l3", "l3").rope_theta == 500_000.0
    assert from_hf_dict(json.loads((HF_DIR / "qwen2-7b.json").read_text()), "q", "q").rope_theta \
        == 1_000_000.0
    # GPT-NeoX names it rotary_emb_base (10000 in EleutherAI/gpt-neox-20b's config.json)
    neox = from_hf_dict(json.loads((HF_DIR / "gpt-neox-20b.json").read_text()), "n", "n")
    assert neox.rope_theta == 10_000.0
    # absent: the transformers default 10000, said in the notes
    bare = {k: v for k, v in llama3.items() if k != "rope_theta"}
    m = from_hf_dict(bare, "bare", "bare")
    assert m.rope_theta == 10_000.0 and "rope_theta not given: 10000 assumed" in m.notes
    # transformers v5 layout: rope_parameters.rope_theta
    v5 = {**bare, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
    assert from_hf_dict(v5, "v5", "v5").rope_theta == 500_000.0
    # rope_scaling is named in the notes (plan3d neither models nor exports it)
    scaled = {**llama3, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    assert "rope_scaling {'rope_type': 'llama3', 'factor': 8.0} is not modeled" in \
        from_hf_dict(scaled, "s", "s").notes
    for bad in ("500000", -1.0, True):
        with pytest.raises(UsageError, match="rope_theta must be a"):
            from_hf_dict({**llama3, "rope_theta": bad}, "bad.json", "bad")
    # BLOOM (ALiBi) has no base
    bloom = from_hf_dict(json.loads((HF_DIR / "bloom-560m.json").read_text()), "b", "b")
    assert bloom.rope_theta is None


def test_hf_show_prints_the_base():
    res = CliRunner().invoke(app, ["models", "--show", str(HF_DIR / "llama3-8b.json")])
    assert res.exit_code == 0, res.stderr
    assert "rope_theta: 500000.0" in res.stdout.splitlines()


def test_rope_theta_on_a_non_rope_model_is_one_line(tmp_path):
    data = catalog.resolve_model("gpt3-175b").model_dump(mode="json", exclude_none=True)
    data["rope_theta"] = 10000
    path = tmp_path / "gpt3-theta.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(app, ["models", "--show", str(path)])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "rope_theta is set (10000) but position_embedding is learned" in lines[0]
    with pytest.raises(UsageError, match="rope_theta"):
        catalog.validate(ModelSpec, {**data, "rope_theta": 0}, "x.yaml")  # > 0


def test_plan_round_trip_and_old_plans(tmp_path):
    plan = make("llama3-8b", 8, tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    path = tmp_path / "plan.yaml"
    write_plan(plan, path)
    assert "  rope_theta: 500000.0\n" in path.read_text()
    assert read_plan(path).model.rope_theta == 500_000.0 and read_plan(path) == plan
    # a plan written before the field existed loads, with the base unknown
    old = tmp_path / "old.yaml"
    old.write_text(plan_to_yaml(plan).replace("  rope_theta: 500000.0\n", ""))
    assert read_plan(old).model.rope_theta is None


def test_cli_search_export_llama3_8b(tmp_path):
    """The reported case: search -m llama3-8b -g 64 --export, export --to megatron."""
    runner = CliRunner()
    plan_file = tmp_path / "l8.yaml"
    res = runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "64", "--export", str(plan_file),
                              "--top", "1"])
    assert res.exit_code == 0, res.stderr
    res = runner.invoke(app, ["export", str(plan_file), "--to", "megatron"])
    assert res.exit_code == 0, res.stderr
    assert megatron_flags(res.stdout)["--rotary-base"] == "500000"


def test_partial_rotary_percent():
    # GPT-NeoX-20B rotates 25 % of each head's dimensions (Black et al. 2022 Sec. 2.1; HF
    # rotary_pct 0.25); Megatron-LM takes it as --rotary-percent, the others get a comment
    neox = catalog.resolve_model("gpt-neox-20b")
    assert neox.rotary_percent == 0.25
    assert all(m.rotary_percent == 1.0 for m in catalog.models().values() if m.name != "gpt-neox-20b")
    plan = make("gpt-neox-20b", 8, gbs=1536, tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1)
    flags = megatron_flags(export_plan(plan, "megatron").text)
    assert flags["--rotary-percent"] == "0.25" and "--rotary-percent" in MEGATRON
    assert "--rotary-percent" not in megatron_flags(export_plan(
        make("llama3-8b", 8, tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1), "megatron").text)
    fsdp = make("gpt-neox-20b", 8, gbs=1536, tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1)
    assert "rotates 0.25 of each head's dimensions" in unwrapped(export_plan(fsdp, "torchtitan").text)
    hf = json.loads((HF_DIR / "gpt-neox-20b.json").read_text())
    assert from_hf_dict(hf, "n", "n").rotary_percent == 0.25
    assert from_hf_dict({**hf, "rotary_pct": 1.0}, "n", "n").rotary_percent == 1.0
    with pytest.raises(UsageError, match="rotary_pct must be in"):
        from_hf_dict({**hf, "rotary_pct": 1.5}, "bad.json", "bad")
    with pytest.raises(ValueError, match="rotary_percent is 0.5 but position_embedding is learned"):
        ModelSpec.model_validate({**catalog.resolve_model("175b").model_dump(), "rotary_percent": 0.5})
