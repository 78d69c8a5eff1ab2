"""Exports to Megatron-LM, Megatron-Bridge (NeMo), DeepSpeed and torchtitan.

Every emitted option name is checked against the target's real option list kept in tests/data
(each file names its source repository, commit and path). Values are hand-computed below.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner import __version__, catalog
from planner.cli import app
from planner.errors import UsageError
from planner.export import read_plan
from planner.frameworks import export_plan
from planner.frameworks.megatron import megatron_args
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec

DATA = Path(__file__).parent / "data"


def option_list(name: str) -> set[str]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


MEGATRON = option_list("megatron_options.txt")
BRIDGE = option_list("megatron_bridge_fields.txt")
DEEPSPEED = option_list("deepspeed_keys.txt")
TITAN_03 = option_list("torchtitan_0.3_options.txt")
TITAN_02 = option_list("torchtitan_0.2_toml_options.txt")


def make(model, gpus: int, seq: int | None = None, gbs: int | None = None, dtype="bf16",
         grad_bytes=4, flash=True, **layout) -> Plan:
    m = catalog.resolve_model(model) if isinstance(model, str) else model
    tr = TrainingSpec(seq_length=seq or m.training.seq_length,
                      global_batch_size=gbs or m.training.global_batch_size, dtype=dtype,
                      grad_bytes=grad_bytes, flash_attention=flash)
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware("dgx-h100"),
                gpus=gpus, training=tr, layout=Layout(**layout))


def megatron_flags(text: str) -> dict[str, str | None]:
    """Parse the exported argument list: {flag: value or None} from the non-comment lines."""
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        parts = line.rstrip(" \\").split()
        out[parts[0]] = parts[1] if len(parts) > 1 else None
    return out


def unwrapped(text: str) -> str:
    """An export's text with its comments unwrapped: a comment line that continues the one above
    (exports wrap comments at 80 columns, continuation lines indented: '#   ...') joined to it."""
    return re.sub(r"\n#   +", " ", text)


def titan_overrides(text: str) -> dict[str, str]:
    """{section.field: value} of torchtitan 0.3.0 overrides; the activation-checkpoint
    subcommand token (activation-checkpoint:full) is a key with the value ""."""
    out = {}
    for line in text.splitlines():
        if line.startswith("activation-checkpoint:"):
            out[line.rstrip(" \\")] = ""
        elif line.startswith("--"):
            parts = line.rstrip(" \\").split()
            section, field = parts[0][2:].split(".", 1)
            if len(parts) == 1:  # boolean flag: --s.field or --s.no_field
                value = "false" if field.startswith("no_") else "true"
                field = field.removeprefix("no_")
            else:
                value = parts[1]
            out[f"{section}.{field}"] = value
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


# GPT-3 175B on 512 GPUs, tp=8 pp=8 dp=8, vpp=2, full recompute, SP, B=1536, b=1 (Narayanan et
# al. 2021's layout family). m = 1536/(8*1) = 192 micro-batches; layers per chunk 96/(8*2) = 6.
GPT3 = dict(tp=8, pp=8, dp=8, zero_stage=1, micro_batch_size=1, recompute="full",
            sequence_parallel=True, vpp=2)
# The same on DeepSpeed's pipeline engine: no interleaving and no Megatron SP in its rules
GPT3_DS = dict(GPT3, sequence_parallel=False, vpp=1)
# ... and on torchtitan: FSDP (ZeRO-3), untied embeddings (it refuses tied ones with PP)
GPT3_UNTIED = catalog.resolve_model("175b").model_copy(update={"tie_embeddings": False})
GPT3_TT = dict(GPT3, zero_stage=3)


def test_megatron_gpt3_values_and_flag_names():
    exp = export_plan(make("175b", 512, **GPT3), "megatron")
    flags = megatron_flags(exp.text)
    assert set(flags) <= MEGATRON, set(flags) - MEGATRON
    assert set(exp.keys) == set(flags)
    assert flags["--tensor-model-parallel-size"] == "8"
    assert flags["--pipeline-model-parallel-size"] == "8"
    assert flags["--num-layers-per-virtual-pipeline-stage"] == "6"  # 96 / (8*2)
    assert "--sequence-parallel" in flags and "--use-distributed-optimizer" in flags
    assert (flags["--recompute-granularity"], flags["--recompute-method"],
            flags["--recompute-num-layers"]) == ("full", "uniform", "1")
    assert (flags["--micro-batch-size"], flags["--global-batch-size"], flags["--seq-length"]) == \
        ("1", "1536", "2048")
    assert (flags["--num-layers"], flags["--hidden-size"], flags["--ffn-hidden-size"],
            flags["--num-attention-heads"]) == ("96", "12288", "49152", "96")
    assert flags["--position-embedding-type"] == "learned_absolute"
    assert flags["--max-position-embeddings"] == "2048"
    assert flags["--attention-dropout"] == "0.1" and flags["--hidden-dropout"] == "0.1"
    assert "--bf16" in flags and "--overlap-grad-reduce" in flags and "--overlap-param-gather" in flags
    # GPT-3 is MHA with biases and tied embeddings: none of these flags
    for absent in ("--group-query-attention", "--swiglu", "--disable-bias-linear",
                   "--untie-embeddings-and-output-weights", "--kv-channels", "--use-megatron-fsdp"):
        assert absent not in flags
    # padded vocab: ceil(50257 / (128*8)) * 1024 = 50 * 1024 = 51200, the Megatron papers' value
    assert "51200" in exp.text
    # shell-ready: every argument line but the last ends with a continuation
    arg_lines = [ln for ln in exp.text.splitlines() if ln.startswith("--")]
    assert all(ln.endswith(" \\") for ln in arg_lines[:-1]) and not arg_lines[-1].endswith("\\")


def test_megatron_option_list_is_a_real_check():
    # The issue text names --virtual-pipeline-model-parallel-size; Megatron-LM's parser at the
    # recorded commit has no such option (it has --num-layers-per-virtual-pipeline-stage and
    # --num-virtual-stages-per-pipeline-rank), so the list rejects it and we never emit it.
    assert "--virtual-pipeline-model-parallel-size" not in MEGATRON
    assert "--num-layers-per-virtual-pipeline-stage" in MEGATRON
    assert len(MEGATRON) == 878  # 877 long options + -h, as the parser lists them


def test_megatron_llama3_70b_gqa_swiglu_fsdp():
    # Llama 3 70B: 64 heads / 8 KV heads, SwiGLU, RMSNorm, no biases, untied, RoPE.
    plan = make("llama3-70b", 64, tp=8, pp=1, dp=8, zero_stage=3, micro_batch_size=1,
                recompute="selective", sequence_parallel=True)
    flags = megatron_flags(export_plan(plan, "megatron").text)
    assert set(flags) <= MEGATRON, set(flags) - MEGATRON
    assert flags["--num-query-groups"] == "8" and "--group-query-attention" in flags
    assert "--swiglu" in flags and flags["--normalization"] == "RMSNorm"
    assert "--disable-bias-linear" in flags and "--untie-embeddings-and-output-weights" in flags
    assert flags["--position-embedding-type"] == "rope"
    assert flags["--ffn-hidden-size"] == "28672"
    assert flags["--use-megatron-fsdp"] is None
    assert flags["--data-parallel-sharding-strategy"] == "optim_grads_params"
    assert flags["--recompute-granularity"] == "selective" and "--recompute-method" not in flags
    # Megatron-FSDP v1 runs the distributed optimizer (Megatron-LM's examples/megatron_fsdp
    # scripts pass both flags; arguments.py @d98e8a64 L1127-1135 turns it on when missing)
    assert "--use-distributed-optimizer" in flags and "--no-gradient-accumulation-fusion" in flags
    assert "--num-layers-per-virtual-pipeline-stage" not in flags  # vpp = 1


def test_megatron_zero0_fp16_grad_bf16_no_flash():
    plan = make("llama2-7b", 8, dtype="fp16", grad_bytes=2, flash=False, tp=2, pp=1, dp=4,
                zero_stage=0, micro_batch_size=1)
    flags = megatron_flags(export_plan(plan, "megatron").text)
    assert set(flags) <= MEGATRON
    assert "--fp16" in flags and "--bf16" not in flags and "--grad-reduce-in-bf16" in flags
    assert flags["--attention-backend"] == "unfused"
    assert "--use-distributed-optimizer" not in flags and "--overlap-param-gather" not in flags
    assert "--sequence-parallel" not in flags


def test_megatron_refuses_alibi():
    plan = make("bloom-176b", 56, tp=8, pp=7, dp=1, zero_stage=1, micro_batch_size=1)
    with pytest.raises(UsageError, match="Megatron-Core has no alibi position embedding"):
        megatron_args(plan)
    with pytest.raises(UsageError, match="Megatron-Core has no alibi position embedding"):
        export_plan(plan, "nemo")  # Bridge builds Megatron-Core models too


def test_nemo_fields_and_values():
    exp = export_plan(make("175b", 512, **GPT3), "nemo")
    body = yaml.safe_load(exp.text)
    fields = flatten(body)
    assert set(fields) <= BRIDGE, set(fields) - BRIDGE
    assert fields["model.tensor_model_parallel_size"] == 8
    assert fields["model.pipeline_model_parallel_size"] == 8
    assert fields["model.virtual_pipeline_model_parallel_size"] == 2
    assert fields["model.sequence_parallel"] is True
    assert (fields["model.recompute_granularity"], fields["model.recompute_method"],
            fields["model.recompute_num_layers"]) == ("full", "uniform", 1)
    assert (fields["train.micro_batch_size"], fields["train.global_batch_size"]) == (1, 1536)
    assert fields["model.seq_length"] == fields["dataset.seq_length"] == 2048
    assert fields["ddp.use_distributed_optimizer"] is True
    assert fields["optimizer.use_distributed_optimizer"] is True
    assert fields["mixed_precision"] == "bf16_mixed"
    # the Hydra override comment carries the same settings
    assert "model.virtual_pipeline_model_parallel_size=2" in exp.text


def test_nemo_zero2_is_megatron_fsdp_optim_grads():
    plan = make("llama3-8b", 16, tp=2, pp=1, dp=8, zero_stage=2, micro_batch_size=1)
    fields = flatten(yaml.safe_load(export_plan(plan, "nemo").text))
    assert fields["ddp.use_megatron_fsdp"] is True
    assert fields["ddp.data_parallel_sharding_strategy"] == "optim_grads"
    # Megatron-FSDP v1 runs the distributed optimizer (Megatron-Bridge training/config.py
    # @067f987df03b L1081-1085 turns both fields on)
    assert fields["ddp.use_distributed_optimizer"] is True
    assert fields["optimizer.use_distributed_optimizer"] is True
    assert fields["model.virtual_pipeline_model_parallel_size"] is None


def test_deepspeed_batch_identity_and_keys():
    exp = export_plan(make("175b", 512, **GPT3_DS), "deepspeed")
    cfg = json.loads(exp.text)
    assert set(flatten(cfg)) <= DEEPSPEED, set(flatten(cfg)) - DEEPSPEED
    # train_batch_size = micro * accumulation * dp: 1 * 192 * 8 = 1536
    assert cfg["train_batch_size"] == 1536
    assert cfg["train_micro_batch_size_per_gpu"] == 1
    assert cfg["gradient_accumulation_steps"] == 192
    assert cfg["zero_optimization"]["stage"] == 1 and cfg["bf16"] == {"enabled": True}
    notes = " ".join(exp.notes)
    assert "num_stages=8" in notes and "--tensor-model-parallel-size 8" in notes
    assert "recompute=full" in notes  # recompute is not dropped
    assert "grad_accum_dtype" in notes  # fp32 gradients are not DeepSpeed's default (bf16)
    # what DeepSpeed cannot run is refused by its rules, each named
    with pytest.raises(UsageError, match="DeepSpeed has no interleaved pipeline schedule"):
        export_plan(make("175b", 512, **dict(GPT3_DS, vpp=2)), "deepspeed")


def test_deepspeed_refuses_zero2_with_pipeline():
    plan = make("175b", 512, tp=8, pp=8, dp=8, zero_stage=2, micro_batch_size=1)
    with pytest.raises(UsageError, match="DeepSpeed: ZeRO-2 and ZeRO-3 need pp = 1"):
        export_plan(plan, "deepspeed")
    # pp = 1: ZeRO-3 is fine; GAS = 512 / (64 * 2) = 4
    cfg = json.loads(export_plan(make("llama3-8b", 64, gbs=512, tp=1, pp=1, dp=64, zero_stage=3,
                                      micro_batch_size=2), "deepspeed").text)
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["gradient_accumulation_steps"] == 4


def test_torchtitan_overrides_pipeline():
    exp = export_plan(make(GPT3_UNTIED, 512, **GPT3_TT), "torchtitan")
    o = titan_overrides(exp.text)
    assert set(o) <= TITAN_03, set(o) - TITAN_03
    assert o["parallelism.tensor_parallel_degree"] == "8"
    assert o["parallelism.pipeline_parallel_degree"] == "8"
    assert o["parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert o["parallelism.pipeline_parallel_layers_per_stage"] == "6"  # 96/(8*2): 16 stages = 8*2
    assert o["parallelism.pipeline_parallel_first_stage_less_layers"] == "0"
    assert o["parallelism.pipeline_parallel_microbatch_size"] == "1"
    # all 192 micro-batches of a DP rank in one pipeline step: local batch = 1536/8 = 192
    assert o["training.local_batch_size"] == "192" and o["training.global_batch_size"] == "1536"
    assert "activation-checkpoint:full" in o  # 0.3.0: a tyro subcommand, not a field
    assert o["parallelism.data_parallel_shard_degree"] == "8"  # FSDP over dp = 8
    assert o["training.mixed_precision_reduce"] == "float32"  # fp32 gradients
    # ZeRO-1 has no torchtitan mode, nor tied embeddings with PP: its rules refuse the plan
    with pytest.raises(UsageError, match="torchtitan offers ZeRO stages 0, 3"):
        export_plan(make(GPT3_UNTIED, 512, **GPT3), "torchtitan")
    with pytest.raises(UsageError, match="torchtitan: tied embeddings need pp = 1"):
        export_plan(make("175b", 512, **GPT3_TT), "torchtitan")


def test_torchtitan_toml_and_zero_mapping():
    # ZeRO-0 -> DDP (replicate = dp); pp = 1 -> local batch = micro-batch, accumulation B/(dp*b)
    plan = make("llama3-8b", 16, gbs=512, tp=2, pp=1, dp=8, zero_stage=0, micro_batch_size=2,
                sequence_parallel=False, recompute="full")
    exp = export_plan(plan, "torchtitan", "toml")
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    body = "\n".join(ln for ln in exp.text.splitlines() if not ln.startswith("#"))
    cfg = tomllib.loads(body)
    keys = set(flatten(cfg))
    assert keys <= TITAN_02, keys - TITAN_02
    assert cfg["parallelism"]["data_parallel_replicate_degree"] == 8
    assert cfg["parallelism"]["data_parallel_shard_degree"] == 1
    assert cfg["training"]["local_batch_size"] == 2 and cfg["training"]["global_batch_size"] == 512
    assert cfg["activation_checkpoint"] == {"mode": "full"}
    # selective recomputation in torchtitan is per-op SAC (costed as such): 0.2.x defaults
    # selective_ac_option to "2" (every other layer, config_manager.py @9dec370), so "op" is set
    sel = make("llama3-8b", 16, gbs=512, tp=2, pp=1, dp=8, zero_stage=0, micro_batch_size=2,
               recompute="selective")
    sel_cfg = tomllib.loads("\n".join(ln for ln in export_plan(sel, "torchtitan", "toml").text.splitlines()
                                      if not ln.startswith("#")))
    assert sel_cfg["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert set(flatten(sel_cfg)) <= TITAN_02
    # 0.3 has no option: its SelectiveAC is per-op
    sel_o = titan_overrides(export_plan(sel, "torchtitan").text)
    assert "activation-checkpoint:selective" in sel_o and set(sel_o) <= TITAN_03
    assert "pipeline_parallel_schedule" not in cfg["parallelism"]
    # TP without SP cannot be expressed in 0.2.x: a comment says so
    assert "always shards norms on the sequence" in unwrapped(exp.text)
    # ... and is a switch in 0.3
    o = titan_overrides(export_plan(plan, "torchtitan").text)
    assert o["parallelism.enable_sequence_parallel"] == "false"
    assert set(o) <= TITAN_03


def test_torchtitan_zero3_and_zero2():
    z3 = titan_overrides(export_plan(make("llama3-8b", 64, gbs=512, tp=1, pp=1, dp=64, zero_stage=3,
                                          micro_batch_size=1), "torchtitan").text)
    assert z3["parallelism.data_parallel_shard_degree"] == "64"
    assert z3["parallelism.data_parallel_replicate_degree"] == "1"
    assert "parallelism.fsdp_reshard_after_forward" not in z3
    with pytest.raises(UsageError, match="torchtitan offers ZeRO stages 0, 3"):
        export_plan(make("llama3-8b", 64, gbs=512, tp=1, pp=1, dp=64, zero_stage=2,
                         micro_batch_size=1), "torchtitan")


def test_torchtitan_refuses_fp16_and_bad_format():
    with pytest.raises(UsageError, match="fp16"):
        export_plan(make("llama3-8b", 8, dtype="fp16", tp=1, pp=1, dp=8, zero_stage=3,
                         micro_batch_size=1), "torchtitan")
    with pytest.raises(UsageError, match="torchtitan-format"):
        export_plan(make("llama3-8b", 8, tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=1),
                    "torchtitan", "yaml")


def test_cli_search_then_export_megatron(tmp_path):
    """The issue's done-when: search --export, then export --to megatron prints accepted flags."""
    runner = CliRunner()
    plan_file = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["search", "--model", "175b", "--gpus", "512", "--top", "1",
                              "--export", str(plan_file)])
    assert res.exit_code == 0, res.stderr
    res = runner.invoke(app, ["export", str(plan_file), "--to", "megatron"])
    assert res.exit_code == 0, res.stderr
    flags = megatron_flags(res.stdout)
    assert set(flags) <= MEGATRON, set(flags) - MEGATRON
    lay = read_plan(plan_file).layout
    assert flags["--tensor-model-parallel-size"] == str(lay.tp)
    assert flags["--pipeline-model-parallel-size"] == str(lay.pp)
    assert flags["--micro-batch-size"] == str(lay.micro_batch_size)
    assert flags["--global-batch-size"] == "1536" and flags["--num-layers"] == "96"
    # every target works on that plan or refuses in one line
    for target in ("nemo", "deepspeed", "torchtitan"):
        res = runner.invoke(app, ["export", str(plan_file), "--to", target])
        assert res.exit_code in (0, 2)
        if res.exit_code == 2:
            assert res.stderr.startswith("error:") and len(res.stderr.strip().splitlines()) == 1


