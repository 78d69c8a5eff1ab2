"""Exports that start: what a framework asserts before it runs a plan, checked on the exported
text (facts only, each with the file, line and version it comes from; nothing here is program
output pasted back).

Sources read for these tests:
  MLM  NVIDIA/Megatron-LM @d98e8a64ddf3 megatron/training/arguments.py (validate_args),
       docs/user-guide/features/megatron_fsdp.md, examples/megatron_fsdp/*.sh,
       megatron/core/transformer/moe/token_dispatcher.py
  MB   NVIDIA-NeMo/Megatron-Bridge @067f987df03b src/megatron/bridge/training/config.py
"""

from __future__ import annotations

import yaml

from planner import __version__, catalog
from planner.frameworks import export_plan
from planner.specs import Layout, Plan, TrainingSpec
from tests import megatron_rules as rules
from tests.test_frameworks import BRIDGE, MEGATRON, flatten


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


# --- 1. Megatron-FSDP: the flags and the environment it needs -----------------------------------

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
    plan = make("mixtral-8x7b", 16, training={"moe_a2a_overlap": True}, tp=2, pp=1, dp=8, ep=8,
                etp=1, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    text = comments(export_plan(plan, "megatron").text)
    assert "environment: export CUDA_DEVICE_MAX_CONNECTIONS=32" in text
    assert "environment conflict: tp=2 cp=1" in text and "EP overlap" in text
