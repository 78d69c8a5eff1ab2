"""The search's choice of activation offload (cost.offload, search.scan): the least N that fits,
within the host memory, only where the framework and the hardware offer it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.cost import memory_total
from planner.cost.offload import host_bytes, least_offload_layers
from planner.frameworks.profile import Overrides, resolve_training
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec

GIB = 2.0 ** 30
LLAMA8 = catalog.resolve_model("llama3-8b")
LLAMA70 = catalog.resolve_model("llama3-70b")
H100 = catalog.resolve_hardware("dgx-h100")
GB200 = catalog.resolve_hardware("gb200-nvl72")
TRAIN8 = TrainingSpec(seq_length=8192, global_batch_size=512)
JOB70 = TrainingSpec(seq_length=8192, global_batch_size=256)
MCORE = catalog.resolve_framework("megatron-core")


def candidates(**kw) -> Candidates:
    """Llama 3 8B on 8 H100, pp 1, ZeRO-3, no recomputation (an offload candidate)."""
    base = dict(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=2, recompute="none")
    return Candidates.from_layouts([Layout(**{**base, **kw})])


def brute_force(c: Candidates, usable: float) -> int:
    """The least N in 2..L-1 whose memory fits (0 when N = 0 fits or none does)."""
    if memory_total(LLAMA8, H100, TRAIN8, c)[0] <= usable:
        return 0
    for n in range(2, LLAMA8.num_layers):
        if memory_total(LLAMA8, H100, TRAIN8, c.replace(offload_layers=np.array([n])))[0] <= usable:
            return n
    return 0


@pytest.mark.parametrize("gib", [20, 45, 60, 75, 79])
def test_least_offload_is_the_brute_force_one(gib):
    c = candidates()
    assert int(least_offload_layers(LLAMA8, H100, TRAIN8, c, gib * GIB)[0]) == brute_force(c, gib * GIB)


@settings(max_examples=30, deadline=None)
@given(gib=st.floats(10, 90), more=st.floats(0, 40), mbs=st.sampled_from([1, 2, 4]))
def test_more_memory_never_needs_more_offload(gib, more, mbs):
    c = candidates(micro_batch_size=mbs)
    n_small = int(least_offload_layers(LLAMA8, H100, TRAIN8, c, gib * GIB)[0])
    n_large = int(least_offload_layers(LLAMA8, H100, TRAIN8, c, (gib + more) * GIB)[0])
    if n_small:  # what fits with less memory fits with more, with no more layers offloaded
        assert n_large <= n_small
    if float(memory_total(LLAMA8, H100, TRAIN8, c)[0]) <= gib * GIB:  # fits without: none
        assert n_small == n_large == 0


def test_bridge_llama3_70b_gb200_recipe():
    # Megatron-Bridge @067f987df perf_recipes/llama/gb200/llama3.py,
    # llama3_70b_pretrain_64gpu_gb200_bf16_config: Llama 3 70B on 64 GB200, BF16, Megatron FSDP
    # (optim_grads_params), tp 1 pp 1 cp 1, mbs 1, gbs 256, seq 8192, no recomputation, bf16
    # gradient reduction (perf_recipes/_common.py grad_reduce_in_fp32 False) and
    # cpu_offloading_num_layers 20. The search, pinned to that layout, offloads the same 20.
    training = resolve_training(JOB70, MCORE, Overrides(grad_dtype="bf16"))
    opts = SearchOptions(tp=1, pp=1, cp=1, zero_stage=3, micro_batch_size=1, recompute="none")
    best = search(LLAMA70, GB200, training, 64, opts).ranked
    assert best.candidates.layout(0).offload_layers == 20
    assert float(best.memory["total"][0]) <= float(GB200.gpu.hbm_capacity)


def test_search_winners_fit_and_stay_within_host_memory():
    training = resolve_training(JOB70, MCORE)
    result = search(LLAMA70, GB200, training, 64, SearchOptions(keep=20))
    c = result.ranked.candidates
    offload = np.asarray(c.offload_layers)
    assert np.any(offload > 0)  # tp 1 pp 1 layouts fit only with offload here
    assert np.all(result.ranked.memory["total"] <= result.usable)
    assert np.all(host_bytes(LLAMA70, training, c) <= GB200.host_memory_per_gpu)
    assert np.all((offload == 0) | ((np.asarray(c.pp) == 1) & (np.asarray(c.recompute) == 0)))


@pytest.mark.parametrize("how", ["pinned 0", "torchtitan", "no host memory", "no bandwidth"])
def test_search_never_offloads_where_it_may_not(how):
    training = resolve_training(JOB70, MCORE)
    # the contrast: on GB200 the free search of this job offloads (tp 1, pp 1 layouts)
    assert np.any(np.asarray(search(LLAMA70, GB200, training, 64, SearchOptions(keep=20))
                             .ranked.candidates.offload_layers) > 0)
    opts, hw = SearchOptions(keep=20, offload_layers=0), GB200
    if how == "torchtitan":
        tt = catalog.resolve_framework("torchtitan")
        training, opts = resolve_training(JOB70, tt), SearchOptions(keep=20, framework=tt)
    elif how == "no host memory":
        hw, opts = GB200.model_copy(update={"host_memory": None}), SearchOptions(keep=20)
    elif how == "no bandwidth":  # a 50 GB/s host link that also carries the 50 GB/s NIC, on
        # 64 GPUs of NVL36x2-like domains of 32: the copies get nothing
        link = GB200.host_link.model_copy(update={"bandwidth_per_gpu": 50e9, "carries_nic_traffic": True})
        hw = GB200.model_copy(update={"host_link": link, "nvlink_domain": 32})
        opts = SearchOptions(keep=20)
    c = search(LLAMA70, hw, training, 64, opts).ranked.candidates
    assert np.all(np.asarray(c.offload_layers) == 0)


def test_offload_beyond_host_memory_is_refused():
    # Llama 3 70B, mbs 4, seq 8192, tp 1: B = (8h + 2*d*(a+2g) + 2*a*d + 6f + 4a) x s*b =
    # (65,536 + 20,480 + 16,384 + 172,032 + 256) x 32,768 = 9,001,238,528 B per layer;
    # 69 layers = 578.4 GiB; a GB200 tray's 960 GiB / 4 GPUs = 240 GiB per GPU holds
    # floor(257,698,037,760 / 9,001,238,528) = 28 layers.
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-70b", "-g", "64", "--hardware",
                                   "gb200-nvl72", "--global-batch-size", "256", "--seq-length",
                                   "8192", "--zero-stage", "3", "--micro-batch-size", "4",
                                   "--offload-layers", "69"])
    assert res.exit_code == 2
    assert "578.4 GiB" in res.output and "240.0 GiB per GPU" in res.output
    assert "at most 28 layers" in res.output


def test_validator_lists_offload_as_not_run():
    from planner import __version__
    from planner.plan import Plan
    from planner.validate.miniature import miniature
    lay = Layout(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=2, offload_layers=16)
    plan = Plan(plan3d_version=__version__, model=LLAMA8, hardware=H100, gpus=8, training=TRAIN8,
                layout=lay)
    run = miniature(plan, world=2)
    assert run.layout.offload_layers == 0
    assert any(d["feature"] == "activation offload" for d in run.not_exercised)


def test_a_tie_ranks_the_layout_without_offload_first():
    # Llama 3 8B on 8 H100: layouts with and without a little offload tie on step time; the one
    # that needs no host memory and no host-link traffic comes first
    ranked = search(LLAMA8, H100, resolve_training(TrainingSpec(seq_length=8192, global_batch_size=512), MCORE),
                    8, SearchOptions(keep=20)).ranked
    tps, offload = ranked.throughput["tokens_per_s"], np.asarray(ranked.candidates.offload_layers)
    for i in range(len(tps)):
        for j in range(i + 1, len(tps)):
            assert not (tps[i] == tps[j] and offload[i] > 0 and offload[j] == 0)


def test_pinned_offload_that_cannot_run_is_a_named_rule():
    # 60 layers of Llama 3 70B at mbs 2 need 60 x 4.19 GiB = 251.5 GiB of host memory per GPU;
    # a GB200 GPU has 240 GiB: no layout passes, and the error names why
    res = CliRunner().invoke(app, ["search", "-m", "llama3-70b", "-g", "64", "--hardware",
                                   "gb200-nvl72", "--global-batch-size", "256", "--seq-length",
                                   "8192", "--offload-layers", "60", "--micro-batch-size", "2",
                                   "--tp", "1", "--cp", "1"])
    assert res.exit_code == 2
    assert "offloaded activations within the host memory, with host-link bandwidth left" in res.output


def test_offload_needs_host_blocks_and_bandwidth(tmp_path):
    import yaml as pyyaml
    data = pyyaml.safe_load(open("hardware_profiles/dgx-h100.yaml"))
    del data["host_memory"]
    bare = tmp_path / "bare.yaml"
    bare.write_text(pyyaml.safe_dump(data))
    res = CliRunner().invoke(app, ["search", "-m", "llama3-8b", "-g", "8", "--hardware", str(bare),
                                   "--offload-layers", "4"])
    assert res.exit_code == 2 and "needs the hardware profile's host_link and host_memory" in res.output
    # a host link of 35 GB/s that also carries a 50 GB/s NIC leaves no bandwidth on 16 GPUs
    data = pyyaml.safe_load(open("hardware_profiles/dgx-h100.yaml"))
    data["name"], data["host_link"]["bandwidth_per_gpu"] = "slow-host", "35 GB/s"
    slow = tmp_path / "slow.yaml"
    slow.write_text(pyyaml.safe_dump(data))
    res = CliRunner().invoke(app, ["estimate", "-m", "llama3-8b", "-g", "16", "--hardware", str(slow),
                                   "--zero-stage", "3", "--offload-layers", "8"])
    assert res.exit_code == 2 and "leaves nothing for offload copies" in res.output


def test_the_closest_miss_offloads_what_its_limits_allow():
    # Llama 3 70B, seq 65536, on 8 H100, pp 1, no recomputation: nothing fits. The closest miss
    # is judged at its least memory: B = 274,688 B/token / tp 8 x 65,536 tokens = 2.25e9 B a
    # layer, the host's 2 TB / 8 GPUs = 250 GB hold 111 such layers, so the limit is N < L:
    # 79 of 80 layers offloaded.
    from planner.errors import NoFitError
    job = resolve_training(TrainingSpec(seq_length=65536, global_batch_size=64), MCORE)
    with pytest.raises(NoFitError) as err:
        search(LLAMA70, H100, job, 8, SearchOptions(pp=1, recompute="none"))
    closest = err.value.closest
    lay = closest.candidates.layout(0)
    assert (lay.tp, lay.offload_layers) == (8, 79)
    assert "offload=79" in str(err.value)
    assert float(host_bytes(LLAMA70, job, closest.candidates)[0]) <= H100.host_memory_per_gpu


def _stall_by_hand(L: int, N: int, f: float, t: float) -> float:
    """The recursion of cost.offload.schedule_stall written out layer by layer (R = L - N slots;
    a copy starts when its layer's forward ends)."""
    R, starts, ends = max(L - N, 1), [0.0] * (L + 1), [0.0] * (L + 1)
    for j in range(1, L + 1):
        start = starts[j - 1] + f if j > 1 else 0.0
        if j - R >= 1:
            start = max(start, ends[j - R])
        starts[j] = start
        ends[j] = max(ends[j - 1], start + f) + t if j <= N else ends[j - 1]
    return max(starts[L] + f - L * f, 0.0)


@settings(max_examples=60, deadline=None)
@given(L=st.integers(2, 40), frac=st.floats(0, 1), f=st.floats(0.001, 1), t=st.floats(0.0, 3))
def test_schedule_stall_is_its_recursion(L, frac, f, t):
    from planner.cost.offload import schedule_stall
    N = min(int(frac * L), L - 1)
    got = float(schedule_stall(np.array([L]), np.array([N]), f, t)[0])
    want = _stall_by_hand(L, N, f, t) if N > 0 else 0.0
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9 * L * f)


def test_why_not_an_offload_beyond_the_host_memory_says_how_many_fit():
    # 60 layers x 4.19 GiB = 251.5 GiB > 240 GiB per GB200 GPU; floor(240 / 4.19) = 57 layers
    res = CliRunner().invoke(app, ["search", "-m", "llama3-70b", "-g", "64", "--hardware",
                                   "gb200-nvl72", "--global-batch-size", "256", "--seq-length",
                                   "8192", "--why-not", "offload=60,mbs=2,zero=3,tp=1,cp=1"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "invalid" in text and "251.5 GiB" in text and "at most 57 layers" in text
