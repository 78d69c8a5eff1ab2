"""FP8 / MXFP8 precision: hand-derived memory, time and traffic terms (fp8_hardware.md), the
refusals, the exports, and one published BF16 -> FP8 speed-up."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from planner import __version__, catalog
from planner.cli import app
from planner.cost import blocks, compute, memory, precision
from planner.cost.step import estimate_layout
from planner.cost.traffic import Elements
from planner.cost.volumes import rank_collectives
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.inputs import training_spec
from planner.search.check import check_layout
from planner.layout import Candidates
from planner.layout import Layout
from planner.plan import Plan

DATA = Path(__file__).parent / "data"
H100, B200 = catalog.resolve_hardware("dgx-h100"), catalog.resolve_hardware("dgx-b200")


def options(name: str) -> set[str]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


def spec(model, precision_name: str, **given):
    return training_spec(model, {"precision": precision_name, **given})


def one(**layout) -> Candidates:
    base = dict(tp=1, pp=1, dp=1, zero_stage=0, micro_batch_size=1, recompute="none",
                sequence_parallel=False, vpp=1)
    return Candidates.from_layouts([Layout(**{**base, **layout})])


def test_llama3_70b_layer_activations_match_the_worked_example():
    # fp8_hardware.md 3.6: one Llama 3 70B layer, TP 4 + SP, s 8192, mbs 1; unit E = s*b*h/t =
    # 8192*8192/4 elements. BF16 33.5 B/E, per-tensor FP8 29.0 B/E (QKV input 2 -> 1, an FP8
    # copy of O +1, fc1 input 2 -> 1, fc2 input 7 -> 3.5), both + the fp32 log-sum-exp
    # 4 B x 64 heads / 4 ranks per token = 64 B per token = 64/2048 = 0.03125 B/E.
    m = catalog.resolve_model("llama3-70b")
    c = one(tp=4, sequence_parallel=True)
    unit = 8192 * 8192 / 4
    per_e = {p: float(memory.activation_per_layer(m, spec(m, p, seq_length=8192,
                                                          global_batch_size=8), c)[0]) / unit
             for p in ("bf16", "fp8", "mxfp8")}
    assert per_e["bf16"] == pytest.approx(33.5 + 0.03125, rel=1e-12)
    assert per_e["fp8"] == pytest.approx(29.0 + 0.03125, rel=1e-12)
    # MXFP8 adds 1/32 B of E8M0 scales per element of the four FP8 tensors: QKV input 1 E,
    # O copy n*d/t = h/t = 1 E, fc1 input 1 E, fc2 input f/h = 3.5 E: 6.5/32 = 0.203125 B/E
    assert per_e["mxfp8"] == pytest.approx(29.0 + 0.03125 + 6.5 / 32, rel=1e-12)


@pytest.mark.parametrize("hw, name, stage, want", [
    # fp8_hardware.md 3.1 / 3.6, bytes per linear parameter beside 4 fp32 grads and 12/d optimizer:
    (H100, "bf16", 1, 2.0),            # BF16 weights
    (H100, "fp8", 1, 2.0),             # FP8 param (uint8 buffer) 1 + transpose 1, param gather
    (H100, "fp8", 0, 4.0),             # no sharded optimizer, no param gather: 2 + 1 + 1 (3.1: 8 + 12/d)
    (B200, "fp8", 1, 1.0),             # Blackwell: no transpose
    (B200, "mxfp8", 1, 2.0 + 2 / 32),  # row + column copies + E8M0 scales, BF16 gather in grad buffer
    (H100, "fp8-blockwise", 1, 4.0 + 8 / 128),  # BF16 2 + row and column FP8 + fp32 1x128 scales
])
def test_linear_weight_bytes(hw, name, stage, want):
    m = catalog.resolve_model("llama3-8b")
    c = one(dp=8, zero_stage=stage)
    w = memory.model_state_bytes(np.array(1.0e9), c, spec(m, name), linear=np.array(1.0e9), hw=hw)
    assert float(w["weights"][0]) / 1.0e9 == pytest.approx(want, rel=1e-12)


def test_fp8_gemm_efficiency_by_hand():
    # one 1 TFLOP GEMM on H100: BF16 eta = 0.605 * 1e12 / (1e12 + 1.61e9) = 0.604027...; FP8 eta =
    # matmul_fp8 0.534 x 1.0 (per-tensor) x 1e12 / (1e12 + 1.61e9 x 1978.9/989.4)
    f = 1.0e12
    m = catalog.resolve_model("llama3-8b")
    bf16 = precision.linear_efficiency(f, H100, spec(m, "bf16"))
    fp8 = precision.linear_efficiency(f, H100, spec(m, "fp8"))
    assert float(bf16) == pytest.approx(0.605 * f / (f + 1.61e9), rel=1e-12)
    assert float(fp8) == pytest.approx(0.534 * f / (f + 1.61e9 * 1978.9 / 989.4), rel=1e-12)
    # B200 MXFP8: matmul_fp8 0.574 x 2677/2815 (kernel-only MXFP8 vs per-tensor, TE GEMM
    # benchmark) with the B200 half size x 4500/2250
    half = B200.efficiency.matmul_half_flops
    mx = precision.linear_efficiency(f, B200, spec(m, "mxfp8"))
    assert float(mx) == pytest.approx(0.574 * 2677 / 2815 * f / (f + half * 4500 / 2250), rel=1e-12)


def test_quantize_traffic_of_an_mlp_block_by_hand():
    # Llama 3 8B MLP at tp 1, one 8192-token micro-batch: linear inputs and output gradients
    # X + G = fc1 in h + out 2f, fc2 in f + out h = 2h + 3f = 8192 + 43008 = 51200 elements per
    # token, at 6 B each (per-tensor, Hopper: amax read 2, read 2, write 1, transpose 1):
    # 51200 x 6 x 8192 B in all, forward a third of it, at the achieved HBM bandwidth.
    m = catalog.resolve_model("llama3-8b")
    c = one()
    bf16 = compute.block_times(m, spec(m, "bf16", seq_length=8192), H100, c)[blocks.MLP]
    fp8 = compute.block_times(m, spec(m, "fp8", seq_length=8192), H100, c)[blocks.MLP]
    extra = 51200 * 6 * 8192 / 3 / (H100.gpu.hbm_bandwidth * H100.efficiency.hbm)
    assert float((fp8.memory_forward - bf16.memory_forward)[0]) == pytest.approx(extra, rel=1e-12)
    # the GEMMs: F = 8192 tokens x 2*3*4096*14336 = 2,886,218,022,912 FLOPs, at the mean GEMM
    # size F/2 = 1.4431e12; time F/(peak x eta), eta = matmul x (F/2)/(F/2 + half) in BF16
    # (0.605, half 1.61e9) and matmul_fp8 x (F/2)/(F/2 + half x 1978.9/989.4) in FP8 (0.534,
    # recipe factor 1): bf16/fp8 = (1978.9/989.4) x (0.534/0.605) x (F/2 + 1.61e9)/(F/2 +
    # 3.2202e9) = 2.000101 x 0.882645 x 0.998887 = 1.763413
    F2 = 8192 * 6 * 4096 * 14336 / 2
    ratio = (1978.9 / 989.4) * (0.534 / 0.605) * (F2 + 1.61e9) / (F2 + 1.61e9 * 1978.9 / 989.4)
    assert float((bf16.gemm_forward / fp8.gemm_forward)[0]) == pytest.approx(ratio, rel=1e-12)
    assert ratio == pytest.approx(1.763413, abs=1e-6)


def test_fp8_traffic_sp_gathers_and_parameter_gather():
    m = catalog.resolve_model("llama3-70b")
    c = one(tp=4, dp=8, zero_stage=1, sequence_parallel=True)

    def volumes(name):
        tr = spec(m, name)
        out: dict = {}
        for x in rank_collectives(m, tr, c, 0, Elements.of(tr)):
            key = (x.group, x.kind, x.what)
            out[key] = out.get(key, 0.0) + float(np.sum(x.calls * x.payload))
        return out

    bf16, fp8 = volumes("bf16"), volumes("fp8")
    for key, v in bf16.items():
        if not v:
            continue
        group, kind, what = key
        ratio = fp8[key] / v
        if group == "tp" and kind == "all_gather" and "output layer" not in what:
            assert ratio == pytest.approx(0.5), key  # FP8 linear inputs / output gradients
        elif group == "dp" and kind == "all_gather":  # FP8 parameter all-gather (1 B vs 2)
            assert ratio == pytest.approx(0.5), key
        else:  # reduce-scatters, all-reduces, gradients, the 16-bit output layer: unchanged
            assert ratio == pytest.approx(1.0), key


def test_mfu_stays_on_the_bf16_peak_and_fp8_is_faster():
    m = catalog.resolve_model("llama3-70b")
    lay = Layout(tp=8, pp=4, dp=2, zero_stage=1, micro_batch_size=1, recompute="full",
                 sequence_parallel=True, vpp=1)
    est = {p: estimate_layout(m, H100, spec(m, p, global_batch_size=64), lay) for p in ("bf16", "fp8")}
    th = est["fp8"].throughput
    # the same FLOPs over the FP8 peak (1978.9) instead of the BF16 one (989.4)
    assert float(th["mfu"][0]) == pytest.approx(float(th["mfu_fp8_peak"][0]) * 1978.9 / 989.4)
    assert "mfu_fp8_peak" not in est["bf16"].throughput
    assert float(est["fp8"].time["step"][0]) < float(est["bf16"].time["step"][0])


def test_published_llama31_405b_fp8_speedup_on_512_h100():
    # dgxc-benchmarking 25.05 (fp8_hardware.md 5.1): Llama 3.1 405B, 512 H100, TP8 PP8 CP2 VP8,
    # GBS 256: BF16 105,863 and FP8 161,072 tokens/s, a 1.52x speed-up (NeMo: bf16 gradients).
    # The predicted speed-up must be within 5 percentage points.
    m = catalog.resolve_model("llama3-405b")
    lay = Layout(tp=8, cp=2, pp=8, dp=4, zero_stage=0, distributed_optimizer=True,
                 micro_batch_size=1, recompute="none", sequence_parallel=True, vpp=8,
                 first_stage_layers=15, last_stage_layers=15)
    steps = {p: float(estimate_layout(m, H100, spec(m, p, global_batch_size=256, grad_bytes=2),
                                      lay).time["step"][0]) for p in ("bf16", "fp8")}
    assert steps["bf16"] / steps["fp8"] == pytest.approx(161072 / 105863, abs=0.05)


@pytest.mark.parametrize("hw, framework, name, match", [
    ("dgx-a100-80g", "megatron-core", "fp8", "needs FP8 tensor cores"),
    ("dgx-h100", "megatron-core", "mxfp8", "runs on Blackwell only"),
    ("dgx-h100", "deepspeed", "fp8", "trains without FP8"),
    ("dgx-h100", "torchtitan", "fp8-blockwise", "no 1x128 / 128x128"),
])
def test_precisions_a_system_cannot_run_are_refused_in_one_line(hw, framework, name, match):
    code = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8", "--hardware",
                                    hw, "--framework", framework, "--precision", name])
    assert code.exit_code == 2 and match in code.output and "Traceback" not in code.output
    assert code.output.count("\n") == 1


def test_a_plan_edited_to_mxfp8_on_h100_is_refused(tmp_path):
    m = catalog.resolve_model("llama3-8b")
    with pytest.raises(UsageError, match="Blackwell only"):
        check_layout(m, H100, spec(m, "mxfp8"), 8, {"tp": 1, "pp": 1, "dp": 8})


def _plan(model: str, hw, name: str, **layout) -> Plan:
    m = catalog.resolve_model(model)
    base = dict(tp=2, pp=1, dp=4, zero_stage=1, micro_batch_size=1, recompute="none",
                sequence_parallel=True, vpp=1)
    lay = Layout(**{**base, **layout})
    return Plan(plan3d_version=__version__, model=m, hardware=hw, gpus=lay.gpus,
                training=spec(m, name, global_batch_size=64), layout=lay)


def test_megatron_fp8_arguments():
    def flags(plan):
        out = {}
        for line in export_plan(plan, "megatron").text.splitlines():
            if line.strip() and not line.startswith("#"):
                parts = line.rstrip(" \\").split()
                out[parts[0]] = parts[1] if len(parts) > 1 else None
        return out
    known = options("megatron_options.txt")
    fp8 = flags(_plan("llama3-8b", H100, "fp8"))
    assert set(fp8) <= known
    assert (fp8["--fp8-format"], fp8["--fp8-recipe"]) == ("hybrid", "tensorwise")
    assert "--fp8-param-gather" in fp8  # ZeRO-1 is Megatron's distributed optimizer here
    ddp = flags(_plan("llama3-8b", H100, "fp8", zero_stage=0))
    assert "--fp8-param-gather" not in ddp  # Megatron: param gather needs a sharded optimizer
    mx = flags(_plan("llama3-8b", B200, "mxfp8"))
    assert (mx["--fp8-format"], mx["--fp8-recipe"]) == ("e4m3", "mxfp8")
    assert "--reuse-grad-buf-for-mxfp8-param-ag" in mx and set(mx) <= known
    block = flags(_plan("llama3-8b", H100, "fp8-blockwise"))
    assert block["--fp8-recipe"] == "blockwise" and "--fp8-param-gather" not in block
    assert "--fp8-format" not in flags(_plan("llama3-8b", H100, "bf16"))


def test_bridge_presets_and_torchtitan_converters():
    # the presets Megatron-Bridge registers (training/mixed_precision.py @05097809, by function name)
    presets = {"bf16_mixed", "fp16_mixed", "bf16_with_fp8_current_scaling_mixed",
               "bf16_with_fp8_subchannel_scaling_mixed", "bf16_with_mxfp8_mixed"}
    for hw, name in ((H100, "bf16"), (H100, "fp8"), (H100, "fp8-blockwise"), (B200, "mxfp8")):
        fields = yaml.safe_load(export_plan(_plan("llama3-8b", hw, name), "nemo").text)
        assert fields["mixed_precision"] in presets
    fsdp = dict(tp=1, dp=8, zero_stage=3, sequence_parallel=False)
    # torchtitan 0.2.2: converters are registered as quantize.linear.mx / .float8
    # (components/quantization/mx.py L171, float8.py L238); MXLinear.recipe_name defaults to
    # "mxfp8_cublas" (config/job_config.py MXLinear)
    toml = export_plan(_plan("llama3-8b", B200, "mxfp8", **fsdp), "torchtitan", "toml")
    assert 'converters = ["quantize.linear.mx"]' in toml.text
    assert 'recipe_name = "mxfp8_cublas"' in toml.text
    assert set(toml.keys) <= options("torchtitan_0.2_toml_options.txt")
    # fp8 is costed as per-tensor scaling: torchao's tensorwise recipe, which 0.2.2 has
    # (job_config.py Float8Linear.recipe_name) and 0.3.0 does not (rowwise only): refused there
    fp8 = _plan("llama3-8b", H100, "fp8", **fsdp)
    toml = export_plan(fp8, "torchtitan", "toml")
    assert 'recipe_name = "tensorwise"' in toml.text and "rowwise" not in toml.text
    with pytest.raises(UsageError, match="only rowwise float8 recipes"):
        export_plan(fp8, "torchtitan")


def test_search_and_plan_record_the_precision(tmp_path):
    plan = tmp_path / "p.yaml"
    r = CliRunner().invoke(app, ["search", "--model", "llama3-8b", "--gpus", "16", "--precision",
                                 "fp8", "--export", str(plan), "--top", "1", "--json"])
    assert r.exit_code == 0, r.output
    entry = json.loads(r.stdout)[0]
    assert entry["throughput"]["mfu_fp8_peak"] < entry["throughput"]["mfu"]
    assert yaml.safe_load(plan.read_text())["training"]["precision"] == "fp8"
    r = CliRunner().invoke(app, ["estimate", "--plan", str(plan), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["throughput"]["mfu_fp8_peak"] > 0