def test_cli_export_output_file_and_force(tmp_path):
    runner = CliRunner()
    plan_file = tmp_path / "plan.yaml"
    from planner.export import write_plan
    write_plan(make("175b", 512, **GPT3_DS), plan_file)
    out = tmp_path / "ds.json"
    res = runner.invoke(app, ["export", str(plan_file), "--to", "deepspeed", "-o", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["gradient_accumulation_steps"] == 192
    assert "note: pipeline: pp=8" in res.stderr
    res = runner.invoke(app, ["export", str(plan_file), "--to", "deepspeed", "-o", str(out)])
    assert res.exit_code == 2 and "--force" in res.stderr
    res = runner.invoke(app, ["export", str(plan_file), "--to", "nemo", "-o", str(out), "--force"])
    assert res.exit_code == 0 and "tensor_model_parallel_size: 8" in out.read_text()
    res = runner.invoke(app, ["export", str(plan_file), "--to", "jax"])
    assert res.exit_code == 2 and "unknown export target" in res.stderr


def test_alibi_is_commented_where_the_shape_is_not_exported():
    # torchtitan trains the model module you register: ALiBi is the module's to implement
    plan = make("bloom-176b", 64, tp=8, pp=1, dp=8, zero_stage=3, micro_batch_size=1)
    assert "ALiBi" in export_plan(plan, "torchtitan").text


def test_exports_set_the_save_interval():
    """Every target sets the save interval the plan's checkpoint estimate gives (common.
    save_interval: the Young/Daly optimum in whole steps), with option names from its list."""
    from planner.frameworks.common import save_interval
    plan = make("175b", 512, **GPT3)
    ck = save_interval(plan)
    n = ck["interval_steps"]
    assert n == max(1, round(ck["optimal_interval_s"] / (ck["interval_s"] / n)))
    flags = megatron_flags(export_plan(plan, "megatron").text)
    assert set(flags) <= MEGATRON
    assert flags["--save-interval"] == str(n) and flags["--ckpt-format"] == "torch_dist"
    # async saves need the persistent worker, else Megatron turns --async-save off
    assert "--async-save" in flags and "--use-persistent-ckpt-worker" in flags
    nemo = yaml.safe_load(export_plan(plan, "nemo").text)
    assert set(flatten(nemo)) <= BRIDGE, set(flatten(nemo)) - BRIDGE
    assert nemo["checkpoint"] == {"save_interval": n, "ckpt_format": "torch_dist",
                                  "async_save": True, "fully_parallel_load": True}
    # torchtitan and DeepSpeed run neither ZeRO-1 nor this 175B layout: an FSDP plan of theirs
    fsdp = make("llama3-8b", 64, gbs=512, tp=1, pp=1, dp=64, zero_stage=3, micro_batch_size=1)
    n = save_interval(fsdp)["interval_steps"]
    o = titan_overrides(export_plan(fsdp, "torchtitan").text)
    assert set(o) <= TITAN_03 and o["checkpoint.interval"] == str(n)
    assert (o["checkpoint.enable"], o["checkpoint.async_mode"]) == ("true", "async")
    assert f"every {n} steps" in " ".join(export_plan(fsdp, "deepspeed").notes)
    # synchronous saves, ZeRO-3 (Megatron-FSDP): fsdp_dtensor, no async flags
    sync = make("llama3-8b", 64, gbs=512, tp=1, pp=1, dp=64, zero_stage=3, micro_batch_size=1)
    sync = sync.model_copy(update={"training": sync.training.model_copy(update={
        "checkpoint": sync.training.checkpoint.model_copy(update={"async_save": False})})})
    flags = megatron_flags(export_plan(sync, "megatron").text)
    assert flags["--ckpt-format"] == "fsdp_dtensor" and "--async-save" not in flags
    titan = export_plan(sync, "torchtitan", "toml").text
    # torchtitan 0.2.2 job_config.py Checkpoint.enable (tests/data/torchtitan_0.2_toml_options.txt)
    assert "enable = true" in titan and 'async_mode = "disabled"' in titan
