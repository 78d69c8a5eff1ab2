"""A chosen plan as written by ``--export``: the model, hardware, framework profile, training and
layout, everything needed to re-evaluate it."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from .framework_spec import FrameworkProfile
from .layout import Layout, split_problem
from .quantities import _Strict
from .specs import HardwareProfile, ModelSpec, TrainingSpec

# A plan3d version as plans record it: major.minor[.patch], then an optional suffix (0.1.0, 1.2rc1)
VERSION_PATTERN = r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?[0-9A-Za-z.]*)?$"


class Plan(_Strict):
    """A chosen plan as written by ``--export``: everything needed to re-evaluate it.

    The model, hardware and framework profile are embedded in full, so a plan reproduces the
    same estimate even if the catalogs change later. ``estimate`` is the prediction at export
    time (SI units). ``framework`` is None in plans written before framework profiles: their
    rules are then the catalog profile named by ``training.framework`` (megatron-core).
    """

    plan3d_version: str = Field(pattern=VERSION_PATTERN)
    model: ModelSpec
    hardware: HardwareProfile
    gpus: int = Field(gt=0)
    training: TrainingSpec
    layout: Layout
    estimate: dict[str, Any] | None = None
    framework: FrameworkProfile | None = None

    @field_validator("framework", mode="before")
    @classmethod
    def _embedded(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError(f"a plan embeds its framework profile in full, not a name ({value!r}): "
                             "delete the framework line (the plan then takes training.framework's "
                             "profile) or export a plan again with plan3d search --framework NAME "
                             "--export")
        return value

    @model_validator(mode="after")
    def _check(self) -> "Plan":
        problem = split_problem(self.gpus, self.layout.model_dump(), exact=True)
        if problem:
            raise ValueError(f"layout {problem}")
        if self.framework is not None and self.framework.name != self.training.framework:
            raise ValueError(f"framework is {self.framework.name} but training.framework is "
                             f"{self.training.framework}")
        return self
