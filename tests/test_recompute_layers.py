"""Full recompute of N layers per model chunk (Megatron's block method): memory and time derived
by hand, the least N the search takes, exports and the frameworks that refuse it
(formulas.md 3.3.1)."""

from __future__ import annotations

import numpy as np
import yaml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner import __version__, catalog
from planner.cli import app
from planner.cost import memory, memory_total
from planner.cost import model_flops as flops
from planner.cost.offload import schedule_stall
from planner.cost.recompute import least_recompute_layers
from planner.cost.step import estimate_layout
from planner.errors import UsageError
from planner.frameworks import export_plan
from planner.frameworks.profile import resolve_training
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.layout import Candidates
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec

from .test_frameworks import BRIDGE, DEEPSPEED, MEGATRON, flatten, megatron_flags

MIB = 2.0 ** 20
LLAMA = catalog.resolve_model("llama3-70b")
H100 = catalog.resolve_hardware("dgx-h100")
TRAIN = TrainingSpec(seq_length=8192, global_batch_size=512)


def layout(n: int = 0, recompute: str = "full", **kw) -> Layout:
    """Llama 3 70B on 64 GPUs: TP8 (SP) PP4 DP2, 20 layers per stage."""
    base = dict(tp=8, pp=4, dp=2, zero_stage=1, micro_batch_size=1, recompute=recompute,
                sequence_parallel=True, recompute_num_layers=n)
    return Layout(**{**base, **kw})


def first_rank_activations(lay: Layout) -> float:
    c = Candidates.from_layouts([lay])
    return float(memory.activation_bytes_by_stage(LLAMA, TRAIN, c, ("first",))["first"][0])


def test_llama3_70b_block_memory_by_hand():
    # Per token per layer, TP8 with SP (formulas.md 3.2): S = (8h + 2*d*(a+2g) + 2*a*d + 6f
    # + 4a)/t = (65,536 + 20,480 + 16,384 + 172,032 + 256)/8 = 34,336 B -> x 8192 tokens =
    # 268.25 MiB; a fully recomputed layer keeps its input 2h/t = 2,048 B/token = 16 MiB.
    # The first rank holds min(pp, m) = 4 micro-batches x 20 layers = 80 layers, + token ids
    # 4 x 8192 x 8 B = 0.25 MiB. N = 5 of 20: q = 1/4 ->
    # 80 x (16/4 + 268.25 x 3/4) + 0.25 = 16,415.25 MiB (no working set: N < 20).
    assert first_rank_activations(layout(5)) == pytest.approx(16_415.25 * MIB, rel=1e-12)
    # every layer: 80 x 16 + 268.25 (one layer recomputed in backward) + 0.25 = 1,548.5 MiB
    assert first_rank_activations(layout(0)) == pytest.approx(1_548.5 * MIB, rel=1e-12)
    # none: 80 x 268.25 + 0.25 = 21,460.25 MiB
    assert first_rank_activations(layout(0, "none")) == pytest.approx(21_460.25 * MIB, rel=1e-12)


def test_block_covering_the_chunk_is_every_layer():
    # N = 20 = the whole chunk recomputes every layer: the same memory and time as N = 0
    every, block = estimate_layout(LLAMA, H100, TRAIN, layout(0)), estimate_layout(LLAMA, H100, TRAIN, layout(20))
    assert float(block.memory["total"][0]) == pytest.approx(float(every.memory["total"][0]), rel=1e-12)
    assert float(block.time["step"][0]) == pytest.approx(float(every.time["step"][0]), rel=1e-12)


