"""Precision speed-ups of same-layout pairs of the modern dataset (planner/fidelity/pairs.py).

Target (torchtitan / dense FP8 accuracy work): the predicted speed-up of each pair within 5
percentage points of the measured one, with `plan3d accuracy --dataset modern --resolve search`.
"""

from __future__ import annotations

import pytest

from planner.fidelity.compare import compare
from planner.fidelity.pairs import precision_pairs
from planner.fidelity.resolve import resolve
from planner.fidelity.runs import load_datasets

PAIRS = {
    # torchtitan benchmarks/llama3_h100_202412_torchtitan.md @31a17bf Table 1 (8 GPUs):
    # FSDP + compile 6,667 TPS/GPU, + Float8 8,532 -> 8532 / 6667 = 1.2797
    ("titan2412-h100-bf16-llama31-8b-8gpu", "titan2412-h100-fp8-llama31-8b-8gpu"): 8532 / 6667,
    # Table 3 (128 GPUs): 6,514 and 8,380 TPS/GPU -> 8380 / 6514 = 1.2865
    ("titan2412-h100-bf16-llama31-8b-128gpu", "titan2412-h100-fp8-llama31-8b-128gpu"): 8380 / 6514,
    # Megatron-Bridge 25.11, Llama 3.1 405B on 128 B200: FP8-CS 6.197 s, MXFP8 6.564 s per
    # iteration (the rows' iteration_s) -> MXFP8 over FP8-CS 6.197 / 6.564 = 0.9441
    ("mbridge2511-b200-fp8cs-llama31-405b-128gpu", "mbridge2511-b200-fp8mx-llama31-405b-128gpu"): 6.197 / 6.564,
    # Llama 3 8B on 8 GB200: 4.16 s and 4.40 s -> 4.16 / 4.40 = 0.9455
    ("mbridge2511-gb200-fp8cs-llama3-8b-8gpu", "mbridge2511-gb200-fp8mx-llama3-8b-8gpu"): 4.16 / 4.40,
}
# Pairs that miss the 5-point target today, with the reason (strict: a fix makes them fail here).
MISSES = {
    ("mbridge2511-gb200-fp8cs-llama3-8b-8gpu", "mbridge2511-gb200-fp8mx-llama3-8b-8gpu"):
        "MXFP8 predicted as fast as FP8-CS on the 8B (its cheaper quantization offsets its slower "
        "GEMMs at gb200-nvl72's hbm factor): predicted 0.997, measured 0.945 (+5.1 points)",
}


@pytest.fixture(scope="module")
def pairs():
    ids = {i for pair in PAIRS for i in pair}
    cases = [c for c in load_datasets(["modern"]) if c.id in ids]
    for case in cases:
        resolve(case)
    return {(p.base.case.id, p.other.case.id): p for p in precision_pairs([compare(c) for c in cases])}


def test_every_pair_is_found_with_its_measured_speedup(pairs):
    assert set(pairs) == set(PAIRS)
    for key, measured in PAIRS.items():
        # per-GPU figures of the source vs the rows' totals: equal to 4 digits
        assert pairs[key].measured == pytest.approx(measured, rel=1e-3)


@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=MISSES[k]))
                                 if k in MISSES else k for k in PAIRS], ids=lambda k: k[1])
def test_predicted_speedup_within_five_points(pairs, key):
    pair = pairs[key]
    assert abs(pair.error_points) <= 5.0, (pair.measured, pair.predicted)


def test_pair_needs_same_layout():
    """Two runs of one source differing in layout as well as precision are no pair: the 405B
    on 256 GB200 (FP8-CS only) pairs with nothing."""
    cases = [c for c in load_datasets(["modern"]) if c.id.startswith("mbridge2511-gb200-fp8cs-llama31-405b")]
    assert precision_pairs([compare(c) for c in cases]) == []
