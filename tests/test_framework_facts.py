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
                "deepspeed": "any", "deepspeed-2021": "any", "torchtitan": "any",
                "torchtitan-2024": "any"}
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


# ----------------------------------------------------------------------------- job settings

AWARE_RULE = ("Megatron-Core: optimizer CPU offload and 16-bit optimizer moments (the "
              "precision-aware optimizer) need the distributed optimizer (ZeRO >= 1)")


def _plan(training: dict, model: str = "llama3-8b", gpus: int = 8, **layout):
    from planner import __version__
    from planner.frameworks.profile import resolve_training
    from planner.layout import Layout
    from planner.plan import Plan
    m, fw = catalog.resolve_model(model), catalog.resolve_framework(training.pop("framework", "megatron-core"))
    tr = resolve_training({"seq_length": 4096, "global_batch_size": 64}, fw).model_copy(update=training)
    lay = dict(tp=1, pp=1, dp=gpus, zero_stage=1, micro_batch_size=1, recompute="full")
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware("dgx-h100"),
                gpus=gpus, training=tr, layout=Layout(**{**lay, **layout}), framework=fw)


def _write(tmp_path, plan) -> str:
    from planner.export import plan_to_yaml
    path = tmp_path / "plan.yaml"
    path.write_text(plan_to_yaml(plan))
    return str(path)


def test_optimizer_offload_gathers_16_bit_parameters_in_fp8(tmp_path):
    # Megatron-LM @d98e8a64 arguments.py L1888-1891 refuses --optimizer-cpu-offload with
    # --fp8-param-gather unless --fp8-recipe delayed, which plan3d's fp8 (tensorwise) and mxfp8
    # are not: a job that offloads its optimizer gathers 16-bit parameters (the MoE report's
    # GB200 MXFP8 DeepSeek-V3 run did, Yan et al. 2026 App. B.2). So it is priced and exported
    # without --fp8-param-gather (the Megatron-LM parser's rule accepts it), its weights keep the
    # 16-bit parameter beside the FP8 copies; the Bridge preset, a name that gathers FP8
    # parameters, is refused in one line
    from planner.cost.precision import fp8_param_gather, weight_bytes
    from planner.frameworks import export_plan
    from tests import megatron_rules as rules
    from tests.test_framework_profiles import cli
    offload = _plan({"precision": "fp8", "optimizer_offload_fraction": 0.5})
    plain = _plan({"precision": "fp8"})
    assert not fp8_param_gather(offload.training) and fp8_param_gather(plain.training)
    hw = offload.hardware  # H100: FP8 copies 1 + its transpose 1 = 2 bytes; + the 16-bit 2
    assert (weight_bytes(hw, offload.training, 1), weight_bytes(hw, plain.training, 1)) == (4.0, 2.0)
    path = _write(tmp_path, offload)
    code, _, err = cli("estimate", "--plan", path)
    assert code == 0, err
    args = rules.parse(export_plan(offload, "megatron").text)
    assert args["optimizer_cpu_offload"] is True and "fp8_param_gather" not in args
    rules.validate(args, world=8)
    code, _, err = cli("export", path, "--to", "nemo")
    assert code == 2 and "fp8_param_gather=False" in err and len(err.strip().splitlines()) == 1
    assert "fp8_param_gather" in rules.parse(export_plan(plain, "megatron").text)


def test_the_precision_aware_optimizer_needs_the_distributed_optimizer():
    # megatron/core/optimizer/__init__.py L1057-1060: "--use-precision-aware-optimizer only
    # supported with distributed optimizer"; offload (arguments.py L1885) and bf16 moments
    # (optimizer_config.py L476-477) need it: ZeRO-0 without the distributed optimizer is refused
    from planner.search.framework_rules import broken_rules
    for training in ({"optimizer_offload_fraction": 1.0}, {"optimizer_moment_bytes": 2}):
        plan = _plan(dict(training), zero_stage=0)
        assert AWARE_RULE in broken_rules(plan.framework, plan.model, plan.training, plan.layout)
        plan = _plan(dict(training), zero_stage=0, distributed_optimizer=True)
        assert AWARE_RULE not in broken_rules(plan.framework, plan.model, plan.training, plan.layout)


def test_the_export_only_refusals_are_rules_too(tmp_path):
    # the other job settings the Megatron-LM export alone refused (megatron_model.py), now rules
    # every consumer runs: EP overlap with the allgather dispatcher (transformer_config.py
    # L3016-3019) and fine-grained beside whole-layer activation offload (L2127-2130)
    from tests.test_framework_profiles import cli
    moe = dict(model="qwen3-30b-a3b", gpus=8, ep=8)
    cases = [({}, {"moe_a2a_overlap": True, "moe_dispatcher": "allgather", "recompute": "none"},
              "EP overlap needs ep > 1, vpp > 1 with pp > 1, no full recompute, the alltoall or a "
              "fused dispatcher"),
             ({"moe_activation_offload": True}, {"offload_layers": 2, "recompute": "none"},
              "fine-grained MoE activation offload excludes whole-layer offloading"),
             ({"moe_activation_offload": True, "framework": "torchtitan"}, {"zero_stage": 3},
              "torchtitan has no Megatron-Core fine-grained MoE activation offload")]
    for training, layout, rule in cases:
        code, _, err = cli("estimate", "--plan", _write(tmp_path, _plan(training, **moe, **layout)))
        assert code != 0 and rule in err and "Traceback" not in err, err
