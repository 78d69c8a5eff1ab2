"""torchtitan's memory and traffic terms, derived by hand: per-op selective checkpointing, FSDP2
under pipeline parallelism (stage held gathered, gradients reduce-scattered once per step) and
its fp32 loss."""

from __future__ import annotations

import numpy as np
import pytest

from planner import catalog
from planner.cost import blocks, memory, per_op_checkpoint
from planner.cost.traffic import Elements
from planner.cost.volumes import dp_collectives
from planner.frameworks.profile import resolve_training
from planner.layout import Candidates
from planner.layout import Layout

LLAMA8B = catalog.resolve_model("llama3-8b")  # h 4096, 32 heads of 128, 8 KV heads, f 14336, V 128256
JOB = {"seq_length": 8192, "global_batch_size": 16}


def titan():
    return resolve_training(JOB, catalog.resolve_framework("torchtitan"))


def megatron():
    return resolve_training(JOB, catalog.resolve_framework("megatron-core"))


def cands(**kw):
    base = dict(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=2, recompute="selective")
    return Candidates.from_layouts([Layout(**{**base, **kw})])


def test_profiles_state_selective_and_loss_facts():
    assert titan().selective_recompute == "per_op" and titan().loss_bytes_per_logit == 12
    assert megatron().selective_recompute == "core_attention" and megatron().loss_bytes_per_logit == 6


def test_per_op_saved_bytes_llama3_8b():
    per = per_op_checkpoint.per_op_saved_per_token(LLAMA8B, cands())
    # attention: block input 2h + wq out 2*32*128 + wv out 2*8*128 + SDPA out 2*32*128 + lse 4*32
    #   = 8192 + 8192 + 2048 + 8192 + 128 = 26752 B/token (no TP: no reduce-scatter output)
    assert float(per[blocks.ATTENTION][0]) == 26752
    # MLP: w1 out 2*14336 + w2 out 2*4096 = 28672 + 8192 = 36864 B/token
    assert float(per[blocks.MLP][0]) == 36864


def test_per_op_saved_bytes_under_tp_and_sp():
    per = per_op_checkpoint.per_op_saved_per_token(LLAMA8B, cands(tp=8, dp=1, sequence_parallel=True))
    # attention, t 8 with SP: input 8192/8 + (wq 8192 + wv 2*8*128 + SDPA 8192 + 128)/8
    #   + wo reduce-scatter out 8192/8 = 1024 + 18560/8 + 1024 = 1024 + 2320 + 1024 = 4368
    assert float(per[blocks.ATTENTION][0]) == pytest.approx(4368)
    # MLP: w1 28672/8 + w2 partial sum 8192 (h wide on every rank) + reduce-scatter 8192/8
    #   = 3584 + 8192 + 1024 = 12800
    assert float(per[blocks.MLP][0]) == pytest.approx(12800)


def test_per_op_activations_and_recompute_share():
    c = cands()
    t = titan()
    tokens = 2 * 8192
    # code 1 under torchtitan saves (26752 + 36864) per token per layer
    got = memory.activation_per_layer(LLAMA8B, t, c)
    assert float(got[0]) == tokens * (26752 + 36864)
    # the even matmuls run again: attention wk + wo = (8 + 32)*128*4096 of 2*(32 + 8)*128*4096
    assert per_op_checkpoint.per_op_recomputed_gemm_share(LLAMA8B, blocks.ATTENTION) == 0.5
    # SwiGLU MLP: w3 of w1, w3, w2
    assert per_op_checkpoint.per_op_recomputed_gemm_share(LLAMA8B, blocks.MLP) == pytest.approx(1 / 3)


def test_fsdp2_under_pp_gathers_and_reduces_once_per_step():
    c = cands(pp=2, micro_batch_size=1, recompute="full")
    t = titan()
    colls = [x for x in dp_collectives(LLAMA8B, t, c, np.asarray(0), Elements.of(t))
             if "ZeRO-3" in x.what and float(np.asarray(x.calls).ravel()[0]) > 0]
    # held stage: one all-gather and one reduce-scatter, both per step; none per micro-batch
    assert sorted((x.kind, x.per) for x in colls) == [("all_gather", "step"), ("reduce_scatter", "step")]
    # without PP FSDP2 reshards after forward: gather for forward and backward, reduce-scatter
    c1 = cands(micro_batch_size=1, recompute="full")
    colls1 = [x for x in dp_collectives(LLAMA8B, t, c1, np.asarray(0), Elements.of(t))
              if "ZeRO-3" in x.what and float(np.asarray(x.calls).ravel()[0]) > 0]
    assert sorted((x.kind, x.per) for x in colls1) == [
        ("all_gather", "microbatch"), ("all_gather", "microbatch"), ("reduce_scatter", "microbatch")]


def test_fsdp2_under_pp_holds_unsharded_params_and_fp32_grads():
    c = cands(pp=2, micro_batch_size=1, recompute="full")
    st = memory.model_state_bytes(np.asarray([1e9]), c, titan())
    # fp32 parameter shard 4/8 + bf16 gathered stage 2 = 0.5 + 2 = 2.5 B per parameter
    assert float(st["weights"][0]) == pytest.approx(2.5e9)
    # fp32 gradient shard 4/8 + unsharded fp32 accumulation 4 = 4.5 B per parameter
    assert float(st["gradients"][0]) == pytest.approx(4.5e9)
    # Adam m, v fp32 over 8: 8/8 = 1 B per parameter
    assert float(st["optimizer"][0]) == pytest.approx(1e9)


def test_loss_bytes_per_logit_on_the_last_stage():
    c = cands(recompute="full")
    tt, mc = titan(), megatron()
    a = memory.activation_bytes_by_stage(LLAMA8B, tt, c, ("last",))["last"]
    b = memory.activation_bytes_by_stage(LLAMA8B, mc.model_copy(update={
        k: getattr(tt, k) for k in ("selective_recompute",)}), c, ("last",))["last"]
    # same layers; the loss differs by (12 - 6) B x V_p per token: 6 * 128256 * 16384 tokens
    assert float(a[0] - b[0]) == pytest.approx(6 * 128256 * 2 * 8192)
