"""The FP8 GEMM shape rules (planner/search/fp8_rules.py): Transformer Engine asserts the tokens
of every FP8 GEMM operand a multiple of 8 and the weight (out, in) multiples of (8, 16)
(transformer_engine/pytorch/utils.py assert_dim_for_fp8_exec; TransformerEngine#1422, #232,
#688), MXFP8 blocks of 32 on both dimensions (MXFP8Quantizer.make_empty); torchao's float8
rowwise runs torch._scaled_mm over the tokens for the weight gradient (x 16), MX blocks of 32.
Values derived by hand in each case."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.frameworks.profile import resolve_training
from planner.layout import Layout
from planner.plan import Plan
from planner.search.framework_rules import broken_rules
from tests.test_framework_profiles import cli

TOKENS_TE = "Megatron-Core (Transformer Engine, {p}): the tokens of each FP8 GEMM, seq/cp/(tp with SP) x mbs, a multiple of {k}"
WIDTHS_TE = "Megatron-Core (Transformer Engine, {p}): every FP8 GEMM's weight per GPU (out, in) a multiple of ({o}, {i})"
TOKENS_AO = "torchtitan (torchao, {p}): the tokens of each FP8 GEMM, seq/cp x mbs, a multiple of {k}"


def broken(model: str, precision: str, seq: int, framework: str = "megatron-core", **layout) -> list[str]:
    m, fw = catalog.resolve_model(model), catalog.resolve_framework(framework)
    tr = resolve_training({"seq_length": seq, "global_batch_size": 256}, fw).model_copy(
        update={"precision": precision})
    lay = dict(pp=1, zero_stage=3 if framework == "torchtitan" else 1, micro_batch_size=1)
    return broken_rules(fw, m, tr, Layout(**{**lay, **layout}))


def test_the_reported_layout_is_refused_by_every_consumer(tmp_path):
    # Llama 3 8B, tp 4 with SP, seq 4100: each FP8 GEMM quantizes 4100/4 x 1 = 1025 tokens, and
    # 1025 = 8 x 128 + 1; estimate accepted it and export wrote --fp8-param-gather for it
    code, out, err = cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "4",
                         "--sequence-parallel", "--seq-length", "4100", "--global-batch-size", "64",
                         "--precision", "fp8")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert TOKENS_TE.format(p="fp8", k=8) in err and "4100/1/4 x 1 = 1025 tokens" in err
    code, _, err = cli("search", "--model", "llama3-8b", "--gpus", "8", "--tp", "4",
                       "--sequence-parallel", "--seq-length", "4100", "--global-batch-size", "64",
                       "--precision", "fp8", "--micro-batch-size", "1")
    assert code != 0 and TOKENS_TE.format(p="fp8", k=8) in err
    m = catalog.resolve_model("llama3-8b")
    tr = resolve_training({"seq_length": 4100, "global_batch_size": 64}, catalog.resolve_framework())
    plan = Plan(plan3d_version="0.0.0", model=m, hardware=catalog.resolve_hardware("dgx-h100"), gpus=8,
                training=tr.model_copy(update={"precision": "fp8"}),
                layout=Layout(tp=4, pp=1, dp=2, zero_stage=1, micro_batch_size=1, sequence_parallel=True))
    for target in ("megatron", "nemo"):
        with pytest.raises(UsageError, match="the tokens of each FP8 GEMM"):
            export_plan(plan, target)


@pytest.mark.parametrize("precision, seq, layout, refused", [
    # 4100/4 x 8 = 8200 = 8 x 1025: a multiple of 8
    ("fp8", 4100, dict(tp=4, dp=2, sequence_parallel=True, micro_batch_size=8), False),
    # no SP: the GEMM's 4100 x 1 tokens, 4100 = 8 x 512 + 4
    ("fp8", 4100, dict(tp=4, dp=2), True),
    # cp 2: 4104/2 = 2052 = 8 x 256 + 4
    ("fp8-blockwise", 4104, dict(tp=1, cp=2, dp=4), True),
    # 4160/4 = 1040 = 8 x 130 (fp8 runs) = 32 x 32 + 16 (MXFP8 does not)
    ("fp8", 4160, dict(tp=4, dp=2, sequence_parallel=True), False),
])
def test_transformer_engine_tokens(precision, seq, layout, refused):
    k = 32 if precision == "mxfp8" else 8
    assert (TOKENS_TE.format(p=precision, k=k) in broken("llama3-8b", precision, seq, **layout)) is refused


def test_mxfp8_needs_blocks_of_32():
    # (the library's rule whatever the GPU) 4160/4 = 1040 tokens, 1040 % 32 = 16; 4096/4 = 1024 = 32 x 32 runs
    fw, m = catalog.resolve_framework(), catalog.resolve_model("llama3-8b")
    tr = resolve_training({"seq_length": 4160, "global_batch_size": 256}, fw).model_copy(
        update={"precision": "mxfp8"})
    lay = Layout(tp=4, pp=1, dp=2, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    assert TOKENS_TE.format(p="mxfp8", k=32) in broken_rules(fw, m, tr, lay)
    tr = tr.model_copy(update={"seq_length": 4096})
    assert not any("FP8 GEMM" in r for r in broken_rules(fw, m, tr, lay))


def test_weight_widths_per_gpu():
    # DeepSeek-V2-Lite's dense layer: f = 10944. At tp 8 its fc2 weight is (2048, 10944/8 = 1368)
    # per GPU, 1368 = 16 x 85 + 8: refused; at tp 4, (2048, 2736), 2736 = 16 x 171 runs FP8,
    # but not MXFP8 (2736 = 32 x 85 + 16). Tokens 4096/tp x 1 pass (multiples of 32).
    fp8 = WIDTHS_TE.format(p="fp8", o=8, i=16)
    mx = WIDTHS_TE.format(p="mxfp8", o=32, i=32)
    moe = dict(ep=1, sequence_parallel=True)
    assert fp8 in broken("deepseek-v2-lite", "fp8", 4096, tp=8, dp=1, **moe)
    assert fp8 not in broken("deepseek-v2-lite", "fp8", 4096, tp=4, dp=2, **moe)
    assert mx in broken("deepseek-v2-lite", "mxfp8", 4096, tp=4, dp=2, **moe)
    # Llama 3 8B at tp 8: qkv (32/8 + 2 x 8/8) x 128 = 768 rows of h 4096, proj (4096, 512),
    # fc1 (2 x 14336/8 = 3584, 4096), fc2 (4096, 1792): all multiples of 32
    assert not any("FP8 GEMM" in r for r in broken("llama3-8b", "fp8", 4096, tp=8, dp=1,
                                                   sequence_parallel=True))


def test_torchao_tokens_are_the_gathered_sequence():
    # torchtitan's float8 rowwise: the weight-gradient _scaled_mm contracts over seq/cp x mbs
    # tokens, which must be a multiple of 16; SP does not divide them (DTensor gathers first).
    # 4104 x 1 = 16 x 256 + 8: refused (Transformer Engine would take 4104 = 8 x 513);
    # 4104 x 2 = 8208 = 16 x 513 runs; tp 4 with SP: still 4104 tokens, refused
    rule = TOKENS_AO.format(p="fp8", k=16)
    base = dict(framework="torchtitan", dp=8, tp=1)
    assert rule in broken("llama3-8b", "fp8", 4104, **base)
    assert rule not in broken("llama3-8b", "fp8", 4104, **{**base, "micro_batch_size": 2})
    assert rule in broken("llama3-8b", "fp8", 4104, framework="torchtitan", tp=4, dp=2,
                          sequence_parallel=True)
    assert TOKENS_TE.format(p="fp8", k=8) not in broken("llama3-8b", "fp8", 4104, tp=1, dp=8)
