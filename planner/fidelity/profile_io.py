"""Write a hardware profile as YAML in the catalog schema (reloadable with ``--hardware PATH``)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import UsageError
from ..specs import HardwareProfile


def write_profile(hw: HardwareProfile, path: Path, force: bool = False) -> None:
    """Serialize ``hw`` (quantities with units) to ``path``; UsageError if it exists and not ``force``."""
    from ..export import check_destination
    check_destination(path, force, "--output", "my-profile.yaml")
    data = hw.model_dump(mode="json")
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    try:
        path.write_text(f"# Calibrated by `plan3d calibrate` from {hw.name}.\n{text}", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
