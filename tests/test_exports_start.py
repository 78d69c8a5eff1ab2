"""Exports that start: what a framework asserts before it runs a plan, checked on the exported
text (facts only, each with the file, line and version it comes from; nothing here is program
output pasted back).

Sources read for these tests:
  MLM  NVIDIA/Megatron-LM @d98e8a64ddf3 megatron/training/arguments.py (validate_args),
       docs/user-guide/features/megatron_fsdp.md, examples/megatron_fsdp/*.sh,
       megatron/core/transformer/moe/token_dispatcher.py
  MB   NVIDIA-NeMo/Megatron-Bridge @067f987df03b src/megatron/bridge/training/config.py
  TT   torchtitan 0.2.2 and 0.3.0 as released on PyPI (the wheels; the names read in them are
       tests/data/torchtitan_0.2_toml_options.txt and torchtitan_0.3_options.txt)
"""

from __future__ import annotations

import errno
import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml

from planner import __version__, catalog, outputs
from planner.cost import precision
from planner.errors import UsageError
from planner.frameworks import TARGETS, export_plan
from planner.frameworks.megatron_software import check_deepep
from planner.frameworks.profile import resolve_training
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec
from tests import megatron_rules as rules
from tests.cli_errors import one_line_error, runner
from planner.cli import app
from tests.test_frameworks import BRIDGE, MEGATRON, TITAN_02, TITAN_03, flatten, titan_overrides


def make(model: str, gpus: int, hw: str = "dgx-h100", training: dict | None = None,
         **layout) -> Plan:
    """A plan of ``model`` on ``gpus`` GPUs of ``hw`` with the model's batch and ``layout``."""
    m = catalog.resolve_model(model)
    tr = TrainingSpec(seq_length=m.training.seq_length,
                      global_batch_size=m.training.global_batch_size, **(training or {}))
    return Plan(plan3d_version=__version__, model=m, hardware=catalog.resolve_hardware(hw),
                gpus=gpus, training=tr, layout=Layout(**layout))


def comments(text: str) -> str:
    """The comment lines of an export joined into one string (wrapping undone)."""
    return " ".join(ln.lstrip("#").strip() for ln in text.splitlines() if ln.startswith("#"))


# --- 1. Megatron-FSDP: the flags and the environment it needs ------------------------------------

# Llama 3 70B, ZeRO-2 and ZeRO-3 on 64 H100 with tp=2 cp=2 (the layout family the search picks)
FSDP = dict(tp=2, cp=2, pp=4, dp=4, micro_batch_size=1, sequence_parallel=True)


def megatron_fsdp_rejects(args: dict, env: dict[str, str]) -> list[str]:
    """MLM arguments.py's checks of a Megatron-FSDP launch (``env``: the environment it runs
    in): L1166-1167 asserts CUDA_DEVICE_MAX_CONNECTIONS != "1"; L1169-1170 asserts
    --ckpt-format fsdp_dtensor. The flags the Megatron-FSDP examples pass
    (examples/megatron_fsdp/train_llama3_8b_fsdp_h100_fp8.sh L113-121,
    sbatch_mfsdp_deepseek_v3.sh L139-148): --use-distributed-optimizer (L1127-1135 turns it on
    with a warning) and --no-gradient-accumulation-fusion (L1153-1160 only warns)."""
    out = []
    if env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        out.append("L1166: FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset")
    if args.get("ckpt_format", "torch_dist") != "fsdp_dtensor":
        out.append("L1169: Megatron-FSDP requires the fsdp_dtensor checkpointing format")
    if args.get("use_distributed_optimizer") is not True:
        out.append("L1129: Megatron-FSDP v1 is only compatible with --use-distributed-optimizer")
    if args.get("gradient_accumulation_fusion", True) is not False and \
            args.get("no_gradient_accumulation_fusion") is not True:
        out.append("L1155: verify fused gradient accumulation with Megatron-FSDP")
    return out


