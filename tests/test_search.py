"""Search: invariants (hypothesis) and named pruning."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from planner import catalog
from planner.cost import evaluate
from planner.errors import NoFitError, UsageError
from planner.search.options import SearchOptions
from planner.search.grid import enumerate_space
from planner.search.run import search
from planner.specs import TrainingSpec

# The project's accuracy target for MFU figures (README "Accuracy": 10 %), relative
MFU_RTOL = 0.10

MODELS = ["llama2-7b", "llama3-8b", "gpt-neox-20b", "llama2-70b", "megatron-22b"]
SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _scaled(hw, **changes):
    """A copy of a hardware profile with some numbers multiplied ("section.field": factor)."""
    for path, factor in changes.items():
        section, field = path.split(".")
        part = getattr(hw, section)
        part = part.model_copy(update={field: getattr(part, field) * factor})
        hw = hw.model_copy(update={section: part})
    return hw


@SETTINGS
@given(name=st.sampled_from(MODELS), nodes=st.sampled_from([1, 2, 4, 8, 16]),
       batch=st.sampled_from([64, 256, 512]))
def test_every_returned_layout_uses_all_gpus_and_fits(name, nodes, batch):
    model, hw = catalog.resolve_model(name), catalog.resolve_hardware("dgx-a100-80g")
    gpus = 8 * nodes
    training = TrainingSpec(seq_length=2048, global_batch_size=batch)
    try:
        result = search(model, hw, training, gpus)
    except (NoFitError, UsageError):
        return
    c, mem = result.ranked.candidates, result.ranked.memory
    assert np.all(c.tp * c.cp * c.pp * c.dp == gpus)
    assert np.all(mem["total"] <= mem["capacity"])
    assert np.all(training.global_batch_size % (c.dp * c.micro_batch_size) == 0)
    tput = result.ranked.throughput["tokens_per_s"]
    # the top tie group first (picked by preference), then the rest best first; every member of
    # the group within the tie band of the group's reference or faster
    assert np.all(np.diff(tput[result.tie_group:]) <= 0)
    assert np.all(tput[:result.tie_group] >= tput[result.reference] * np.exp(-result.tie_band) * (1 - 1e-9)
                  / (1 + result.features.below[:result.tie_group] + result.features.above[result.reference]))
    strict = search(model, hw, training, gpus, SearchOptions(strict_rank=True))
    assert np.all(np.diff(strict.ranked.throughput["tokens_per_s"]) <= 0)  # ranked best first
    assert strict.ranked.throughput["tokens_per_s"][0] == tput.max()


@SETTINGS
@given(name=st.sampled_from(MODELS), nodes=st.sampled_from([1, 2, 8]), factor=st.floats(1.01, 4.0))
def test_more_hbm_never_loses_a_feasible_layout(name, nodes, factor):
    model, hw = catalog.resolve_model(name), catalog.resolve_hardware("dgx-a100-40g")
    training = TrainingSpec(seq_length=2048, global_batch_size=512)
    space = enumerate_space(model, hw, training, 8 * nodes, SearchOptions())
    small = evaluate(model, hw, training, space).fits
    big = evaluate(model, _scaled(hw, **{"gpu.hbm_capacity": factor}), training, space).fits
    assert np.all(big[small])
    assert big.sum() >= small.sum()


@SETTINGS
@given(name=st.sampled_from(MODELS), nodes=st.sampled_from([1, 4, 16]),
       field=st.sampled_from(["intra_node.bandwidth_per_gpu", "inter_node.bandwidth_per_nic",
                              "gpu.hbm_bandwidth"]),
       factor=st.floats(1.01, 8.0))
def test_more_bandwidth_never_makes_a_layout_slower(name, nodes, field, factor):
    model, hw = catalog.resolve_model(name), catalog.resolve_hardware("dgx-h100")
    training = TrainingSpec(seq_length=4096, global_batch_size=256)
    space = enumerate_space(model, hw, training, 8 * nodes, SearchOptions())
    base = evaluate(model, hw, training, space).time["step"]
    fast = evaluate(model, _scaled(hw, **{field: factor}), training, space).time["step"]
    assert np.all(fast <= base * (1 + 1e-12))


def test_time_terms_add_up_to_the_step(gpt3, h100, gpt3_training):
    result = search(gpt3, h100, gpt3_training, 512)
    t = result.ranked.time
    total = sum(t[k] for k in ("compute", "recompute", "tp_comm", "cp_comm", "pp_comm", "dp_comm",
                               "bubble", "optimizer"))
    np.testing.assert_allclose(total, t["step"], rtol=1e-12)


def test_175b_on_512_h100(gpt3, h100, gpt3_training):
    result = search(gpt3, h100, gpt3_training, 512)
    best = result.ranked.candidates.layout(0)
    # GPT-3 175B does not fit without model parallelism: its bf16 weights alone are 349 GB.
    assert best.tp * best.pp >= 8
    assert result.enumerated == sum(result.pruned.values()) + result.fitting
    assert len(result.ranked) == min(result.fitting, SearchOptions().keep)
    # Megatron-LM README (commit 0010ab7, "Strong Scaling Results"): GPT-3 175B on H100 at a
    # fixed batch falls from 47 % MFU on 96 GPUs to 42 % on 4608; 512 GPUs lie between, so
    # within the project's 10 % MFU target: 0.42 x 0.9 = 0.378 <= MFU <= 0.47 x 1.1 = 0.517
    assert 0.42 * (1 - MFU_RTOL) <= result.ranked.throughput["mfu"][0] <= 0.47 * (1 + MFU_RTOL)


@pytest.mark.parametrize("gpus, published", [
    (96, 0.47),
    pytest.param(4608, 0.42, marks=pytest.mark.xfail(strict=True, reason=(
        "plan3d's best layout reaches about 34 % MFU on 4608 GPUs, 8 points below the published "
        "42 %: the exposed communication at that scale is over-estimated"))),
])
def test_gpt3_strong_scaling_matches_megatron_readme(gpt3, h100, gpus, published):
    # Megatron-LM README (commit 0010ab7, "Strong Scaling Results"): GPT-3 175B strong scaled
    # from 96 to 4608 H100 GPUs "using the same batch size of 1152 sequences throughout",
    # MFU from 47 % to 42 %. The layouts are only in an image; the search's best layout should
    # reach the published MFU within MFU_RTOL (it may pick a better one than NVIDIA ran, but
    # not by more than the target).
    result = search(gpt3, h100, TrainingSpec(seq_length=2048, global_batch_size=1152), gpus)
    assert result.ranked.throughput["mfu"][0] == pytest.approx(published, rel=MFU_RTOL)


def test_pins_are_respected(gpt3, h100, gpt3_training):
    result = search(gpt3, h100, gpt3_training, 512, SearchOptions(tp=8, zero_stage=1, recompute="full"))
    c = result.ranked.candidates
    assert set(c.tp) == {8} and set(c.zero_stage) == {1} and set(c.recompute) == {2}


def test_bad_gpu_counts_and_batches(gpt3, h100, gpt3_training):
    with pytest.raises(UsageError, match="whole number of 8-GPU nodes"):
        search(gpt3, h100, gpt3_training, 12)
    with pytest.raises(UsageError, match="must be positive"):
        search(gpt3, h100, gpt3_training, 0)
    # (without context parallelism: with it, tp*cp*pp can reach 512 and dp = 1 splits any batch)
    with pytest.raises(UsageError, match="not divisible by any data-parallel degree"):
        search(gpt3, h100, TrainingSpec(seq_length=2048, global_batch_size=7), 512,
               SearchOptions(max_cp=1))
    with pytest.raises(NoFitError, match=r"closest, .* needs \d+\.\d GiB of 79\.6 GiB"):  # 81,559 MiB
        search(gpt3, h100, gpt3_training, 8)