def test_block_time_is_n_of_the_chunk_layers():
    # the recompute term is the forward of N of each chunk's 20 layers again: 5/20 of every
    # layer's; the other terms do not change; HFU's recompute FLOPs are 5/20 too
    every, block = estimate_layout(LLAMA, H100, TRAIN, layout(0)), estimate_layout(LLAMA, H100, TRAIN, layout(5))
    assert float(block.time["recompute"][0]) == pytest.approx(0.25 * float(every.time["recompute"][0]), rel=1e-12)
    assert float(block.time["compute"][0]) == pytest.approx(float(every.time["compute"][0]), rel=1e-12)
    extra = flops.recompute_flops_per_step(LLAMA, 8192, 512, np.array([2]))[0]
    f_model = flops.model_flops_per_step(LLAMA, 8192, 512, np.array([8]))
    hfu_extra = (float(block.throughput["hfu"][0]) - float(block.throughput["mfu"][0])) \
        * float(block.time["step"][0])
    mfu_time = float(block.throughput["mfu"][0]) * float(block.time["step"][0])
    # (hfu - mfu) x step / (mfu x step) = recompute FLOPs / model FLOPs = 0.25 x extra / f_model
    assert hfu_extra / mfu_time == pytest.approx(0.25 * extra / float(np.ravel(f_model)[0]), rel=1e-9)


def test_interleaved_chunks_take_n_per_chunk():
    # vpp 2: chunks of 10 layers, N = 5 -> half of each chunk (and of the rank) recomputed
    c = Candidates.from_layouts([layout(5, vpp=2)])
    assert float(c.recompute_share(80, 0)[0]) == 0.5
    assert float(c.recomputed_layers(80)[0]) == 40.0  # 4 ranks x 2 chunks x 5


def brute_least_n(lay: Layout, usable: float) -> int:
    """The least N in 1..19 whose memory fits, else 0 (every layer): by trying each N."""
    for n in range(1, 20):
        c = Candidates.from_layouts([lay.model_copy(update={"recompute_num_layers": n})])
        if memory_total(LLAMA, H100, TRAIN, c)[0] <= usable:
            return n
    return 0


@pytest.mark.parametrize("gib", [32.0, 40.0, 45.0, 50.0, 70.0])
def test_least_n_is_the_brute_force_one(gib):
    lay = layout(0)
    c = Candidates.from_layouts([lay])
    n = int(least_recompute_layers(LLAMA, H100, TRAIN, c, gib * 2**30)[0])
    assert n == brute_least_n(lay, gib * 2**30)


@settings(max_examples=25, deadline=None)
@given(st.floats(28.0, 79.0), st.floats(0.0, 20.0), st.sampled_from([1, 2]), st.sampled_from([1, 2]))
def test_more_memory_never_needs_more_layers(gib, more, mbs, vpp):
    lay = layout(0, micro_batch_size=mbs, vpp=vpp)
    c = Candidates.from_layouts([lay])
    chunk = 20 // vpp

    def n_at(g):  # 0 = every layer = the whole chunk
        n = int(least_recompute_layers(LLAMA, H100, TRAIN, c, g * 2**30)[0])
        return chunk if n == 0 else n
    assert n_at(gib + more) <= n_at(gib)


def test_search_takes_the_least_n_that_fits():
    # Llama 3 70B, 8k, on 64 H100 with full recompute pinned at TP8 PP4: every winner's N
    # fits, and N - 1 does not (unless N = 1)
    opts = SearchOptions(tp=8, pp=4, recompute="full", vpp=1, micro_batch_size=2, keep=8)
    result = search(LLAMA, H100, TRAIN, 64, opts)
    cand = result.ranked.candidates
    assert np.all(result.ranked.memory["total"] <= result.usable)
    for i in range(len(cand)):
        lay = cand.layout(i)
        assert lay.recompute_num_layers > 0
        assert lay.recompute_num_layers == brute_least_n(lay.model_copy(update={"recompute_num_layers": 0}),
                                                         result.usable)


def test_search_prefers_fewer_layers_to_every_layer():
    # mbs 2 does not fit without recompute at TP8 PP4 (none: activations alone ~42 GiB on
    # the first rank + 25 GiB of states and the reserve): the winner with full recompute
    # recomputes fewer than all 20 layers and is faster than every layer
    opts = SearchOptions(tp=8, pp=4, recompute="full", vpp=1, micro_batch_size=2, zero_stage=1, keep=1)
    best = search(LLAMA, H100, TRAIN, 64, opts).ranked
    lay = best.candidates.layout(0)
    assert 0 < lay.recompute_num_layers < 20
    every = estimate_layout(LLAMA, H100, TRAIN, lay.model_copy(update={"recompute_num_layers": 0}))
    assert float(best.time["step"][0]) < float(every.time["step"][0])


