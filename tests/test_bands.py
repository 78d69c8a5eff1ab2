"""Error bands (planner.search.bands): the conformal rule, the regime backoff, the unchecked
terms, and the shipped benchmarks/error_bands.yaml being what benchmarks/error_bands.py computes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import catalog
from planner.cost.step import estimate_layout
from planner.layout import Candidates, Layout
from planner.search import bands as B
from planner.specs import TrainingSpec
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_conformal_takes_the_ceil_n_plus_one_level_th_absolute_value():
    # n = 4, level 0.5: the ceil(5 x 0.5) = 3rd smallest |value| of 0.05, 0.1, 0.2, 0.3 is 0.2
    assert B.conformal([0.1, -0.2, 0.05, 0.3], 0.5) == (-0.2, 0.2)
    # level 0.9 on 3 values: ceil(4 x 0.9) = 4 > 3, the largest
    assert B.tie_band([0.01, -0.04, 0.02], 0.9) == 0.04
    assert B.conformal([], 0.9) == (0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=1, max_size=40), st.sampled_from(B.LEVELS))
def test_conformal_covers_at_least_its_level_of_its_own_values(values, level):
    lo, hi = B.conformal(values, level)
    inside = sum(lo <= v <= hi for v in values)
    assert lo <= 0 <= hi and inside >= min(len(values), math.ceil(level * len(values)))


def _rec(i, source, kind="dense", precision="bf16", generation="ampere", framework="megatron-core", d=0.1):
    return {"id": f"r{i}", "source": source, "kind": kind, "precision": precision,
            "generation": generation, "framework": framework, "d": d}


def test_select_drops_the_framework_then_the_generation_until_enough_runs_of_two_sources():
    records = [_rec(i, "a") for i in range(5)] + [_rec(5 + i, "b", generation="hopper") for i in range(5)]
    query = {"kind": "dense", "precision": "bf16", "generation": "ampere", "framework": "megatron-core"}
    # the full regime has 5 runs of one source; without the framework still; without the
    # generation 10 runs of 2 sources: that level
    dims, chosen = B.select(records, query, min_runs=9, min_sources=2)
    assert dims == ("kind", "precision") and len(chosen) == 10
    dims, chosen = B.select(records, query, min_runs=5, min_sources=1)
    assert dims == B.REGIME_DIMS and len(chosen) == 5
    dims, chosen = B.select(records, {**query, "kind": "moe"}, min_runs=9, min_sources=2)
    assert dims == () and len(chosen) == 10  # nothing of the kind: all runs


def test_band_bounds_are_e_to_the_sides_widened():
    band = B.Band(-0.2, 0.2, 0.85)
    low, high = band.bounds(10.0, 0.1, 0.3)
    assert low == pytest.approx(10 * (math.exp(-0.2) - 0.1)) and high == pytest.approx(10 * (math.exp(0.2) + 0.3))
    assert band.below == pytest.approx(1 - math.exp(-0.2)) and band.above == pytest.approx(math.exp(0.2) - 1)


def test_regime_reads_the_generation_from_the_gpus_formats():
    dense, moe = catalog.resolve_model("llama3-8b"), catalog.resolve_model("qwen3-30b-a3b")
    fp8 = TrainingSpec(seq_length=4096, global_batch_size=64, precision="fp8-blockwise")
    bf16 = TrainingSpec(seq_length=4096, global_batch_size=64)
    assert B.regime(dense, catalog.resolve_hardware("dgx-a100-80g"), bf16) == \
        {"kind": "dense", "precision": "bf16", "generation": "ampere", "framework": "megatron-core"}
    assert B.regime(moe, catalog.resolve_hardware("dgx-h100"), fp8)["generation"] == "hopper"
    assert B.regime(moe, catalog.resolve_hardware("dgx-h100"), fp8)["precision"] == "fp8"
    assert B.regime(moe, catalog.resolve_hardware("gb200"), bf16)["kind"] == "moe"
    assert B.generation(catalog.resolve_hardware("dgx-b200")) == "blackwell"


def _bands(checked: dict) -> B.Bands:
    return B.Bands(0.85, 0.8, 9, 2, [], [], [], checked)


def test_cp_is_checked_only_at_no_fewer_tokens_per_rank_than_a_measured_run_in_its_placement():
    model, hw = catalog.resolve_model("llama3-70b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    # tp 4 x cp 2 = 8 GPUs: one NVLink domain, 4,096 tokens per CP rank; tp 4 x cp 4 = 16: across
    c = Candidates.from_layouts([Layout(tp=4, cp=2, pp=4, dp=2, zero_stage=1, micro_batch_size=1),
                                 Layout(tp=4, cp=4, pp=4, dp=1, zero_stage=1, micro_batch_size=1)])
    seen = {"cp_ring_nvlink": {"runs": ["x"], "key": 4096.0}, "cp_ring_network": {"runs": ["y"], "key": 16384.0}}
    open_ = B.unchecked(model, hw, tr, c, _bands(seen))
    assert set(open_) == {"cp_ring_network"} and list(open_["cp_ring_network"]) == [False, True]
    seen["cp_ring_nvlink"]["key"] = 8192.0  # the least measured is more tokens per rank: open
    assert list(B.unchecked(model, hw, tr, c, _bands(seen))["cp_ring_nvlink"]) == [True, False]
    # a term no run exercised is unchecked wherever it is used
    off = Candidates.from_layouts([Layout(tp=8, pp=1, dp=8, zero_stage=1, micro_batch_size=1,
                                          offload_layers=4)])
    assert B.unchecked(model, hw, tr, off, _bands({}))["offload"].tolist() == [True]


def test_widening_spans_an_unchecked_term_from_hidden_to_fully_exposed():
    model, hw = catalog.resolve_model("llama3-70b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    lay = Layout(tp=4, cp=4, pp=4, dp=1, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    est = estimate_layout(model, hw, tr, lay)
    masks = {"cp_ring_network": np.array([True])}
    below, above = B.widening(est, masks, model, hw, tr)
    step, exposed, link = (float(est.time["step"][0]), float(est.time["cp_comm"][0]),
                           float(est.link["cp"][0]))
    assert below[0] == pytest.approx(exposed / step)
    assert above[0] == pytest.approx((max(link, exposed) - exposed) / step)
    assert B.widening(est, {}, model, hw, tr)[0][0] == 0.0


def test_the_shipped_file_derives_its_cells_from_its_runs():
    shipped = B.shipped()
    data = yaml.safe_load(Path(shipped.path).read_text())
    for name, cell in data["step"]["cells"].items():
        query = dict(zip(B.REGIME_DIMS, name.split(" ")))
        band = shipped.step(query)
        assert (round(band.below, 5), round(band.above, 5)) == (cell["below"], cell["above"]), name
    assert round(shipped.memory({}).above, 5) == data["memory"]["band"]["above"]
    assert round(shipped.min_free(), 5) == data["memory"]["band"]["min_free"]
    assert round(shipped.tie(), 5) == data["pairs"]["band"]
    covered, total = data["coverage"]["step"]["all"]
    assert covered >= B.TARGET_COVERAGE * total  # the level reaches the target, leave-one-source-out
    assert shipped.level == min(lv for lv in B.LEVELS if lv >= shipped.level)


@pytest.fixture(scope="module")
def error_bands():
    return load_benchmark("error_bands")


def test_the_shipped_file_is_what_the_script_computes(error_bands, capsys):
    # reruns plan3d accuracy --dataset all --resolve search with leave-one-source-out (minutes)
    assert error_bands.main(["--check"]) == 0, capsys.readouterr().out