def test_megatron_fsdp_exports_the_flags_and_environment_it_starts_with():
    for zero, strategy in ((2, "optim_grads"), (3, "optim_grads_params")):
        exp = export_plan(make("llama3-70b", 64, zero_stage=zero, **FSDP), "megatron")
        args = rules.parse(exp.text)
        assert {"--" + k.replace("_", "-") for k in args} <= MEGATRON
        assert args["use_megatron_fsdp"] is True
        assert args["data_parallel_sharding_strategy"] == strategy
        # the environment the export says to launch in: CUDA_DEVICE_MAX_CONNECTIONS unset
        text = comments(exp.text)
        assert "environment: unset CUDA_DEVICE_MAX_CONNECTIONS" in text
        assert megatron_fsdp_rejects(args, env={}) == []
        # a Hopper TP launch script's CUDA_DEVICE_MAX_CONNECTIONS=1 is refused, and the export
        # names that conflict (tp=2 wants 1 before Blackwell: arguments.py L1453-1465)
        assert megatron_fsdp_rejects(args, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
        assert "environment conflict: tp=2 cp=2" in text


def test_nemo_fsdp_sets_the_distributed_optimizer_and_env_vars():
    # Megatron-Bridge (MB training/config.py): Megatron-FSDP v1 turns use_distributed_optimizer
    # on in ddp and optimizer (L1081-1085) and asserts CUDA_DEVICE_MAX_CONNECTIONS != "1"
    # (L1110-1111); env_vars (L965) are applied with os.environ.setdefault (L1989)
    exp = export_plan(make("llama3-70b", 64, zero_stage=3, **FSDP), "nemo")
    body = yaml.safe_load(exp.text)
    fields = flatten(body)
    assert set(fields) <= BRIDGE, set(fields) - BRIDGE
    assert fields["ddp.use_megatron_fsdp"] is True
    assert fields["ddp.use_distributed_optimizer"] is True
    assert fields["optimizer.use_distributed_optimizer"] is True
    assert fields["model.gradient_accumulation_fusion"] is False
    assert fields["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert str(fields["env_vars.CUDA_DEVICE_MAX_CONNECTIONS"]) != "1"
    assert "'++env_vars={CUDA_DEVICE_MAX_CONNECTIONS:32}'" in comments(exp.text)


def test_environment_of_tp_without_fsdp_and_on_blackwell():
    # TP/CP before Blackwell without FSDP: Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS == "1"
    # (MLM arguments.py L1476-1479); from Blackwell on nothing is required (L1453-1455)
    dense = dict(tp=8, pp=1, dp=8, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    hopper = export_plan(make("llama3-70b", 64, **dense), "megatron")
    assert "environment: export CUDA_DEVICE_MAX_CONNECTIONS=1" in comments(hopper.text)
    bridge = flatten(yaml.safe_load(export_plan(make("llama3-70b", 64, **dense), "nemo").text))
    assert bridge["env_vars.CUDA_DEVICE_MAX_CONNECTIONS"] == 1
    blackwell = export_plan(make("llama3-70b", 64, hw="dgx-b200", **dense), "megatron")
    assert "CUDA_DEVICE_MAX_CONNECTIONS is not required" in comments(blackwell.text)
    assert "env_vars" not in yaml.safe_load(
        export_plan(make("llama3-70b", 64, hw="dgx-b200", **dense), "nemo").text)


def test_environment_of_ep_overlap_beside_tp_names_the_conflict():
    # EP overlap wants CUDA_DEVICE_MAX_CONNECTIONS > 1 (MLM megatron/core/transformer/moe/
    # README.md L437); beside TP before Blackwell Megatron-LM only warns (arguments.py
    # L1466-1475: "1 or 32")
    plan = make("mixtral-8x7b", 16, tp=2, pp=1, dp=8, ep=8, moe_a2a_overlap=True,
                etp=1, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    text = comments(export_plan(plan, "megatron").text)
    assert "environment: export CUDA_DEVICE_MAX_CONNECTIONS=32" in text
    assert "environment conflict: tp=2 cp=1" in text and "EP overlap" in text


# --- 2. torchtitan: every key the release's config dataclasses have ------------------------------

# The values torchtitan 0.2.2 types as Literal, for the fields plan3d writes (torchtitan-0.2.2
# wheel, torchtitan/config/job_config.py: Training.mixed_precision_param / _reduce,
# ActivationCheckpoint.mode, Checkpoint.async_mode, Float8Linear.recipe_name,
# MXGroupedMM.recipe_name; converter names: components/quantization/float8.py L238-239,
# mx.py L171-172)
TITAN_022_VALUES = {
    "training.mixed_precision_param": {"bfloat16", "float32"},
    "training.mixed_precision_reduce": {"float32"},
    "activation_checkpoint.mode": {"selective", "full", "memory_budget", "none"},
    "checkpoint.async_mode": {"disabled", "async", "async_with_pinned_mem"},
    "quantize.linear.float8.recipe_name": {"tensorwise", "rowwise", "rowwise_with_gw_hp"},
    "quantize.grouped_mm.mx.recipe_name": {"mxfp8"},
}
CONVERTERS_022 = {"quantize.linear.float8", "quantize.grouped_mm.float8", "quantize.linear.mx",
                  "quantize.grouped_mm.mx"}
ZERO3 = dict(pp=1, zero_stage=3, micro_batch_size=1)
TITAN_PLANS = [
    make("llama3-8b", 16, tp=2, dp=8, sequence_parallel=True, **ZERO3),
    make("llama3-8b", 16, tp=1, pp=1, dp=16, zero_stage=0, micro_batch_size=1,
         recompute="selective"),
    make("llama3-70b", 64, tp=8, pp=4, dp=2, vpp=2, zero_stage=3, micro_batch_size=1,
         sequence_parallel=True, recompute="full"),
    make("qwen3-30b-a3b", 16, tp=2, dp=8, ep=8, etp=1, sequence_parallel=True, **ZERO3),
    make("llama3-8b", 16, training={"precision": "fp8"}, tp=1, dp=16, **ZERO3),
    make("qwen3-30b-a3b", 16, hw="dgx-b200", training={"precision": "mxfp8"}, tp=1, dp=16, ep=8,
         etp=1, **ZERO3),
]


def test_torchtitan_toml_parses_into_torchtitan_022_config():
    for plan in TITAN_PLANS:
        text = export_plan(plan, "torchtitan", "toml").text
        assert text.startswith("# torchtitan 0.2.2 job file")  # the release it targets
        assert "pip install torchtitan==0.2.2" in comments(text)
        data = flatten(tomllib.loads(text))
        # ConfigManager._dict_to_dataclass refuses any key its dataclasses lack
        assert set(data) <= TITAN_02, set(data) - TITAN_02
        for key, allowed in TITAN_022_VALUES.items():
            assert key not in data or data[key] in allowed, (key, data[key])
        assert set(data.get("model.converters", [])) <= CONVERTERS_022
        assert data["checkpoint.enable"] is True  # Checkpoint.enable, not enable_checkpoint
        if data.get("parallelism.expert_parallel_degree", 1) > 1:  # parallel_dims.py L58-59
            assert data["parallelism.expert_tensor_parallel_degree"] in \
                (1, data["parallelism.tensor_parallel_degree"])


def test_torchtitan_refuses_bf16_gradient_reduction():
    # training.mixed_precision_reduce is Literal["float32"] in 0.2.2 (job_config.py Training)
    # and 0.3.0 (configs.py TrainingConfig): a torchtitan plan that reduces in bf16 has no
    # spelling (a plan of another framework gets float32 and the re-plan note)
    plan = make("llama3-8b", 16, training={"grad_bytes": 2, "framework": "torchtitan"}, tp=1,
                dp=16, **ZERO3)
    for fmt in ("toml", "overrides"):
        with pytest.raises(UsageError, match="float32 only"):
            export_plan(plan, "torchtitan", fmt)


def test_torchtitan_overrides_use_torchtitan_030_names():
    for plan in TITAN_PLANS:
        if plan.training.precision == "fp8":
            continue  # refused by 0.3.0 (test_fp8_is_named_and_exported_as_the_costed_recipe)
        text = export_plan(plan, "torchtitan").text
        assert text.startswith("# torchtitan 0.3.0 command-line overrides")
        assert "pip install torchtitan==0.3.0" in comments(text)
        o = titan_overrides(text)
        assert set(o) <= TITAN_03, set(o) - TITAN_03
        # the activation-checkpoint subcommand is the last token (tyro parses it last)
        assert text.rstrip().splitlines()[-1] == f"activation-checkpoint:{plan.layout.recompute}"


# --- 4. FP8 in torchtitan: one recipe name, the one the cost model charged -----------------------

def test_fp8_is_named_and_exported_as_the_costed_recipe():
    # what the cost model charges for fp8 (planner/cost/precision.py): no scale bytes per
    # element (one scale per tensor) and the per-tensor GEMM rate (kernel factor 1): per-tensor
    # current scaling, which torchao calls "tensorwise" (torchao Float8LinearRecipeName); its
    # rowwise recipe has one scale per row and another GEMM
    assert precision.SCALE_BYTES["fp8"] == 0.0 and precision.RECIPE_GEMM_FACTOR["fp8"] == 1.0
    plan = make("llama3-8b", 16, training={"precision": "fp8"}, tp=1, dp=16, **ZERO3)
    toml = export_plan(plan, "torchtitan", "toml").text
    assert tomllib.loads(toml)["quantize"]["linear"]["float8"]["recipe_name"] == "tensorwise"
    assert "fp8: per-tensor scaling (torchao tensorwise)" in comments(toml)
    assert "rowwise" not in toml
    # 0.3.0 has no tensorwise recipe (float8.py Float8LinearConverter.Config recipe_name:
    # Literal["rowwise", "rowwise_with_gw_hp"]): refused, naming the costed recipe and the way out
    with pytest.raises(UsageError, match=r"only rowwise float8 recipes.*per-tensor scaling "
                                         r"\(torchao tensorwise\).*--torchtitan-format toml"):
        export_plan(plan, "torchtitan")
    # 0.2.2 quantizes experts with rowwise float8 only (Float8GroupedMMConverter): refused
    moe = make("qwen3-30b-a3b", 16, training={"precision": "fp8"}, tp=1, dp=16, ep=8, etp=1,
               **ZERO3)
    with pytest.raises(UsageError, match="experts with rowwise float8 only"):
        export_plan(moe, "torchtitan", "toml")


# --- 6. Every exported line within 80 columns, the output still valid ----------------------------

COLUMNS = 80
WIDE_PLANS = [  # long comments: Megatron-FSDP, MoE with every job setting, MLA, windows, sinks
    make("llama3-70b", 64, zero_stage=2, first_stage_layers=18, last_stage_layers=20,
         **dict(FSDP, pp=4)),
    make("deepseek-v3", 1024, training={"cross_entropy_in_place": True,
                                        "moe_activation_offload": True},
         tp=2, pp=8, dp=64, ep=64, etp=1, vpp=2, zero_stage=1, micro_batch_size=1,
         sequence_parallel=True, recompute="selective+", moe_dispatcher="deepep",
         moe_a2a_overlap=True, cuda_graphs="layers"),
    make("gpt-oss-20b", 16, tp=1, pp=1, dp=16, ep=8, zero_stage=1, micro_batch_size=1),
    make("bloom-176b", 64, tp=8, dp=8, sequence_parallel=True, **ZERO3),
] + TITAN_PLANS


def unbreakable(line: str) -> bool:
    """A line that no wrapping can shorten: one word after the comment mark (a long flag value
    or Hydra override), or a flag with its one value (shell)."""
    words = line.lstrip("#").strip().rstrip("\\").split()
    return len(words) == 1 or (len(words) == 2 and words[0].startswith("--"))


def exports_of(plan: Plan):
    """(target, format, Export) for every target and format that runs ``plan``."""
    for target, fmt in (("megatron", None), ("nemo", None), ("deepspeed", None),
                        ("torchtitan", "overrides"), ("torchtitan", "toml")):
        try:
            yield target, fmt, export_plan(plan, target, *([fmt] if fmt else []))
        except UsageError:
            continue  # what the framework cannot run (test_frameworks covers the refusals)


def test_every_exported_line_fits_80_columns_and_parses():
    seen = set()
    for plan in WIDE_PLANS:
        for target, fmt, exp in exports_of(plan):
            seen.add((target, fmt))
            long = [ln for ln in exp.text.splitlines() if len(ln) > COLUMNS]
            assert all(unbreakable(ln) for ln in long), (target, fmt, long)
            # still what the framework's parser reads
            if target == "megatron":
                rules.parse(exp.text)
            elif target == "nemo":
                yaml.safe_load(exp.text)
            elif target == "deepspeed":
                json.loads(exp.text)
            elif fmt == "toml":
                tomllib.loads(exp.text)
    assert len(seen) == 5  # every exporter and format was exercised


# --- 3. An export's notes never advise what the plan already is ----------------------------------

# the framework each export target runs (README "Into the training stack": nemo is Megatron-Bridge,
# which builds Megatron-Core; megatron-core's exporter is megatron)
RUNS = {"megatron": "megatron-core", "nemo": "megatron-core", "deepspeed": "deepspeed",
        "torchtitan": "torchtitan"}


def made_for(framework: str, **layout) -> Plan:
    """A Llama 3 8B plan on 16 H100 made for ``framework`` (its profile's training facts)."""
    profile = catalog.resolve_framework(framework)
    plan = make("llama3-8b", 16, **layout)
    return plan.model_copy(update={"training": resolve_training(plan.training, profile),
                                   "framework": profile})


def test_notes_never_advise_the_plans_own_framework():
    ddp = dict(tp=1, pp=1, dp=16, zero_stage=0, micro_batch_size=1)  # every framework runs it
    for framework in ("megatron-core", "deepspeed", "torchtitan"):
        plan = made_for(framework, **ddp)
        names = {framework, *catalog.resolve_framework(framework).aliases}
        for target in TARGETS:
            exp = export_plan(plan, target)
            said = " ".join(exp.notes) + " " + comments(exp.text)
            assert not any(f"--framework {n}" in said for n in names), (framework, target)
            # another framework's runtime: the note says which framework to re-plan with
            assert (f"re-plan with --framework {RUNS[target]}" in said) == \
                (RUNS[target] != framework), (framework, target)


def test_a_refusal_of_the_plans_own_framework_does_not_advise_it():
    # a torchtitan plan edited to ZeRO-1, which torchtitan does not offer (its profile's rules)
    plan = made_for("torchtitan", tp=1, pp=1, dp=16, zero_stage=1, micro_batch_size=1)
    with pytest.raises(UsageError) as refused:
        export_plan(plan, "torchtitan")
    assert "ZeRO stages 0, 3" in str(refused.value)
    assert "--framework torchtitan" not in str(refused.value)
    # made for megatron-core, the same plan's refusal does point at torchtitan's search
    with pytest.raises(UsageError, match="search with --framework torchtitan"):
        export_plan(made_for("megatron-core", tp=1, pp=1, dp=16, zero_stage=1,
                             micro_batch_size=1), "torchtitan")


# --- 7. The flex dispatcher where Megatron-Core's DeepEP refuses it ------------------------------

def test_flex_deepep_over_one_expert_rank_is_refused_with_megatrons_assertion():
    # MLM megatron/core/transformer/moe/token_dispatcher.py L1836: MoEFlexTokenDispatcher with
    # the deepep backend asserts tp_size * ep_size > 1, "DeepEP dispatcher requires TPxEP > 1",
    # where tp_size is the expert TP group's (pg_collection.expt_tp, L86-89); the software
    # rules the search applies refuse it too
    deepep = {"moe_dispatcher": "deepep"}
    single = make("olmoe-1b-7b", 8, tp=1, pp=1, dp=8, ep=1, etp=1, zero_stage=1,
                  micro_batch_size=1, **deepep)
    for target in ("megatron", "nemo"):
        with pytest.raises(UsageError, match="DeepEP dispatcher needs etp\\*ep > 1"):
            export_plan(single, target)
    # the exporter's own check, where a caller skips the rules (Megatron's words)
    with pytest.raises(UsageError, match=r'"DeepEP dispatcher requires TPxEP > 1"'):
        check_deepep(single)
    # attention TP does not count: the assertion is on the expert TP (etp = 1 here)
    tp2 = make("olmoe-1b-7b", 8, tp=2, pp=1, dp=4, ep=1, etp=1, zero_stage=1,
               micro_batch_size=1, sequence_parallel=True, **deepep)
    with pytest.raises(UsageError, match="etp\\*ep > 1"):
        export_plan(tp2, "megatron")
    # etp x ep = 2: DeepEP runs
    ep2 = make("olmoe-1b-7b", 8, tp=1, pp=1, dp=8, ep=2, etp=1, zero_stage=1,
               micro_batch_size=1, **deepep)
    args = rules.parse(export_plan(ep2, "megatron").text)
    assert (args["moe_token_dispatcher_type"], args["moe_flex_dispatcher_backend"]) == \
        ("flex", "deepep")


# --- 5. No command overwrites its own input, even with --force -----------------------------------

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8", "--export",
                              str(path)])
    assert res.exit_code == 0, res.stderr
    return path


def test_export_never_writes_over_its_plan(plan_file, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_bytes(plan_file.read_bytes())
    before = plan.read_bytes()
    link, hard = tmp_path / "link.args", tmp_path / "hard.args"
    link.symlink_to(plan)
    os.link(plan, hard)
    (tmp_path / "sub").mkdir()
    for out in (plan, link, hard, tmp_path / "sub" / ".." / "plan.yaml"):
        for force in (["--force"], []):  # without --force too: not "pass --force" advice
            line = one_line_error(["export", str(plan), "-o", str(out), *force])
            assert "is this command's input" in line and "even with --force" in line, line
    # a framework profile file given with --to is an input as well
    profile = tmp_path / "mcore.yaml"
    profile.write_bytes((ROOT / "framework_profiles" / "megatron-core.yaml").read_bytes())
    line = one_line_error(["export", str(plan), "--to", str(profile), "-o", str(profile),
                           "--force"])
    assert "is this command's input" in line
    assert plan.read_bytes() == before
    # another file is written as before
    res = runner.invoke(app, ["export", str(plan), "-o", str(tmp_path / "out.args")])
    assert res.exit_code == 0 and (tmp_path / "out.args").read_text().startswith("# Megatron-LM")


def test_calibrate_never_writes_over_its_runs_or_hardware_file(tmp_path):
    runs = tmp_path / "runs.yaml"
    runs.write_bytes((ROOT / "benchmarks" / "published_runs.yaml").read_bytes())
    hw = tmp_path / "hw.yaml"
    hw.write_bytes((ROOT / "hardware_profiles" / "dgx-h100.yaml").read_bytes())
    for out, hardware in ((runs, "dgx-h100"), (hw, str(hw))):
        line = one_line_error(["calibrate", str(runs), "--hardware", hardware, "-o", str(out),
                               "--force", "--no-loo"])
        assert f"--output {out} is this command's input" in line
    assert runs.read_bytes() == (ROOT / "benchmarks" / "published_runs.yaml").read_bytes()
    assert hw.read_bytes() == (ROOT / "hardware_profiles" / "dgx-h100.yaml").read_bytes()


def test_validate_never_writes_its_measurements_over_the_plan(plan_file, tmp_path):
    pytest.importorskip("torch")  # validate runs only with PyTorch installed
    plan = tmp_path / "plan.yaml"
    plan.write_bytes(plan_file.read_bytes())
    line = one_line_error(["validate", str(plan), "--local", "--out", str(plan), "--force"])
    assert "is this command's input" in line


# --- 8. A write that fails names the path and exits 2 --------------------------------------------

def test_an_output_name_too_long_is_one_line_naming_it(plan_file, tmp_path):
    # a 300-character file name: the system refuses it (ENAMETOOLONG, NAME_MAX 255 on Linux)
    long = tmp_path / ("x" * 300 + ".args")
    for args in (["export", str(plan_file), "-o", str(long)],
                 ["search", "--model", "llama3-8b", "--gpus", "8", "--export", str(long)],
                 ["calibrate", str(ROOT / "benchmarks" / "published_runs.yaml"), "--hardware",
                  "dgx-h100", "-o", str(long), "--no-loo"]):
        line = one_line_error(args)
        assert line.startswith(f"error: cannot write {long}") and "too long" in line, line


def test_a_failed_write_to_stdout_names_stdout(monkeypatch):
    def full(_data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr("planner.outputs.write_stdout", full)
    with pytest.raises(UsageError, match="cannot write stdout: No space left on device"):
        outputs.write(Path("-"), "text", force=False)
