"""Fitting only some factors (benchmarks/calibration.yaml ``fitted``) and taking priors from
another profile (``priors_from``)."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.errors import UsageError
from planner.fidelity.calibrate import fit
from planner.fidelity.loso import calibration_plan, prior_profile
from planner.fidelity.runs import load_datasets


def test_fit_moves_only_the_named_factors():
    hw = catalog.resolve_hardware("grand-teton-h100")
    runs = [c for c in load_datasets(["modern"]) if c.id.startswith("titan2412-h100-bf16-")]
    result = fit(runs, hw, leave_one_out=False, only=["matmul"])
    assert set(result.factors) == {"matmul"}
    with pytest.raises(UsageError, match="not a factor"):
        fit(runs, hw, leave_one_out=False, only=["matmul", "nvlinks"])


def test_grand_teton_plan_takes_dgx_h100_priors():
    plan = calibration_plan()["grand-teton-h100"]
    assert plan.fitted == ["matmul", "matmul_fp8"] and plan.priors_from == "dgx-h100"
    prior = prior_profile("grand-teton-h100", plan).efficiency
    h100 = catalog.resolve_hardware("dgx-h100").efficiency
    # every factor starts at dgx-h100's; the shipped grand-teton keeps the unfitted ones as they are
    assert prior.matmul == h100.matmul and prior.hbm == h100.hbm
    shipped = catalog.resolve_hardware("grand-teton-h100").efficiency
    assert (shipped.hbm, shipped.nvlink, shipped.network) == (h100.hbm, h100.nvlink, h100.network)
