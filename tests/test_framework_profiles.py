"""Framework profiles: the schema and its sources, one resolved TrainingSpec, the rules of each
framework in the search and in its export (one source), the memory accounting and reserve, and
the cases that showed the training software is an input (values derived by hand below)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from planner import catalog
from planner.cost.model_counts import total_params
from planner.cost.memory import activation_per_layer
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.frameworks.profile import Overrides, resolve_training
from planner.search.framework_rules import broken_rules
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec

GIB = 2.0**30
MIB = 2.0**20
DATA = Path(__file__).parent / "data"
SHIPPED = ("megatron-core", "megatron-lm-2021", "megatron-lm-2022", "deepspeed", "deepspeed-2021",
           "torchtitan", "torchtitan-2024", "llm-foundry")


def cli(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, env={"COLUMNS": "80", "PATH": ""})
    return proc.returncode, proc.stdout, proc.stderr


def options(name: str) -> set[str]:
    lines = (DATA / name).read_text(encoding="utf-8").splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")}


# ----------------------------------------------------------------------------- schema, sources


def test_shipped_profiles_source_every_fact():
    profiles = catalog.framework_profiles()
    assert set(profiles) == set(SHIPPED)
    for p in profiles.values():
        for block in (p.rules, p.runtime, p.memory, p.reserve):
            facts = [f for f in type(block).model_fields if f != "sources"]
            assert sorted(block.sources) == sorted(facts), p.name
            assert all(len(block.sources[f].strip()) > 10 for f in facts), p.name
    assert {p.export for p in profiles.values()} == {"megatron", "deepspeed", "torchtitan", None}


def test_a_fact_without_a_source_and_extends(tmp_path):
    base = yaml.safe_load((catalog.catalog_dir("framework_profiles") / "deepspeed.yaml").read_text())
    del base["runtime"]["sources"]["flash_attention"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**base, "name": "mine"}))
    with pytest.raises(UsageError, match="runtime: .*flash_attention has no source"):
        catalog.resolve_framework(str(bad))
    # a user profile extends a shipped one: the given facts replace, each with its source
    mine = tmp_path / "mine.yaml"
    mine.write_text(textwrap.dedent("""\
        name: my-deepspeed
        extends: deepspeed
        display: My DeepSpeed
        runtime:
          flash_attention: false
          sources: {flash_attention: our model code has no flash attention}
        """))
    p = catalog.resolve_framework(str(mine))
    assert p.name == "my-deepspeed" and not p.runtime.flash_attention
    assert p.rules == catalog.resolve_framework("deepspeed").rules
    unsourced = tmp_path / "unsourced.yaml"
    unsourced.write_text("name: x\nextends: deepspeed\nruntime: {flash_attention: false}\n")
    with pytest.raises(UsageError, match="runtime.flash_attention changes the fact of deepspeed "
                                         "without a source"):  # the parent's source no longer fits
        catalog.resolve_framework(str(unsourced))
    with pytest.raises(UsageError, match="not a shipped framework profile"):
        catalog.validate_framework({"name": "x", "extends": "nope"}, "x.yaml")


def test_megatron_core_is_the_training_spec_default():
    # the cost model's defaults and the default profile are one set of facts
    job = TrainingSpec(seq_length=2048, global_batch_size=1536)
    assert resolve_training(job, catalog.resolve_framework()) == job


def test_overrides_set_single_facts():
    job = {"seq_length": 2048, "global_batch_size": 8}
    ds = catalog.resolve_framework("deepspeed")
    t = resolve_training(job, ds)
    assert (t.framework, t.grad_bytes, t.flash_attention, t.zero3_gather_unit) == ("deepspeed", 2, True, "module")
    t = resolve_training(job, ds, Overrides(flash_attention=False, grad_dtype="fp32", allocator_reserve=0.05))
    assert (t.grad_bytes, t.flash_attention, t.reserve_allocator) == (4, False, 0.05)
    with pytest.raises(UsageError, match="does not train in fp16"):
        resolve_training({**job, "dtype": "fp16"}, catalog.resolve_framework("torchtitan"))


# ----------------------------------------------------------------------------- DeepSpeed: cp, ZeRO-2


def test_cp_plan_refused_by_deepspeed_and_deepspeed_search(tmp_path):
    plan = tmp_path / "plan.yaml"
    code, _, err = cli("search", "--model", "175b", "--gpus", "512", "--cp", "2", "--export", str(plan))
    assert code == 0, err
    code, out, err = cli("export", str(plan), "--to", "deepspeed")
    assert code == 2 and out == "" and "DeepSpeed has no Megatron-style context parallelism" in err
    # --framework deepspeed searches only what DeepSpeed runs, and why-not names its rule
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--framework", "deepspeed",
                         "--json", "--top", "50")
    assert code == 0, err
    for entry in json.loads(out):
        lay = entry["layout"]
        assert lay["cp"] == 1 and lay["vpp"] == 1 and not lay["sequence_parallel"]
        assert lay["pp"] == 1 or lay["zero_stage"] <= 1
        assert lay["first_stage_layers"] == 0
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--framework", "deepspeed",
                         "--why-not", "cp=2")
    assert code == 0 and "DeepSpeed has no Megatron-style context parallelism" in out, err


def test_deepspeed_zero2_model_states_and_grad_dtype():
    # Llama-2 7B on 8 GPUs, dp 8, ZeRO-2: DeepSpeed keeps 16-bit weights replicated and shards
    # 16-bit grads + fp32 grads + fp32 weights + Adam m, v: 2 + (2 + 4 + 4 + 8)/8 = 4.25 B per
    # parameter (its estimator after PR #5099: 2P + 18P/N); Megatron-Core's ZeRO-2 with fp32
    # grads: 2 + (4 + 12)/8 = 4 B. tp = pp = 1: the GPU holds every parameter (vocab 32000 is
    # already a multiple of 128, no padding).
    from planner.cost.step import estimate_layout
    m, hw = catalog.resolve_model("llama2-7b"), catalog.resolve_hardware("dgx-h100")
    p = total_params(m)
    lay = Layout(tp=1, pp=1, dp=8, zero_stage=2, micro_batch_size=1)

    def states(framework, grad=None):
        tr = resolve_training({"seq_length": 4096, "global_batch_size": 8},
                              catalog.resolve_framework(framework), Overrides(grad_dtype=grad))
        mem = estimate_layout(m, hw, tr, lay).memory
        return float(mem["weights"][0] + mem["gradients"][0] + mem["optimizer"][0])

    assert states("deepspeed") == pytest.approx(4.25 * p, rel=1e-12)  # 28.64e9 B
    assert states("megatron-core") == pytest.approx(4.0 * p, rel=1e-12)
    assert states("deepspeed", "fp32") == pytest.approx(4.0 * p, rel=1e-12)  # no 16-bit copy then
    code, out, err = cli("estimate", "--model", "llama2-7b", "--gpus", "8", "--dp", "8",
                         "--zero-stage", "2", "--framework", "deepspeed")
    assert code == 0, err
    assert "framework deepspeed: flash attention, bf16 gradients" in out.replace("\n", " ")
    code, out, err = cli("estimate", "--model", "llama2-7b", "--gpus", "8", "--dp", "8",
                         "--zero-stage", "2", "--framework", "deepspeed", "--grad-dtype", "fp32")
    assert code == 0 and "fp32 gradients" in out
    code, _, err = cli("estimate", "--model", "llama2-7b", "--gpus", "8", "--grad-dtype", "fp8")
    assert code == 2 and "--grad-dtype must be fp32 or bf16" in err


# ----------------------------------------------------------------------------- torchtitan: m >= pp


def test_torchtitan_refuses_fewer_microbatches_than_stages(tmp_path):
    # Llama-3 8B, pp 8, dp 1, global batch 4: m = 4 / (1 * mbs) <= 4 < 8 stages, which PyTorch's
    # Schedule1F1B refuses ("Number of microbatches (4) must be greater than or equal to the
    # number of stages (8)"); Megatron-Core's 1F1B runs it (warm-up min(pp - rank - 1, m))
    plan = tmp_path / "plan.yaml"
    base = ("--model", "llama3-8b", "--gpus", "8", "--pp", "8", "--dp", "1", "--global-batch-size", "4")
    code, _, err = cli("search", *base, "--export", str(plan))
    assert code == 0, err
    code, out, err = cli("export", str(plan), "--to", "torchtitan")
    assert code == 2 and "torchtitan: 1F1B needs micro-batches >= pipeline stages" in err, err
    code, out, err = cli("search", *base, "--framework", "torchtitan")
    assert code == 2 and "micro-batches" in err and "torchtitan" in err, err


def test_torchtitan_interleaving_follows_pytorch_rounds():
    from planner.search.framework_rules import framework_masks
    titan = catalog.resolve_framework("torchtitan")
    m = catalog.resolve_model("llama3-8b")
    # pp 4, vpp 2: m 10 -> rounds 2, 10 % 2 = 0 runs; m 9 -> rounds 2, 9 % 2 = 1 raises in PyTorch
    c = Candidates.from_layouts([Layout(tp=1, pp=4, dp=1, zero_stage=0, micro_batch_size=1, vpp=2)])
    rule = "torchtitan: interleaved 1F1B needs >= pp micro-batches, a multiple of m // pp"
    for batch, ok in ((10, True), (9, False), (8, True), (3, False)):
        tr = resolve_training({"seq_length": 8192, "global_batch_size": batch}, titan)
        assert bool(framework_masks(titan, m, tr, c)[rule][0]) is ok, batch


# ----------------------------------------------------------------------------- flash attention


V100 = textwrap.dedent("""\
    name: dgx1-v100-32g
    gpu:
      name: V100-SXM2-32GB
      hbm_capacity: 32 GiB
      hbm_bandwidth: 900 GB/s
      peak_tflops: {fp16: 125, bf16: 125}
      source: NVIDIA V100 datasheet (SXM2 32 GB, 900 GB/s, 125 TFLOP/s fp16 tensor); V100 has no bf16, its fp16 peak stands in
    gpus_per_node: 8
    intra_node: {name: NVLink 2, bandwidth_per_gpu: 150 GB/s, latency: 10 us, source: V100 datasheet 300 GB/s both ways}
    inter_node: {name: EDR InfiniBand, nics_per_node: 4, bandwidth_per_nic: 100 Gb/s, latency: 20 us, source: DGX-1 datasheet}
    efficiency: {matmul: 0.7, matmul_half_flops: 5.0e+8, attention: 0.5, hbm: 0.85, nvlink: 0.78, network: 0.9, source: test profile}
    """)

GPT2_LARGE = textwrap.dedent("""\
    name: gpt2-large
    source: Radford et al. 2019 Table 2 (36 layers, d_model 1280); HF gpt2-large config (20 heads, 1024 positions, vocab 50257, dropout 0.1)
    num_layers: 36
    hidden_size: 1280
    num_attention_heads: 20
    vocab_size: 50257
    activation: gelu
    norm: layernorm
    bias: true
    tie_embeddings: true
    position_embedding: learned
    max_position_embeddings: 1024
    dropout: 0.1
    training: {seq_length: 1024, global_batch_size: 512}
    """)


def test_no_flash_attention_gpt2_large_on_a_v100(tmp_path):
    """GPT-2 large on one 32 GiB V100, micro-batch 8 (megatron-core; tp = pp = dp = 1).

    Parameters: a layer 4h^2 + 8h^2 + biases (3h + h + 4h + h = 11,520) + two LayerNorms
    (5,120) = 19,677,440; 36 layers 708,387,840; embedding 50304 (padded to 128) x 1280
    = 64,389,120; positions 1024 x 1280 = 1,310,720; final norm 2,560 (tied output, pp = 1):
    P = 774,090,240. States 18 B/param (bf16 weights, fp32 grads, fp32 master + Adam; dp = 1):
    13,933,624,320 B.
    Activations per layer per token without flash attention: Korthikanti's 34h + 5as =
    43,520 + 102,400 = 145,920 B; x s*b = 8192 tokens x 36 layers = 43,033,559,040 B; the
    embedding's ids and dropout mask 8192 x (8 + 1280) = 10,551,296 B; the output layer's
    inputs and logits 8192 x (4h + 6 x 50304) = 2,514,485,248 B: 45,558,595,584 B.
    Reserve: 1 GiB runtime, no NCCL communicator on one GPU, 0.2 x 45,558,595,584:
    1,073,741,824 + 9,111,719,116.8 B.
    Total 69,677,680,844.8 B = 64.89 GiB > 32 GiB (the flat 3 GiB of before gave 58.4 GiB).
    With flash attention the scores become the fp32 log-sum-exp, 4a = 80 B per token:
    36 x 8192 x 43,600 + 2,525,036,544 = 15,383,199,744 B of activations, reserve
    1,073,741,824 + 3,076,639,948.8: total 33,467,205,836.8 B = 31.17 GiB, which fits.
    """
    hw, model = tmp_path / "v100.yaml", tmp_path / "gpt2-large.yaml"
    hw.write_text(V100)
    model.write_text(GPT2_LARGE)
    base = ("--model", str(model), "--hardware", str(hw), "--gpus", "1")
    code, out, err = cli("estimate", *base, "--micro-batch-size", "8", "--no-flash-attention", "--json")
    assert code == 1, err  # does not fit
    d = json.loads(out)
    assert d["memory"]["total"] == pytest.approx(69_677_680_844.8, rel=1e-12)
    assert d["memory"]["activations"] == pytest.approx(45_558_595_584, rel=1e-12)
    assert not d["memory"]["fits"]
    code, out, err = cli("estimate", *base, "--micro-batch-size", "8", "--json")
    assert code == 0, err
    assert json.loads(out)["memory"]["total"] == pytest.approx(33_467_205_836.8, rel=1e-12)
    # the search under the same assumption no longer proposes micro-batch 8 without recompute
    code, out, err = cli("search", *base, "--no-flash-attention", "--json", "--top", "1")
    assert code == 0, err
    lay = json.loads(out)[0]["layout"]
    assert lay["micro_batch_size"] < 8 or lay["recompute"] != "none"
    code, out, err = cli("search", *base, "--no-flash-attention", "--top", "1")
    assert "framework megatron-core: no flash attention" in out.replace("\n", " ")


# ----------------------------------------------------------------------------- KV heads vs TP

CHATGLM2 = textwrap.dedent("""\
    name: chatglm2-6b
    source: THUDM/chatglm2-6b config.json (28 layers, hidden 4096, 32 heads, multi_query_group_num 2, ffn 13696, padded_vocab_size 65024)
    num_layers: 28
    hidden_size: 4096
    num_attention_heads: 32
    num_kv_heads: 2
    ffn_hidden_size: 13696
    vocab_size: 65024
    activation: swiglu
    norm: rmsnorm
    position_embedding: rope
    training: {seq_length: 4096, global_batch_size: 256}
    """)


def test_kv_heads_below_tp_is_a_framework_rule(tmp_path):
    path = tmp_path / "chatglm2.yaml"
    path.write_text(CHATGLM2)
    base = ("--model", str(path), "--gpus", "8", "--tp", "4")
    code, out, err = cli("estimate", *base)  # Megatron-Core: tp 4 = 2 x 2 KV heads
    assert code == 0, err
    code, out, err = cli("estimate", *base, "--framework", "torchtitan", "--zero-stage", "3")
    assert code == 2 and "torchtitan: tp divides the KV heads" in err, err
    # each of the 4 ranks keeps K and V of one KV head: per token per layer (bf16, no SP)
    # 8h (norm, QKV and fc1 inputs) + [2d(a + 2*max(g,t)) + 2ad + 6f]/t + flash lse 4a/t
    # = 32,768 + (10,240 + 8,192 + 82,176)/4 + 128/4 = 32,768 + 25,152 + 32 = 57,952 B
    m = catalog.resolve_model(str(path))
    c = Candidates.from_layouts([Layout(tp=4, pp=1, dp=2, zero_stage=1, micro_batch_size=1)])
    tr = TrainingSpec(seq_length=4096, global_batch_size=256)
    assert float(activation_per_layer(m, tr, c)[0]) == pytest.approx(4096 * 57_952, rel=1e-12)


# ----------------------------------------------------------------------------- reserve, stages


def test_the_reserve_scales_with_the_working_set():
    # llama3-70b on 64 H100: the winner keeps, beyond its tensors, 1 GiB + 0.6 GiB per NCCL
    # communicator + 20 % of its activations and buffers (megatron-core's profile)
    from planner.search.run import search
    m, hw = catalog.resolve_model("llama3-70b"), catalog.resolve_hardware("dgx-h100")
    tr = resolve_training({"seq_length": m.training.seq_length, "global_batch_size": 1024},
                          catalog.resolve_framework())
    best = search(m, hw, tr, 64).ranked
    mem = {k: float(v[0]) for k, v in best.memory.items()}
    c = best.candidates.take(np.array([0]))
    expected = GIB + 600 * MIB * int(c.communicators[0]) + 0.2 * (mem["activations"] + mem["other"])
    assert mem["reserve"] == pytest.approx(expected, rel=1e-12)
    assert mem["reserve"] > 0.2 * mem["activations"] > 0
    assert mem["total"] == pytest.approx(sum(mem[k] for k in ("weights", "gradients", "optimizer",
                                                              "activations", "other", "reserve")))
    assert mem["total"] <= mem["capacity"]


def test_estimate_shows_every_pipeline_stage():
    """Llama-2 7B, 16 GPUs, dp 8, pp 2, micro-batch 2, global batch 2048 (seq 4096), ZeRO-1.

    Per layer per token (SwiGLU, RMSNorm, no dropout, flash): 8h + 2d(a + 2g) + 2ad + 6f + 4a
    = 32,768 + 24,576 + 8,192 + 66,048 + 128 = 131,712 B; x 8192 tokens = 1,078,984,704 B.
    m = 2048 / (8 x 2) = 128. First stage: 2 micro-batches x 16 layers in flight + ids
    2 x 8192 x 8 B = 34,527,641,600 B; 16 layers x 202,383,360 + embedding 32000 x 4096 =
    3,369,205,760 params x (2 + 4 + 12/8) B = 25,269,043,200 B; reserve 1 GiB + 3 NCCL
    communicators (pp, dp, tp*pp) x 600 MiB + 0.2 x activations = 9,866,706,944 B:
    69,663,391,744 B = 64.88 GiB. Last stage: 1 micro-batch x 16 layers + final-norm/output
    inputs and logits 8192 x (4 x 4096 + 6 x 32000) = 18,970,836,992 B; 3,369,209,856 params
    x 7.5 = 25,269,073,920 B; reserve 6,755,346,022.4 B: 50,995,256,934.4 B = 47.49 GiB.
    (With the flat 3 GiB of before: 58.60 and 44.20 GiB; the command printed only the first.)
    """
    base = ("estimate", "--model", "llama2-7b", "--gpus", "16", "--dp", "8", "--pp", "2",
            "--micro-batch-size", "2", "--global-batch-size", "2048")
    code, out, err = cli(*base, "--json")
    assert code == 0, err
    pipe = json.loads(out)["pipeline"]
    first, last = pipe["ranks"]
    assert first["memory_total"] == pytest.approx(69_663_391_744, rel=1e-12)
    assert last["memory_total"] == pytest.approx(50_995_256_934.4, rel=1e-12)
    assert (first["kind"], last["kind"], pipe["binding"]) == ("first", "last", 0)
    times = [first["microbatch_time"], last["microbatch_time"]]
    assert pipe["imbalance"] == pytest.approx(max(times) / (sum(times) / 2), rel=1e-12)
    assert pipe["slowest"] == times.index(max(times))
    code, out, err = cli(*base)
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith((" first", " last"))}
    assert "64.88" in rows["first"] and "binds memory" in rows["first"]
    assert "47.49" in rows["last"]
    assert "stage imbalance:" in out


# ----------------------------------------------------------------------------- one source: exports


def _sample_layouts(model: str, gpus: int, batch: int, count: int, seed: int):
    """``count`` layouts of the search space that pass the rules every framework shares."""
    from planner.search.options import SearchOptions
    from planner.search.grid import enumerate_space
    from planner.search.rules import constraint_masks
    m, hw = catalog.resolve_model(model), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=m.training.seq_length, global_batch_size=batch)
    c = enumerate_space(m, hw, tr, gpus, SearchOptions(max_vpp=4, max_cp=2))
    masks = constraint_masks(m, tr, hw, c)
    generic = np.ones(len(c), dtype=bool)
    for rule, ok in masks.items():
        if ":" not in rule:  # framework rules are named "<framework>: ..."
            generic &= np.broadcast_to(ok, generic.shape)
    index = np.flatnonzero(generic)
    pick = np.random.default_rng(seed).choice(index, size=min(count, index.size), replace=False)
    return m, tr, [c.layout(int(i)) for i in pick]


@pytest.mark.parametrize("model,gpus,batch", [("llama3-8b", 64, 512), ("175b", 256, 1536),
                                               ("qwen3-30b-a3b", 64, 512)])
def test_framework_rules_and_export_refusals_agree(model, gpus, batch):
    from planner import __version__
    from planner.plan import Plan
    m, tr, layouts = _sample_layouts(model, gpus, batch, 150, seed=gpus)
    hw = catalog.resolve_hardware("dgx-h100")
    for target, name in (("megatron", "megatron-core"), ("deepspeed", "deepspeed"),
                         ("torchtitan", "torchtitan")):
        profile = catalog.resolve_framework(name)
        runs = refused = 0
        for lay in layouts:
            plan = Plan(plan3d_version=__version__, model=m, hardware=hw, gpus=lay.gpus,
                        training=tr, layout=lay)
            broken = broken_rules(profile, m, tr, lay)
            if broken:
                with pytest.raises(UsageError, match="cannot run this plan"):
                    export_plan(plan, target)
                refused += 1
            else:
                export_plan(plan, target)
                runs += 1
        # Llama-3 8B (untied) exercises both outcomes for every framework; GPT-3's tied
        # embeddings keep torchtitan to pp = 1, which the sample may not hold; Qwen3-30B-A3B
        # adds the expert rules (DeepSpeed: ep divides dp; torchtitan: etp = 1, EP from FSDP)
        if model == "llama3-8b":
            assert runs and (refused or name == "megatron-core"), (name, runs, refused)


@pytest.mark.parametrize("framework,target,check", [
    ("megatron-core", "megatron", "megatron_options.txt"),
    ("deepspeed", "deepspeed", "deepspeed_keys.txt"),
    ("torchtitan", "torchtitan", "torchtitan_0.3_options.txt"),
])
def test_main_job_per_framework_exports_what_its_parser_accepts(tmp_path, framework, target, check):
    plan = tmp_path / "p.yaml"
    code, _, err = cli("search", "--model", "175b", "--gpus", "512", "--framework", framework,
                       "--export", str(plan), "--top", "1")
    assert code == 0, err
    saved = yaml.safe_load(plan.read_text())
    assert saved["framework"]["name"] == saved["training"]["framework"] == framework
    code, out, err = cli("export", str(plan), "--to", framework)
    assert code == 0, err
    code2, out2, _ = cli("export", str(plan))  # the plan's framework is the default target
    assert (code2, out2) == (0, out)
    text = "\n".join(ln for ln in out.splitlines() if not ln.startswith("#"))
    if target == "megatron":
        keys = {ln.rstrip(" \\").split()[0] for ln in text.splitlines() if ln.strip()}
    elif target == "deepspeed":
        def flat(d, prefix=""):
            return [k for key, v in d.items()
                    for k in (flat(v, f"{prefix}{key}.") if isinstance(v, dict) else [prefix + key])]
        keys = set(flat(json.loads(text)))
    else:
        keys = {ln.rstrip(" \\").split()[0][2:].replace(".no_", ".") for ln in text.splitlines()
                if ln.startswith("--")}
    assert keys and keys <= options(check), keys - options(check)


def test_historical_profiles_have_no_exporter(tmp_path):
    plan = tmp_path / "p.yaml"
    code, _, err = cli("search", "--model", "megatron-1.7b", "--gpus", "32", "--framework",
                       "megatron-lm-2021", "--export", str(plan), "--top", "1")
    assert code == 0, err
    code, _, err = cli("export", str(plan))
    assert code == 2 and "has no exporter" in err
    code, out, err = cli("export", str(plan), "--to", "megatron")
    assert code == 0, err


def test_model_rules_refuse_before_searching():
    # Megatron-Core builds no ALiBi model; DeepSpeed runs the model code it is given
    code, _, err = cli("search", "--model", "mpt-7b", "--gpus", "8")
    assert code == 2 and "Megatron-Core has no alibi position embedding" in err
    code, _, err = cli("search", "--model", "mpt-7b", "--gpus", "8", "--framework", "deepspeed", "--top", "1")
    assert code == 0, err


# ----------------------------------------------------------------------------- published runs


def test_each_published_run_resolves_its_facts_from_a_profile():
    from planner.fidelity.runs import default_dataset, load_runs
    expected = {"megatron21-t1-": ("megatron-lm-2021", "fp16"),
                "megatron21-t2-ptd-": ("megatron-lm-2021", "fp16"),
                "megatron21-t2-zero3-": ("deepspeed-2021", "fp16"),
                "megatron-readme2020-": ("megatron-lm-2021", "fp16"),
                "korthikanti22-": ("megatron-lm-2022", "fp16"),
                "mosaic-": ("llm-foundry", "bf16"), "vocabpar-": ("megatron-core", "bf16")}
    pure = {"mosaic-mpt-70b-a100_80gb-64gpu-seq2048", "mosaic-mpt-70b-a100_40gb-128gpu-seq2048",
            "mosaic-mpt-30b-a100_40gb-128gpu-seq2048", "mosaic-mpt-13b-a100_40gb-128gpu-seq2048",
            "mosaic-mpt-7b-a100_40gb-128gpu-seq2048"}  # [precision=bf16 (PURE)]: bf16 reduction
    checked = 0
    for case in load_runs(default_dataset()):
        if case.training is None:
            continue
        name, dtype = next(v for k, v in expected.items() if case.id.startswith(k))
        grad = Overrides(grad_dtype="bf16") if case.id in pure else None
        job = {"seq_length": case.training.seq_length, "dtype": dtype,
               "global_batch_size": case.training.global_batch_size}
        assert case.training == resolve_training(job, catalog.resolve_framework(name), grad), case.id
        assert not any(a.startswith("framework=") for a in case.assumptions), case.id
        checked += 1
    assert checked == 56
    # the facts the loader once inferred from years and wording, now the profiles':
    k22 = catalog.resolve_framework("megatron-lm-2022")
    assert (k22.runtime.flash_attention, k22.runtime.overlap_grad_reduce,
            k22.runtime.tp_backward_overlap, k22.memory.gradients["fp16"]) == (False, False, True, "fp32")
    ds21 = catalog.resolve_framework("deepspeed-2021")
    # DeepSpeed issue #1174: 5.1e9 params x 2 B x 7/8 received in 0.42 s = 21.25 GB/s per GPU
    assert ds21.runtime.zero3_throughput == pytest.approx(5.1e9 * 2 * 7 / 8 / 0.42, rel=1e-12)


def test_a_run_names_its_framework_or_assumes_megatron_core(tmp_path):
    from planner.fidelity.runs import load_runs
    rows = yaml.safe_load((Path(__file__).parents[1] / "benchmarks" / "published_runs.yaml").read_text())
    row = next(r for r in rows if r["id"] == "korthikanti22-175b-selective-sp")
    mine = dict(row, id="my-run", framework={"framework": "megatron-lm-2021", "dtype": "fp16"})
    plain = dict(row, id="my-plain-run")
    path = tmp_path / "runs.yaml"  # no runs_facts.yaml beside it: the shipped facts files
    path.write_text(yaml.safe_dump([mine, plain]))
    cases = {c.id: c for c in load_runs(path)}
    assert cases["my-run"].training.framework == "megatron-lm-2021"
    assert cases["my-run"].training.grad_bytes == 2 and not cases["my-run"].training.tp_backward_overlap
    assert cases["my-plain-run"].training.framework == "megatron-core"
    assert "framework=megatron-core bf16" in cases["my-plain-run"].assumptions
    bad = dict(row, id="bad-run", framework={"framework": "megatron-core", "grad": "fp32"})
    path.write_text(yaml.safe_dump([bad]))
    with pytest.raises(UsageError, match="bad-run: framework: grad: unknown field"):
        load_runs(path)
