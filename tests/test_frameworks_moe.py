"""Exports of mixture-of-experts, MLA, MTP, sliding-window and biased models, and of every model
field a target has an option for.

Megatron-LM: every flag is in the parser's option list and the arguments pass Megatron-LM's own
validation (tests/megatron_rules.py ports the rules from NVIDIA/Megatron-LM @ d98e8a64, each with
its file and line). Plans are built directly (specs.Plan): the per-GPU cost model does not cost
MoE/MLA/MTP, the exports do not need it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner import __version__, catalog
from planner.cost.model_counts import moe_layer_mask, window_layer_mask
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.frameworks.common import ARCHITECTURE_FIELDS
from planner.frameworks.megatron_model import layer_pattern
from planner.hf_config import from_hf_dict
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from tests import megatron_rules as rules
from tests.test_frameworks import BRIDGE, MEGATRON, TITAN_02, TITAN_03, flatten, titan_overrides

HF = Path(__file__).parent / "data" / "hf"


def plan_of(model, gpus: int, seq: int = 4096, gbs: int | None = None, **layout) -> Plan:
    m = catalog.resolve_model(model) if isinstance(model, str) else model
    tr = TrainingSpec(seq_length=seq, global_batch_size=gbs or m.training.global_batch_size)
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware("dgx-h100"),
                gpus=gpus, training=tr, layout=Layout(**layout))


# DeepSeek-V3 on 1,024 GPUs as in Megatron-Bridge's H100 table (moe.md 7: TP2, EP64), with an
# uneven split of its 61 layers over pp 8 (7 + 6*8 + 6): stage = tp*dp = 2*64 = 128 GPUs,
# ep*etp = 64 divides it (edp 2); 256 experts % 64 = 0; SP on (tp 2).
DSV3 = dict(tp=2, pp=8, dp=64, ep=64, etp=1, zero_stage=1, micro_batch_size=1,
            sequence_parallel=True, first_stage_layers=7, last_stage_layers=6)


DSV3_PP1 = {**DSV3, "pp": 1, "first_stage_layers": 0, "last_stage_layers": 0}  # 128 GPUs


def test_deepseek_v3_passes_megatron_validation():
    plan = plan_of("deepseek-v3", 1024, **DSV3)
    exp = export_plan(plan, "megatron")
    args = rules.parse(exp.text)
    assert {"--" + k.replace("_", "-") for k in args} <= MEGATRON
    assert set(exp.keys) == {"--" + k.replace("_", "-") for k in args}
    rules.validate(args, world=1024)
    assert (args["num_experts"], args["moe_router_topk"], args["moe_ffn_hidden_size"]) == \
        ("256", "8", "2048")
    assert args["moe_shared_expert_intermediate_size"] == "2048"  # 1 shared expert of 2048
    assert (args["expert_model_parallel_size"], args["expert_tensor_parallel_size"]) == ("64", "1")
    assert args["moe_grouped_gemm"] is True and args["moe_token_dispatcher_type"] == "alltoall"
    # layer pattern: 3 dense then 58 MoE, Megatron's reading equals plan3d's
    assert args["moe_layer_freq"] == [0] * 3 + [1] * 58
    assert rules.moe_layers(args, 61) == list(moe_layer_mask(plan.model))
    # MLA: q 1536, kv 512, qk 128 + rope 64, v 128; latent norms; plain RoPE without fusion
    assert (args["q_lora_rank"], args["kv_lora_rank"], args["qk_head_dim"],
            args["qk_pos_emb_head_dim"], args["v_head_dim"]) == ("1536", "512", "128", "64", "128")
    assert args["multi_latent_attention"] and args["qk_layernorm"] and args["no_rope_fusion"]
    assert "group_query_attention" not in args
    assert args["mtp_num_layers"] == "1" and args["norm_epsilon"] == "1e-06"
    assert "'[0]*3+[1]*58'" in exp.text  # quoted for the shell: [ ] * are glob characters


@pytest.mark.parametrize("change, rule", [
    ({"num_experts": "96"}, "arguments.py L1657"),                       # 96 % 64 != 0
    ({"sequence_parallel": None}, "moe_layer.py L636-640"),                # tp 2 without SP
    ({"disable_bias_linear": None, "expert_tensor_parallel_size": "2"}, "L2612-2615"),
    ({"moe_router_topk": "1"}, "L2661-2669"),                              # top-1, softmax
    ({"moe_layer_freq": [0] * 3 + [1] * 57}, "gpt_layer_specs.py L652"),   # 60 entries for 61
    ({"no_rope_fusion": None}, "L3345-3346"),                              # MLA + fusion + rope
    ({"group_query_attention": True}, "arguments.py L1974"),
])
def test_the_ported_rules_find_errors(change, rule):
    args = rules.parse(export_plan(plan_of("deepseek-v3", 1024, **DSV3), "megatron").text)
    for k, v in change.items():
        if v is None:
            args.pop(k)
        else:
            args[k] = v
    with pytest.raises(rules.MegatronRejects, match=rule.replace(".", r"\.")):
        rules.validate(args, world=1024)


def test_megatron_refuses_what_megatron_refuses():
    with pytest.raises(UsageError, match="num_experts % expert-model-parallel-size"):
        export_plan(plan_of("deepseek-v3", 768, **{**DSV3, "dp": 48, "ep": 48}), "megatron")
    with pytest.raises(UsageError, match="without sequence parallelism"):
        export_plan(plan_of("deepseek-v3", 1024, **{**DSV3, "sequence_parallel": False}), "megatron")
    # GPT-OSS has biases in its experts: Megatron-Core needs etp 1
    with pytest.raises(UsageError, match="biases in MoE layers only with expert tensor parallel 1"):
        export_plan(plan_of("gpt-oss-120b", 64, tp=2, pp=4, dp=8, ep=4, etp=2, zero_stage=1,
                            micro_batch_size=1, sequence_parallel=True), "megatron")


def test_gpt_oss_window_sinks_biases():
    plan = plan_of("gpt-oss-120b", 64, tp=2, pp=4, dp=8, ep=8, etp=1, zero_stage=1,
                   micro_batch_size=1, sequence_parallel=True)
    args = rules.parse(export_plan(plan, "megatron").text)
    rules.validate(args, world=64)
    # window 128 keys incl. itself -> Megatron (127, 0); skip freq 2: layers 0, 2, ... windowed
    assert args["window_size"] == (127, 0) and args["window_attn_skip_freq"] == 2
    assert rules.window_layers(args, 36) == list(window_layer_mask(plan.model))
    assert args["softmax_type"] == "learnable" and "disable_bias_linear" not in args
    assert (args["num_query_groups"], args["kv_channels"]) == ("8", "64")  # 64 heads of 64, 8 KV
    assert args["moe_layer_freq"] == "1" or args["moe_layer_freq"] == 1


def test_layer_patterns_megatron_cannot_say_with_an_integer():
    # Llama 4 Maverick: MoE on layers 1, 3, 5, ... (HF moe_layers = range(step-1, L, step));
    # Megatron's integer 2 would mean layers 0, 2, 4, ... (i % 2 == 0), so a list is written
    plan = plan_of("llama4-maverick", 64, tp=2, pp=2, dp=16, ep=16, etp=1, zero_stage=1,
                   micro_batch_size=1, sequence_parallel=True)
    exp = export_plan(plan, "megatron")
    args = rules.parse(exp.text)
    rules.validate(args, world=64)
    assert rules.moe_layers(args, 48) == list(moe_layer_mask(plan.model)) == [i % 2 == 1 for i in range(48)]
    assert args["moe_layer_freq"] == [0, 1] * 24
    assert args["moe_router_pre_softmax"] is True  # top-1 with the softmax default
    # an odd / listed window pattern is a 0/1 list with 1 = windowed layer
    assert layer_pattern([False, True, True, False]) == "[0]+[1]*2+[0]"
    assert rules.eval_pattern(layer_pattern(np.arange(7) % 3 == 0)) == [1, 0, 0, 1, 0, 0, 1]


def test_qwen2_qkv_bias_and_norm_epsilon_reach_every_target():
    qwen2 = from_hf_dict(json.loads((HF / "qwen2-7b.json").read_text()), "qwen2", "qwen2-7b")
    assert qwen2.qkv_bias and qwen2.norm_epsilon == 1e-6
    plan = plan_of(qwen2, 8, seq=4096, gbs=64, tp=2, pp=1, dp=4, zero_stage=1, micro_batch_size=1,
                   sequence_parallel=True)
    args = rules.parse(export_plan(plan, "megatron").text)
    rules.validate(args, world=8)
    assert args["add_qkv_bias"] is True and "disable_bias_linear" in args  # o and MLP: none
    assert args["norm_epsilon"] == "1e-06" and args["rotary_base"] == "1000000"
    fields = flatten(yaml.safe_load(export_plan(plan, "nemo").text))
    assert fields["model.add_qkv_bias"] is True and fields["model.add_bias_linear"] is False
    assert fields["model.layernorm_epsilon"] == 1e-6 and fields["model.num_query_groups"] == 4
    fsdp = plan_of(qwen2, 8, seq=4096, gbs=64, tp=2, pp=1, dp=4, zero_stage=3,
                   micro_batch_size=1, sequence_parallel=True)  # torchtitan has no ZeRO-1
    titan = export_plan(fsdp, "torchtitan").text
    assert "qkv_bias=True" in titan and "norm_epsilon=1e-06" in titan  # named, not dropped


def test_nemo_moe_and_mla_fields():
    exp = export_plan(plan_of("deepseek-v3", 128, **DSV3_PP1), "nemo")
    fields = flatten(yaml.safe_load(exp.text))
    assert set(fields) <= BRIDGE, set(fields) - BRIDGE
    assert fields["model.num_moe_experts"] == 256 and fields["model.moe_router_topk"] == 8
    assert fields["model.moe_layer_freq"] == [0] * 3 + [1] * 58
    assert fields["model.moe_shared_expert_intermediate_size"] == 2048
    assert (fields["model.expert_model_parallel_size"], fields["model.expert_tensor_parallel_size"]) \
        == (64, 1)
    assert fields["model.multi_latent_attention"] and fields["model.q_lora_rank"] == 1536
    assert fields["model.mtp_num_layers"] == 1 and fields["model.apply_rope_fusion"] is False
    assert "model.moe_layer_freq=[0,0,0,1," in exp.text  # the Hydra override form
    gpt_oss = flatten(yaml.safe_load(export_plan(plan_of(
        "gpt-oss-20b", 16, tp=1, pp=1, dp=16, ep=8, zero_stage=1, micro_batch_size=1), "nemo").text))
    assert gpt_oss["model.window_size"] == [127, 0] and gpt_oss["model.window_attn_skip_freq"] == 2
    assert gpt_oss["model.softmax_type"] == "learnable" and gpt_oss["model.add_bias_linear"] is True


def test_torchtitan_expert_parallel_and_refusals():
    plan = plan_of("qwen3-30b-a3b", 16, gbs=64, tp=2, pp=1, dp=8, ep=8, etp=1, zero_stage=3,
                   micro_batch_size=1, sequence_parallel=True)
    o = titan_overrides(export_plan(plan, "torchtitan").text)
    assert set(o) <= TITAN_03 and o["parallelism.expert_parallel_degree"] == "8"
    # the torchtitan profile's rules (0.3): no expert TP; EP from FSDP x CP x TP
    with pytest.raises(UsageError, match="torchtitan has no expert tensor parallelism"):
        export_plan(plan_of("qwen3-30b-a3b", 16, gbs=64, tp=2, pp=1, dp=8, ep=4, etp=2,
                            zero_stage=3, micro_batch_size=1, sequence_parallel=True), "torchtitan")
    # 0.2.2 TOML: etp = 1 or tp (parallel_dims.py L58-59), experts over dp_shard x cp x tp /
    # (etp x ep) = 8 x 1 x 2 / 8 = 2 ranks; expert_tensor_parallel_degree (default 1) written
    toml = export_plan(plan, "torchtitan", "toml")
    assert "expert_parallel_degree = 8" in toml.text and "expert_tensor_parallel_degree = 1" in toml.text
    assert set(toml.keys) <= TITAN_02
    # tp = 1: EP from FSDP x CP: (16 x 1) % 8 == 0
    toml = export_plan(plan_of("qwen3-30b-a3b", 16, gbs=64, tp=1, pp=1, dp=16, ep=8, etp=1,
                               zero_stage=3, micro_batch_size=1), "torchtitan", "toml")
    assert "expert_parallel_degree = 8" in toml.text and set(toml.keys) <= TITAN_02
    # ZeRO-0 is DDP replicas (dp_replicate): EP can only take TP x CP ranks, 2 here
    with pytest.raises(UsageError, match="DDP replicas hold no experts"):
        export_plan(plan_of("qwen3-30b-a3b", 16, gbs=64, tp=2, pp=1, dp=8, ep=8, zero_stage=0,
                            micro_batch_size=1, sequence_parallel=True), "torchtitan")


def test_deepspeed_moe_is_autoep_in_the_config_or_the_layer_arguments():
    # DeepSpeed @edaa72212672 reads MoE from ds_config's expert_parallel (AutoEP; runtime/
    # config.py EXPERT_PARALLEL, module_inject/auto_ep_config.py parse_autoep_config) at tp =
    # etp = 1, the only MoE path at ZeRO-3 (runtime/engine.py L1872-1915)
    for zero in (1, 3):
        exp = export_plan(plan_of("mixtral-8x7b", 8, gbs=64, tp=1, pp=1, dp=8, ep=8, zero_stage=zero,
                                  micro_batch_size=1), "deepspeed")
        cfg = json.loads(exp.text)
        assert cfg["expert_parallel"] == {"enabled": True, "autoep_size": 8}
        assert cfg["zero_optimization"]["stage"] == zero
        note = next(n for n in exp.notes if n.startswith("experts:"))
        assert "preset_model" in note
        # the optimizer's MoE parameter groups (zero/stage_1_and_2.py L779-780 asserts them)
        assert "split_params_into_different_moe_groups_for_optimizer" in note
    # expert TP is the model code's deepspeed.moe.layer.MoE (AutoEP refuses it): its arguments
    exp = export_plan(plan_of("mixtral-8x7b", 16, gbs=64, tp=1, pp=1, dp=16, ep=8, etp=2,
                              zero_stage=1, micro_batch_size=1), "deepspeed")
    assert "expert_parallel" not in json.loads(exp.text)
    note = next(n for n in exp.notes if n.startswith("experts:"))
    assert "num_experts=8, k=2, ep_size=8, enable_expert_tensor_parallelism=True" in note
    assert "drop_tokens=False" in note and "split_params_into_different_moe_groups" in note
    # its expert groups are carved from the data-parallel ranks: ep must divide dp
    with pytest.raises(UsageError, match="ep divides the data-parallel size"):
        export_plan(plan_of("mixtral-8x7b", 8, gbs=64, tp=2, pp=1, dp=4, ep=8, etp=1,
                            zero_stage=1, micro_batch_size=1), "deepspeed")


# ModelSpec field -> the option (or field) each target sets it with; None = the target has no
# option for it, so the output must name the field. A field added to ModelSpec without an entry
# here fails test_every_model_field_is_written_or_named.
MEGATRON_OPTIONS = {
    "num_layers": "--num-layers", "hidden_size": "--hidden-size",
    "num_attention_heads": "--num-attention-heads", "num_kv_heads": "--num-query-groups",
    "head_dim": "--kv-channels", "ffn_hidden_size": "--ffn-hidden-size", "vocab_size": None,
    "activation": "--swiglu", "tie_embeddings": "--untie-embeddings-and-output-weights",
    "norm": "--normalization", "bias": "--disable-bias-linear",
    "position_embedding": "--position-embedding-type",
    "max_position_embeddings": "--max-position-embeddings", "rope_theta": "--rotary-base",
    "rotary_percent": "--rotary-percent", "dropout": "--hidden-dropout",
    "attention_type": "--multi-latent-attention", "mla": "--kv-lora-rank", "moe": "--num-experts",
    "mtp_layers": "--mtp-num-layers", "sliding_window": "--window-size",
    "window_layers": "--window-attn-skip-freq", "qk_norm": "--qk-layernorm",
    "attention_sinks": "--softmax-type", "qkv_bias": "--add-qkv-bias",
    "norm_epsilon": "--norm-epsilon", "swiglu_limit": None,
}
BRIDGE_FIELDS = {
    "num_layers": "model.num_layers", "hidden_size": "model.hidden_size",
    "num_attention_heads": "model.num_attention_heads", "num_kv_heads": "model.num_query_groups",
    "head_dim": "model.kv_channels", "ffn_hidden_size": "model.ffn_hidden_size",
    "vocab_size": "model.vocab_size", "activation": "model.gated_linear_unit",
    "tie_embeddings": "model.share_embeddings_and_output_weights", "norm": "model.normalization",
    "bias": "model.add_bias_linear", "position_embedding": "model.position_embedding_type",
    "max_position_embeddings": None, "rope_theta": "model.rotary_base",
    "rotary_percent": "model.rotary_percent", "dropout": "model.hidden_dropout",
    "attention_type": "model.multi_latent_attention", "mla": "model.kv_lora_rank",
    "moe": "model.num_moe_experts", "mtp_layers": "model.mtp_num_layers",
    "sliding_window": "model.window_size", "window_layers": "model.window_attn_skip_freq",
    "qk_norm": "model.qk_layernorm", "attention_sinks": "model.softmax_type",
    "qkv_bias": "model.add_qkv_bias", "norm_epsilon": "model.layernorm_epsilon", "swiglu_limit": None,
}
# models that between them set every architecture field away from its default
WALK = [("deepseek-v3", DSV3_PP1, 128), ("gpt-oss-120b", dict(tp=2, pp=4, dp=8, ep=8, zero_stage=1,
        micro_batch_size=1, sequence_parallel=True), 64),
        ("qwen3-30b-a3b", dict(tp=2, pp=1, dp=8, ep=8, zero_stage=1, micro_batch_size=1,
                               sequence_parallel=True), 16),
        ("gpt-neox-20b", dict(tp=2, pp=1, dp=4, zero_stage=1, micro_batch_size=1), 8),
        ("gpt3-175b", dict(tp=8, pp=8, dp=1, zero_stage=1, micro_batch_size=1), 64),
        ("olmoe-1b-7b", dict(tp=1, pp=1, dp=8, ep=8, zero_stage=1, micro_batch_size=1), 8)]


def test_option_maps_cover_modelspec_and_name_real_options():
    assert set(MEGATRON_OPTIONS) == set(BRIDGE_FIELDS) == set(ARCHITECTURE_FIELDS)
    assert {o for o in MEGATRON_OPTIONS.values() if o} <= MEGATRON
    assert {o for o in BRIDGE_FIELDS.values() if o} <= BRIDGE


@pytest.mark.parametrize("name, layout, gpus", WALK)
def test_every_model_field_is_written_or_named(name, layout, gpus):
    plan = plan_of(name, gpus, gbs=gpus * 8, **layout)
    model = plan.model
    spec = type(model).model_fields
    set_fields = [f for f in ARCHITECTURE_FIELDS
                  if spec[f].is_required() or getattr(model, f) != spec[f].default]
    # torchtitan and DeepSpeed run ZeRO-3 without PP (their rules): the same model as FSDP
    fsdp = plan_of(name, gpus, gbs=gpus * 8, **{**layout, "zero_stage": 3, "pp": 1,
                                               "dp": layout["dp"] * layout["pp"]})
    # DeepSpeed: no SP, and ZeRO-2 for MoE models (ZeRO-3 MoE runs AutoEP at tp = etp = 1 only)
    no_sp = plan_of(name, gpus, gbs=gpus * 8, **{**layout, "zero_stage": 2 if model.moe else 3, "pp": 1,
                                                "dp": layout["dp"] * layout["pp"],
                                                "sequence_parallel": False})
    for target, options, p in (("megatron", MEGATRON_OPTIONS, plan), ("nemo", BRIDGE_FIELDS, plan),
                               ("torchtitan", {}, fsdp), ("deepspeed", {}, no_sp)):
        exp = export_plan(p, target)  # a UsageError fails the test: every target must export
        written = set(exp.keys)
        text = exp.text + "\n".join(exp.notes)
        for f in set_fields:
            option = options.get(f)
            expressed = option is not None and option in written
            if f == "qk_norm" and model.qk_norm == "full":
                expressed = False  # Megatron/Bridge --qk-layernorm is per head: must be named
            if f == "bias" and target == "megatron":
                expressed = True  # bias true is Megatron's default (no --disable-bias-linear)
            if f == "tie_embeddings" and target == "megatron" and model.tie_embeddings:
                expressed = True  # tied is Megatron's default
            if f == "activation" and target == "megatron" and model.activation == "gelu":
                expressed = True  # gelu is Megatron's default
            if f == "head_dim" and target == "megatron":
                expressed = "--kv-channels" in written or "--multi-latent-attention" in written
            assert expressed or f in text, f"{target}: {name}.{f} neither written nor named"


def test_qwen2_qkv_bias_in_the_per_gpu_parameters():
    # Qwen2-7B: h 3584, 28 heads of d 128, 4 KV heads; Q, K, V biases (n + 2g)*d = (28 + 8) x 128
    # = 4,608 per layer. At tp 2 they are column-parallel: 4,608 / 2 = 2,304 per GPU, on top
    # of the weights' 2*h*d*(n + g)/t = 2 x 3584 x 128 x 32 / 2 = 14,680,064.
    from planner.cost import blocks
    from planner.layout import Candidates
    from planner.layout import Layout
    qwen2 = from_hf_dict(json.loads((HF / "qwen2-7b.json").read_text()), "qwen2", "qwen2-7b")
    c = Candidates.from_layouts([Layout(tp=2, pp=1, dp=4, zero_stage=1, micro_batch_size=1)])
    sharded, _, _ = blocks.block_params(qwen2, c)[blocks.ATTENTION]
    assert float(np.ravel(sharded)[0]) == 14_680_064 + 2_304
    plain = qwen2.model_copy(update={"qkv_bias": False})
    assert float(np.ravel(blocks.block_params(plain, c)[blocks.ATTENTION][0])[0]) == 14_680_064


@pytest.mark.parametrize("name, layout, gpus, dense", [
    ("qwen3-30b-a3b", dict(tp=2, pp=1, dp=8, ep=8, zero_stage=1, micro_batch_size=1, sequence_parallel=True), 16, None),
    ("deepseek-v3", DSV3_PP1, 128, 18432)])  # DeepSeek-V3's 3 dense layers: intermediate_size 18432
def test_the_dense_mlp_width_is_written_only_where_a_dense_layer_uses_it(name, layout, gpus, dense):
    # Qwen3-30B-A3B is MoE in every layer: its config's intermediate_size 6144 (and a 4h
    # fallback for models without one) was written as --ffn-hidden-size, a width nothing uses
    plan = plan_of(name, gpus, gbs=gpus * 8, **layout)
    meg, nemo = export_plan(plan, "megatron"), export_plan(plan, "nemo")
    if dense is None:
        assert "--ffn-hidden-size" not in meg.keys and "--ffn-hidden-size not set" in meg.text
        assert "ffn_hidden_size:" not in nemo.text.replace("moe_ffn_hidden_size:", "")
        assert "ffn_hidden_size not set (the model's ffn_hidden_size 6144)" in nemo.text
    else:
        assert f"--ffn-hidden-size {dense}" in meg.text and f"ffn_hidden_size: {dense}" in nemo.text