def plan(lay: Layout) -> Plan:
    return Plan(plan3d_version=__version__, model=LLAMA, hardware=H100, gpus=64, training=TRAIN,
                layout=lay)


def test_megatron_export_writes_the_block_method():
    flags = megatron_flags(export_plan(plan(layout(5)), "megatron").text)
    assert flags["--recompute-granularity"] == "full"
    assert flags["--recompute-method"] == "block"
    assert flags["--recompute-num-layers"] == "5"
    assert {"--recompute-granularity", "--recompute-method", "--recompute-num-layers"} <= MEGATRON
    every = megatron_flags(export_plan(plan(layout(0)), "megatron").text)
    assert (every["--recompute-method"], every["--recompute-num-layers"]) == ("uniform", "1")


def test_nemo_export_writes_the_block_method():
    import yaml
    cfg = flatten(yaml.safe_load(export_plan(plan(layout(5)), "nemo").text))
    assert cfg["model.recompute_granularity"] == "full"
    assert cfg["model.recompute_method"] == "block"
    assert cfg["model.recompute_num_layers"] == 5
    assert {"model.recompute_method", "model.recompute_num_layers"} <= BRIDGE


def test_deepspeed_writes_activation_checkpointing_and_refuses_n():
    import json
    # DeepSpeed has no SP: the same layout without it
    cfg = json.loads(export_plan(plan(layout(0, sequence_parallel=False)), "deepspeed").text)
    ac = cfg["activation_checkpointing"]
    assert ac["number_checkpoints"] == 20  # one per layer of a stage: 80 / 4
    assert not ac["partition_activations"] and not ac["cpu_checkpointing"]
    assert set(flatten(cfg)) <= DEEPSPEED
    with pytest.raises(UsageError, match="recomputes every layer in full"):
        export_plan(plan(layout(5, sequence_parallel=False)), "deepspeed")


def test_torchtitan_refuses_n_and_its_search_never_proposes_it():
    with pytest.raises(UsageError, match="recomputes every layer in full"):
        export_plan(plan(layout(5)), "torchtitan")
    tt = catalog.framework_profiles()["torchtitan"]
    training = resolve_training(TRAIN, tt)
    opts = SearchOptions(recompute="full", framework=tt, keep=16)
    ranked = search(LLAMA, H100, training, 64, opts).ranked
    assert np.all(np.asarray(ranked.candidates.recompute_num_layers) == 0)


def test_n_needs_full_recompute():
    with pytest.raises(ValueError, match="needs recompute full"):
        layout(5, "selective")
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-70b", "-g", "64", "--tp", "8",
                                   "--pp", "4", "--recompute-num-layers", "5"])
    assert res.exit_code != 0 and "needs recompute full" in res.output
    assert "Traceback" not in res.output


def test_n_beyond_a_chunk_is_refused():
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-70b", "-g", "64", "--tp", "8",
                                   "--pp", "4", "--recompute", "full", "--recompute-num-layers", "21"])
    assert res.exit_code != 0 and "at most a model chunk's layers" in res.output


def test_estimate_json_says_which_recompute():
    import json
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-70b", "-g", "64", "--tp", "8", "--pp", "4",
                                   "--sequence-parallel", "--recompute", "full",
                                   "--recompute-num-layers", "5", "--seq-length", "8192",
                                   "--global-batch-size", "512", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["layout"]["recompute_num_layers"] == 5
    r = d["recompute"]
    assert (r["mode"], r["method"], r["num_layers"], r["chunk_layers"]) == ("full", "block", 5, 20.0)
    assert r["recomputed_layers"] == 20.0  # 4 stages x 5


# ----------------------------------------------------------------------------- activation offload

LLAMA8 = catalog.resolve_model("llama3-8b")
TRAIN8 = TrainingSpec(seq_length=8192, global_batch_size=512)


def offload_layout(n: int, **kw) -> Layout:
    return Layout(**{**dict(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=2, offload_layers=n), **kw})


