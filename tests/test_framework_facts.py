"""Framework profile facts checked against the frameworks' code at the commits the profiles pin:
a rule names what the framework cannot run (not what the model code it runs lacks), with its
source. Each test holds a case that the old facts got wrong."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from planner import catalog
from planner.errors import UsageError
from planner.search.framework_rules import model_problems
from planner.specs import TrainingSpec


def job(model, framework: str = "megatron-core", **kw) -> TrainingSpec:
    return TrainingSpec(seq_length=2048, global_batch_size=model.training.global_batch_size,
                        framework=framework, **kw)


# ----------------------------------------------------------------------------- model code


@pytest.mark.parametrize("name, kind", [("bloom-176b", "alibi"), ("gpt-neox-20b", "rope")])
def test_deepspeed_of_2021_runs_the_positions_of_its_model_code(name, kind):
    # BLOOM-176B trained with ALiBi on Megatron-DeepSpeed (bigscience tr11-176B-ml) and
    # GPT-NeoX-20B with rotary embeddings on GPT-NeoX (DeepSpeed): the positions are the model
    # code's, which DeepSpeed wraps (deepspeed.initialize(model=...)); the 2021 profile refused both
    model = catalog.resolve_model(name)
    assert model.position_embedding == kind
    for framework in ("deepspeed-2021", "deepspeed"):
        profile = catalog.resolve_framework(framework)
        assert profile.rules.model_code == "any"
        assert model_problems(profile, model, job(model, framework, dtype="bf16")) == []


def test_megatron_still_refuses_what_its_own_model_code_lacks():
    # Megatron-LM is its own model code: --position-embedding-type learned_absolute | rope
    mpt = catalog.resolve_model("mpt-7b")
    problems = model_problems(catalog.resolve_framework(), mpt, job(mpt))
    assert problems and "Megatron-Core has no alibi position embedding" in problems[0]


def test_a_profile_of_foreign_model_code_cannot_refuse_a_model_feature(tmp_path):
    # the kind, caught when a profile is loaded: model_code any and a narrowed list
    for field, narrowed in (("position_embedding", ["learned"]), ("attention", ["mha"]),
                            ("activation", ["gelu"]), ("norm", ["layernorm"])):
        path = tmp_path / f"{field}.yaml"
        path.write_text(textwrap.dedent(f"""\
            name: my-ds-{field.replace('_', '-')}
            extends: deepspeed
            display: My DeepSpeed
            rules:
              {field}: {yaml.safe_dump(narrowed, default_flow_style=True).strip()}
              sources: {{{field}: our model code}}
            """))
        with pytest.raises(UsageError, match=f"{field}: this framework runs the model code it is "
                                             "given .model_code: any., so it cannot refuse"):
            catalog.resolve_framework(str(path))
    # the same list is a fact where the framework is the model code
    ok = tmp_path / "own.yaml"
    ok.write_text("name: my-mcore\nextends: megatron-core\ndisplay: Mine\nrules:\n"
                  "  attention: [mha]\n  sources: {attention: our fork builds MHA only}\n")
    assert catalog.resolve_framework(str(ok)).rules.attention == ["mha"]


def test_every_shipped_profile_says_whose_model_code_it_runs():
    expected = {"megatron-core": "framework", "megatron-lm-2021": "framework",
                "megatron-lm-2022": "framework", "llm-foundry": "framework",
                "deepspeed": "any", "deepspeed-2021": "any", "torchtitan": "any"}
    profiles = catalog.framework_profiles()
    assert {n: p.rules.model_code for n, p in profiles.items()} == expected


# ----------------------------------------------------------------------------- MTP under torchtitan

MTP_RULE = "torchtitan: multi-token prediction (MTP) layers need pp = 1 and cp = 1"


def _broken(framework: str, model, **layout) -> list[str]:
    from planner.layout import Layout
    from planner.search.framework_rules import broken_rules
    tr = TrainingSpec(seq_length=4096, global_batch_size=15360, framework=framework)
    return broken_rules(catalog.resolve_framework(framework), model, tr, Layout(**layout))


def test_torchtitan_refuses_mtp_with_pipeline_or_context_parallelism():
    # torchtitan @b5bcd76c66d0 models/deepseek_v3/mtp.py L197-206: MTPDecoder raises
    # NotImplementedError for pipeline_parallel_degree > 1 and context_parallel_degree > 1
    v3 = catalog.resolve_model("deepseek-v3")
    assert v3.mtp_layers == 1
    base = dict(tp=2, dp=2, ep=16, etp=1, zero_stage=3, micro_batch_size=1, sequence_parallel=True)
    assert MTP_RULE in _broken("torchtitan", v3, pp=16, cp=4, **base)
    assert MTP_RULE in _broken("torchtitan", v3, pp=1, cp=4, **{**base, "dp": 32})
    assert MTP_RULE in _broken("torchtitan", v3, pp=16, cp=1, **{**base, "dp": 8})
    assert MTP_RULE not in _broken("torchtitan", v3, pp=1, cp=1, **{**base, "dp": 128})
    # without its MTP layer (torchtitan's own deepseek_v3_671b config: num_mtp_layers 0) the
    # rule does not apply; Megatron-Core puts MTP on the last stage and has no such rule
    plain = v3.model_copy(update={"mtp_layers": 0})
    assert MTP_RULE not in _broken("torchtitan", plain, pp=16, cp=4, **base)
    assert not any("MTP" in r for r in _broken("megatron-core", v3, pp=16, cp=4, **base))


def test_torchtitan_search_of_deepseek_v3_keeps_mtp_on_one_stage():
    from tests.test_framework_profiles import cli
    code, out, err = cli("search", "--model", "deepseek-v3", "--gpus", "256", "--framework",
                         "torchtitan", "--json", "--top", "3")
    assert code == 0, err
    import json
    rows = json.loads(out)
    assert rows and all(r["layout"]["pp"] == 1 and r["layout"]["cp"] == 1 for r in rows)
    code, _, err = cli("search", "--model", "deepseek-v3", "--gpus", "256", "--framework",
                       "torchtitan", "--pp", "16")
    assert code != 0 and MTP_RULE in err and "Traceback" not in err


# ----------------------------------------------------------------------------- DeepSpeed MoE at ZeRO-3

ZERO3_MOE_RULE = "DeepSpeed: MoE layers with ZeRO-3 need tp = 1 and etp = 1"


@pytest.mark.parametrize("zero, etp, refused", [(3, 1, False), (3, 2, True), (2, 2, False),
                                                (1, 1, False)])
def test_deepspeed_runs_moe_at_zero_3_through_autoep(zero, etp, refused):
    # DeepSpeed @edaa72212672 runtime/engine.py L1872-1915: ZeRO-3 with MoE runs AutoEP layers
    # (native deepspeed.moe.layer.MoE refused) and refuses expert_tensor_parallel_size != 1 and
    # AutoTP; the profile used to refuse every ZeRO-3 MoE plan ("MoE not supported with Stage 3")
    qwen = catalog.resolve_model("qwen3-30b-a3b")
    profile = catalog.resolve_framework("deepspeed")
    assert profile.rules.max_zero_stage_with_moe == 3 and not profile.rules.moe_zero3_model_parallel
    from planner.layout import Layout
    from planner.search.framework_rules import broken_rules
    tr = TrainingSpec(seq_length=4096, global_batch_size=64, framework="deepspeed")
    lay = Layout(tp=1, pp=1, dp=16, ep=8, etp=etp, zero_stage=zero, micro_batch_size=1)
    broken = broken_rules(profile, qwen, tr, lay)
    assert (ZERO3_MOE_RULE in broken) is refused
    assert not any("ZeRO stage 2 or lower" in b for b in broken)
