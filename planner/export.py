"""plan.yaml: write a chosen plan for review, and read it back (framework configs come later)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from . import __version__
from .files import read_yaml, refuse_other_kind, validate
from .errors import UsageError
from .outputs import check_destination, write  # noqa: F401 (check_destination re-exported)
from .framework_spec import FrameworkProfile
from .plan import VERSION_PATTERN, Plan
from .specs import HardwareProfile, ModelSpec, TrainingSpec
from .layout import Layout
from .inputs import check_training, field_of
from .search.check import check_layout
from .search.framework_rules import profile_for


def make_plan(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, layout: Layout,
              estimate: dict, framework: FrameworkProfile | None = None) -> Plan:
    """A Plan with the estimate's memory/time/throughput (SI units) and, where given, its error
    band (explain_bands.estimate_band) attached and the framework profile embedded (None: the catalog
    profile ``training.framework`` names)."""
    return Plan(plan3d_version=__version__, model=model, hardware=hw, gpus=layout.gpus,
                training=training, layout=layout,
                estimate={k: estimate[k] for k in ("memory", "time", "throughput", "band") if k in estimate},
                framework=profile_for(training, framework))


def plan_to_yaml(plan: Plan) -> str:
    """The plan as YAML text: model, hardware, gpus, training, layout, estimate, framework (stable
    key order)."""
    header = ("# plan3d plan: re-evaluate with `plan3d estimate --plan FILE`.\n"
              "# estimate: bytes, seconds, FLOP/s as TFLOP/s per GPU; mfu/hfu are fractions of peak.\n")
    data = plan.model_dump(mode="json", exclude_none=True)
    return header + yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)


def write_plan(plan: Plan, path: Path, force: bool = False) -> None:
    """Write plan.yaml (or to stdout for '-', planner.outputs); an existing file is kept unless
    ``force`` (UsageError)."""
    write(path, plan_to_yaml(plan), force)


_VERSION = re.compile(VERSION_PATTERN)


def _version_key(text: object) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a version string such as "0.1.0" or "1.2" (None: not one)."""
    match = _VERSION.match(str(text).strip())
    return None if match is None else tuple(int(g or 0) for g in match.groups())  # type: ignore[return-value]


def read_plan(path: Path) -> Plan:
    """Load and validate a plan file (UsageError with the field on any problem). A
    ``plan3d_version`` that is no version is refused; a plan that fails to validate and was
    written by a newer plan3d says so (its fields may be ones this version does not know)."""
    data = read_yaml(path)
    refuse_other_kind(data, str(path), "plan")
    written = data.get("plan3d_version") if isinstance(data, dict) else None
    if written is not None and _version_key(written) is None:
        raise UsageError(f"{path}: plan3d_version: {written!r} is not a plan3d version "
                         f"(e.g. {__version__})")
    try:
        return validate(Plan, data, str(path))
    except UsageError as exc:
        if written is not None and _version_key(written) > _version_key(__version__):
            raise UsageError(f"{exc} (written by plan3d {written}, newer than this {__version__}: "
                             "read it with that version or later)") from None
        raise


def read_checked_plan(path: Path) -> Plan:
    """read_plan, then the checks every command applies (planner.inputs.check_training: the
    training against the model; search.check_layout: the layout rules): a plan edited by hand
    into an invalid one is a UsageError here, before anything is estimated, exported, placed or
    run. TP across nodes is allowed (it is slow, not invalid)."""
    plan = read_plan(path)
    try:
        check_training(plan.model, plan.training, field_of("training"))
        check_layout(plan.model, plan.hardware, plan.training, plan.gpus, plan.layout.model_dump(),
                     allow_cross_node_tp=True, framework=plan.framework)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return plan