def test_offload_memory_by_hand():
    # Llama 3 8B, s 8192, b 2, TP 1: B = (8h + 2*d*(a+2g) + 2*a*d + 6f + 4a) x s*b =
    # (32,768 + 12,288 + 8,192 + 86,016 + 128) x 16,384 = 2,283,798,528 B per layer; pp 1
    # holds one micro-batch of 32 layers. N = 16 offloaded, one layer in transfer kept:
    # activations fall by 16 B - B = 15 B.
    B = 2_283_798_528
    act = {n: estimate_layout(LLAMA8, H100, TRAIN8, offload_layout(n)).memory["activations"][0]
           for n in (0, 16)}
    assert float(act[0] - act[16]) == pytest.approx(15 * B, rel=1e-12)


def test_offload_schedule_by_hand():
    # 10 layers of 1 s, copies of 2 s (link-bound), N = 5, R = 10 - 5 = 5 on the GPU:
    # e_i = max(e_{i-1}, s_i + 1) + 2: e1..e5 = 3, 5, 7, 9, 11 (s1..s5 = 0..4);
    # s_j = max(s_{j-1} + 1, e_{j-5}): s6..s10 = 5, 6, 7, 9, 11 -> the pass ends at 12, 2 s late
    assert schedule_stall(10, 5, 1.0, 2.0) == pytest.approx(2.0, rel=1e-12)
    # R = 1 serialises: 9 copies of 0.5 s exposed; a fast link with R >= 2 hides every copy
    assert schedule_stall(10, 9, 1.0, 0.5) == pytest.approx(4.5, rel=1e-12)
    assert schedule_stall(10, 5, 1.0, 0.5) == 0.0
    assert schedule_stall(10, 0, 1.0, 9.0) == 0.0


def test_offload_time_in_the_step():
    # Llama 3 8B, s 8192, b 2 on 8 H100, 32 micro-batches: B = 2,283,798,528 B, a copy over
    # PCIe Gen5 (64 GB/s) 35.68 ms. N = 31 leaves R = 1 layer on the GPU: each pass is serial,
    # 31 copies exposed forward and 31 backward: 32 x 62 x 35.68 ms = 70.80 s per step.
    t = {n: float(estimate_layout(LLAMA8, H100, TRAIN8, offload_layout(n)).time["offload"][0])
         for n in (8, 16, 31)}
    assert t[31] == pytest.approx(32 * 62 * 2_283_798_528 / 64e9, rel=1e-9)
    # link-bound (35.7 ms a copy over a layer forward f): the pass stalls by f + N x 35.7 ms -
    # 32 f when that is positive, so 8 copies hide for f >= 9.2 ms and 16 only for f >= 18.4 ms;
    # the model's layer forward here is between (checked: 0 stall at 8, some at 16)
    assert t[8] == 0.0 and 0 < t[16] < t[31]
    fast = H100.model_copy(update={"host_link": H100.host_link.model_copy(
        update={"bandwidth_per_gpu": 1e15})})
    assert float(estimate_layout(LLAMA8, fast, TRAIN8, offload_layout(16)).time["offload"][0]) == 0.0
    none = estimate_layout(LLAMA8, H100, TRAIN8, offload_layout(0))
    assert float(none.time["offload"][0]) == 0.0


def test_offload_exports_and_refusals():
    p = Plan(plan3d_version=__version__, model=LLAMA8, hardware=H100, gpus=8, training=TRAIN8,
             layout=offload_layout(16))
    flags = megatron_flags(export_plan(p, "megatron").text)
    assert flags["--cpu-offloading-num-layers"] == "16" and "--cpu-offloading-num-layers" in MEGATRON
    fields = flatten(yaml.safe_load(export_plan(p, "nemo").text))
    assert set(fields) <= BRIDGE, set(fields) - BRIDGE
    assert (fields["model.cpu_offloading"], fields["model.cpu_offloading_weights"],
            fields["model.cpu_offloading_num_layers"]) == (True, False, 16)
    none = flatten(yaml.safe_load(export_plan(p.model_copy(update={"layout": offload_layout(0)}), "nemo").text))
    assert "model.cpu_offloading" not in none
    for target in ("deepspeed", "torchtitan"):
        with pytest.raises(UsageError, match="has no activation offload"):
            export_plan(p, target)
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "-g", "8", "--pp", "2",
                                   "--offload-layers", "4"])
    assert res.exit_code != 0 and "activation offload needs pp = 1 and no recomputation" in res.output
