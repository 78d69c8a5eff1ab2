"""Write a hardware profile as YAML in the catalog schema (reloadable with ``--hardware PATH``).

Fitted efficiency factors are written to 4 significant digits (the fit's own precision is far
coarser: leave-one-out errors of a few per cent), and ``step_overhead`` in the unit that reads
best ("11.3 ms"), as the shipped profiles write it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..specs import HardwareProfile
from ..fmt import duration_text
from ..outputs import write

DIGITS = 4
NUMBER_FACTORS = ("matmul", "matmul_fp8", "matmul_half_flops", "attention", "hbm", "nvlink", "network")


def profile_data(hw: HardwareProfile) -> dict:
    """``hw`` as its YAML mapping: quantities with units, efficiency factors to DIGITS
    significant digits, ``step_overhead`` as e.g. "11.3 ms"."""
    data = hw.model_dump(mode="json")
    eff = data["efficiency"]
    for key in NUMBER_FACTORS:
        value = getattr(hw.efficiency, key)
        if value is not None:  # matmul_fp8 is None on a GPU without FP8
            eff[key] = float(f"{float(value):.{DIGITS}g}")
    eff["step_overhead"] = duration_text(float(hw.efficiency.step_overhead), DIGITS)
    return data


def write_profile(hw: HardwareProfile, path: Path, force: bool = False,
                  calibrated_from: str | None = None) -> None:
    """Serialize ``hw`` (profile_data) to ``path``, headed by a comment naming the profile it was
    calibrated from (``calibrated_from``, default ``hw.name``); '-' writes stdout. UsageError if
    ``path`` is an existing file and not ``force``, or cannot be written (planner.outputs)."""
    text = yaml.safe_dump(profile_data(hw), sort_keys=False, allow_unicode=True, width=100)
    origin = calibrated_from or hw.name
    write(path, f"# Calibrated by `plan3d calibrate` from {origin}.\n{text}", force, "--output",
          "my-profile.yaml")
