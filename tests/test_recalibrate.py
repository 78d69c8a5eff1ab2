"""The shipped efficiency factors are what benchmarks/recalibrate.py gives: the fits of
benchmarks/calibration.yaml and the derivations of the profiles without a fit of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner import catalog
from planner.fidelity.loso import calibration_plan
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def recalibrate():
    return load_benchmark("recalibrate")


def test_shipped_factors_are_what_a_fresh_fit_gives(recalibrate, capsys):
    # every fitted profile refitted on its plan's runs, every follower rederived: nothing differs
    assert recalibrate.main(["--check", "--no-loo"]) == 0, capsys.readouterr().out


def test_shipped_plans_are_the_fitted_profiles_only():
    # dgx-b200 and gb200-nvl72 are derived, not fitted (their modern-run fits are in
    # calibration_explore.yaml); dgx-h100 is fitted on the published runs, matmul_fp8 derived
    plan = calibration_plan()
    assert set(plan) == {"dgx-a100-80g", "dgx-a100-40g", "dgx-h100", "grand-teton-h100"}
    assert plan["dgx-h100"].datasets == ["published"] and "matmul_fp8" not in plan["dgx-h100"].fitted
    explore = calibration_plan(ROOT / "benchmarks" / "calibration_explore.yaml")
    assert {"dgx-b200", "gb200-nvl72"} <= set(explore)


def test_derived_factors_by_hand():
    h100 = catalog.resolve_hardware("dgx-h100").efficiency
    assert h100.matmul == pytest.approx(0.605)
    # FP8 / BF16 MAMF (fp8_hardware.md 5.3): H100 (1402.6/1979) / (794.5/989)
    # = 0.708742 / 0.803337 = 0.882248; 0.605 x 0.882248 = 0.53376 -> 0.534
    assert h100.matmul_fp8 == pytest.approx(0.534)
    b200 = catalog.resolve_hardware("dgx-b200").efficiency
    # 0.605 x (1745.0/2250) / (794.5/989) = 0.605 x 0.775556 / 0.803337 = 0.584078 -> 0.584;
    # x (3432.5/4500) / (1745.0/2250) = x 0.762778 / 0.775556 = x 0.983524: 0.584078 x 0.983524
    # = 0.574455 -> 0.574; half-efficiency GEMM: 1.6 us x 2250 TFLOP/s = 3.6e9 FLOP
    assert (b200.matmul, b200.matmul_fp8) == (pytest.approx(0.584), pytest.approx(0.574))
    assert b200.matmul_half_flops == pytest.approx(3.6e9)
    gb200 = catalog.resolve_hardware("gb200-nvl72").efficiency
    # 0.605 x (1822.0/2500) / 0.803337 = 0.605 x 0.7288 / 0.803337 = 0.548873 -> 0.549;
    # x (3615.6/5000) / 0.7288 = x 0.72312 / 0.7288 = x 0.992206: 0.544595 -> 0.545
    assert (gb200.matmul, gb200.matmul_fp8) == (pytest.approx(0.549), pytest.approx(0.545))
    # the rest is dgx-h100's
    for eff in (b200, gb200):
        assert (eff.attention, eff.hbm, eff.nvlink, eff.network) == \
            (h100.attention, h100.hbm, h100.nvlink, h100.network)
